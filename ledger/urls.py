from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

from . import apis, views

api_v1: list[URLPattern | URLResolver] = [
    path("", include("idempotency.urls")),
    path("accounts/me", apis.AccountMeApi.as_view(), name="account-me"),
    path(
        "accounts/me/entries", apis.AccountEntriesApi.as_view(), name="account-entries"
    ),
    path("transfers", apis.TransferCreateApi.as_view(), name="api-transfer-create"),
    path(
        "transfers/batches/<int:batch_id>",
        apis.TransferBatchDetailApi.as_view(),
        name="api-transfer-batch-detail",
    ),
    path(
        "transfers/<int:transfer_id>",
        apis.TransferDetailApi.as_view(),
        name="api-transfer-detail",
    ),
    path("", include("orders.api_urls")),
    path("", include("payments.api_urls")),
]

# Asked by machines that name this host by its address (a load balancer's health
# check, Prometheus): `ledger.middleware.ProbeMiddleware` answers them whatever the
# Host header says.
PROBES = {"healthz": views.healthz, "readyz": views.readyz, "metrics": views.metrics}

urlpatterns = [
    path("favicon.ico", views.favicon, name="favicon"),
    *(path(name, view, name=name) for name, view in PROBES.items()),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("provider/", include("payments.provider.urls")),
    path("api/schema/", apis.SchemaApi.as_view(), name="schema"),
    path("api/docs/", apis.SchemaDocsApi.as_view(url_name="schema"), name="docs"),
    path("", include("orders.urls")),
    path("", include("payments.urls")),  # an order's page and its Pay button
]

handler400 = "ledger.problems.bad_request"
handler403 = "ledger.problems.permission_denied"
handler404 = "ledger.problems.page_not_found"
handler500 = "ledger.problems.server_error"
