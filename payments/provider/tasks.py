"""The simulator's delivery task: at least once, on a retry schedule."""

from celery import shared_task
from django.conf import settings

from .services import notification_deliver, notifications_lost


def retry_delay(attempt: int) -> float:
    """Seconds before retry `attempt` (0-based): 15, 15, 30, 180, 600 ... scaled."""
    schedule = settings.PROVIDER_RETRY_SCHEDULE
    return schedule[min(attempt, len(schedule) - 1)] * settings.PROVIDER_RETRY_SCALE


@shared_task(bind=True, acks_late=True, max_retries=None)
def notification_deliver_task(self, notification_id: int) -> bool:
    """Deliver one callback; until the merchant says 200, try again later."""
    if notification_deliver(notification_id=notification_id):
        return True
    if self.request.retries >= len(settings.PROVIDER_RETRY_SCHEDULE):
        return False  # gave up; the merchant's re-drive asks for the status
    raise self.retry(countdown=retry_delay(self.request.retries))


@shared_task
def redeliver_lost_notifications() -> int:
    """Send again the deliveries whose task was lost before its first attempt (a
    provider delivers at least once); a duplicate is answered 200 and changes
    nothing on the merchant's side."""
    lost = notifications_lost(older_than_seconds=60 * settings.PROVIDER_RETRY_SCALE)
    for notification_id in lost:
        notification_deliver_task.delay(notification_id)
    return len(lost)
