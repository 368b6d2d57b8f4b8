"""Celery beat with a leader: any number of beats may run, one acts at a time.

Two beats (a second host, a restarted container whose old one hangs on) would send
every periodic task twice. So `LeaderScheduler`, django-celery-beat's database
scheduler, sends only while it holds the lease named "beat" (`idempotency.leases`: a
row with its holder and `expires_at`, by the database's clock). The others stay idle
and try to take the lease every third of its length; one of them wins once it has
expired (its holder died, hangs or lost the database), reloads the schedule with the
times the old leader last sent each task (saved after every send) and carries on
where it stopped. A leader that cannot renew before its lease ends stops sending.

A send is not one step: Celery publishes with retries (`task_publish_retry_policy`),
and each try may wait on the broker's socket (connecting, each answer) up to its
timeout. Against a broker that never answers a send took about 25 s, most of a 30 s
lease: a leader that started one late in its lease went on trying after the lease
had passed to another beat, and both sent. So the leader starts a try, the first or
a retry (of the send, or of connecting for the first one), only while its lease has
`BEAT_PUBLISH_TRY_SECONDS` (the longest one try can take), the pause before it and a
tenth of the lease left, renewing it first when less is left; if it cannot, it gives
the send up (logged; the task goes again at its next run) before the lease ends. A
leader whose database answers keeps the lead through a frozen broker; one that loses
it stops trying before another beat can take over.

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


class LeadEnding(Exception):
    """The lead may end before another try would (its pause included): not made."""


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

    @property
    def _needed(self) -> float:
        """How much of the lease must be left to start one try of a send: the try,
        and a tenth of the lease (a slow renewal, the clocks' drift)."""
        return float(settings.BEAT_PUBLISH_TRY_SECONDS) + self._seconds / 10

    def setup_schedule(self) -> None:
        # Only the leader writes the schedule (from CELERY_BEAT_SCHEDULE) to the
        # database; a follower does it when it takes over.
        self._lead()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # A tick sends at most one task, so this is a check before every send.
        if not self._lead():
            return self._seconds / 3
        if "producer" not in self.__dict__:
            # The first send connects (Celery's `producer`, retried for as long as
            # the broker refuses): do it before the check, not between it and the
            # send.
            try:
                self.producer  # noqa: B018
            except LeadEnding as error:
                logger.error("beat: not connected to the broker: %s", error)
                return self._seconds / 3
            if not self._lead():
                return self._seconds / 3
        interval = super().tick(*args, **kwargs)
        return min(interval, self._next_renewal())

    def _ensure_connected(self) -> Any:
        """Connect as the parent does, with a check of the lead before every retry."""

        def retry(error: Exception, interval: float) -> None:
            self._may_retry(error, interval)
            logger.error(
                "beat: Connection error: %s. Trying again in %s seconds...",
                error,
                interval,
            )

        return self.connection.ensure_connection(
            retry, self.app.conf.broker_connection_max_retries
        )

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Send as the parent does, with a check of the lead before every retry (the
        retry policy's errback runs before each one)."""
        # The entry sent (the one `tick` reserved the next run from) only for this
        # send; its options are never saved (a `ModelEntry` saves its run times).
        options = entry.options
        policy = {**options.get("retry_policy", {}), "errback": self._may_retry}
        entry.options = {**options, "retry_policy": policy}
        try:
            super().apply_entry(entry, producer=producer)
        finally:
            entry.options = options

    def _may_retry(self, error: Exception, interval: float) -> None:
        """kombu's errback before a retry, after a pause of `interval` seconds."""
        if self._lease is None or not self._lead(pause=interval):
            raise LeadEnding(f"no retry after {error!r}: the lead may end first")

    def _left(self, lease: Lease) -> float:
        return lease.deadline - steady()

    def _next_renewal(self) -> float:
        if self._lease is None:
            return 0
        return max(0.0, self._lease.sent + self._seconds / 3 - steady())

    def _lead(self, pause: float = 0.0) -> bool:
        """Whether this beat may start a try of a send after `pause` seconds: it
        holds the lease, renewed a third of the way in (or sooner, when less is
        left than the pause and a try need), and the lease outlasts both."""
        needed = pause + self._needed
        lease = self._lease
        if (
            lease is not None
            and self._next_renewal() > 0
            and self._left(lease) >= needed
        ):
            return True
        try:
            if lease is None:
                taken = self._leases.acquire([LEASE_NAME], seconds=self._seconds)
                if taken is not None:
                    self._lease = taken
                    logger.info("beat: leading, as %s", taken.holder)
                    self._take_over()
                return taken is not None and self._left(taken) >= needed
            renewed = self._leases.renew(lease, seconds=self._seconds)
        except DatabaseError as error:
            logger.warning("beat: could not reach the lease: %s", error)
            if lease is not None and self._left(lease) < self._needed:
                self._lease = None  # too little left to act on: as good as lost
            return lease is not None and self._left(lease) >= needed
        if renewed is None:
            logger.warning("beat: lost the lead; another beat leads now")
            self._lease = None
            return False
        self._lease = renewed
        return self._left(renewed) >= needed

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
