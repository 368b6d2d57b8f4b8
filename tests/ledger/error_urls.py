"""The project's URLs and error handlers, with views that fail as a bug or a refusal
would: a page and an API path of each."""

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.urls import handler400, handler403, handler404, handler500
from ledger.urls import urlpatterns as project_urls

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


def broken_page(request: HttpRequest) -> HttpResponse:
    request.user.get_username()  # as a page reads its user before it fails
    raise RuntimeError("a bug in a page")


def forbidden_page(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied


class BrokenApi(APIView):
    authentication_classes = ()
    permission_classes = ()

    def get(self, request: Request) -> Response:
        raise RuntimeError("a bug in an endpoint")


def forbidden_api(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied  # outside DRF, whose handler answers its own views'


urlpatterns = [
    path("test/broken", broken_page),
    path("test/forbidden", forbidden_page),
    path("api/v1/test/broken", BrokenApi.as_view()),
    path("api/v1/test/forbidden", forbidden_api),
    *project_urls,
]
