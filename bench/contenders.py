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
* **floor**, not a design but a measuring rod: only the round trips that our design
  (a Redis lock per key; the key committed in the effect's transaction) cannot do
  without on a first execution, and no logic around them: a Redis `SET NX PX`, BEGIN,
  the view's write, one INSERT of the key row, COMMIT, a Redis DEL. No fingerprint, no
  lookup, no stored response, no replay, no metrics: no implementation of the design
  can be cheaper.
"""

from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone
from idempotency_key.decorators import idempotency_key
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from idempotency.engine import REPLAY_HEADER, Status
from idempotency.models import IdempotencyRecord
from idempotency.redis import get_redis
from ledger.auth import authenticated
from orders.services import preorder_create


def _issue(request: Request) -> Response:
    preorder = preorder_create(owner=authenticated(request))
    return Response({"merchant_order_no": preorder.merchant_order_no}, status=201)


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


# The key row, with constants for everything the floor does not compute.
FLOOR_INSERT = """
INSERT INTO idempotency_idempotencyrecord
    (scope, key, endpoint, method, path, fingerprint, request_fields, status,
     response_headers, recovery_point, recovery_data, created_at, expires_at)
VALUES (%s, %s, 'bench.floor', 'POST', '', '', '{}', 'succeeded', '{}', 'finished',
        '{}', now(), now() + interval '1 day')
"""


class FloorPreorderApi(APIView):
    def post(self, request: Request) -> HttpResponse:
        key = request.headers.get("Idempotency-Key")
        redis = get_redis()
        if key is None or redis is None:
            return _issue(request)
        scope = f"floor:{request.user.pk}"
        lock = f"{scope}:{key}"
        if not redis.set(lock, "1", nx=True, px=30_000):
            return HttpResponse(status=409)
        try:
            with transaction.atomic():
                response = _issue(request)
                with connection.cursor() as cursor:
                    cursor.execute(FLOOR_INSERT, [scope, key])
        finally:
            redis.delete(lock)
        return response


class PackagePreorderApi(APIView):
    def post(self, request: Request) -> Response:
        return _issue(request)


package_preorder = idempotency_key(optional=True)(PackagePreorderApi.as_view())
