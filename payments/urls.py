"""The payment pages of the web UI, mounted at the site root by `ledger.urls`."""

from django.urls import path

from . import views

urlpatterns = [
    path("orders/<str:merchant_order_no>", views.order_detail, name="order-detail"),
    path("orders/<str:merchant_order_no>/pay", views.order_pay, name="order-pay"),
]
