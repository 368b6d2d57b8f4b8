"""`make run` as a new user starts it: a fresh clone, an empty environment, a terminal.

The stack runs from a `git clone` of this checkout with only PATH, HOME and PORT set
(and, in the second run, the services' variables: PostgreSQL, Redis, RabbitMQ), so it
installs its own `.venv/` and uses exactly the processes of the Procfile. Ctrl-C is
typed on a pseudo-terminal as a person would: the run must stop every process warmly,
print no ERROR line and let make exit 0. In between, the whole journey of CONTRACT.md
runs against it, provider payment confirmed on the pay page included, and so do the
README's examples.
"""

import contextlib
import os
import pty
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest

from ledger.supervisor import bindable
from tests.ops.readme import run_readme_examples
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.slow

STAYS_UP_SECONDS = 60
SETTLES_WITHIN_SECONDS = 30


def clean_path() -> str:
    """The caller's PATH without any virtualenv: `make run` must find its own."""
    parts = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep)
    return os.pathsep.join(p for p in parts if ".venv" not in p and "/venv" not in p)


class MakeRun:
    """`make run` in its own session, with a pseudo-terminal as its terminal."""

    def __init__(self, clone: Path, env: dict[str, str], log: Path) -> None:
        self.clone = clone
        self.port = int(env["PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.master, slave = pty.openpty()
        self._log = log.open("w")
        self.process = subprocess.Popen(
            ["make", "run"],
            cwd=clone,
            env=env,
            stdin=slave,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The terminal becomes make's controlling terminal, as in a shell.
            preexec_fn=lambda: __import__("fcntl").ioctl(
                0, __import__("termios").TIOCSCTTY, 0
            ),
        )
        os.close(slave)
        self.started = self.up_since = time.monotonic()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_banner(self, seconds: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = self.output()
            match = re.search(r"API token\s+([0-9a-f]{40})", text)
            admin = re.search(r"Admin\s+\S+\s+user (\S+) / (\S+)", text)
            friend = re.search(
                r"Recipient\s+user (\S+) / (\S+).*\n\s+API token ([0-9a-f]{40})", text
            )
            if match and admin and friend and "Ctrl-C stops everything" in text:
                self.up_since = time.monotonic()
                return {
                    "token": match.group(1),
                    "admin": admin.group(1),
                    "admin_password": admin.group(2),
                    "friend": friend.group(1),
                    "friend_password": friend.group(2),
                    "friend_token": friend.group(3),
                }
            assert self.process.poll() is None, f"make run ended:\n{text[-4000:]}"
            time.sleep(0.5)
        raise AssertionError(f"no start-up banner:\n{self.output()[-4000:]}")

    def descendants(self) -> set[int]:
        """Every process started under make, whatever session it moved to."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        found, frontier = set(), {self.process.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
            found |= frontier
        return found

    def ctrl_c(self) -> int:
        os.write(self.master, b"\x03")  # what the terminal sends for Ctrl-C
        try:
            return self.process.wait(timeout=120)
        finally:
            os.close(self.master)

    def kill(self) -> None:
        if self.process.poll() is None:
            for pid in self.descendants() | {self.process.pid}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("clone") / "ledger"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    return target


def service_database() -> str:
    name = f"ledger_make_run_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
        conn.autocommit = True
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_database(name: str) -> None:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
        conn.autocommit = True
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module", params=["embedded", "services"])
def stack(request, clone: Path, tmp_path_factory) -> Iterator[tuple[MakeRun, dict]]:
    port = 8000 if bindable(8000) else free_port()
    env = {"PATH": clean_path(), "HOME": os.environ.get("HOME", "/root")}
    env["PORT"] = str(port)
    database = vhost = None
    if request.param == "services":
        database = service_database()
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{database}"
        env["REDIS_URL"] = "redis://127.0.0.1:6379/9"
        # The broker is the machine's RabbitMQ, on a vhost of this run's own (the
        # compose stack and the chaos runs use a Redis broker).
        vhost = rabbitmq_vhost()
        env["CELERY_BROKER_URL"] = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
        flush_redis(9)
    else:
        shutil.rmtree(clone / ".var", ignore_errors=True)
    logs = tmp_path_factory.mktemp(f"make-run-{request.param}")
    run = MakeRun(clone, env, logs / "run.log")
    try:
        logins = run.wait_for_banner()
        yield run, logins
    finally:
        run.kill()
        if database:
            drop_database(database)
            flush_redis(9)
        if vhost:
            rabbitmqctl("delete_vhost", vhost)


def rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "--quiet", *args], check=True, capture_output=True, timeout=60
    )


def rabbitmq_vhost() -> str:
    name = f"ledger-make-run-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    return name


def flush_redis(*dbs: int) -> None:
    import redis

    for db in dbs:
        redis.Redis(host="127.0.0.1", port=6379, db=db).flushdb()


def api(run: MakeRun, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=run.url, headers={"Authorization": f"Token {token}"}, timeout=15
    )


def new_order(client: httpx.Client, amount: int = 1999) -> str:
    number = client.post("/api/v1/preorders").json()["merchant_order_no"]
    answer = client.post(
        "/api/v1/orders",
        headers={"Idempotency-Key": f"o-{number}"},
        json={"merchant_order_no": number, "amount": amount, "currency": "CNY"},
    )
    assert answer.status_code == 201, answer.text
    return number


def confirm_on_pay_page(pay_url: str) -> None:
    """Open the pay page as the payer's browser does and press Confirm."""
    with httpx.Client(timeout=15) as browser:
        page = browser.get(pay_url)
        assert page.status_code == 200, page.text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        form = {"action": "confirm"}
        if csrf:
            form["csrfmiddlewaretoken"] = csrf.group(1)
        answer = browser.post(pay_url, data=form, headers={"Referer": pay_url})
        assert answer.status_code in (200, 303), answer.text


def test_every_flow_works_under_make_run(stack) -> None:
    run, logins = stack
    with api(run, logins["token"]) as client:
        # Provider payment: pending, confirmed on the pay page, settled by the
        # worker's callback to the web process.
        number = new_order(client)
        paying = client.post(
            f"/api/v1/orders/{number}/pay",
            headers={"Idempotency-Key": f"pp-{number}"},
            json={"method": "provider"},
        )
        assert paying.status_code == 201, paying.text
        payment = paying.json()
        assert payment["status"] == "pending"
        confirm_on_pay_page(payment["pay_url"])
        deadline = time.monotonic() + SETTLES_WITHIN_SECONDS
        status = None
        while time.monotonic() < deadline:
            status = client.get(f"/api/v1/orders/{number}").json()["status"]
            if status == "paid":
                break
            time.sleep(0.5)
        assert status == "paid", f"never settled:\n{run.output()[-3000:]}"
        refund = client.post(
            f"/api/v1/payments/{payment['id']}/refund",
            headers={"Idempotency-Key": f"r-{number}"},
            json={"reason": "changed my mind"},
        )
        assert refund.status_code == 201, refund.text

        # Balance payment, and its retry replayed.
        number = new_order(client, 500)
        for replayed in ("", "true"):
            paid = client.post(
                f"/api/v1/orders/{number}/pay",
                headers={"Idempotency-Key": f"p-{number}"},
                json={"method": "balance"},
            )
            assert paid.status_code == 201, paid.text
            assert paid.headers.get("Idempotent-Replayed", "") == replayed

        number = new_order(client, 300)
        cancelled = client.post(
            f"/api/v1/orders/{number}/cancel",
            headers={"Idempotency-Key": f"c-{number}"},
        )
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"

        # A transfer to the recipient the banner names, seen with its token.
        sent = client.post(
            "/api/v1/transfers",
            headers={"Idempotency-Key": f"t-{number}"},
            json={"to": logins["friend"], "amount": 7, "currency": "CNY"},
        )
        assert sent.status_code == 201, sent.text
    with api(run, logins["friend_token"]) as friend:
        entries = friend.get("/api/v1/accounts/me/entries").json()["results"]
        assert entries[0]["amount"] == 7, entries

    # The web UI and the admin, logged in as the banner says.
    with httpx.Client(base_url=run.url, timeout=15) as browser:
        log_in(browser, run, "/login", "demo", "demo-password")
        log_in(browser, run, "/admin/login/", logins["admin"], logins["admin_password"])
        assert browser.get("/account").status_code == 200
        assert browser.get("/admin/orders/order/").status_code == 200
    with httpx.Client(base_url=run.url, timeout=15) as browser:
        log_in(browser, run, "/login", logins["friend"], logins["friend_password"])
        assert "¥0.07" in browser.get("/account").text


def log_in(
    browser: httpx.Client, run: MakeRun, path: str, username: str, password: str
) -> None:
    page = browser.get(path)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text
    answer = browser.post(
        path,
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token.group(1),
        },
        headers={"Referer": run.url + path},
    )
    assert answer.status_code == 302, answer.text


def test_provider_payments_at_once_outnumbering_the_web_s_threads(stack) -> None:
    """Twelve provider payments at once, more than the web's 2 x 4 threads: each
    waits for the provider simulator's answer, which comes from a process of its
    own. (When the web also answered for the provider, every thread could be left
    waiting on a provider call only a free thread could answer: payments failed
    with 503 after the provider timeout, and the whole site stalled meanwhile.)"""
    run, logins = stack
    with api(run, logins["token"]) as client:
        numbers = [new_order(client, 100) for _ in range(12)]

    def pay(number: str) -> httpx.Response:
        with api(run, logins["token"]) as client:
            return client.post(
                f"/api/v1/orders/{number}/pay",
                headers={"Idempotency-Key": f"many-{number}"},
                json={"method": "provider"},
            )

    with ThreadPoolExecutor(len(numbers)) as pool:
        answers = list(pool.map(pay, numbers))
    assert [a.status_code for a in answers] == [201] * len(numbers), [
        (a.status_code, a.text[:200]) for a in answers
    ]
    assert {a.json()["status"] for a in answers} == {"pending"}
    # The shopper still opens the pay page on the web's own port.
    assert {urlsplit(a.json()["pay_url"]).netloc for a in answers} == {
        urlsplit(run.url).netloc
    }


def test_the_readme_examples_run_as_pasted(stack) -> None:
    run, logins = stack
    run_readme_examples(ROOT / "README.md", run.url, logins["token"])


def test_metrics_are_one_figure_for_the_whole_host(stack) -> None:
    run, _ = stack
    totals = []
    for _ in range(6):  # every scrape lands on one of two gunicorn workers
        text = httpx.get(f"{run.url}/metrics", timeout=10).text
        totals.append(sample(text, 'http_requests_total{method="GET",route="healthz"'))
        httpx.get(f"{run.url}/healthz", timeout=10)
    assert totals == sorted(totals) and totals[-1] - totals[0] == 5, totals
    # The Celery worker's processes write to the same sum: the callback tasks ran.
    assert 'celery_tasks_total{outcome="succeeded"' in text, text[-2000:]


def sample(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_stack_stays_up_and_ctrl_c_stops_it_cleanly(stack) -> None:
    run, _ = stack
    # A minute counted from the banner, not from make's start: installing may take
    # longer than that, and the stack used to die seconds after it came up.
    time.sleep(max(0.0, STAYS_UP_SECONDS - (time.monotonic() - run.up_since)))
    assert run.process.poll() is None, run.output()[-4000:]
    assert httpx.get(f"{run.url}/healthz", timeout=5).status_code == 200
    processes = run.descendants()
    assert len(processes) >= 6, processes  # make, serve, gunicorn x3, celery ...

    assert run.ctrl_c() == 0, run.output()[-4000:]
    left = [pid for pid in processes if Path(f"/proc/{pid}").exists()]
    assert not left, f"still running: {left}"
    output = run.output()
    errors = [
        line
        for line in output.splitlines()
        if re.search(r'"level": "(ERROR|CRITICAL)"|ERROR/|\[ERROR\]|Traceback', line)
    ]
    assert not errors, "\n".join(errors)
    assert "Warm shutdown" in output
    assert "still running: SIGKILL" not in output  # every process stopped warmly
    # Everything it wrote is in ignored folders (.venv/, .var/): the clone is clean.
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=run.clone, capture_output=True, text=True
    )
    assert status.stdout == "", status.stdout
