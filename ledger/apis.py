from typing import Any

from django.conf import settings
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.fields import Field
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.decorators import idempotent

from .auth import authenticated
from .fields import (
    MAX_INT64,
    BoundedListField,
    CurrencyField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNestedSerializer,
)
from .forms import row_id
from .openapi import IDEMPOTENCY_KEY
from .problems import PROBLEM_CONTENT_TYPE
from .renderers import JSONRenderer
from .selectors import account_postings, transfer_batch_get, transfer_get
from .services import (
    TransferItem,
    transfer_batch_create,
    transfer_create,
    wallet_get_or_create,
)

MAX_TRANSFERS_PER_BATCH = 100


class AccountMeApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Account"

        id = serializers.IntegerField()
        currency = serializers.CharField()
        balance = serializers.IntegerField(help_text="What the postings sum to.")
        held = serializers.IntegerField(help_text="The sum of the active holds.")
        available = serializers.IntegerField(
            help_text="`balance - held`: what a debit or a new hold may take."
        )
        version = serializers.IntegerField()

    @extend_schema(responses={200: OutputSerializer})
    def get(self, request: Request) -> Response:
        wallet = wallet_get_or_create(
            owner_id=authenticated(request).pk,
            currency=settings.LEDGER_DEFAULT_CURRENCY,
        )
        return Response(self.OutputSerializer(wallet).data)


class PageQuery(serializers.Serializer):
    """The query parameters every paged list reads; a list with filters extends it
    (`CheckedCursor.query`)."""

    class Meta:
        ref_name = "PageQuery"

    cursor = serializers.CharField(required=False, trim_whitespace=False)
    page_size = serializers.IntegerField(required=False, min_value=1)


# What a page's `next` or `previous` cursor is made of (DRF's: base64).
CURSOR_PATTERN = "^[A-Za-z0-9+/]+={0,2}$"


class CheckedCursor(CursorPagination):
    """A cursor pagination that refuses a cursor it did not make (one that does not
    decode, or a forged position: a cursor is only base64, anyone can write one)
    before it reaches the query, as bad input: `400 validation_error` naming
    `cursor`, like any other query parameter, where DRF answers 404.

    Every parameter of a list is read as a body's field is (`query`): a blank one
    (`?status=`, `?page_size=`) or one given twice is a 400 naming it, where DRF
    reads a blank value as none given (the whole list, unfiltered) and a page size
    that is not a positive integer as the default."""

    invalid_cursor_message = _(  # type: ignore[assignment]  # (lazy: per request)
        "Invalid cursor: use a page's next or previous link as it is."
    )

    def position_ok(self, position: str) -> bool:
        return "\x00" not in position

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
        except NotFound:  # DRF's answer to a cursor that does not decode
            cursor = None
        else:
            position = cursor.position if cursor is not None else None
            if position is None or self.position_ok(str(position)):
                return cursor
        raise serializers.ValidationError(
            {self.cursor_query_param: [self.invalid_cursor_message]}
        )

    @classmethod
    def query(
        cls, request: Request, form: type[serializers.Serializer] = PageQuery
    ) -> dict[str, Any]:
        """The query parameters `form` names, validated (the cursor decoded: one
        no page gave out is refused here too); any other is ignored."""
        given = request.query_params
        names = [name for name in form().get_fields() if name in given]
        twice = {
            # (read as one of them, the page would silently drop the others)
            name: [_("Give one %(name)s.") % {"name": name}]
            for name in names
            if len(given.getlist(name)) > 1
        }
        if twice:
            raise serializers.ValidationError(twice)
        # A plain dict, not the QueryDict: DRF reads a blank value in a QueryDict
        # as the field left out.
        values = form(data={name: given[name] for name in names})
        values.is_valid(raise_exception=True)
        cls().decode_cursor(request)
        return values.validated_data

    @classmethod
    def documented(cls, name: str, item: Any, *parameters: Any, **schema: Any) -> Any:
        """`extend_schema` for a GET answering one page (`next`, `previous`,
        `results`: `item`s), with the query's own `parameters` before the cursor's."""
        page = inline_serializer(
            name,
            {
                "next": serializers.URLField(allow_null=True),
                "previous": serializers.URLField(allow_null=True),
                "results": item(many=True),
            },
        )
        return extend_schema(
            parameters=[
                *parameters,
                # (What `query` refuses: blank, or a size below 1. A cursor is
                # base64: any other character, a NUL say, names nothing.)
                OpenApiParameter(
                    "cursor",
                    {"type": "string", "minLength": 1, "pattern": CURSOR_PATTERN},
                    description="From `next`/`previous`.",
                ),
                OpenApiParameter(
                    "page_size",
                    {"type": "integer", "minimum": 1},
                    description=f"At most {cls.max_page_size}.",
                ),
            ],
            responses={200: page},
            **schema,
        )

    @classmethod
    def respond(
        cls, rows: Any, request: Request, view: APIView, serializer: Any
    ) -> Response:
        """One page of `rows`, each as `serializer` renders it."""
        cls.query(request)
        paginator = cls()
        page: Any = paginator.paginate_queryset(rows, request, view=view)
        return paginator.get_paginated_response(serializer(page, many=True).data)


class NewestFirst(CheckedCursor):
    ordering = "-id"
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"

    def position_ok(self, position: str) -> bool:
        return row_id(position.removeprefix("-")) is not None


class AccountEntriesApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Posting"

        id = serializers.IntegerField()
        entry_id = serializers.IntegerField()
        kind = serializers.CharField(source="entry.kind")
        amount = serializers.IntegerField()
        balance_after = serializers.IntegerField()
        version = serializers.IntegerField()
        currency = serializers.CharField(source="entry.currency")
        description = serializers.CharField(source="entry.description")
        created_at = serializers.DateTimeField(source="entry.created_at")

    @NewestFirst.documented("EntriesPage", OutputSerializer)
    def get(self, request: Request) -> Response:
        # Refused before the wallet is made: a refusal makes nothing.
        NewestFirst.query(request)
        wallet = wallet_get_or_create(
            owner_id=authenticated(request).pk,
            currency=settings.LEDGER_DEFAULT_CURRENCY,
        )
        return NewestFirst.respond(
            account_postings(account=wallet), request, self, self.OutputSerializer
        )


class TransferItemSerializer(StrictNestedSerializer):
    """One transfer asked for. The amount may be any integer here: zero or a
    negative one is the business refusal `invalid_transfer` (422), not a form error."""

    class Meta:
        ref_name = "TransferInput"

    to = StrictCharField(max_length=150)
    # Any 64-bit integer: one past the largest order amount is still "not
    # positive" or more than the wallet holds (the refusals the contract names).
    amount = StrictIntegerField(min_value=-MAX_INT64 - 1, max_value=MAX_INT64)
    # Left out: the ledger's default currency, as everywhere money is given.
    currency = CurrencyField(default=lambda: settings.LEDGER_DEFAULT_CURRENCY)
    description = StrictCharField(
        free_text=True, required=False, allow_blank=True, max_length=255, default=""
    )


class TransferBatchInputSerializer(StrictInputSerializer):
    class Meta:
        ref_name = "TransferBatchInput"

    transfers = BoundedListField(
        child=TransferItemSerializer(),
        min_length=1,
        max_length=MAX_TRANSFERS_PER_BATCH,
    )


class TransferOutputSerializer(serializers.Serializer):
    class Meta:
        ref_name = "Transfer"

    id = serializers.IntegerField()
    sender = serializers.CharField(source="sender.username")  # shown as "from"
    to = serializers.CharField(source="recipient.username")
    amount = serializers.IntegerField()
    currency = serializers.CharField()
    status = serializers.CharField()
    created_at = serializers.DateTimeField()

    def get_fields(self) -> dict[str, Field]:
        # `from` is a Python keyword, so the field is declared as `sender`.
        return {
            ("from" if name == "sender" else name): field
            for name, field in super().get_fields().items()
        }


class TransferBatchOutputSerializer(serializers.Serializer):
    class Meta:
        ref_name = "TransferBatch"

    id = serializers.IntegerField(source="batch_id")
    transfers = TransferOutputSerializer(many=True)


class TransferCreateApi(APIView):
    """Send money to another customer: one transfer, or a batch of 1 to 100 that
    moves all or nothing (`{"transfers": [...]}`)."""

    @extend_schema(
        request=PolymorphicProxySerializer(
            component_name="TransferCreateInput",
            serializers=[TransferItemSerializer, TransferBatchInputSerializer],
            resource_type_field_name=None,
        ),
        responses={
            201: PolymorphicProxySerializer(
                component_name="TransferCreateOutput",
                serializers=[TransferOutputSerializer, TransferBatchOutputSerializer],
                resource_type_field_name=None,
            )
        },
        parameters=[IDEMPOTENCY_KEY],
    )
    @idempotent("ledger.transfer")
    def post(self, request: Request) -> Response:
        sender = authenticated(request)
        if isinstance(request.data, dict) and "transfers" in request.data:
            batch = TransferBatchInputSerializer(data=request.data)
            batch.is_valid(raise_exception=True)
            items = [TransferItem(**item) for item in batch.validated_data["transfers"]]
            transfers = transfer_batch_create(sender=sender, items=items)
            batch_id = transfers[0].batch_id
            data = TransferBatchOutputSerializer(
                {"batch_id": batch_id, "transfers": transfers}
            ).data
            location = reverse("api-transfer-batch-detail", args=[batch_id])
        else:
            single = TransferItemSerializer(data=request.data)
            single.is_valid(raise_exception=True)
            transfer = transfer_create(
                sender=sender, item=TransferItem(**single.validated_data)
            )
            data = TransferOutputSerializer(transfer).data
            location = reverse("api-transfer-detail", args=[transfer.pk])
        return Response(
            data,
            status=status.HTTP_201_CREATED,
            headers={"Location": request.build_absolute_uri(location)},
        )


class TransferBatchDetailApi(APIView):
    """A batch as its sender made it (the `id` a batch's 201 answered with, which
    numbers batches, not transfers)."""

    @extend_schema(responses={200: TransferBatchOutputSerializer})
    def get(self, request: Request, batch_id: int) -> Response:
        transfers = transfer_batch_get(user=authenticated(request), batch_id=batch_id)
        body = {"batch_id": batch_id, "transfers": transfers}
        return Response(TransferBatchOutputSerializer(body).data)


class TransferDetailApi(APIView):
    @extend_schema(responses={200: TransferOutputSerializer})
    def get(self, request: Request, transfer_id: int) -> Response:
        transfer = transfer_get(user=authenticated(request), transfer_id=transfer_id)
        return Response(TransferOutputSerializer(transfer).data)


class _ProblemsAsJson(APIView):
    """Render a refusal of the schema's pages as the API's problem+json.

    Their renderers (YAML and JSON for the schema, Swagger's HTML page for the docs)
    are for the document itself. DRF renders an error with whichever of them the
    content negotiation chose, or with the first when it failed (an unknown
    `?format=`, an `Accept` none of them offers): a YAML or HTML body under the
    problem's `application/problem+json`. A refusal here is rendered as on every
    other API path instead.
    """

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and getattr(response, "exception", False):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = PROBLEM_CONTENT_TYPE
        return response


class SchemaApi(_ProblemsAsJson, SpectacularAPIView):
    """`GET /api/schema/`: the OpenAPI document."""


class SchemaDocsApi(_ProblemsAsJson, SpectacularSwaggerView):
    """`GET /api/docs/`: Swagger UI over the document, from the app's own files."""
