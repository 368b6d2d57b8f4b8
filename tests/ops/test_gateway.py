"""The gateway layer: deploy/nginx.conf never retries a POST upstream, and every
error answered outside the app is problem+json too.

Debian's nginx runs the project's config (rendered with loopback ports and temporary
paths) in front of two real gunicorns on the test database. Upstream A is the primary,
B the backup nginx fails over to. A POST whose upstream stalls past
`proxy_read_timeout`, or dies mid-request, gets 504/502 and is never sent to B; the
client's retry with the same Idempotency-Key then makes exactly one deposit. A GET in
the same situation does fail over to B. nginx's own errors and gunicorn's own
refusals are problem+json; the app's own problem bodies pass unchanged.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import httpx
import pytest
from django.db import connection

from ledger.openapi import problem_codes
from tests.helpers import Customer, assert_problem, wait_for
from tests.servers import (
    ROOT,
    children,
    free_port,
    gunicorn,
    procfile_options,
    raw_exchange,
    stop,
)

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
LEASE = 2  # seconds, the idempotency lease of the upstreams

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed"),
]


def render(
    config: str, *, port: int, primary: str, backup: str, tmp: Path, read_timeout: int
) -> str:
    """The project's config with loopback addresses and every path inside `tmp`."""
    replacements = [
        (
            r"server web:8000 ([^;]*);",
            f"server {primary} \\1;\n server {backup} backup;",
        ),
        (r"listen 8080;", f"listen 127.0.0.1:{port};"),
        (r"pid [^;]+;", f"pid {tmp}/nginx.pid;"),
        (r"proxy_read_timeout \d+s;", f"proxy_read_timeout {read_timeout}s;"),
        (r"access_log /dev/stdout", f"access_log {tmp}/access.log"),
        (r"alias /srv/static/;", f"alias {ROOT}/static/;"),
        (r"(_temp_path) /tmp/", f"\\1 {tmp}/"),
    ]
    for pattern, replacement in replacements:
        config, n = re.subn(pattern, replacement, config)
        assert n >= 1, f"deploy/nginx.conf no longer has {pattern!r}"
    if os.geteuid() == 0:  # workers keep our uid, so they can use tmp_path
        config = "user root;\n" + config
    return config


@contextmanager
def nginx(
    tmp_path: Path, primary: str, backup: str, read_timeout: int
) -> Iterator[str]:
    tmp = tmp_path / "nginx"
    tmp.mkdir()
    port = free_port()
    config = render(
        (ROOT / "deploy/nginx.conf").read_text(),
        port=port,
        primary=primary,
        backup=backup,
        tmp=tmp,
        read_timeout=read_timeout,
    )
    conf = tmp / "nginx.conf"
    conf.write_text(config)
    log = (tmp / "stderr.log").open("w")
    process = subprocess.Popen(
        [
            NGINX,
            "-c",
            str(conf),
            "-p",
            f"{tmp}/",
            "-e",
            str(tmp / "error.log"),
            "-g",
            "daemon off;",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            assert process.poll() is None, (tmp / "error.log").read_text()
            with suppress(httpx.HTTPError):
                httpx.get(f"{url}/static/css/app.css", timeout=1)
                break
            assert time.monotonic() < deadline, "nginx never came up"
            time.sleep(0.05)
        yield url
    finally:
        stop(process)
        log.close()


def gateway_log(path: Path, at_least: int) -> list[dict]:
    """nginx's access log; it writes a line just after the client has its answer."""
    deadline = time.monotonic() + 10
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= at_least or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)


def upstream_requests(log: Path, method: str, path: str) -> list[str]:
    return [
        line for line in log.read_text().splitlines() if f"{method} {path} " in line
    ]


ACCESS_FORMAT = (
    "--access-logfile - --access-logformat '%(m)s %(U)s %(s)s rid=%({x-request-id}i)s'"
)


@contextmanager
def gateway(tmp_path: Path, read_timeout: int) -> Iterator[dict]:
    """Upstreams A (primary) and B (backup), nginx in front of them."""
    with ExitStack() as stack:
        (a, a_master), (b, _) = (
            stack.enter_context(
                gunicorn(
                    tmp_path,
                    "tests.idempotency.server_settings",
                    IDEMPOTENCY_LEASE_SECONDS=str(LEASE),
                    GUNICORN_CMD_ARGS=ACCESS_FORMAT,
                    PYTHONUNBUFFERED="1",  # each access line is on disk at once
                )
            )
            for _ in range(2)
        )
        a_addr, b_addr = a.removeprefix("http://"), b.removeprefix("http://")
        url = stack.enter_context(nginx(tmp_path, a_addr, b_addr, read_timeout))
        yield {
            "url": url,
            "a": a_addr,
            "b": b_addr,
            "a_master": a_master,
            "log": tmp_path / "nginx/access.log",
            "a_log": tmp_path / f"gunicorn-{a_addr.split(':')[1]}.log",
            "b_log": tmp_path / f"gunicorn-{b_addr.split(':')[1]}.log",
        }


PHASED = "/test/phased-deposits"


def assert_documented_problem(answer: httpx.Response, status: int, code: str) -> dict:
    """A problem+json answer whose code the OpenAPI schema documents."""
    problem = assert_problem(answer, status, code)
    assert code in problem_codes()
    return problem


def post_deposit(
    url: str, customer: Customer, key: str, path: str = "/test/deposits", **body
) -> httpx.Response:
    return httpx.post(
        f"{url}{path}",
        json={"amount": 100, **body},
        headers={"Authorization": f"Token {customer.token}", "Idempotency-Key": key},
        timeout=30,
    )


def retry_until_done(url: str, customer: Customer, key: str, **body) -> httpx.Response:
    """A well-behaved client: honour 409 + Retry-After and retry 502/504."""
    deadline = time.monotonic() + 30
    while True:
        answer = post_deposit(url, customer, key, **body)
        if answer.status_code not in (409, 502, 503, 504):
            return answer
        assert time.monotonic() < deadline, f"never finished: {answer.status_code}"
        time.sleep(float(answer.headers.get("Retry-After", "0.2")))


def in_view_elsewhere() -> int:
    """How many other connections are inside a view's transaction: have written,
    or wait for a row lock to write (one customer's deposits queue on its wallet)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND (state = 'idle in transaction'"
            " OR (state = 'active' AND wait_event_type = 'Lock'))"
        )
        return cursor.fetchone()[0]


def test_stalled_post_is_not_retried_but_a_stalled_get_fails_over(tmp_path):
    """Upstream A runs the Procfile's threads; a stalled POST holds each of them, so
    a GET to A stalls too."""
    _, options = procfile_options()
    threads = int(options[options.index("--threads") + 1])
    alice = Customer("alice")
    keys = [f"gw-{uuid.uuid4()}" for _ in range(threads)]
    answers: dict[str, httpx.Response] = {}
    with gateway(tmp_path, read_timeout=1) as gw:
        url = gw["url"]

        def slow_post(key: str) -> None:
            answers[key] = post_deposit(url, alice, key, sleep=4)

        posts = [threading.Thread(target=slow_post, args=(key,)) for key in keys]
        for post in posts:
            post.start()
        wait_for(lambda: in_view_elsewhere() == threads)  # A has no thread left
        # A GET to A now waits behind the stalled POSTs: nginx times out, tries B.
        get = httpx.get(f"{url}/healthz", headers={"X-Request-ID": "get-1"}, timeout=30)
        for post in posts:
            post.join(timeout=30)

        assert get.status_code == 200
        assert get.headers["X-Request-ID"] == "get-1"
        for key in keys:
            assert_documented_problem(answers[key], 504, "gateway_timeout")
            assert answers[key].headers["X-Request-ID"]  # made up by nginx
        entries = gateway_log(gw["log"], threads + 1)
        (got,) = [entry for entry in entries if entry["method"] == "GET"]
        posted = [entry for entry in entries if entry["method"] == "POST"]
        assert [entry["upstream_addr"] for entry in posted] == [gw["a"]] * threads
        assert got["upstream_addr"] == f"{gw['a']}, {gw['b']}"  # tried A, then B
        assert upstream_requests(gw["b_log"], "POST", "/test/deposits") == []
        # The id reached upstream B (gunicorn logs just after it answers).
        wait_for(
            lambda: any(
                line.endswith("rid=get-1")
                for line in upstream_requests(gw["b_log"], "GET", "/healthz")
            )
        )

        # The stalled POSTs finish on A by themselves; the retries get their answers.
        for key in keys:
            final = retry_until_done(url, alice, key, sleep=4)
            assert final.status_code == 201
            assert final.headers["Idempotent-Replayed"] == "true"
        assert alice.deposits() == threads


def test_upstream_dying_mid_post_is_not_retried_and_the_retry_runs_once(tmp_path):
    alice = Customer("alice")
    key = f"gw-{uuid.uuid4()}"
    answers: dict[str, httpx.Response] = {}
    with gateway(tmp_path, read_timeout=30) as gw:
        url = gw["url"]

        def doomed_post() -> None:
            answers["post"] = post_deposit(url, alice, key, sleep=20, path=PHASED)

        thread = threading.Thread(target=doomed_post)
        thread.start()
        # Phase 1 committed the deposit; the view now waits on its "outside call".
        wait_for(lambda: alice.deposits() == 1)
        (worker,) = children(gw["a_master"].pid)
        os.kill(worker, signal.SIGKILL)
        thread.join(timeout=30)

        assert_documented_problem(answers["post"], 502, "bad_gateway")
        (entry,) = gateway_log(gw["log"], 1)
        assert entry["upstream_addr"] == gw["a"]  # B never saw the POST
        assert upstream_requests(gw["b_log"], "POST", PHASED) == []

        # The same request again, with the same key: it waits out the dead
        # worker's lease, takes the key over and finishes without a second deposit.
        final = retry_until_done(url, alice, key, sleep=20, path=PHASED)
        assert final.status_code == 201
        again = post_deposit(url, alice, key, sleep=20, path=PHASED)
        assert again.status_code == 201
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.content == final.content
        assert alice.deposits() == 1


def test_static_files_are_served_by_nginx_itself(tmp_path):
    with gateway(tmp_path, read_timeout=30) as gw:
        answer = httpx.get(f"{gw['url']}/static/css/app.css", timeout=10)
        assert answer.status_code == 200
        assert answer.text == (ROOT / "static/css/app.css").read_text()
        for log in (gw["a_log"], gw["b_log"]):
            assert upstream_requests(log, "GET", "/static/css/app.css") == []


def raw_problem(url: str, request: bytes, status: int, code: str) -> dict:
    """A request httpx would not send as is (a DEL in a header, 10,000 bytes of URL)."""
    got, headers, body, _ = raw_exchange(url, request)
    assert got == status, body
    assert headers["content-type"] == "application/problem+json", body
    assert headers["x-request-id"], headers
    problem = json.loads(body)
    assert (problem["status"], problem["code"]) == (status, code), problem
    assert {"type", "title", "detail"} <= set(problem) and code in problem_codes()
    return problem


def get(path: bytes, headers: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: gw\r\n%sConnection: close\r\n\r\n" % (
        path,
        headers,
    )


def test_errors_outside_the_app_are_problems_and_the_apps_pass_unchanged(tmp_path):
    alice = Customer("alice")
    with gateway(tmp_path, read_timeout=30) as gw:
        url = gw["url"]
        # nginx's own: a body over client_max_body_size, a request line over its
        # buffers, a header over them, a request it cannot read.
        big = httpx.post(f"{url}/api/v1/orders", content=b"x" * (2 << 20), timeout=30)
        assert_documented_problem(big, 413, "payload_too_large")
        raw_problem(url, get(b"/healthz?" + b"a" * 10_000), 414, "uri_too_long")
        raw_problem(
            url,
            get(b"/healthz", b"X-Big: " + b"a" * 10_000 + b"\r\n"),
            400,
            "bad_request",
        )
        raw_problem(
            url,
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\nHost: gw\r\n\r\n",
            400,
            "bad_request",
        )
        # gunicorn's own, passed through: a DEL in a header value, a request line
        # nginx reads but gunicorn does not (over 4094 bytes).
        raw_problem(url, get(b"/healthz", b"X-Note: a\x7fb\r\n"), 400, "bad_request")
        raw_problem(url, get(b"/healthz?" + b"a" * 5000), 414, "uri_too_long")
        # The app's own problem bodies, not replaced by nginx's.
        missing = post_deposit(url, alice, key="")
        assert_documented_problem(missing, 400, "idempotency_key_invalid")
        invalid = post_deposit(url, alice, f"gw-{uuid.uuid4()}", amount="lots")
        assert assert_documented_problem(invalid, 400, "validation_error")["errors"][
            "amount"
        ]
        assert alice.deposits() == 0
