"""Celery beat with a leader: any number of beats may run, one acts at a time.

Two beats (a second host, a restarted container whose old one hangs on) would send
every periodic task twice. So `LeaderScheduler`, django-celery-beat's database
scheduler, sends only while it holds the lease named "beat" (`idempotency.leases`: a
row with its holder and `expires_at`, by the database's clock). The others stay idle
and try to take the lease every third of its length; one of them wins once it has
expired (its holder died, hangs or lost the database), reloads the schedule with the
times the old leader last sent each task (saved after every send) and carries on
where it stopped. A leader that cannot renew before its lease ends stops sending.

Each periodic task stays safe if two ran all the same (a leader that froze mid-send
and woke after the take-over, or a schedule saved a moment before a crash): they are
batch deletes, conditional updates and re-drives of work that is itself idempotent.
"""

import logging
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from idempotency.leases import Lease, LeaseStore, steady

logger = logging.getLogger(__name__)

LEASE_NAME = "beat"


class LeaderScheduler(DatabaseScheduler):
    """A `DatabaseScheduler` whose `tick()` sends only while it leads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._leases = LeaseStore()
        self._lease: Lease | None = None
        # Save each task's last run as soon as it was sent, so that a new leader
        # neither repeats nor skips it.
        kwargs.setdefault("sync_every_tasks", 1)
        super().__init__(*args, **kwargs)

    @property
    def _seconds(self) -> float:
        return float(settings.BEAT_LEASE_SECONDS)

    def setup_schedule(self) -> None:
        # Only the leader writes the schedule (from CELERY_BEAT_SCHEDULE) to the
        # database; a follower does it when it takes over.
        self._lead()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._lead():
            return self._seconds / 3
        interval = super().tick(*args, **kwargs)
        return min(interval, self._next_renewal())

    def _next_renewal(self) -> float:
        if self._lease is None:
            return 0
        return max(0.0, self._lease.sent + self._seconds / 3 - steady())

    def _lead(self) -> bool:
        """Whether this beat leads now: renew the lease a third of the way in, or
        try to take it. Never acts within a tenth of the lease of its end."""
        lease = self._lease
        if lease is not None and self._next_renewal() > 0:
            return True
        try:
            if lease is None:
                taken = self._leases.acquire([LEASE_NAME], seconds=self._seconds)
                if taken is not None:
                    self._lease = taken
                    logger.info("beat: leading, as %s", taken.holder)
                    self._take_over()
                return taken is not None
            renewed = self._leases.renew(lease, seconds=self._seconds)
        except DatabaseError as error:
            logger.warning("beat: could not reach the lease: %s", error)
            if lease is not None and steady() < lease.deadline - self._seconds / 10:
                return True  # still ours for a while; try again next tick
            self._lease = None
            return False
        if renewed is None:
            logger.warning("beat: lost the lead; another beat leads now")
            self._lease = None
            return False
        self._lease = renewed
        return True

    def _take_over(self) -> None:
        """Write the configured schedule, then read every entry as the previous
        leader left it."""
        super().setup_schedule()
        self.sync()
        self._schedule = self.all_as_schedule()
        self._heap = None

    def close(self) -> None:
        super().close()
        lease, self._lease = self._lease, None
        if lease is not None:
            try:  # another beat may lead at once, not after the lease
                self._leases.release(lease)
            except DatabaseError:
                logger.warning("beat: could not release the lead", exc_info=True)
        self._leases.close()
