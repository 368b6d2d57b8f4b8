"""The project's URLs plus the benchmark's contenders (bench/contenders.py).

The contenders' pre-orders sit right after the project's own in the orders API, under
/api/v1/bench/, so that routing a request to any of them costs what it costs ours.
"""

from collections.abc import Sequence
from typing import cast

from django.urls import URLPattern, URLResolver, include, path

from ledger.urls import api_v1
from ledger.urls import urlpatterns as project_urls
from orders import api_urls

from .contenders import (
    ExpiringPowertoolsPreorderApi,
    FloorPreorderApi,
    NaivePreorderApi,
    PowertoolsPreorderApi,
    package_preorder,
)

Patterns = list[URLPattern | URLResolver]

contenders: Patterns = [
    path("bench/naive/preorders", NaivePreorderApi.as_view()),
    path("bench/package/preorders", package_preorder),
    path("bench/floor/preorders", FloorPreorderApi.as_view()),
    path("bench/powertools/preorders", PowertoolsPreorderApi.as_view()),
    path(
        "bench/powertools-expiring/preorders", ExpiringPowertoolsPreorderApi.as_view()
    ),
]


def _replaced(patterns: Sequence[object], urlconf: object, by: Patterns) -> Patterns:
    """`patterns` with the include of `urlconf` (a module or list) including `by`."""
    return [
        path(str(p.pattern), include(by))
        if isinstance(p, URLResolver) and p.urlconf_name is urlconf
        else cast(URLPattern | URLResolver, p)
        for p in patterns
    ]


_orders: Patterns = [api_urls.urlpatterns[0], *contenders, *api_urls.urlpatterns[1:]]
urlpatterns = _replaced(project_urls, api_v1, _replaced(api_v1, api_urls, _orders))
