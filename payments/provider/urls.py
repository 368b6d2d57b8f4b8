from django.urls import path

from . import views

urlpatterns = [
    path("charges", views.ChargeCreateApi.as_view(), name="provider-charges"),
    path(
        "charges/<str:merchant_order_no>",
        views.ChargeDetailApi.as_view(),
        name="provider-charge-detail",
    ),
    path(
        "charges/<str:merchant_order_no>/cancel",
        views.ChargeCancelApi.as_view(),
        name="provider-charge-cancel",
    ),
    path(
        "charges/<str:merchant_order_no>/refund",
        views.ChargeRefundApi.as_view(),
        name="provider-charge-refund",
    ),
    path("pay/<str:txn_id>", views.pay_page, name="provider-pay"),
]
