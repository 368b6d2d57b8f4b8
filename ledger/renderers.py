"""The one JSON renderer of the API: DRF's, made unable to fail on text it echoes."""

from collections.abc import Mapping
from typing import Any

from rest_framework import renderers


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
