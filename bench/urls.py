"""The project's URLs plus the benchmark's contenders (bench/contenders.py)."""

from django.urls import path

from ledger.urls import urlpatterns as project_urls

from .contenders import (
    ExpiringPowertoolsPreorderApi,
    FloorPreorderApi,
    NaivePreorderApi,
    PowertoolsPreorderApi,
    package_preorder,
)

urlpatterns = [
    path("bench/naive/preorders", NaivePreorderApi.as_view()),
    path("bench/package/preorders", package_preorder),
    path("bench/floor/preorders", FloorPreorderApi.as_view()),
    path("bench/powertools/preorders", PowertoolsPreorderApi.as_view()),
    path(
        "bench/powertools-expiring/preorders", ExpiringPowertoolsPreorderApi.as_view()
    ),
    *project_urls,
]
