"""The idempotent client against a real server: retries converge on one effect."""

import email.utils
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from django.db import connection

from idempotency.client import (
    IdempotentClient,
    IntentStore,
    KeyExpired,
    KeyReused,
    OutcomeUnknown,
    Result,
)
from idempotency.client import retry_after as _retry_after
from idempotency.models import IdempotencyRecord
from ledger.services import ledger_deposit
from tests.helpers import wait_for
from tests.servers import children, gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("client")


@pytest.fixture(scope="module")
def server(module_tmp, django_db_setup, django_db_blocker):
    """One server for the module: each test has its own customer and keys (and the
    database is flushed between tests), and nothing here depends on a fresh one."""
    with gunicorn(module_tmp, "tests.idempotency.server_settings", workers=2) as (
        url,
        _,
    ):
        yield url


def client_for(server, alice, tmp_path, **options) -> IdempotentClient:
    options.setdefault("deadline", 20)
    return IdempotentClient(
        server, alice.token, store=tmp_path / "intents.sqlite3", **options
    )


def test_a_crash_is_retried_to_one_effect(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path)
    body = {"amount": 5, "fail": "crash_once"}
    response = client.post("/test/deposits", body, intent="deposit 1")
    assert response.status_code == 201
    assert client.attempts >= 2  # a 500 (once per server worker), then success
    assert alice.deposits() == 1


def test_a_timeout_is_retried_and_answered_with_the_original(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path, timeout=0.5)
    body = {"amount": 5, "sleep": 1.5}
    response = client.post("/test/deposits", body, intent="slow deposit")
    assert response.status_code == 201
    assert response.headers["Idempotent-Replayed"] == "true"  # the first one's answer
    assert client.attempts >= 2
    assert alice.deposits() == 1


def test_a_restarted_agent_reuses_its_key(server, alice, tmp_path):
    first = client_for(server, alice, tmp_path).post(
        "/test/deposits", {"amount": 5}, intent="deposit 2"
    )
    # A new process (new client, same store file) carries on with the same intent.
    again = client_for(server, alice, tmp_path).post(
        "/test/deposits", {"amount": 5}, intent="deposit 2"
    )
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1
    assert IntentStore(tmp_path / "intents.sqlite3").final_status("deposit 2") == 201


def test_a_changed_request_under_an_old_intent_is_a_bug(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path)
    client.post("/test/deposits", {"amount": 5}, intent="deposit 3")
    with pytest.raises(KeyReused):
        client.post("/test/deposits", {"amount": 6}, intent="deposit 3")
    assert alice.deposits() == 1


def test_a_business_refusal_is_final(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path)
    response = client.post("/test/deposits", {"amount": 0}, intent="bad deposit")
    assert response.status_code == 400
    assert client.attempts == 1


def test_an_unreachable_server_ends_in_outcome_unknown(alice, tmp_path):
    client = IdempotentClient(
        "http://127.0.0.1:9", alice.token, store=tmp_path / "i.db", deadline=0.5
    )
    with pytest.raises(OutcomeUnknown) as unknown:
        client.post("/test/deposits", {"amount": 5}, intent="nowhere")
    assert unknown.value.status == {"status": "unreachable"}
    assert client.attempts >= 2


def test_status_resolves_an_unknown_outcome(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path)
    assert client.status("never sent") is None
    client.post("/test/deposits", {"amount": 5}, intent="deposit 4")
    assert client.status("deposit 4")["status"] == "succeeded"
    assert isinstance(client.http, httpx.Client)


def test_a_caller_supplied_key_is_sent_as_is(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path)
    first = client.post("/test/deposits", {"amount": 5}, key="deposit:42")
    again = client.post("/test/deposits", {"amount": 5}, key="deposit:42")
    assert (first.key, first.replayed) == ("deposit:42", False)
    assert again.replayed and again.content == first.content
    assert client.status("key:deposit:42")["status"] == "succeeded"
    assert alice.deposits() == 1
    with pytest.raises(TypeError):
        client.post("/test/deposits", {"amount": 5}, intent="x", key="y")


def test_a_key_past_its_time_to_live_is_never_sent_again(server, alice, tmp_path):
    client = client_for(server, alice, tmp_path, key_ttl=0.5)
    assert client.post("/test/deposits", {"amount": 5}, intent="old").status_code == 201
    time.sleep(0.6)
    # The server may have forgotten the key: a retry could deposit again.
    with pytest.raises(KeyExpired) as expired:
        client.post("/test/deposits", {"amount": 5}, intent="old")
    assert expired.value.status["status"] == "succeeded"  # what the server still knows
    assert not expired.value.replayed
    assert alice.deposits() == 1


def scripted(*answers: httpx.Response) -> httpx.Client:
    """A transport that answers from a script, for the client's own timing rules."""
    pending = list(answers)
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(time.monotonic())
        return pending.pop(0)

    http = httpx.Client(base_url="http://shop", transport=httpx.MockTransport(handler))
    http.sent = sent  # type: ignore[attr-defined]
    return http


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_retry_after_is_honoured(tmp_path, status, form):
    wait = 1  # a hundred times the client's own first delay (base_delay)
    value = str(wait)
    if form == "http-date":
        value = email.utils.formatdate(time.time() + wait + 1, usegmt=True)
    http = scripted(
        httpx.Response(status, headers={"Retry-After": value}),
        httpx.Response(201, json={"ok": True}, headers={"Idempotent-Replayed": "true"}),
    )
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, base_delay=0.01
    )
    result = client.post("/pay", {}, intent="pay")
    assert result.status_code == 201 and result.replayed
    gap = http.sent[1] - http.sent[0]  # type: ignore[attr-defined]
    assert gap >= wait - 0.05, gap  # a whole-second date may round down
    assert _retry_after(httpx.Response(429, headers={"Retry-After": "soon"})) is None


def test_a_retry_after_of_a_non_ascii_digit_is_no_hint():
    # "\u00b2" is a digit to str.isdigit, not to float(): it once raised.
    hostile = httpx.Response(429, headers={"Retry-After": "\u00b2".encode("latin-1")})
    assert _retry_after(hostile) is None


def test_a_retry_after_date_past_any_calendar_is_no_hint(tmp_path):
    absurd = "Mon, 01 Jan 99999999999 00:00:00 GMT"
    assert _retry_after(httpx.Response(503, headers={"Retry-After": absurd})) is None
    http = scripted(
        httpx.Response(503, headers={"Retry-After": absurd}),
        httpx.Response(201, json={"ok": True}),
    )
    client = IdempotentClient("http://shop", "t", store=tmp_path / "i.db", http=http)
    assert client.post("/pay", {}, intent="pay").status_code == 201


def always(*answers: httpx.Response) -> httpx.Client:
    """A transport that answers every POST with `answers[0]` and every GET (the
    key-status endpoint) with `answers[1]`, however often it is asked."""

    def handler(request: httpx.Request) -> httpx.Response:
        return answers[0] if request.method == "POST" else answers[1]

    return httpx.Client(base_url="http://shop", transport=httpx.MockTransport(handler))


def test_a_long_run_of_retries_still_ends_in_outcome_unknown(tmp_path):
    # An agent with a long deadline against a server that keeps failing at once:
    # past 1,024 attempts the backoff's 2**attempt no longer fits in a float.
    http = always(httpx.Response(503), httpx.Response(404))
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=5
    )
    client.max_delay = 0.0  # as many retries as the deadline allows, fast
    with pytest.raises(OutcomeUnknown):
        client.post("/pay", {}, intent="pay")
    assert client.attempts > 1100


def test_a_failing_status_endpoint_is_not_no_record(tmp_path):
    # None means "the server has no record"; a 502 from the status endpoint says
    # nothing of the kind, and a caller reading None could start the intent anew.
    http = always(httpx.Response(502), httpx.Response(502))
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=0.3
    )
    with pytest.raises(OutcomeUnknown) as unknown:
        client.post("/pay", {}, intent="pay")
    assert unknown.value.status == {"status": "unreachable"}
    assert client.status("pay") == {"status": "unreachable"}


def deposit_uncommitted() -> bool:
    """A server's request has made its deposit and not yet committed it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_giving_up_on_a_request_in_flight_says_it_is_in_flight(server, alice, tmp_path):
    # The first attempt commits its deposit and its key in one transaction, so the
    # key-status endpoint answers 404 while it runs: no record is not "nothing
    # happened" when the server has just said the key is in flight.
    slow = {"amount": 5, "sleep": 3}
    first = threading.Thread(
        target=client_for(server, alice, tmp_path).post,
        args=("/test/deposits", slow),
        kwargs={"intent": "slow"},
    )
    first.start()
    wait_for(deposit_uncommitted, what="the first attempt's open transaction")
    with pytest.raises(OutcomeUnknown) as unknown:
        client_for(server, alice, tmp_path, deadline=1).post(
            "/test/deposits", slow, intent="slow"
        )
    first.join()
    assert unknown.value.status == {"status": "processing"}
    assert alice.deposits() == 1


@pytest.mark.parametrize("value", ["0", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_a_retry_after_of_now_still_backs_off(tmp_path, value):
    # "0", or a date already past (a server whose clock is behind ours), must not
    # turn the retries into a busy loop against a server that said it is overloaded.
    http = always(
        httpx.Response(503, headers={"Retry-After": value}), httpx.Response(404)
    )
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=1
    )
    with pytest.raises(OutcomeUnknown):
        client.post("/pay", {}, intent="pay")
    assert client.attempts < 30


AGENT = Path(__file__).resolve().parents[2] / "examples" / "agent.py"


def run_agent(server: str, token: str, tmp_path: Path, task: str):
    command = [sys.executable, str(AGENT), "--url", server, "--token", token]
    command += ["--task", task, "--amount", "1999"]
    command += ["--store", str(tmp_path / "agent.sqlite3")]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_example_agent_pays_once_however_often_it_runs(server, alice, tmp_path):
    ledger_deposit(account_id=alice.wallet.pk, amount=5000, reference="agent funds")
    first = run_agent(server, alice.token, tmp_path, "buy tea #1")
    again = run_agent(server, alice.token, tmp_path, "buy tea #1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert again.returncode == 0, again.stdout + again.stderr
    assert "pay: 201 (replayed)" in again.stdout
    alice.wallet.refresh_from_db()
    assert alice.wallet.balance == 5000 - 1999


def test_the_example_agent_reports_a_refused_step(server, alice, tmp_path):
    # A wrong token is refused at the first step; the agent says so and stops.
    ran = run_agent(server, "not-a-token", tmp_path, "buy tea #2")
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr, ran.stderr
    assert "401" in ran.stdout


@pytest.mark.parametrize("body", [b"[]", b'"busy"', b"null"])
def test_an_answer_that_is_json_but_no_object_is_read_as_no_code(tmp_path, body):
    # A 409 or 422 from something in between (a proxy, a gateway) that is JSON
    # but not a problem object: no code, so a final answer, never a crash.
    json_409 = httpx.Response(
        409, content=body, headers={"Content-Type": "application/json"}
    )
    http = always(json_409, httpx.Response(404))
    client = IdempotentClient("http://shop", "t", store=tmp_path / "i.db", http=http)
    assert client.post("/pay", {}, intent="pay").status_code == 409


@pytest.mark.parametrize("status", [507, 524, 408])
def test_every_5xx_is_retried(tmp_path, status):
    # The server stores no 5xx and frees the key; a gateway's 524 (origin timed
    # out) may hide a charge that went through: neither is a final answer. Nor is a
    # proxy's 408: the request did not reach the app whole.
    http = scripted(
        httpx.Response(status),
        httpx.Response(201, json={"ok": True}, headers={"Idempotent-Replayed": "true"}),
    )
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, base_delay=0.01
    )
    result = client.post("/pay", {}, intent="pay")
    assert (result.status_code, result.replayed) == (201, True)


def test_a_worker_killed_mid_request_is_retried_to_one_effect(alice, tmp_path):
    # The worker dies inside a phased request after its deposit committed: the
    # client sees its connection broken, then 409s while the dead request's lease
    # runs, then the retry that takes the key over and resumes it.
    with gunicorn(
        tmp_path, "tests.idempotency.server_settings", IDEMPOTENCY_LEASE_SECONDS="2"
    ) as (url, master):
        client = client_for(url, alice, tmp_path, deadline=30)
        answers: list[Result] = []
        thread = threading.Thread(
            target=lambda: answers.append(
                client.post(
                    "/test/phased-deposits", {"amount": 5, "sleep": 30}, intent="phased"
                )
            )
        )
        thread.start()
        wait_for(
            lambda: IdempotencyRecord.objects.filter(
                recovery_point="deposited"
            ).exists()
        )
        (worker,) = children(master.pid)
        os.kill(worker, signal.SIGKILL)
        thread.join(timeout=40)
    (answer,) = answers
    assert answer.status_code == 201
    assert client.attempts >= 2
    assert alice.deposits() == 1


@pytest.mark.parametrize("key", [".", ".."])
def test_the_status_of_a_dot_key_is_its_own(server, alice, tmp_path, key):
    # "." and ".." are valid keys, but as a URL's last segment they are dot
    # segments, which the URL resolution removes: the status request went to
    # /api/v1/ instead (404, "no record" of a key the server holds).
    client = client_for(server, alice, tmp_path)
    assert client.post("/test/deposits", {"amount": 5}, key=key).status_code == 201
    assert client.status(f"key:{key}")["status"] == "succeeded"


@pytest.mark.parametrize("key", ["line\nbreak", "caf\u00e9", "x" * 256, ""])
def test_a_key_the_server_would_refuse_is_refused_before_sending(tmp_path, key):
    # A newline made httpx refuse to send: a "transport error" retried until the
    # deadline, then OutcomeUnknown; a non-ASCII key a UnicodeEncodeError.
    http = always(httpx.Response(201), httpx.Response(404))
    client = IdempotentClient("http://shop", "t", store=tmp_path / "i.db", http=http)
    with pytest.raises(ValueError, match="printable ASCII"):
        client.post("/pay", {}, key=key)
    assert client.attempts == 0


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost:8000", "ftp://shop", ""])
def test_an_address_without_http_is_refused_at_once(tmp_path, url):
    # httpx cannot send to "127.0.0.1:8000": each attempt was a transport error,
    # retried to the deadline and reported as an outcome unknown, as if the
    # network were down, for what is a mistake in the caller's code.
    started = time.monotonic()
    with pytest.raises(ValueError, match="http://"):
        IdempotentClient(url, "t", store=tmp_path / "i.db", deadline=5).post(
            "/api/v1/preorders", {}, intent="pay"
        )
    assert time.monotonic() - started < 1


def test_a_path_that_is_no_http_address_is_refused_at_once(tmp_path):
    client = IdempotentClient("http://127.0.0.1:9", "t", store=tmp_path / "i.db")
    with pytest.raises(ValueError, match="no http"):
        client.post("ftp://shop/pay", {}, intent="pay")
    assert client.attempts == 1


@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_a_retry_after_past_the_deadline_says_when_to_retry(tmp_path, form):
    # The server asks for no retry before 30 s; the caller has 5. Retrying sooner
    # goes against what the server said, and sleeping out the 5 s changes nothing:
    # the call ends at once, saying when the same intent may be retried.
    value = "30"
    if form == "http-date":
        value = email.utils.formatdate(time.time() + 30, usegmt=True)
    http = always(
        httpx.Response(503, headers={"Retry-After": value}), httpx.Response(404)
    )
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=5
    )
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown) as unknown:
        client.post("/pay", {}, intent="pay")
    assert time.monotonic() - started < 1
    assert client.attempts == 1
    retry_at = unknown.value.retry_at
    assert retry_at is not None and retry_at.tzinfo is not None
    assert 28 <= (retry_at - datetime.now(UTC)).total_seconds() <= 30.5
    assert f"{retry_at:%Y-%m-%dT%H:%M:%SZ}" in str(unknown.value)


def test_a_deadline_spent_on_backoff_names_no_retry_time(tmp_path):
    http = always(httpx.Response(503), httpx.Response(404))
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=0.3
    )
    with pytest.raises(OutcomeUnknown) as unknown:
        client.post("/pay", {}, intent="pay")
    assert unknown.value.retry_at is None


def recording(*answers: httpx.Response, timeout: float = 5.0) -> httpx.Client:
    """`scripted`, keeping each request sent (`http.requests`)."""
    pending = list(answers)
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return pending.pop(0)

    http = httpx.Client(
        base_url="http://shop", transport=httpx.MockTransport(handler), timeout=timeout
    )
    http.requests = requests  # type: ignore[attr-defined]
    return http


@pytest.mark.parametrize(
    ("deadline", "timeout", "prefer"),
    [
        (60, 30, "wait=10"),  # the most the server waits
        (60, 10, "wait=9"),  # the answer must come before the read timeout
        (3.5, 30, "wait=3"),  # within the time left
        (60, 0.5, None),  # no whole second to wait
        (0.9, 30, None),
    ],
)
def test_each_attempt_asks_the_server_to_wait_within_its_time(
    tmp_path, deadline, timeout, prefer
):
    http = recording(httpx.Response(201), timeout=timeout)
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=deadline
    )
    client.post("/pay", {}, intent="pay")
    (sent,) = http.requests  # type: ignore[attr-defined]
    assert sent.headers.get("Prefer") == prefer


def test_a_409_from_a_server_that_does_not_wait_is_polled(tmp_path):
    # A server without `Prefer: wait` answers the in-flight key at once: the client
    # retries after its Retry-After, as before.
    in_flight = httpx.Response(
        409, json={"code": "idempotency_key_in_flight"}, headers={"Retry-After": "1"}
    )
    stored = httpx.Response(201, json={}, headers={"Idempotent-Replayed": "true"})
    http = recording(in_flight, stored)
    client = IdempotentClient(
        "http://shop", "t", store=tmp_path / "i.db", http=http, deadline=20
    )
    started = time.monotonic()
    result = client.post("/pay", {}, intent="pay")
    assert (result.status_code, result.replayed) == (201, True)
    assert time.monotonic() - started >= 1
    assert [r.headers["Prefer"] for r in http.requests] == ["wait=4"] * 2  # type: ignore[attr-defined]


def test_a_retry_of_a_request_in_flight_waits_for_it_on_the_server(
    server, alice, tmp_path
):
    # The retry finds the first attempt still running: it waits for it on the
    # server (Prefer: wait) and gets its answer in one request, where it used to
    # take a 409 and poll.
    slow = {"amount": 5, "sleep": 3}
    first = threading.Thread(
        target=client_for(server, alice, tmp_path).post,
        args=("/test/deposits", slow),
        kwargs={"intent": "slow"},
    )
    first.start()
    wait_for(deposit_uncommitted, what="the first attempt's open transaction")
    retry = client_for(server, alice, tmp_path)
    answer = retry.post("/test/deposits", slow, intent="slow")
    first.join()
    assert (answer.status_code, answer.replayed) == (201, True)
    assert answer.headers["Preference-Applied"].startswith("wait=")
    assert retry.attempts == 1
    assert alice.deposits() == 1
