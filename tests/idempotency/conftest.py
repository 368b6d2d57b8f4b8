import json
import uuid

import pytest
from rest_framework.test import APIClient

from ledger.models import JournalEntry
from ledger.services import customer_get_or_create


class Customer:
    def __init__(self, username: str) -> None:
        self.user, self.token, self.wallet = customer_get_or_create(
            username=username, currency="CNY"
        )

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {self.token}")
        return client

    def post(self, path: str, body, key: str | None, client: APIClient | None = None):
        headers = {} if key is None else {"Idempotency-Key": key}
        raw = body if isinstance(body, str) else json.dumps(body)
        return (client or self.client()).post(
            path, raw, content_type="application/json", headers=headers
        )

    def deposits(self) -> int:
        return JournalEntry.objects.filter(postings__account=self.wallet).count()


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
