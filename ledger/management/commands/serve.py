"""`make run`: check the settings, migrate, seed the demo, run the whole stack."""

import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from kombu import Connection
from kombu.transport import TRANSPORT_ALIASES

from ledger.demo import demo_seed
from ledger.supervisor import (
    Supervisor,
    free_port,
    read_procfile,
    stop_with_parent,
    terminal_foreground,
)

DEVELOPMENT_SECRET = "dev-provider-secret"  # noqa: S105 - the embedded default
PROVIDER = "provider"  # the Procfile's provider simulator


class Command(BaseCommand):
    help = (
        "Serve the web UI, API and admin with a Celery worker, Celery beat and the "
        "provider simulator until Ctrl-C (what `make run` runs)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--procfile", default=str(settings.BASE_DIR / "Procfile"))

    def handle(self, *args: Any, procfile: str, **options: Any) -> None:
        stop_with_parent()
        port = port_number(os.environ.get("PORT") or "8000")
        check_port_free(port)
        check_folder(settings.DATA_DIR, "LEDGER_DATA_DIR")
        check_broker(settings.CELERY_BROKER_URL)
        try:
            call_command("migrate", interactive=False, verbosity=0)
            demo = demo_seed()
        except DatabaseError as exc:
            raise CommandError(f"the database does not answer: {exc}") from exc

        processes = read_procfile(Path(procfile))
        provider_port = None
        while PROVIDER in processes and provider_port in (None, port):
            provider_port = free_port()  # (the web's port is free too, until it binds)
        supervisor = Supervisor(processes, child_env(port, provider_port))
        urls = [f"http://127.0.0.1:{p}" for p in (port, provider_port) if p]
        ready = Readiness(urls)
        with terminal_foreground():
            supervisor.install_signals()
            supervisor.start()

            def on_line(name: str, line: str) -> None:
                if ready.note(name, line):
                    self.stdout.write(banner(port, demo))
                    self.stdout.flush()  # a pipe or a file holds it back otherwise

            status = supervisor.run(on_line)
        if status:
            raise CommandError("a process of the stack stopped; see the lines above")


def port_number(value: str) -> int:
    if not (value.isdigit() and 0 < int(value) < 65536):
        raise CommandError(f"PORT={value!r} is not a port number: use 1 to 65535")
    return int(value)


def check_port_free(port: int) -> None:
    """Refuse a port something listens on. Bound as gunicorn binds (`SO_REUSEADDR`):
    connections the previous run closed linger on the port in TIME_WAIT for a minute
    after Ctrl-C, and they do not stop gunicorn, so they must not stop this either."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError as exc:
            raise CommandError(
                f"port {port} is in use ({exc.strerror}): stop what serves it, or run "
                f"on another port: PORT={port + 1} make run"
            ) from exc


def check_folder(folder: Path, setting: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CommandError(
            f"the folder {folder} cannot be used ({exc.strerror}): set {setting} "
            "to a writable folder"
        ) from exc


def check_broker(url: str) -> None:
    """Refuse a broker that cannot work, in one line, before anything starts."""
    scheme = urlsplit(url).scheme
    if scheme not in TRANSPORT_ALIASES:
        raise CommandError(
            f"CELERY_BROKER_URL has an unknown scheme {scheme!r}: use filesystem:// "
            "(the default), redis://HOST:6379/1 or amqp://USER:PASSWORD@HOST:5672//"
        )
    if scheme == "filesystem":
        options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        for folder in {options["data_folder_in"], options["processed_folder"]}:
            check_folder(Path(folder), "LEDGER_DATA_DIR")
        return
    try:
        # The settings' transport options bound a Redis broker's socket waits: one
        # that accepts the connection and never answers is refused, not waited on.
        with Connection(
            url,
            connect_timeout=5,
            transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        ) as connection:
            connection.ensure_connection(max_retries=1, timeout=5)
    except Exception as exc:  # any failure to connect is the same answer here
        raise CommandError(
            f"the broker at {url.split('@')[-1]} does not answer ({exc}); "
            "start it or fix CELERY_BROKER_URL"
        ) from exc


def child_env(port: int, provider_port: int | None = None) -> dict[str, str]:
    """The stack's environment: one PORT for every process (the provider simulator
    builds its callbacks' URL and the pay page's from it) and one metrics folder,
    emptied now, that every web and Celery process writes to so /metrics sums them.

    The provider simulator serves its charge API from a process of its own (the
    Procfile's `provider`, on a free port), as a real provider would: a provider
    payment's request waits for the provider's answer, and a web server that also
    answered for the provider would, once every thread of it waited so, have none
    left to answer with (each pay request then failed after the provider timeout,
    and the whole site stalled meanwhile). Shoppers still open the pay page on the
    web's port. A `PAYMENT_PROVIDER_URL` or `PROVIDER_PUBLIC_URL` of the caller's
    wins.
    """
    env = dict(os.environ)
    env["PORT"] = str(port)
    if provider_port is not None:
        env["PROVIDER_PORT"] = str(provider_port)
        for name, value in (
            ("PAYMENT_PROVIDER_URL", f"http://127.0.0.1:{provider_port}/provider"),
            ("PROVIDER_PUBLIC_URL", f"http://127.0.0.1:{port}"),
        ):
            if not env.get(name):
                env[name] = value
    env["PYTHONUNBUFFERED"] = "1"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    metrics = Path(env.get("PROMETHEUS_MULTIPROC_DIR") or settings.DATA_DIR / "metrics")
    metrics.mkdir(parents=True, exist_ok=True)
    for stale in metrics.glob("*.db"):
        stale.unlink()
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
    return env


class Readiness:
    """The stack is ready once the web (and the provider simulator) answer /healthz
    and the worker and beat said they started (or, if they are slow to say so,
    after 90 s)."""

    SIGNS = {"worker": " ready.", "beat": "beat: Starting..."}

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.web = self.announced = False
        self.started: set[str] = set()
        self.since = time.monotonic()

    def note(self, name: str, line: str) -> bool:
        """Take one output line; True exactly once, when the banner is due."""
        sign = self.SIGNS.get(name)
        if sign and sign in line:
            self.started.add(name)
        others = self.started == set(self.SIGNS)
        slow = time.monotonic() - self.since > 90
        if not self.web and (others or slow or "Booting worker" in line):
            self.web = self._answers()
        if self.announced or not (self.web and (others or slow)):
            return False
        self.announced = True
        return True

    def _answers(self) -> bool:
        # httpx logs each request at INFO: not a line for the start-up output.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        return all(self._url_answers(url) for url in self.urls)

    @staticmethod
    def _url_answers(url: str) -> bool:
        for _ in range(50):
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.1)
        return False


def admin_lines(url: str, admin: dict[str, Any]) -> list[str]:
    username, indent = admin["username"], " " * 14
    login = f"  Admin       {url}/admin/   user {username}"
    if admin["password"] is None:
        return [
            f"{login}, whose password is no longer the one kept in",
            f"{indent}{admin['password_file']}: delete that file and start again",
            f"{indent}for a new password, shown here (or log in with yours).",
        ]
    return [
        f"{login} / {admin['password']}",
        f"{indent}(the admin password is kept in {admin['password_file']})",
    ]


def banner(port: int, demo: dict[str, Any]) -> str:
    url = f"http://127.0.0.1:{port}"
    customer, friend, admin = demo["customer"], demo["friend"], demo["admin"]
    secret = settings.PAYMENT_PROVIDER_SECRET
    if secret == DEVELOPMENT_SECRET:
        secret_line = f"{secret}   (embedded default; set PAYMENT_PROVIDER_SECRET)"
    else:
        secret_line = "from PAYMENT_PROVIDER_SECRET (not shown)"  # noqa: S105
    rule = "-" * 78
    return "\n".join(
        [
            rule,
            f"  The ledger is up: {url}/",
            f"  Shop        {url}/login   user {customer['username']}"
            f" / {customer['password']}",
            f"  API token   {customer['token']}",
            f"              curl {url}/api/v1/accounts/me"
            f' -H "Authorization: Token {customer["token"]}"',
            f"  Recipient   user {friend['username']} / {friend['password']}"
            f"   (send {friend['username']} a transfer)",
            f"              API token {friend['token']}",
            *admin_lines(url, admin),
            f"  API docs    {url}/api/docs/",
            f"  Callback secret  {secret_line}",
            "  Ctrl-C stops everything.",
            rule,
            "",
        ]
    )
