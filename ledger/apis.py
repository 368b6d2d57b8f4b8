from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .auth import authenticated
from .selectors import account_postings
from .services import wallet_get_or_create


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


class NewestFirst(CursorPagination):
    ordering = "-id"
    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"


class AccountEntriesApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Posting"

        id = serializers.IntegerField()
        entry_id = serializers.IntegerField()
        kind = serializers.CharField(source="entry.kind")
        amount = serializers.IntegerField()
        currency = serializers.CharField(source="entry.currency")
        description = serializers.CharField(source="entry.description")
        created_at = serializers.DateTimeField(source="entry.created_at")

    PageSerializer = inline_serializer(
        "EntriesPage",
        {
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": OutputSerializer(many=True),
        },
    )

    @extend_schema(
        parameters=[
            OpenApiParameter("cursor", str, description="From `next`/`previous`."),
            OpenApiParameter(
                "page_size", int, description=f"At most {NewestFirst.max_page_size}."
            ),
        ],
        responses={200: PageSerializer},
    )
    def get(self, request: Request) -> Response:
        wallet = wallet_get_or_create(
            owner_id=authenticated(request).pk,
            currency=settings.LEDGER_DEFAULT_CURRENCY,
        )
        paginator = NewestFirst()
        page = paginator.paginate_queryset(
            account_postings(account=wallet), request, view=self
        )
        return paginator.get_paginated_response(
            self.OutputSerializer(page, many=True).data
        )
