from django.urls import path

from . import apis

urlpatterns = [
    path(
        "idempotency-keys/<path:key>",
        apis.IdempotencyKeyApi.as_view(),
        name="idempotency-key",
    ),
]
