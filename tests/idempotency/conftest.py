import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.helpers import Customer


@pytest.fixture
def alice(db) -> Customer:
    return Customer("alice")


@pytest.fixture
def bob(db) -> Customer:
    return Customer("bob")


@pytest.fixture
def key() -> str:
    return f"key-{uuid.uuid4()}"


@pytest.fixture
def no_redis(settings):
    settings.REDIS_URL = ""


@pytest.fixture
def needs_redis(settings):
    if not settings.REDIS_URL:
        pytest.skip("needs Redis (the embedded SQLite mode runs without it)")


@pytest.fixture
def release() -> Iterator[Callable[[], None]]:
    """Ends at once the `sleep` of the test views' requests running in this
    process (`tests.idempotency.views.pause`): the test lets its slow request finish
    when it has seen what it waits for."""
    from tests.idempotency.views import released

    released.clear()
    yield released.set
    released.clear()
