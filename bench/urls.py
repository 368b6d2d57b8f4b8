from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.decorators import idempotent
from ledger.auth import authenticated
from ledger.urls import urlpatterns as project_urls
from orders.services import preorder_create


class BenchPreorderApi(APIView):
    """Issue a pre-order number: a small real write (one INSERT in a transaction)
    that no two requests contend on, so the figures show the layer, not row locks."""

    # With a key the request goes through the layer; without one it does not.
    @idempotent("bench.preorder", default="optional")
    def post(self, request: Request) -> Response:
        preorder = preorder_create(owner=authenticated(request))
        return Response({"merchant_order_no": preorder.merchant_order_no}, status=201)


urlpatterns = [path("bench/preorders", BenchPreorderApi.as_view()), *project_urls]
