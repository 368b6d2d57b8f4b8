"""The simulator's HTTP face: a merchant API and a server-rendered pay page."""

import hmac
from urllib.parse import urlsplit

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from rest_framework import exceptions, serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orders.fields import MAX_AMOUNT, StrictCharField, StrictIntegerField

from .models import Charge
from .services import charge_cancel, charge_create, charge_refund, charge_settle

SECRET_HEADER = "X-Merchant-Secret"  # noqa: S105 - a header name


def charge_data(charge: Charge, request: HttpRequest) -> dict:
    path = reverse("provider-pay", args=[charge.txn_id])
    base = settings.PROVIDER_PUBLIC_URL
    return {
        "txn_id": charge.txn_id,
        "merchant_order_no": charge.merchant_order_no,
        "amount": charge.amount,
        "currency": charge.currency,
        "status": charge.status,
        "pay_url": f"{base}{path}" if base else request.build_absolute_uri(path),
    }


class _MerchantApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        given = request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(
            given.encode(), settings.PAYMENT_PROVIDER_SECRET.encode()
        ):
            raise exceptions.AuthenticationFailed("Unknown merchant.")


def _web_address(value: str) -> None:
    """An http(s) address with a host: the pay page links to it, so never a
    `javascript:` one. Any host name, as the merchant's browser saw it (an intranet
    name without a dot, a port), is the merchant's to choose."""
    try:
        parts = urlsplit(value)
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() or not c.isprintable() for c in value)
    ):
        raise serializers.ValidationError("An http or https URL is required.")


class ChargeCreateApi(_MerchantApi):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ProviderChargeInput"

        merchant_order_no = StrictCharField(max_length=64)
        amount = StrictIntegerField(min_value=1, max_value=MAX_AMOUNT)
        currency = StrictCharField(min_length=3, max_length=3)
        description = StrictCharField(
            free_text=True, max_length=255, required=False, default="", allow_blank=True
        )
        return_url = StrictCharField(
            max_length=500,
            required=False,
            default="",
            allow_blank=True,
            validators=[_web_address],
        )

    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        charge, created = charge_create(**serializer.validated_data)
        return Response(charge_data(charge, request), status=201 if created else 200)


def _merchant_order_no(value: str) -> str:
    """A number as the charge API stores it; anything else names no charge (404),
    never a database error (PostgreSQL refuses a NUL in text)."""
    if not 0 < len(value) <= 64 or "\x00" in value:
        raise Http404("no such charge")
    return value


class ChargeDetailApi(_MerchantApi):
    def get(self, request: Request, merchant_order_no: str) -> Response:
        charge = get_object_or_404(
            Charge, merchant_order_no=_merchant_order_no(merchant_order_no)
        )
        return Response(charge_data(charge, request))


class _ChargeActionApi(_MerchantApi):
    """A merchant's action on one of its charges (no body): `200` with the charge
    as the action left it, `404` for an unknown merchant order number."""

    act: staticmethod

    def post(self, request: Request, merchant_order_no: str) -> Response:
        try:
            charge = self.act(merchant_order_no=_merchant_order_no(merchant_order_no))
        except Charge.DoesNotExist:
            raise Http404("no such charge") from None
        return Response(charge_data(charge, request))


class ChargeCancelApi(_ChargeActionApi):
    """Cancel an open charge. Idempotent: the charge, now `CANCELLED`, however
    often it is asked; `409` if the payer paid it first."""

    act = staticmethod(charge_cancel)


class ChargeRefundApi(_ChargeActionApi):
    """Refund a paid charge, all of it. Idempotent: the charge, now `REFUNDED`,
    however often it is asked; `409` if it was never paid."""

    act = staticmethod(charge_refund)


@require_http_methods(["GET", "POST"])
def pay_page(request: HttpRequest, txn_id: str) -> HttpResponse:
    """The payer's page: the charge, and Confirm / Decline (Post-Redirect-Get).

    A charge the merchant cancelled cannot be confirmed: a POST from a page opened
    before the cancel is refused (`409`, the page saying why), never settled. The
    merchant's cancel reaches the provider by a task, moments after the order's: a
    confirmation in between is paid, and the merchant refunds it as the late
    success for a cancelled order it is.
    """
    charge = get_object_or_404(Charge, txn_id=txn_id)
    if request.method == "POST":
        action = request.POST.get("action")
        if action in ("confirm", "decline") and charge.status == Charge.Status.PENDING:
            charge = charge_settle(
                txn_id=txn_id,
                outcome=Charge.Status.SUCCESS
                if action == "confirm"
                else Charge.Status.FAILED,
            )
        if charge.status != Charge.Status.CANCELLED:
            response = HttpResponseRedirect(request.path)
            response.status_code = 303
            return response
        return render(
            request,
            "provider/pay.html",
            {"charge": charge, "refused": True},
            status=409,
        )
    return render(
        request,
        "provider/pay.html",
        {"charge": charge},
    )
