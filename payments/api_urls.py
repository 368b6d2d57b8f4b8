"""The payments API, mounted under /api/v1/ by `ledger.urls`."""

from django.urls import path

from . import apis

urlpatterns = [
    path(
        "payments/callback",
        apis.ProviderCallbackApi.as_view(),
        name="api-payment-callback",
    ),
    path(
        "orders/<str:merchant_order_no>/pay",
        apis.OrderPayApi.as_view(),
        name="api-order-pay",
    ),
    path(
        "payments/<int:payment_id>",
        apis.PaymentDetailApi.as_view(),
        name="api-payment-detail",
    ),
    path(
        "payments/<int:payment_id>/capture",
        apis.PaymentCaptureApi.as_view(),
        name="api-payment-capture",
    ),
    path(
        "payments/<int:payment_id>/void",
        apis.PaymentVoidApi.as_view(),
        name="api-payment-void",
    ),
    path(
        "payments/<int:payment_id>/refund",
        apis.PaymentRefundApi.as_view(),
        name="api-payment-refund",
    ),
]
