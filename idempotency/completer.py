"""The completer: finish phased requests whose client never came back.

A phased request commits its work in steps, each with a recovery point. When its
process dies past the first recovery point, the client's retry resumes it after the
lease. An agent that died too never retries: the work it began (a charge opened, not
yet asked of the provider) would stay half done. So, as in rocket-rides' completer,
an endpoint registers a resumer that continues its work from a record alone, and
beat runs `complete_stuck` every minute: each phased key whose lease passed is taken
over (the same conditional update a client's retry makes, so exactly one of them
wins) and finished by its resumer; its response is stored for the client's retry.

```python
@register_resumer("orders.pay")
def resume_pay(record: IdempotencyRecord, phases: Phases) -> HttpResponse: ...
```

A key still at its first recovery point ("started") has committed nothing but its
record: it is released instead (`services.record_release_stuck`).
"""

import logging
from collections.abc import Callable
from functools import partial

from django.http import HttpResponse

from . import records
from .engine import Phases, run_phases
from .models import IdempotencyRecord
from .sql import DatabaseNow

logger = logging.getLogger(__name__)

Resumer = Callable[[IdempotencyRecord, Phases], HttpResponse]
RESUMERS: dict[str, Resumer] = {}


def register_resumer(endpoint: str) -> Callable[[Resumer], Resumer]:
    """Let the completer finish `endpoint`'s phased requests from their records."""

    def register(resumer: Resumer) -> Resumer:
        RESUMERS[endpoint] = resumer
        return resumer

    return register


def complete_stuck(*, limit: int = 100) -> int:
    """Finish up to `limit` phased requests whose lease passed; how many finished."""
    stuck = (
        IdempotencyRecord.objects.filter(
            status=IdempotencyRecord.Status.PROCESSING,
            locked_until__lt=DatabaseNow(),
            endpoint__in=list(RESUMERS),
        )
        .exclude(recovery_point="started")
        .order_by("locked_until")[:limit]
    )
    finished = 0
    for record in stuck:
        locked_until = records.take_over(record)  # by the database's clock
        if locked_until is None:
            continue  # a client's retry (or another completer) took it first
        phases = Phases(
            record.pk,
            record.recovery_point,
            record.recovery_data,
            locked_until,
            resumed=True,
        )
        resume = partial(RESUMERS[record.endpoint], record)
        try:
            run_phases(record.fingerprint, resume, phases)
        except Exception:  # one failure must not stop the others; the next run retries
            logger.exception(
                "could not complete key %s (%s)", record.pk, record.endpoint
            )
            continue
        finished += 1
        logger.info("completed key %s (%s)", record.pk, record.endpoint)
    return finished
