import pytest

from tests.servers import gunicorn
from tests.workers import BROKER_URL, SETTINGS, broker, celery_worker


@pytest.fixture
def provider(tmp_path, settings, on_postgres):
    """The app (our API, the callback endpoint, the provider simulator) on gunicorn,
    with a Redis broker; this process's provider client pointed at it."""
    with (
        broker(),
        gunicorn(tmp_path, SETTINGS, CELERY_BROKER_URL=BROKER_URL) as (url, _),
    ):
        settings.PAYMENT_PROVIDER_URL = f"{url}/provider"
        yield url


@pytest.fixture
def worker(tmp_path, provider):
    """A real Celery worker beside `provider`, calling it and calling back to it."""
    with celery_worker(
        tmp_path,
        PAYMENT_PROVIDER_URL=f"{provider}/provider",
        PROVIDER_CALLBACK_URL=f"{provider}/api/v1/payments/callback",
        PROVIDER_RETRY_SCALE="0.02",
    ) as process:
        yield process
