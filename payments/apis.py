from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency import jsonparse
from idempotency.completer import register_resumer
from idempotency.decorators import idempotent
from idempotency.engine import Phases
from idempotency.models import IdempotencyRecord
from ledger.auth import authenticated
from ledger.exceptions import DomainError
from ledger.fields import MAX_INT64
from ledger.problems import PROBLEM_CONTENT_TYPE, problem
from ledger.renderers import JSONRenderer
from orders.apis import IDEMPOTENCY_KEY
from orders.fields import StrictCharField, StrictInputSerializer, StrictIntegerField
from orders.selectors import order_get

from .models import CALLBACK_STATUSES, Payment
from .selectors import order_page_url, payment_get
from .services import (
    HOLD_SECONDS_MAX,
    HOLD_SECONDS_MIN,
    payment_authorize_with_balance,
    payment_capture,
    payment_pay_with_balance,
    payment_pay_with_provider,
    payment_refund,
    payment_void,
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
    # Manual capture: what the hold reserved and until when (null otherwise).
    authorized_amount = serializers.IntegerField(allow_null=True)
    expires_at = serializers.DateTimeField(source="hold.expires_at", allow_null=True)


def _pays_with_provider(request: Request) -> bool:
    """The engine's mode for a pay request: a provider payment calls outside, so it
    runs in phases; a wallet payment in one transaction."""
    data = request.data
    return isinstance(data, dict) and data.get("method") == Payment.Method.PROVIDER


class OrderPayApi(APIView):
    """Pay an order: parse, call the method's service, render.

    `balance` is one transaction (the engine's atomic mode); `provider` calls
    outside, so it runs in phases with recovery points: a retry after a crash, or
    beat's completer, resumes where the first attempt stopped. `balance` with
    `"capture": "manual"` only authorizes: a hold reserves the money until the
    payment is captured, voided or expires.
    """

    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "OrderPayInput"

        method = serializers.ChoiceField(choices=Payment.Method.choices)
        capture = serializers.ChoiceField(
            choices=Payment.Capture.choices,
            required=False,
            default=Payment.Capture.AUTOMATIC,
        )
        hold_seconds = StrictIntegerField(
            required=False, min_value=HOLD_SECONDS_MIN, max_value=HOLD_SECONDS_MAX
        )

        def validate(self, attrs: dict) -> dict:
            attrs = super().validate(attrs)
            manual = attrs["capture"] == Payment.Capture.MANUAL
            if manual and attrs["method"] != Payment.Method.BALANCE:
                raise serializers.ValidationError(
                    {"capture": ["Manual capture is for balance payments only."]}
                )
            if "hold_seconds" in attrs and not manual:
                raise serializers.ValidationError(
                    {"hold_seconds": ["Only with manual capture."]}
                )
            return attrs

    @extend_schema(
        request=InputSerializer,
        responses={201: PaymentOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("orders.pay", phased=_pays_with_provider)
    def post(
        self, request: Request, merchant_order_no: str, idem: Phases | None = None
    ) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        order = order_get(
            owner=authenticated(request), merchant_order_no=merchant_order_no
        )
        data = serializer.validated_data
        if idem is not None:  # the provider
            payment = payment_pay_with_provider(
                order_id=order.pk,
                phases=idem,
                return_url=order_page_url(request, order.merchant_order_no),
            )
        elif data["capture"] == Payment.Capture.MANUAL:
            payment = payment_authorize_with_balance(
                order_id=order.pk,
                hold_seconds=data.get("hold_seconds", settings.HOLD_TTL_SECONDS),
            )
        else:
            payment = payment_pay_with_balance(order_id=order.pk)
        return _created(payment)


def _created(payment: Payment) -> Response:
    return Response(
        PaymentOutputSerializer(payment).data, status=status.HTTP_201_CREATED
    )


@register_resumer("orders.pay")
def resume_pay_with_provider(record: IdempotencyRecord, idem: Phases) -> HttpResponse:
    """Beat's completer finishing a provider payment whose client never came back.

    A refusal (the order was paid another way or cancelled meanwhile) is answered
    as the API answers it, and stored for the client's retry; a provider that does
    not answer is raised, and the key left for the next run."""
    try:
        payment = payment_pay_with_provider(order_id=idem.data["order_id"], phases=idem)
    except DomainError as refused:
        if refused.status >= 500:
            raise
        refusal = problem(
            refused.status, refused.code, refused.title, refused.detail, **refused.extra
        )
        return HttpResponse(
            JSONRenderer().render(refusal),
            status=refused.status,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    body = JSONRenderer().render(PaymentOutputSerializer(payment).data)
    return HttpResponse(body, status=201, content_type="application/json")


class PaymentDetailApi(APIView):
    @extend_schema(responses={200: PaymentOutputSerializer})
    def get(self, request: Request, payment_id: int) -> Response:
        payment = payment_get(owner=authenticated(request), payment_id=payment_id)
        return Response(PaymentOutputSerializer(payment).data)


class PaymentCaptureApi(APIView):
    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "PaymentCaptureInput"

        # Any amount above the authorization is the business refusal
        # `capture_exceeds_authorization` (422), however large; past 64 bits, 400.
        amount = StrictIntegerField(required=False, min_value=1, max_value=MAX_INT64)

    @extend_schema(
        request=InputSerializer,
        responses={200: PaymentOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("payments.capture")
    def post(self, request: Request, payment_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payment = payment_get(owner=authenticated(request), payment_id=payment_id)
        payment = payment_capture(
            payment_id=payment.pk, amount=serializer.validated_data.get("amount")
        )
        return Response(PaymentOutputSerializer(payment).data)


class PaymentVoidApi(APIView):
    class InputSerializer(StrictInputSerializer):
        """No fields: an empty body or `{}`."""

        class Meta:
            ref_name = "PaymentVoidInput"

    @extend_schema(
        request=None,
        responses={200: PaymentOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("payments.void")
    def post(self, request: Request, payment_id: int) -> Response:
        self.InputSerializer(data=request.data).is_valid(raise_exception=True)
        payment = payment_get(owner=authenticated(request), payment_id=payment_id)
        return Response(
            PaymentOutputSerializer(payment_void(payment_id=payment.pk)).data
        )


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

        reason = StrictCharField(
            free_text=True, required=False, max_length=64, allow_blank=False
        )

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

        # What the provider signed, taken as sent: an event id is its own to
        # choose, and an order number, transaction or amount (any 64-bit one)
        # that is not a pending payment's is the contract's `callback_mismatch`,
        # not a form error.
        event_id = StrictCharField(opaque=True, max_length=128)
        merchant_order_no = StrictCharField(opaque=True, max_length=32)
        provider_txn_id = StrictCharField(opaque=True, max_length=64)
        status = serializers.ChoiceField(choices=CALLBACK_STATUSES)
        amount = StrictIntegerField(min_value=-MAX_INT64 - 1, max_value=MAX_INT64)

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
