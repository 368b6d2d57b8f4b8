"""The orders API, mounted under /api/v1/ by `ledger.urls`."""

from django.urls import path

from . import apis

urlpatterns = [
    path("preorders", apis.PreOrderCreateApi.as_view(), name="api-preorder-create"),
    # GET lists the caller's orders, POST places one (api-order-list is the same URL).
    path("orders", apis.OrdersApi.as_view(), name="api-order-create"),
    path(
        "orders/<str:merchant_order_no>",
        apis.OrderDetailApi.as_view(),
        name="api-order-detail",
    ),
    path(
        "orders/<str:merchant_order_no>/cancel",
        apis.OrderCancelApi.as_view(),
        name="api-order-cancel",
    ),
]
