"""The payment pages of the web UI, mounted at the site root by `ledger.urls`."""

from django.urls import path

from . import views

urlpatterns = [
    path("orders/<str:merchant_order_no>", views.order_detail, name="order-detail"),
    path("orders/<str:merchant_order_no>/pay", views.order_pay, name="order-pay"),
    path("orders/<str:merchant_order_no>/live", views.order_live, name="order-live"),
    path(
        "orders/<str:merchant_order_no>/refund",
        views.order_refund,
        name="order-refund",
    ),
    path("account/payments", views.payment_history_page, name="payment-list"),
    path(
        "account/payments/<int:payment_id>",
        views.payment_receipt,
        name="payment-detail",
    ),
]
