"""Response storage: what a finished request's answer is kept as, and how it is
replayed.

One rule for every endpoint: an outcome decided once the endpoint began executing
(2xx, and 4xx business refusals) is stored and replayed byte for byte, with the headers
that matter. What is not: a refusal of the request's form (malformed JSON, a body that
fails the schema: see `refuse_form`; 413; 415), and what a retry could change (5xx,
429, our own 409 in-flight answer); after them the key is free, so a retry (or the
corrected request) runs again.
"""

import base64
import json
from dataclasses import dataclass

from django.http import HttpResponse
from django.utils import translation

from . import metrics
from .models import IdempotencyRecord

STORED_HEADERS = ("Content-Type", "Location", "Content-Language")
REPLAY_HEADER = "Idempotent-Replayed"
# Set on a response that refuses the request for its form (see `refuse_form`).
FORM_REFUSED = "idempotency_form_refused"
# Statuses that always refuse the request's form: too large, or not our media type.
FORM_STATUSES = frozenset({413, 415})


@dataclass(frozen=True)
class StoredResponse:
    fingerprint: str
    status: int
    headers: dict[str, str]
    body: bytes

    def dumps(self) -> str:
        return json.dumps(
            {
                "f": self.fingerprint,
                "s": self.status,
                "h": self.headers,
                "b": base64.b64encode(self.body).decode(),
            }
        )

    @classmethod
    def loads(cls, raw: bytes) -> "StoredResponse":
        data = json.loads(raw)
        return cls(data["f"], data["s"], data["h"], base64.b64decode(data["b"]))

    @classmethod
    def of(cls, fingerprint: str, response: HttpResponse) -> "StoredResponse":
        headers = {h: response[h] for h in STORED_HEADERS if response.has_header(h)}
        # The language its body was written in: LocaleMiddleware says it only on
        # the answer's way out, after this, and a replay from Redis never passes
        # it (one from the database would say the retry's language instead).
        language = translation.get_language()
        if language and "Content-Language" not in headers:
            headers["Content-Language"] = language
        return cls(fingerprint, response.status_code, headers, response.content)

    @classmethod
    def of_record(cls, record: IdempotencyRecord) -> "StoredResponse":
        return cls(
            record.fingerprint,
            record.response_status or 200,
            record.response_headers,
            bytes(record.response_body or b""),
        )


def refuse_form(response: HttpResponse) -> HttpResponse:
    """Mark `response` as a refusal of the request's form (malformed JSON, a body that
    fails the endpoint's schema): decided before the endpoint began executing, so it
    is not stored and the key stays free for the corrected request."""
    setattr(response, FORM_REFUSED, True)
    return response


def should_store(response: HttpResponse) -> bool:
    """Is this response an outcome a retry must see again? (See the module doc.)"""
    status = response.status_code
    if status >= 500 or status == 429 or status in FORM_STATUSES:
        return False
    return not getattr(response, FORM_REFUSED, False)


def replay(stored: StoredResponse) -> HttpResponse:
    metrics.count("replayed")
    response = HttpResponse(stored.body, status=stored.status)
    for name, value in stored.headers.items():
        response[name] = value
    # As the first answer had it (CommonMiddleware set it): a replay the middleware
    # answers from Redis skips that, and went out chunked without it.
    if stored.status not in (204, 304):  # (which must not send one)
        response["Content-Length"] = str(len(stored.body))
    response[REPLAY_HEADER] = "true"
    return response
