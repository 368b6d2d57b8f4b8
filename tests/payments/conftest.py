import pytest

from tests.servers import gunicorn
from tests.workers import BROKER_URL, SETTINGS, broker


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
