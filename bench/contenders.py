"""Other ways to give the pre-order endpoint idempotency keys, for the benchmark to
hold ours against (bench/idempotency_overhead.py). None is part of the product.

* **naive**, the design the seeds start from: insert the key row first (its own
  autocommit INSERT; the unique constraint refuses a second one), run the view, then
  update the row with the response. Fewer statements than ours and no Redis, but
  three commits per request, and wrong after a crash: the key and the effect commit
  separately, so a process killed after the first commit leaves the key `processing`
  for good (every retry gets 409), whether the pre-order was made or not.
* **package**: django-idempotency-key 1.3.0, configured as its README says for several
  processes (responses in a Redis cache, its Redis lock). The lock covers only the
  check "is a response stored for this key?", not the view, so requests that arrive
  together all find nothing stored and all run the view.
* **powertools**: AWS Lambda Powertools' idempotency utility, as its documentation
  sets it up for any Python function: `idempotent_function` over the function that
  makes the effect, its Redis persistence layer (`RedisCachePersistenceLayer`, by
  URL), the idempotency key taken from the payload by JMESPath (here the caller and
  the Idempotency-Key header). Not its `payload_validation_jmespath`: with the Redis
  layer (3.37.0) the COMPLETED record is written without the payload's hash, so
  every replay fails validation (422); without it, a key reused with another body
  silently replays the first answer. Redis only: one SET NX of an INPROGRESS
  record, the function, one SET of the COMPLETED record; a replay is one GET.
  Nothing commits the key with the effect, and outside Lambda (no remaining time to
  register) an INPROGRESS record left by a killed process blocks the key until the
  record expires, then lets it run again.
* **floor**, not a design but a measuring rod: only the round trips that the
  corrected design of ours cannot do without on a first execution, with no logic
  around them: a Redis `SET NX PX` (the lock), BEGIN, the key lookup that also takes
  the PostgreSQL advisory lock in the same statement (`bench.bulk.KEY_LOOKUP`),
  the view's write, one INSERT of the key row with the response, COMMIT, and one
  Redis round trip that releases the lock and caches the response. No fingerprint,
  no stored headers, no replay (a finished key is a 409), no metrics: no
  implementation of that design can be cheaper.
"""

import json
import warnings
from collections.abc import Callable
from datetime import timedelta
from functools import cache

from aws_lambda_powertools.utilities.idempotency import (
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
    RedisCachePersistenceLayer,
)
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone
from idempotency_key.decorators import idempotency_key
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from bench.bulk import KEY_LOOKUP
from idempotency.engine import REPLAY_HEADER, Status
from idempotency.models import IdempotencyRecord
from idempotency.redis import get_redis
from ledger.auth import authenticated
from orders.apis import PreOrderCreateApi
from orders.services import preorder_create


def _issue(request: Request) -> Response:
    """The pre-order endpoint's own work and answer (`PreOrderCreateApi.post` without
    the layer), so that every design measured around it runs the same view."""
    preorder = preorder_create(owner=authenticated(request))
    return Response(PreOrderCreateApi.OutputSerializer(preorder).data, status=201)


class NaivePreorderApi(APIView):
    def post(self, request: Request) -> HttpResponse:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return _issue(request)
        now = timezone.now()
        record = IdempotencyRecord(
            scope=f"naive:{request.user.pk}",
            key=key,
            endpoint="bench.naive",
            method="POST",
            path=request.path,
            fingerprint="",
            status=Status.PROCESSING,
            created_at=now,
            expires_at=now + timedelta(days=1),
        )
        try:
            record.save(force_insert=True)  # autocommit: the constraint decides
        except IntegrityError:
            stored = IdempotencyRecord.objects.get(scope=record.scope, key=key)
            if stored.status == Status.PROCESSING:
                return HttpResponse(status=409)
            replayed = HttpResponse(stored.response_body, status=stored.response_status)
            replayed["Content-Type"] = "application/json"
            replayed[REPLAY_HEADER] = "true"
            return replayed
        response = self.finalize_response(request, _issue(request))
        response.render()
        record.status = Status.SUCCEEDED
        record.response_status = response.status_code
        record.response_body = response.content
        record.save(update_fields=["status", "response_status", "response_body"])
        return response


# The key row: the response, and constants for everything the floor does not compute.
FLOOR_INSERT = """
INSERT INTO idempotency_idempotencyrecord
    (scope, key, endpoint, method, path, fingerprint, request_fields, status,
     response_status, response_headers, response_body, recovery_point,
     recovery_data, created_at, expires_at)
VALUES (%s, %s, 'bench.floor', 'POST', '', '', '{}', 'succeeded', 201, '{}', %s,
        'finished', '{}', now(), now() + interval '1 day')
"""


class FloorPreorderApi(APIView):
    def post(self, request: Request) -> HttpResponse:
        key = request.headers.get("Idempotency-Key")
        redis = get_redis()
        if key is None or redis is None:
            return _issue(request)
        scope = f"floor:{request.user.pk}"
        lock = f"floor:lock:{scope}:{key}"
        if not redis.set(lock, "1", nx=True, px=30_000):
            return HttpResponse(status=409)
        body = None
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(KEY_LOOKUP, {"scope": scope, "key": key})
                if cursor.fetchone()[1] is not None:
                    return HttpResponse(status=409)  # the floor does not replay
                response = _issue(request)
                body = json.dumps(response.data).encode()
                cursor.execute(FLOOR_INSERT, [scope, key, body])
        finally:
            finish = redis.pipeline(transaction=False)  # one round trip
            finish.delete(lock)
            if body is not None:
                finish.set(f"floor:response:{scope}:{key}", body, px=3_600_000)
            finish.execute()
        return response


# Its default: a finished record is remembered for an hour.
POWERTOOLS_EXPIRY_SECONDS = 3600
# For the crash test: the same endpoint whose records expire after two seconds, so
# that a retry after the record's expiry is a matter of seconds, not of an hour.
POWERTOOLS_CRASH_EXPIRY_SECONDS = 2


@cache
def _powertools(expires_after_seconds: int) -> Callable[..., dict]:
    """The decorated function, one per process (gunicorn imports the app in every
    worker) and per expiry, each with its own persistence layer, as the utility
    configures a layer for the one function it serves."""
    with warnings.catch_warnings():  # the class is deprecated for its new name,
        warnings.simplefilter("ignore", DeprecationWarning)  # CachePersistenceLayer
        persistence = RedisCachePersistenceLayer(url=settings.REDIS_URL)
    config = IdempotencyConfig(
        event_key_jmespath="[user, key]",
        expires_after_seconds=expires_after_seconds,
        raise_on_no_idempotency_key=True,
    )

    @idempotent_function(
        data_keyword_argument="call", persistence_store=persistence, config=config
    )
    def issue(*, call: dict, request: Request) -> dict:
        return _issue(request).data

    return issue


class PowertoolsPreorderApi(APIView):
    expires_after_seconds = POWERTOOLS_EXPIRY_SECONDS

    def post(self, request: Request) -> Response:
        key = request.headers.get("Idempotency-Key")
        if key is None:
            return _issue(request)
        call = {"user": request.user.pk, "key": key}
        try:
            issued = _powertools(self.expires_after_seconds)(call=call, request=request)
        except IdempotencyAlreadyInProgressError:
            return Response(status=409)
        return Response(issued, status=201)


class ExpiringPowertoolsPreorderApi(PowertoolsPreorderApi):
    expires_after_seconds = POWERTOOLS_CRASH_EXPIRY_SECONDS


class PackagePreorderApi(APIView):
    def post(self, request: Request) -> Response:
        return _issue(request)


package_preorder = idempotency_key(optional=True)(PackagePreorderApi.as_view())
