"""The one JSON renderer of the API (DRF's, made unable to fail on text it echoes)
and the content negotiation that chooses it."""

from collections.abc import Iterable, Mapping
from typing import Any

from django.utils.translation import gettext as _
from rest_framework import exceptions, renderers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from .problems import PROBLEM_CONTENT_TYPE


class JSONRenderer(renderers.JSONRenderer):
    """Render JSON as DRF does (UTF-8, unescaped); fall back to ASCII escapes when
    the data holds text UTF-8 cannot encode.

    JSON may spell a lone surrogate (`"\\ud800"`), and an error message may echo it
    back (a field named so, a choice that is not one). Escaped, it is still the same
    JSON string; unescaped, encoding the body fails and the answer would be a 500.
    """

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            return _Escaping().render(data, accepted_media_type, renderer_context)


class _Escaping(renderers.JSONRenderer):
    ensure_ascii = True


def accepts_problems(request: Request) -> bool:
    """Does the request's Accept name problem documents (with a `q` above 0)?"""
    for token in request.headers.get("Accept", "").split(",")[:64]:
        media_type, *params = (part.strip().lower() for part in token.split(";"))
        if media_type != PROBLEM_CONTENT_TYPE:
            continue
        q = next((p.partition("=")[2] for p in params if p.startswith("q=")), "1")
        if q.strip() not in {"0", "0.", "0.0", "0.00", "0.000"}:
            return True
    return False


class ContentNegotiation(DefaultContentNegotiation):
    """DRF's, but a client that accepts only problem documents (`Accept:
    application/problem+json`) is answered as one that accepts JSON: an error is
    the problem document it asked for, a success the API's JSON (RFC 9110 lets a
    server disregard Accept rather than refuse). DRF answered such a client 406
    whatever it asked, its errors included. An Accept that names neither is still
    a 406, whose detail says what the API answers in."""

    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> tuple[BaseRenderer, str]:
        renderers = list(renderers)
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except exceptions.NotAcceptable as refusal:
            json = [r for r in renderers if r.media_type == "application/json"]
            if json and accepts_problems(request):
                return json[0], json[0].media_type
            offered = [r.media_type for r in renderers]
            raise exceptions.NotAcceptable(
                _(
                    "Accept names none of the media types this answers in: "
                    "%(offered)s (and application/problem+json for an error)."
                )
                % {"offered": ", ".join(dict.fromkeys(offered))},
                available_renderers=refusal.available_renderers,
            ) from None
