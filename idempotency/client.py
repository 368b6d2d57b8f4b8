"""The idempotent HTTP client, for scripts and automated agents that must retry safely.

The rule it encodes: **one key per intent, kept until the intent has a final answer.**
An intent is a name you choose for one thing you mean to happen once ("pay order
1234"); the client gives it a key the first time and keeps that key in a small SQLite
file, so a process that is killed and started again sends the *same* key and gets the
original outcome instead of a second charge.

It retries what may succeed on a retry — timeouts, connection errors, 5xx, 429 and
409 `idempotency_key_in_flight` (honouring `Retry-After`) — with exponential backoff and
full jitter until a deadline. It stops on any other answer: 2xx, and 4xx the server
decided. A 422 `idempotency_key_reused` means the caller sent a different request under
an old intent: a bug, raised as `KeyReused`. When the deadline passes with the outcome
still unknown, it asks the key-status endpoint and raises `OutcomeUnknown` with what
the server knows.

```python
from idempotency.client import IdempotentClient

client = IdempotentClient("http://127.0.0.1:8000", token="...", store="agent-keys.db")
response = client.post(
    "/api/v1/orders/1234/pay", {"method": "balance"}, intent="pay order 1234"
)
print(response.status_code, response.json())
```
"""

import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class KeyReused(Exception):
    """The server saw this intent's key with a different request (422)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__(response.json().get("detail", "idempotency key reused"))


class OutcomeUnknown(Exception):
    """The deadline passed before a final answer; `status` is what the key-status
    endpoint said (None if the server has no record: nothing took effect)."""

    def __init__(self, intent: str, key: str, status: dict[str, Any] | None) -> None:
        self.intent, self.key, self.status = intent, key, status
        super().__init__(f"outcome of {intent!r} unknown (key {key}): {status}")


class IntentStore:
    """Intent name → idempotency key, in a SQLite file shared by restarts and by
    several processes (the first to ask for an intent's key decides it)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS intents ("
                " intent TEXT PRIMARY KEY, key TEXT NOT NULL,"
                " created_at REAL NOT NULL, final_status INTEGER)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def key_for(self, intent: str) -> str:
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO intents (intent, key, created_at)"
                " VALUES (?, ?, ?)",
                (intent, f"intent-{uuid.uuid4()}", time.time()),
            )
            (key,) = db.execute(
                "SELECT key FROM intents WHERE intent = ?", (intent,)
            ).fetchone()
        return key

    def finish(self, intent: str, status: int) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE intents SET final_status = ? WHERE intent = ?", (status, intent)
            )

    def final_status(self, intent: str) -> int | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT final_status FROM intents WHERE intent = ?", (intent,)
            ).fetchone()
        return row[0] if row else None


class IdempotentClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        store: str | Path = ".idempotency-intents.sqlite3",
        deadline: float = 60.0,
        timeout: float = 10.0,
        base_delay: float = 0.1,
        max_delay: float = 5.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self.headers = {"Authorization": f"Token {token}"}
        self.intents = IntentStore(store)
        self.deadline = deadline
        self.base_delay, self.max_delay = base_delay, max_delay
        self.attempts = 0  # requests sent, for callers that report retries

    def post(self, path: str, body: dict[str, Any], *, intent: str) -> httpx.Response:
        """POST `body` to `path` so that `intent` takes effect at most once."""
        key = self.intents.key_for(intent)
        headers = {**self.headers, "Idempotency-Key": key}
        give_up = time.monotonic() + self.deadline
        attempt = 0
        while True:
            wait = None
            try:
                self.attempts += 1
                response = self.http.post(path, json=body, headers=headers)
            except httpx.TransportError:  # timeouts and broken connections
                response = None
            if response is not None:
                if response.status_code == 422 and _code(response) == (
                    "idempotency_key_reused"
                ):
                    raise KeyReused(response)
                if response.status_code == 409 and _code(response) == (
                    "idempotency_key_in_flight"
                ):
                    wait = float(response.headers.get("Retry-After", "1"))
                elif response.status_code not in RETRYABLE_STATUS:
                    self.intents.finish(intent, response.status_code)
                    return response
            if wait is None:
                wait = random.uniform(  # noqa: S311 (jitter, not cryptography)
                    0, min(self.max_delay, self.base_delay * 2**attempt)
                )
            attempt += 1
            if time.monotonic() + wait > give_up:
                raise OutcomeUnknown(intent, key, self._status(key))
            time.sleep(wait)

    def _status(self, key: str) -> dict[str, Any] | None:
        try:
            response = self.http.get(
                f"/api/v1/idempotency-keys/{quote(key, safe='')}", headers=self.headers
            )
        except httpx.TransportError:
            return {"status": "unreachable"}
        return response.json() if response.status_code == 200 else None

    def status(self, intent: str) -> dict[str, Any] | None:
        """What the server knows of this intent's key (None: no record of it)."""
        return self._status(self.intents.key_for(intent))


def _code(response: httpx.Response) -> str | None:
    try:
        return response.json().get("code")
    except ValueError:
        return None
