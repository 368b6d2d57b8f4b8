from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import jsonparse
from idempotency.decorators import idempotent
from idempotency.engine import Phases
from ledger.auth import authenticated
from orders.apis import IDEMPOTENCY_KEY
from orders.fields import (
    MAX_AMOUNT,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
)
from orders.selectors import order_get

from .models import Payment
from .provider_client import provider_charge_create
from .selectors import payment_get
from .services import (
    payment_create,
    payment_provider_start,
    payment_record_charge,
    payment_refund,
    provider_event_receive,
)
from .signatures import HEADER, signature_verify


class PaymentOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    order = serializers.CharField(source="order.merchant_order_no")
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    method = serializers.CharField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()
    succeeded_at = serializers.DateTimeField()
    provider_txn_id = serializers.CharField()
    pay_url = serializers.CharField()


class OrderPayApi(APIView):
    """Pay an order. `balance` is one transaction (the engine's atomic mode);
    `provider` calls outside, so it runs in phases with recovery points: a retry
    after a crash resumes where the first attempt stopped."""

    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "OrderPayInput"

        method = serializers.ChoiceField(choices=Payment.Method.choices)

    @extend_schema(
        request=InputSerializer,
        responses={201: PaymentOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    def post(self, request: Request, merchant_order_no: str) -> Response:
        try:
            data = request.data
        except exceptions.ParseError as error:
            # The balance path refuses it, under the engine. (DRF parses a body once:
            # asked again, it would answer an empty body, "method is required".)
            return self.pay_with_balance(request, merchant_order_no, malformed=error)
        if isinstance(data, dict) and data.get("method") == Payment.Method.PROVIDER:
            return self.pay_with_provider(request, merchant_order_no)
        return self.pay_with_balance(request, merchant_order_no)

    def _input(self, request: Request, merchant_order_no: str):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        order = order_get(
            owner=authenticated(request), merchant_order_no=merchant_order_no
        )
        return order, serializer.validated_data["method"]

    @idempotent("orders.pay")
    def pay_with_balance(
        self,
        request: Request,
        merchant_order_no: str,
        malformed: exceptions.ParseError | None = None,
    ) -> Response:
        if malformed is not None:
            raise malformed
        order, method = self._input(request, merchant_order_no)
        payment = payment_create(order_id=order.pk, method=method)
        return Response(
            PaymentOutputSerializer(payment).data, status=status.HTTP_201_CREATED
        )

    @idempotent("orders.pay", phased=True)
    def pay_with_provider(
        self, request: Request, merchant_order_no: str, idem: Phases
    ) -> Response:
        order, _ = self._input(request, merchant_order_no)
        if idem.recovery_point == "started":
            with idem.phase("payment_created"):
                idem.data["payment_id"] = payment_provider_start(order_id=order.pk).pk
        if idem.recovery_point == "payment_created":
            # Outside any transaction, no row locks held; the merchant order number
            # is the provider's idempotency key, so a resumed request gets the
            # same transaction back instead of a second charge.
            charge = provider_charge_create(
                merchant_order_no=order.merchant_order_no,
                amount=order.amount,
                currency=order.currency,
                description=order.description,
            )
            with idem.phase("provider_answered"):
                payment_record_charge(
                    payment_id=idem.data["payment_id"],
                    provider_txn_id=charge.txn_id,
                    pay_url=charge.pay_url,
                )
        payment = Payment.objects.select_related("order").get(
            pk=idem.data["payment_id"]
        )
        return Response(
            PaymentOutputSerializer(payment).data, status=status.HTTP_201_CREATED
        )


class PaymentDetailApi(APIView):
    @extend_schema(responses={200: PaymentOutputSerializer})
    def get(self, request: Request, payment_id: int) -> Response:
        payment = payment_get(owner=authenticated(request), payment_id=payment_id)
        return Response(PaymentOutputSerializer(payment).data)


class RefundOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    payment = serializers.IntegerField(source="payment_id")
    order = serializers.CharField(source="payment.order.merchant_order_no")
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    reason = serializers.CharField()
    payment_status = serializers.CharField(source="payment.status")
    order_status = serializers.CharField(source="payment.order.status_name")
    created_at = serializers.DateTimeField()


class PaymentRefundApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "PaymentRefundInput"

        reason = StrictCharField(required=False, max_length=64, allow_blank=False)

    @extend_schema(
        request=InputSerializer,
        responses={201: RefundOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("payments.refund")
    def post(self, request: Request, payment_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payment = payment_get(owner=authenticated(request), payment_id=payment_id)
        refund = payment_refund(
            payment_id=payment.pk,
            reason=serializer.validated_data.get("reason", "requested"),
        )
        return Response(
            RefundOutputSerializer(refund).data, status=status.HTTP_201_CREATED
        )


class ProviderCallbackApi(APIView):
    """The payment provider's signed callback: verify, store in the inbox, ack.

    No token and no session (so no CSRF): the signature is the authentication.
    Processing happens later in a Celery task; this answers as soon as the event is
    durably stored.
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ProviderCallbackInput"

        event_id = StrictCharField(max_length=128)
        merchant_order_no = StrictCharField(max_length=32)
        provider_txn_id = StrictCharField(max_length=64)
        status = serializers.ChoiceField(choices=["SUCCESS", "FAILED"])
        amount = StrictIntegerField(min_value=1, max_value=MAX_AMOUNT)

    @extend_schema(
        request=InputSerializer,
        responses={200: dict},
        parameters=[
            OpenApiParameter(
                HEADER,
                str,
                OpenApiParameter.HEADER,
                required=True,
                description="t=<unix seconds>,n=<nonce>,v1=<hex HMAC-SHA256>",
            )
        ],
    )
    def post(self, request: Request) -> Response:
        body = request.body
        signature_verify(
            header=request.headers.get(HEADER),
            body=body,
            secret=settings.PAYMENT_PROVIDER_SECRET,
        )
        try:
            text = body.decode("utf-8")
            data = jsonparse.loads(text)
        except ValueError:  # not UTF-8, not JSON, or nested too deeply
            raise exceptions.ParseError("The body is not valid UTF-8 JSON.") from None
        serializer = self.InputSerializer(data=data)
        serializer.is_valid(raise_exception=True)
        provider_event_receive(payload=serializer.validated_data, raw_body=text)
        return Response({"code": "SUCCESS"}, status=status.HTTP_200_OK)
