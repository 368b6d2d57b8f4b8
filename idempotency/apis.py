from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .models import IdempotencyRecord
from .sql import DatabaseNow


class IdempotencyKeyApi(APIView):
    """Where did my request with this key end? Lets a client that timed out resolve
    an unknown outcome without sending the request again."""

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "IdempotencyKey"

        key = serializers.CharField()
        status = serializers.CharField()
        created_at = serializers.DateTimeField()
        expires_at = serializers.DateTimeField()
        response_status = serializers.IntegerField(
            required=False,
            allow_null=True,
            help_text="The stored answer's status; present once finished.",
        )

    @extend_schema(responses={200: OutputSerializer})
    def get(self, request: Request, key: str) -> Response:
        record = (
            IdempotencyRecord.objects.filter(scope=f"user:{request.user.pk}", key=key)
            .only("key", "status", "created_at", "expires_at", "response_status")
            .annotate(db_now=DatabaseNow())
            .first()
        )
        if record is None or record.expired(record.db_now):  # type: ignore[attr-defined]
            raise Http404
        data = self.OutputSerializer(record).data
        if not record.finished:
            data.pop("response_status")
        return Response(data)
