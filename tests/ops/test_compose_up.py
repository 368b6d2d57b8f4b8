"""The compose stack started for real: `docker compose up`, a journey through nginx.

On a copy of the working tree with a `.env` made from `.env.example` (the user's own
`.env` is never read or touched), the images are built and the repository's
docker-compose.yml is brought up as the project `ledgercomposetest`, nginx on
127.0.0.1:8080. Once every service is healthy, a customer pays one order through the
provider (the pay page's form confirmed, the worker's callback through nginx marks it
paid) and one from the wallet, and retries with the same Idempotency-Key are replayed
(`Idempotent-Replayed: true`) without a second effect. Then `docker compose down -v`
removes the containers and volumes, whatever happened.

Base images: PYTHON_IMAGE, POSTGRES_IMAGE, REDIS_IMAGE and NGINX_IMAGE when set; else,
with debootstrap installed (CI: `.ci/run`), stand-ins built once from Debian's packages
by deploy/local-images/build.sh; else the public defaults. `make compose-test` runs this
test alone. It skips only where docker cannot run at all, and not even then under CI
or with LEDGER_COMPOSE_TEST=required, where it fails instead.
"""

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from tests.servers import ROOT

PROJECT = "ledgercomposetest"
BASE = "http://127.0.0.1:8080"
IMAGE_VARIABLES = ("PYTHON_IMAGE", "POSTGRES_IMAGE", "REDIS_IMAGE", "NGINX_IMAGE")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def cannot_run(reason: str) -> None:
    required = os.environ.get("CI") or os.environ.get("LEDGER_COMPOSE_TEST")
    if required:
        pytest.fail(f"the compose test must run here, but {reason}")
    pytest.skip(reason)


def compose_command() -> list[str]:
    """`docker compose` (v2 plugin) or Debian bookworm's `docker-compose` (v1)."""
    if shutil.which("docker") is None:
        cannot_run("the docker binary is not installed")
    info = subprocess.run(["docker", "info"], capture_output=True, check=False)
    if info.returncode != 0:
        cannot_run(f"the docker engine does not answer: {info.stderr.decode()[-300:]}")
    plugin = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False
    )
    if plugin.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    cannot_run("docker is installed without Compose (no plugin, no docker-compose)")
    raise AssertionError("unreachable")


def base_images() -> dict[str, str]:
    given = {name: os.environ[name] for name in IMAGE_VARIABLES if name in os.environ}
    sbin = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
    if given or shutil.which("debootstrap", path=sbin) is None:
        return given  # the rest: the compose file's public defaults
    started = time.monotonic()
    built = subprocess.run(
        ["bash", str(ROOT / "deploy/local-images/build.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    print(f"compose: base images ready in {time.monotonic() - started:.0f} s")
    return dict(line.split("=", 1) for line in built.stdout.split())


def copy_tree(target: Path) -> None:
    """The working tree's files (tracked and untracked, not ignored) into `target`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # not a file deleted since its last commit
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def port_8080_is_free() -> bool:
    with socket.socket() as s:
        # As a server binds it: a closed connection's TIME_WAIT does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 8080))
        except OSError:
            return False
    return True


class Compose:
    def __init__(self, command: list[str], directory: Path, env: dict[str, str]):
        self.command = [*command, "--project-name", PROJECT, "--ansi", "never"]
        self.directory = directory
        self.env = env

    def __call__(self, *args: str, timeout: float = 600) -> str:
        result = subprocess.run(
            [*self.command, *args],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        assert result.returncode == 0, (
            f"compose {' '.join(args)}: exit {result.returncode}\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        return result.stdout

    def down(self) -> None:
        subprocess.run(
            [*self.command, "down", "--volumes", "--remove-orphans", "--timeout", "20"],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            check=False,
            timeout=300,
        )

    def health(self) -> dict[str, str]:
        """Each service container's health (or state, when it has no health check)."""
        states = {}
        for container in self("ps", "-q", "--all").split():
            inspected = json.loads(
                subprocess.run(
                    ["docker", "inspect", container],
                    capture_output=True,
                    check=True,
                ).stdout
            )[0]
            service = inspected["Config"]["Labels"]["com.docker.compose.service"]
            state = inspected["State"]
            states[service] = (state.get("Health") or {}).get("Status") or (
                f"{state['Status']} {state['ExitCode']}"
            )
        return states


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Compose]:
    command = compose_command()
    directory = tmp_path / "stack"
    directory.mkdir()
    copy_tree(directory)
    shutil.copy(ROOT / ".env.example", directory / ".env")
    env = {**os.environ, **base_images()}
    env.pop("COMPOSE_PROJECT_NAME", None)
    env.pop("COMPOSE_FILE", None)
    compose = Compose(command, directory, env)
    compose.down()  # what an interrupted earlier run may have left
    if not port_8080_is_free():
        pytest.fail(
            "127.0.0.1:8080 is taken (another `docker compose up`? `make run`?): "
            "the stack's nginx publishes that port; free it and run again"
        )
    started = time.monotonic()
    try:
        build = ["build", "--force-rm"] if command == ["docker-compose"] else ["build"]
        compose(*build, timeout=1200)
        built = time.monotonic()
        compose("up", "--detach", timeout=600)
        wait_healthy(compose)
        print(
            f"compose: built in {built - started:.0f} s, "
            f"healthy {time.monotonic() - built:.0f} s later"
        )
        yield compose
    finally:
        # Every container's log, for a failure's post-mortem (test-artifacts/ is
        # ignored by git).
        logs = subprocess.run(
            [*compose.command, "logs", "--no-color", "--timestamps"],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        (ROOT / "test-artifacts/compose.log").write_text(logs.stdout + logs.stderr)
        stopping = time.monotonic()
        compose.down()
        print(f"compose: down in {time.monotonic() - stopping:.0f} s")
        left = subprocess.run(
            [
                "docker",
                "ps",
                "--all",
                "--quiet",
                "--filter",
                f"label=com.docker.compose.project={PROJECT}",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        assert not left, f"containers left behind: {left}"
        print(f"compose: {time.monotonic() - started:.0f} s from build to down")
        print("compose: the containers' logs are in test-artifacts/compose.log")


def wait_healthy(compose: Compose, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = compose.health()
        long_running = {k: v for k, v in states.items() if k != "migrate"}
        if (
            states.get("migrate") == "exited 0"
            and len(long_running) == 7
            and set(long_running.values()) == {"healthy"}
        ):
            return
        assert "unhealthy" not in states.values(), states
        time.sleep(2)
    raise AssertionError(f"not healthy within {seconds} s: {states}")


class FormParser(HTMLParser):
    """The first <form>: its method, action and the fields a browser would send."""

    def __init__(self) -> None:
        super().__init__()
        self.method: str | None = None
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.buttons: dict[str, str] = {}
        self.in_form = self.done = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag == "form" and not self.done:
            self.in_form = True
            self.method = attr.get("method", "get").lower()
            self.action = attr.get("action", "")
        elif self.in_form and tag == "input" and "name" in attr:
            self.fields[attr["name"]] = attr.get("value", "")
        elif self.in_form and tag == "button" and "name" in attr:
            self.buttons[attr.get("value", "")] = attr["name"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.in_form:
            self.in_form, self.done = False, True


def create_customer(compose: Compose) -> str:
    out = compose(
        "exec", "-T", "web", "python", "manage.py", "create_customer", "alice",
        "--balance", "100000",
    )  # fmt: skip
    line = next(x for x in reversed(out.splitlines()) if x.startswith("{"))
    return json.loads(line)["token"]


def new_order(api: httpx.Client, amount: int) -> str:
    preorder = api.post("/api/v1/preorders")
    assert preorder.status_code == 201, preorder.text
    number = preorder.json()["merchant_order_no"]
    created = api.post(
        "/api/v1/orders",
        headers={"Idempotency-Key": f"order-{uuid.uuid4()}"},
        json={
            "merchant_order_no": number,
            "amount": amount,
            "currency": "CNY",
            "description": "compose journey",
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "pending_payment"
    return number


def test_compose_stack_serves_the_journey_through_nginx(stack: Compose) -> None:
    token = create_customer(stack)
    api = httpx.Client(
        base_url=BASE, headers={"Authorization": f"Token {token}"}, timeout=30
    )

    # The gateway answers, with a request id; static files and the Chinese UI ship.
    ready = api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.headers.get("X-Request-ID")
    css = api.get("/static/css/app.css")
    assert css.status_code == 200
    assert css.headers["Content-Type"].startswith("text/css")
    login = httpx.get(f"{BASE}/login", headers={"Accept-Language": "zh-hans"})
    assert "登录" in login.text  # "Log in"

    # An order, created and then retried with the same key: replayed, not repeated.
    preorder = api.post("/api/v1/preorders")
    assert preorder.status_code == 201, preorder.text
    number = preorder.json()["merchant_order_no"]
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    body = {
        "merchant_order_no": number,
        "amount": 2500,
        "currency": "CNY",
        "description": "compose journey",
    }
    first = api.post("/api/v1/orders", headers=key, json=body)
    assert first.status_code == 201, first.text
    again = api.post("/api/v1/orders", headers=key, json=body)
    assert again.status_code == 201
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.content == first.content
    assert again.headers["Location"] == first.headers["Location"]

    # Paid through the provider: its pay page confirmed like a browser would, then
    # the worker delivers the callback through nginx and the order becomes paid.
    paid = api.post(
        f"/api/v1/orders/{number}/pay",
        headers={"Idempotency-Key": f"pay-{uuid.uuid4()}"},
        json={"method": "provider"},
    )
    assert paid.status_code == 201, paid.text
    payment = paid.json()
    assert payment["status"] == "pending"
    pay_url = payment["pay_url"]
    assert pay_url.startswith(f"{BASE}/provider/pay/"), pay_url
    browser = httpx.Client(timeout=30)
    page = browser.get(pay_url)
    assert page.status_code == 200, page.text
    form = FormParser()
    form.feed(page.text)
    assert form.method == "post", page.text
    assert "confirm" in form.buttons, page.text
    confirmed = browser.post(
        httpx.URL(pay_url).join(form.action or ""),
        data={**form.fields, form.buttons["confirm"]: "confirm"},
        headers={"Origin": BASE, "Referer": pay_url},
    )
    assert confirmed.status_code == 303, confirmed.text
    assert browser.get(pay_url).text.count('data-status="SUCCESS"') == 1
    deadline = time.monotonic() + 30
    order = api.get(f"/api/v1/orders/{number}").json()
    while order["status"] != "paid" and time.monotonic() < deadline:
        time.sleep(0.5)
        order = api.get(f"/api/v1/orders/{number}").json()
    assert order["status"] == "paid", order
    # (The contract lists the order's payments; not every build shows them yet.)
    statuses = [p["status"] for p in order.get("payments", [{"status": "succeeded"}])]
    assert statuses == ["succeeded"], order

    # Paid from the wallet, and the retry of that payment moves no money twice.
    before = api.get("/api/v1/accounts/me").json()["balance"]
    second = new_order(api, 1999)
    key = {"Idempotency-Key": f"pay-{uuid.uuid4()}"}
    debit = api.post(
        f"/api/v1/orders/{second}/pay", headers=key, json={"method": "balance"}
    )
    assert debit.status_code == 201, debit.text
    assert debit.json()["status"] == "succeeded"
    replay = api.post(
        f"/api/v1/orders/{second}/pay", headers=key, json={"method": "balance"}
    )
    assert replay.status_code == 201
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.content == debit.content
    assert api.get(f"/api/v1/orders/{second}").json()["status"] == "paid"
    assert api.get("/api/v1/accounts/me").json()["balance"] == before - 1999

    # /metrics sums the web workers and the Celery worker (a shared tmpfs volume).
    metrics = api.get("/metrics")
    assert metrics.status_code == 200
    assert 'idempotency_requests_total{outcome="replayed"}' in metrics.text
    assert "celery_tasks_total{" in metrics.text

    checked = stack("exec", "-T", "web", "python", "manage.py", "check_ledger")
    report = json.loads(next(x for x in checked.splitlines() if x.startswith("{")))
    assert report["ok"], report
