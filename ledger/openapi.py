"""OpenAPI: the idempotency contract and every problem+json answer, in the schema.

`LedgerAutoSchema` (the DRF `DEFAULT_SCHEMA_CLASS`) documents, for every operation,
without each view repeating it:

- on each method decorated with `@idempotent(...)`: the `Idempotency-Key` request
  header (required unless the endpoint's mode is "optional"), the
  `Idempotent-Replayed` response header, `Prefer: wait=N` and its
  `Preference-Applied`, `Retry-After` on 409/503 and the engine's
  refusals (400 missing/invalid key, 409 in flight, 422 reused, 503 unavailable);
- the error responses an API operation can give (401, 404 on paths with parameters,
  400 on paged lists for a cursor not theirs, 400/409/413/415/422 on writes), each
  `application/problem+json` with the `Problem` component, whose `code` enumerates
  every stable code the app can answer with.

A new endpoint needs nothing more than `@idempotent` (and `@extend_schema` for its
request and success body). `problems(InsufficientFunds, ...)` adds its domain errors
with their status and code to an `@extend_schema(responses=...)` when an endpoint
wants them spelled out; `IDEMPOTENCY_KEY` is the header parameter itself.
"""

import importlib
from collections import defaultdict
from typing import Any

from django.conf import settings
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from idempotency.exceptions import ProblemError

from .problems import _DRF_CODES, HTTP_CODES, PROBLEM_CONTENT_TYPE

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=True,
    description=(
        "1 to 255 printable ASCII characters, one new key per intended write (a UUID "
        "is ideal). The same key with the same request replays the stored answer; "
        "with a different request it is refused (422 idempotency_key_reused)."
    ),
)
IDEMPOTENT_REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    enum=["true"],
    response=True,
    description="Present when this answer is the stored answer to an earlier "
    "request with the same key, returned byte for byte.",
)
RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[409, 503],
    description="Seconds to wait before retrying with the same key "
    "(sent with idempotency_key_in_flight and idempotency_unavailable).",
)
PREFER = OpenApiParameter(
    "Prefer",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="`wait=N` (1 to 10 seconds; more counts as 10): if the key's first "
    "request is still in flight, wait up to N seconds for it and replay its answer "
    "instead of answering 409 idempotency_key_in_flight at once.",
)
PREFERENCE_APPLIED = OpenApiParameter(
    "Preference-Applied",
    str,
    OpenApiParameter.HEADER,
    response=True,
    description="`wait=N` when the request waited for the key's first request, as "
    "its `Prefer: wait=N` asked.",
)

# Codes the idempotency layer itself answers with (only on idempotent operations).
IDEMPOTENCY_CODES = {
    "idempotency_key_missing",
    "idempotency_key_invalid",
    "idempotency_key_in_flight",
    "idempotency_key_reused",
    "idempotency_unavailable",
}
# Codes answered outside DRF's exception handler: the error views, the request limits,
# gunicorn and nginx in front of the app (ledger.problems.HTTP_CODES).
EXTRA_CODES = {code: status for status, code in HTTP_CODES.items()}


def _subclasses(cls: type[ProblemError]) -> list[type[ProblemError]]:
    found: list[type[ProblemError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def problem_codes() -> dict[str, int]:
    """Every stable `code` the app answers with, and its HTTP status."""
    for app in ("ledger", "idempotency", "orders", "payments"):
        try:  # register every app's domain errors
            importlib.import_module(f"{app}.exceptions")
        except ModuleNotFoundError:
            continue
    codes = dict(EXTRA_CODES)
    for cls, (code, _title) in _DRF_CODES.items():
        codes[code] = int(cls.status_code)  # type: ignore[attr-defined]
    for error in _subclasses(ProblemError):
        if error.code:  # a batch's refusal answers with its items' codes
            codes[error.code] = error.status
    return dict(sorted(codes.items()))


def codes_by_status() -> dict[int, list[str]]:
    by_status: dict[int, list[str]] = defaultdict(list)
    for code, status in problem_codes().items():
        by_status[status].append(code)
    return by_status


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details, with a stable machine-readable `code`."""

    type = serializers.CharField(help_text="`/problems/<code>`.")
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.ChoiceField(
        choices=[], help_text="Stable and machine-readable; decide on this."
    )
    # DRF's metaclass takes declared fields off the class, so these two names do
    # not hide Serializer.errors and Serializer.fields (mypy cannot know that).
    errors = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="validation_error: the invalid fields and why."
    )
    fields = serializers.ListField(  # type: ignore[assignment]
        child=serializers.CharField(),
        required=False,
        help_text="idempotency_key_reused: the top-level fields that differ.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        code: Any = self.fields["code"]  # type: ignore[index]
        code.choices = list(problem_codes())


def _description(status: int, codes: list[str]) -> str:
    listed = ", ".join(f"`{code}`" for code in codes)
    return f"Problem details; `code` is one of {listed}."


def problems(*errors: type[ProblemError]) -> dict[Any, OpenApiResponse]:
    """`@extend_schema(responses={...})` entries for these domain errors."""
    by_status: dict[int, list[str]] = defaultdict(list)
    for error in errors:
        by_status[error.status].append(error.code)
    return {
        (status, PROBLEM_CONTENT_TYPE): OpenApiResponse(
            ProblemSerializer, description=_description(status, sorted(codes))
        )
        for status, codes in sorted(by_status.items())
    }


WRITES = ("post", "put", "patch", "delete")


def idempotency_marker(view: type, method: str) -> dict[str, Any] | None:
    """What `@idempotent` recorded on the handler of `method`.

    A view whose only write handler dispatches to `@idempotent` helper methods
    (`post` calling `pay_with_balance` or `pay_with_provider`) counts as idempotent
    too, with the helpers' endpoint.
    """
    marker = getattr(getattr(view, method.lower(), None), "idempotency", None)
    if marker is not None or method.lower() not in WRITES:
        return marker
    if [m for m in WRITES if hasattr(view, m)] != [method.lower()]:
        return None
    helpers = [
        getattr(value, "idempotency", None)
        for klass in view.__mro__
        for value in vars(klass).values()
    ]
    return next((h for h in helpers if h is not None), None)


class LedgerAutoSchema(AutoSchema):
    def idempotency_mode(self) -> str | None:
        """ "required"/"optional" for an `@idempotent` method, else None."""
        marker = idempotency_marker(type(self.view), self.method)
        if marker is None:
            return None
        mode = settings.IDEMPOTENCY_ENDPOINTS.get(marker["endpoint"], marker["default"])
        return None if mode == "off" else mode

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        mode = self.idempotency_mode()
        if mode is not None:
            key = IDEMPOTENCY_KEY
            if mode != "required":
                key = OpenApiParameter(
                    key.name,
                    str,
                    key.location,
                    required=False,
                    description=f"Optional here. {key.description}",
                )
            parameters += [key, PREFER, IDEMPOTENT_REPLAYED, PREFERENCE_APPLIED]
            parameters += [RETRY_AFTER]
        return parameters

    def _has_parameter(self, name: str) -> bool:
        return any(
            getattr(p, "name", None) == name for p in self.get_override_parameters()
        )

    def error_statuses(self) -> dict[int, list[str]]:
        """The problem responses this operation can give, with their codes."""
        by_status = codes_by_status()
        idempotent = self.idempotency_mode() is not None
        writes = self.method in ("POST", "PUT", "PATCH", "DELETE")
        # 401 everywhere: a bad token is refused even where no token is needed,
        # and the provider's callback answers 401 to a bad signature.
        paged = self._has_parameter("cursor")
        wanted = {401, 400} if writes or idempotent or paged else {401}
        if "{" in self.path:
            wanted.add(404)  # an unknown object
        if writes:
            # 413: a body over the limit; 415: not JSON, or in a content coding.
            wanted |= {409, 413, 415, 422}
        if idempotent:
            wanted |= {409, 422, 503}
        result = {}
        for status in sorted(wanted):
            codes = [
                code
                for code in by_status.get(status, [])
                if idempotent or code not in IDEMPOTENCY_CODES
            ]
            if status == 400 and not (writes or idempotent):
                # A read's only 400: a query parameter refused (a cursor not ours).
                codes = ["validation_error"]
            elif not writes:
                codes = [c for c in codes if c not in ("validation_error",)]
            if codes:
                result[status] = codes
        return result

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)  # type: ignore[arg-type]
        if not self.path.startswith("/api/v1/"):
            return responses
        for status, codes in self.error_statuses().items():
            if str(status) in responses:
                continue
            response = self._get_response_for_code(
                ProblemSerializer, str(status), (PROBLEM_CONTENT_TYPE,), direction
            )
            response["description"] = _description(status, codes)
            responses[str(status)] = response
        return dict(sorted(responses.items()))


def only_our_api(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Preprocessing hook: the schema is our API (`/api/...`), not the pages or the
    bundled provider simulator, which stands for someone else's service."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith("/api/")]
