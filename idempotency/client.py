"""The idempotent HTTP client, for scripts and automated agents that must retry safely.

The rule it encodes: **one key per intent, kept until the intent has a final answer.**
An intent is a name you choose for one thing you mean to happen once ("pay order
1234"); the client gives it a key the first time and keeps that key in a small SQLite
file, so a process that is killed and started again sends the *same* key and gets the
original outcome instead of a second charge.

A caller that already has a natural key for the operation (`order:1234:pay`) passes
it as `key=` instead of an intent; it is sent as is.

It retries what may succeed on a retry — timeouts, connection errors, 5xx, 429, a
proxy's 408 (the request never reached the app whole) and 409
`idempotency_key_in_flight` — with exponential backoff and full jitter until a
deadline, honouring the server's `Retry-After` (seconds or an HTTP date) on 409, 429
and 503. Every attempt carries `Prefer: wait=N` (up to 10 s, within the time left and
the read timeout), so a retry that finds the key's first request still running waits
for it on the server and gets its answer as soon as it is stored, instead of a 409 to
poll on; a server that does not wait answers the 409 all the same. It stops on any
other answer: 2xx, and 4xx the server decided; the `Result` says whether it was a
replay of an earlier attempt's answer (`replayed`). A 422 `idempotency_key_reused`
means the caller sent a different request under an old intent: a bug, raised as
`KeyReused`. When the deadline passes with the outcome still unknown, it asks the
key-status endpoint and raises `OutcomeUnknown` with what the server knows. A
`Retry-After` that falls past the deadline ends the call at once (no retry may come
sooner, and sleeping out the time left changes nothing): its `OutcomeUnknown` says in
`retry_at` when the server takes the intent again.

It never sends a key the server may have forgotten: the server keeps a key for its
time to live (`key_ttl`, 24 h by default, as the server's `IDEMPOTENCY_TTL_SECONDS`)
after the request finished, so past `key_ttl` since the key was first sent a retry
could be executed as a new operation, a second charge. The client raises `KeyExpired`
instead, with what the key-status endpoint knows. An address it cannot send to (no
`http://`) is a `ValueError` at once, never retried: a bug, not a network outage.

```python
from idempotency.client import IdempotentClient

client = IdempotentClient("http://127.0.0.1:8000", token="...", store="agent-keys.db")
result = client.post(
    "/api/v1/orders/1234/pay", {"method": "balance"}, key="order:1234:pay"
)
print(result.status_code, result.replayed, result.json())
```
"""

import random
import sqlite3
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from .fingerprint import key_is_valid

REPLAY_HEADER = "Idempotent-Replayed"


@dataclass
class Result:
    """The final answer to an intent: the server's response, and whether it was the
    stored answer of an earlier attempt (`replayed`) rather than a fresh execution."""

    response: httpx.Response
    key: str

    @property
    def replayed(self) -> bool:
        return self.response.headers.get(REPLAY_HEADER) == "true"

    @property
    def status_code(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers

    @property
    def content(self) -> bytes:
        return self.response.content

    @property
    def text(self) -> str:
        return self.response.text

    def json(self) -> Any:
        return self.response.json()


class KeyReused(Exception):
    """The server saw this intent's key with a different request (422)."""

    replayed = False  # the server refused; nothing of ours was replayed

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        super().__init__(response.json().get("detail", "idempotency key reused"))


class OutcomeUnknown(Exception):
    """The deadline passed before a final answer; `status` is what the key-status
    endpoint said: `{"status": "processing"}` when the server had just answered
    that the key is in flight, `{"status": "unreachable"}` if it could not answer,
    None if it has no record. None is "nothing has taken effect" only once no
    attempt can still be running: one that commits its effect and its key together
    is not recorded until it finishes, so resolve it by retrying the same intent.

    `retry_at` (UTC) is set when the server's `Retry-After` asked for no retry
    before a time past the deadline: the client stopped at once rather than sleep
    through what was left for nothing; retry the same intent from then on."""

    replayed = False

    def __init__(
        self,
        intent: str,
        key: str,
        status: dict[str, Any] | None,
        retry_at: datetime | None = None,
    ) -> None:
        self.intent, self.key, self.status = intent, key, status
        self.retry_at = retry_at
        message = f"outcome of {intent!r} unknown (key {key}): {status}"
        if retry_at is not None:
            message += (
                f"; the server asked for no retry before {retry_at:%Y-%m-%dT%H:%M:%SZ}"
                ", past the deadline: retry the same intent from then on"
            )
        super().__init__(message)


class KeyExpired(OutcomeUnknown):
    """The key is older than the server's time to live: sending it again could run
    the operation a second time, so the client does not. `status` is what the server
    still knows of it (None: forgotten, or never arrived)."""


class IntentStore:
    """Intent name → idempotency key, in a SQLite file shared by restarts and by
    several processes (the first to ask for an intent's key decides it), with when
    the key was first sent."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS intents ("
                " intent TEXT PRIMARY KEY, key TEXT NOT NULL,"
                " created_at REAL NOT NULL, final_status INTEGER, sent_at REAL)"
            )
            columns = {row[1] for row in db.execute("PRAGMA table_info(intents)")}
            if "sent_at" not in columns:  # a file from before the column
                db.execute("ALTER TABLE intents ADD COLUMN sent_at REAL")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def key_for(self, intent: str, key: str | None = None) -> str:
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO intents (intent, key, created_at)"
                " VALUES (?, ?, ?)",
                (intent, key or f"intent-{uuid.uuid4()}", time.time()),
            )
            (key,) = db.execute(
                "SELECT key FROM intents WHERE intent = ?", (intent,)
            ).fetchone()
        return key

    def sending(self, intent: str) -> float:
        """Note a send; return when the intent's key was first sent."""
        with self._connect() as db:
            db.execute(
                "UPDATE intents SET sent_at = ? WHERE intent = ? AND sent_at IS NULL",
                (time.time(), intent),
            )
            (sent_at,) = db.execute(
                "SELECT sent_at FROM intents WHERE intent = ?", (intent,)
            ).fetchone()
        return sent_at

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


# 4xx answers that decided nothing: too many requests, and a request timeout (a
# proxy that did not get the whole request in time; nothing reached the app).
TRY_AGAIN = frozenset({408, 429})
# The longest `Prefer: wait=N` the server honours (a larger N counts as this).
MAX_PREFERRED_WAIT = 10


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
        key_ttl: float = 86400.0,
    ) -> None:
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout)
        # "127.0.0.1:8000" is no address httpx can send to: every attempt would fail
        # as a transport error, retried to the deadline as if the network were down.
        where = self.http.base_url
        if where.scheme not in ("http", "https") or not where.host:
            raise ValueError(
                f"base_url needs http:// or https:// and a host, as in "
                f"http://127.0.0.1:8000, not {str(where)!r}"
            )
        self.headers = {"Authorization": f"Token {token}"}
        self.intents = IntentStore(store)
        self.deadline = deadline
        self.base_delay, self.max_delay = base_delay, max_delay
        self.key_ttl = key_ttl
        self.attempts = 0  # requests sent, for callers that report retries

    def post(
        self,
        path: str,
        body: dict[str, Any],
        *,
        intent: str | None = None,
        key: str | None = None,
    ) -> Result:
        """POST `body` to `path` so that `intent` (or the caller's own `key`) takes
        effect at most once."""
        if (intent is None) == (key is None):
            raise TypeError("give either intent= or key=")
        if key is not None and not key_is_valid(key):  # as the server checks it
            raise ValueError("a key is 1 to 255 printable ASCII characters")
        intent = intent if intent is not None else f"key:{key}"
        key = self.intents.key_for(intent, key)
        headers = {**self.headers, "Idempotency-Key": key}
        give_up = time.monotonic() + self.deadline
        attempt = 0
        while True:
            if time.time() - self.intents.sending(intent) > self.key_ttl:
                raise KeyExpired(intent, key, self._status(key))
            wait, in_flight = None, False
            waits = self._preferred_wait(give_up - time.monotonic())
            prefer = {"Prefer": f"wait={waits}"} if waits else {}
            try:
                self.attempts += 1
                response = self.http.post(
                    path, json=body, headers={**headers, **prefer}
                )
            except httpx.UnsupportedProtocol as wrong:  # a path of "ftp://...": a bug
                raise ValueError(f"{path!r} is no http(s) address: {wrong}") from None
            except httpx.TransportError:  # timeouts and broken connections
                response = None
            if response is not None:
                code = response.status_code
                if code == 422 and _code(response) == "idempotency_key_reused":
                    raise KeyReused(response)
                in_flight = code == 409 and _code(response) == (
                    "idempotency_key_in_flight"
                )
                if not in_flight and code < 500 and code not in TRY_AGAIN:
                    self.intents.finish(intent, code)
                    return Result(response, key)
                wait = retry_after(response)
            hinted = bool(wait)  # the server's, which no retry may come before
            if not wait:  # no hint, or "now": back off all the same
                # 2**attempt past 1,024 attempts no longer fits in a float; long
                # before that the ceiling is max_delay.
                ceiling = self.base_delay * 2 ** min(attempt, 64)
                wait = random.uniform(  # noqa: S311 (jitter, not cryptography)
                    0, min(self.max_delay, ceiling)
                )
            attempt += 1
            if time.monotonic() + wait > give_up:
                status = self._status(key)
                if status is None and in_flight:
                    # An attempt that commits its effect and its key in one
                    # transaction has no record until it finishes.
                    status = {"status": "processing"}
                retry_at = None
                if hinted:
                    retry_at = datetime.now(UTC) + timedelta(seconds=wait)
                raise OutcomeUnknown(intent, key, status, retry_at)
            time.sleep(wait)

    def _preferred_wait(self, left: float) -> int:
        """The seconds to ask the server to wait for the key's request in flight
        (`Prefer: wait=N`), 0 for none: at most the server's 10, within the time
        left, and a second short of this client's read timeout, so that the answer
        after the wait arrives before the client gives up reading it."""
        read = self.http.timeout.read
        bound = left if read is None else min(left, read - 1)
        return max(0, min(MAX_PREFERRED_WAIT, int(bound)))

    def _status(self, key: str) -> dict[str, Any] | None:
        # Dots escaped too: a key "." or ".." would be a dot segment, resolved away.
        segment = quote(key, safe="").replace(".", "%2E")
        try:
            response = self.http.get(
                f"/api/v1/idempotency-keys/{segment}", headers=self.headers
            )
        except httpx.TransportError:
            return {"status": "unreachable"}
        if response.status_code == 404:
            return None  # the server has no record of the key
        try:  # anything else (a 502 from a proxy, a page of HTML) tells nothing
            status = response.json() if response.status_code == 200 else None
        except ValueError:
            status = None
        return status if isinstance(status, dict) else {"status": "unreachable"}

    def status(self, intent: str) -> dict[str, Any] | None:
        """What the server knows of this intent's key (None: no record of it)."""
        return self._status(self.intents.key_for(intent))


def retry_after(response: httpx.Response) -> float | None:
    """The server's `Retry-After` in seconds (a number or an HTTP date), if any."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # a year past any calendar
        return None
    return max(0.0, when.timestamp() - time.time())


def _code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("code") if isinstance(body, dict) else None  # a proxy's [] too
