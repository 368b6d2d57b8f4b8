from typing import Any

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.decorators import idempotent
from ledger.apis import CheckedCursor, NewestFirst, PageQuery
from ledger.auth import authenticated

from .fields import (
    MAX_AMOUNT,
    MAX_ITEM_QUANTITY,
    MAX_ORDER_LINES,
    BoundedListField,
    CurrencyField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNestedSerializer,
)
from .models import MERCHANT_ORDER_NO_MAX_LENGTH, SKU_MAX_LENGTH, Order
from .selectors import order_get, order_list, product_list
from .services import order_cancel, order_create, preorder_create


class OrderItemOutputSerializer(serializers.Serializer):
    """One line of an order placed with `items`; `price` is the unit price it was
    sold at, `amount` the line's total (minor units)."""

    class Meta:
        ref_name = "OrderItem"

    sku = serializers.CharField()
    name = serializers.CharField()
    quantity = serializers.IntegerField()
    price = serializers.IntegerField()
    amount = serializers.IntegerField()


class OrderOutputSerializer(serializers.Serializer):
    merchant_order_no = serializers.CharField()
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    description = serializers.CharField()
    status = serializers.CharField(source="status_name")
    items = OrderItemOutputSerializer(many=True, source="items.all")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    paid_at = serializers.DateTimeField()


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=True,
    description="1 to 255 printable ASCII characters; one new key per intended write.",
)


def order_response(order: Order, *, status_code: int = status.HTTP_200_OK) -> Response:
    return Response(OrderOutputSerializer(order).data, status=status_code)


class PreOrderCreateApi(APIView):
    """Issue a fresh merchant order number to the caller (the pre-order step).

    The Idempotency-Key is optional here: without one a retry only issues another
    number, which expires unused; with one (as the idempotent client sends) a retry
    after a crash gets the same number back.
    """

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PreOrder"

        merchant_order_no = serializers.CharField()
        expires_at = serializers.DateTimeField()

    @extend_schema(request=None, responses={201: OutputSerializer})
    @idempotent("orders.preorder", default="optional")
    def post(self, request: Request) -> Response:
        preorder = preorder_create(owner=authenticated(request))
        return Response(
            self.OutputSerializer(preorder).data, status=status.HTTP_201_CREATED
        )


class OrderItemInputSerializer(StrictNestedSerializer):
    class Meta:
        ref_name = "OrderItemInput"

    sku = StrictCharField(max_length=SKU_MAX_LENGTH)
    quantity = StrictIntegerField(min_value=1, max_value=MAX_ITEM_QUANTITY)


class OrderCreateApi(APIView):
    """Place an order for an amount, or for `items` whose stock it takes.

    With `items` the amount is the sum of price x quantity and the currency the
    products' (`currency`, if sent, must match them). Refusals: `409 out_of_stock`
    (its `sku` names the first short line; nothing is taken), `422 product_unknown`,
    `422 items_currency_mismatch` (products priced in different currencies, or not
    in the `currency` sent), `422 order_amount_too_large`.
    """

    class InputSerializer(StrictInputSerializer):
        class Meta:
            ref_name = "OrderCreateInput"

        merchant_order_no = StrictCharField(max_length=MERCHANT_ORDER_NO_MAX_LENGTH)
        amount = StrictIntegerField(
            min_value=1,
            max_value=MAX_AMOUNT,
            required=False,
            help_text="Minor units. Send either `amount` or `items`, not both.",
        )
        items = BoundedListField(
            child=OrderItemInputSerializer(),
            min_length=1,
            max_length=MAX_ORDER_LINES,
            required=False,
            help_text=(
                f"1 to {MAX_ORDER_LINES} lines of `sku` and `quantity` "
                f"(1 to {MAX_ITEM_QUANTITY}); instead of `amount`."
            ),
        )
        currency = CurrencyField(required=False)
        description = StrictCharField(
            free_text=True, required=False, allow_blank=True, max_length=255, default=""
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            attrs = super().validate(attrs)
            if "amount" in attrs and "items" in attrs:
                both = ["Send either `amount` or `items`, not both."]
                raise serializers.ValidationError({"amount": both, "items": both})
            if "amount" not in attrs and "items" not in attrs:
                raise serializers.ValidationError(
                    {"amount": ["This field is required (or send `items`)."]}
                )
            return attrs

    @extend_schema(
        request=InputSerializer,
        responses={201: OrderOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("orders.create")
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if "items" in data:
            order = order_create(
                owner=authenticated(request),
                merchant_order_no=data["merchant_order_no"],
                items=[(line["sku"], line["quantity"]) for line in data["items"]],
                currency=data.get("currency"),
                description=data["description"],
            )
        else:
            order = order_create(
                owner=authenticated(request),
                merchant_order_no=data["merchant_order_no"],
                amount=data["amount"],
                currency=data.get("currency") or settings.LEDGER_DEFAULT_CURRENCY,
                description=data["description"],
            )
        response = order_response(order, status_code=status.HTTP_201_CREATED)
        response["Location"] = request.build_absolute_uri(
            reverse("api-order-detail", args=[order.merchant_order_no])
        )
        return response


# Read through the reverse relation: the orders app never imports the payments app.
class OrderPaymentSerializer(serializers.Serializer):
    """One of the order's payments, newest first."""

    id = serializers.IntegerField()
    method = serializers.CharField()
    amount = serializers.IntegerField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()


class OrderDetailOutputSerializer(OrderOutputSerializer):
    payments = OrderPaymentSerializer(many=True, source="payments.all")


class OrderDetailApi(APIView):
    @extend_schema(responses={200: OrderDetailOutputSerializer})
    def get(self, request: Request, merchant_order_no: str) -> Response:
        order = order_get(
            owner=authenticated(request), merchant_order_no=merchant_order_no
        )
        return Response(OrderDetailOutputSerializer(order).data)


class OrderCancelApi(APIView):
    class InputSerializer(StrictInputSerializer):
        """No fields: an empty body or `{}`; anything else is refused for its form."""

        class Meta:
            ref_name = "OrderCancelInput"

    @extend_schema(
        request=None,
        responses={200: OrderOutputSerializer},
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("orders.cancel")
    def post(self, request: Request, merchant_order_no: str) -> Response:
        self.InputSerializer(data=request.data).is_valid(raise_exception=True)
        order = order_get(
            owner=authenticated(request), merchant_order_no=merchant_order_no
        )
        return order_response(order_cancel(order_id=order.pk))


class Catalogue(CheckedCursor):
    ordering = "sku"  # unique and never changed: a stable cursor
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


class ProductListApi(APIView):
    """The catalogue with each product's stock, by SKU, paginated."""

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Product"

        sku = serializers.CharField()
        name = serializers.CharField()
        price = serializers.IntegerField()
        currency = serializers.CharField()
        stock = serializers.IntegerField()

    @Catalogue.documented("ProductsPage", OutputSerializer)
    def get(self, request: Request) -> Response:
        return Catalogue.respond(product_list(), request, self, self.OutputSerializer)


class OrderListApi(APIView):
    """The caller's orders, newest first, paginated like every list;
    `?status=paid` keeps the orders in that state (one state: a second is a 400)."""

    class FilterSerializer(PageQuery):
        class Meta:
            ref_name = "OrderListFilter"

        status = serializers.ChoiceField(
            choices=[s.name.lower() for s in Order.Status], required=False
        )

    @NewestFirst.documented(
        "OrdersPage",
        OrderOutputSerializer,
        OpenApiParameter(
            "status",
            str,
            enum=[s.name.lower() for s in Order.Status],
            description="Only the orders in this state.",
        ),
        operation_id="v1_orders_list",
    )
    def get(self, request: Request) -> Response:
        name = NewestFirst.query(request, self.FilterSerializer).get("status")
        orders = order_list(
            owner=authenticated(request),
            status=Order.Status[name.upper()] if name else None,
            with_items=True,
        )
        return NewestFirst.respond(orders, request, self, OrderOutputSerializer)


class OrdersApi(OrderListApi, OrderCreateApi):
    """`/api/v1/orders`: GET lists the caller's orders, POST places one."""
