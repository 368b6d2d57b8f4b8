from django.urls import path

from ledger.urls import urlpatterns as project_urls

from . import views

urlpatterns = [
    path("test/deposits", views.DepositApi.as_view()),
    path("test/phased-deposits", views.PhasedDepositApi.as_view()),
    *project_urls,
]
