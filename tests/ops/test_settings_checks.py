"""Settings that would quietly weaken a guarantee stop `manage.py` before anything
serves (Django's system checks: `migrate`, `check`, `runserver`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ledger.broker import REDIS_VISIBILITY_TIMEOUT_SECONDS
from ledger.checks import MERCHANT_SUB_ACCOUNTS_MAX
from ledger.settings.base import env_int
from orders.services import PREORDER_PURGE_MIN_GRACE_SECONDS
from payments.checks import REDRIVE_ATTEMPTS_MAX
from payments.services import HOLD_SECONDS_MAX, HOLD_SECONDS_MIN
from payments.tasks import RETRY

ROOT = Path(__file__).resolve().parents[2]


def refused() -> list[str | None]:
    return [message.id for message in checks.run_checks() if message.is_serious()]


def manage_py_check(**variables: str) -> subprocess.CompletedProcess[str]:
    """`manage.py check` as an operator runs it, with `variables` in its environment."""
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_shipped_settings_pass():
    assert refused() == []


@pytest.mark.parametrize(
    ("setting", "value", "code"),
    [
        ("IDEMPOTENCY_TTL_SECONDS", 0, "idempotency.E001"),
        ("IDEMPOTENCY_LEASE_SECONDS", -5, "idempotency.E001"),
        ("IDEMPOTENCY_REPLAY_CACHE_SECONDS", -1, "idempotency.E002"),
        ("IDEMPOTENCY_REDIS_FAILURE", "refuze", "idempotency.E003"),
        ("IDEMPOTENCY_ENDPOINTS", {"orders.pay": "sometimes"}, "idempotency.E004"),
        ("PREORDER_PURGE_AFTER_SECONDS", 599, "orders.E001"),
        ("HOLD_TTL_SECONDS", 59, "payments.E001"),
        ("HOLD_TTL_SECONDS", 2592001, "payments.E001"),
        # Parked at the first refusal whatever it says; or a count the payment's
        # small-integer column cannot reach (its update fails every minute after
        # 32767 refusals, and the payment is never parked).
        ("PAYMENT_REDRIVE_MAX_ATTEMPTS", 0, "payments.E003"),
        ("PAYMENT_REDRIVE_MAX_ATTEMPTS", 32768, "payments.E003"),
        ("LEDGER_DEFAULT_CURRENCY", "ZZZ", "ledger.E001"),
        ("LEDGER_DEFAULT_CURRENCY", "cny", "ledger.E001"),
        ("SNOWFLAKE_LEASE_SECONDS", 0, "idempotency.E006"),
        ("BEAT_LEASE_SECONDS", 0, "ledger.E002"),
        # Beat would never start a send: a try must fit in 9/10 of the lease.
        ("BEAT_LEASE_SECONDS", 20, "ledger.E004"),
        ("BEAT_PUBLISH_TRY_SECONDS", 27.0, "ledger.E004"),
        ("BEAT_PUBLISH_TRY_SECONDS", 0.0, "ledger.E004"),
    ],
)
def test_a_setting_that_weakens_a_guarantee_is_refused(settings, setting, value, code):
    setattr(settings, setting, value)
    assert refused() == [code]


def test_the_redis_visibility_timeout_outlasts_every_countdown(settings):
    """A delayed task waits unacknowledged in its worker on Redis: the visibility
    timeout must outlast the longest countdown and the run after it, or a second
    worker would be handed it while the first still holds it."""
    longest = max(max(settings.PROVIDER_RETRY_SCHEDULE), RETRY["retry_backoff_max"])
    assert longest + settings.CELERY_TASK_TIME_LIMIT < REDIS_VISIBILITY_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    "url", ["", "redis://127.0.0.1:7000/3", "unix:///run/redis.sock"]
)
def test_a_redis_cluster_needs_a_node_and_database_0(settings, url):
    settings.REDIS_CLUSTER, settings.REDIS_URL = True, url
    assert refused() == ["idempotency.E005"]
    settings.REDIS_URL = "redis://127.0.0.1:7000/0"
    assert refused() == []


@pytest.mark.parametrize(
    "url", ["bogus", "127.0.0.1:6379", "http://127.0.0.1:6379/0", "REDIS://h:6379/0"]
)
def test_a_redis_url_that_names_no_redis_is_refused(settings, url):
    """redis-py takes only these schemes, and reads a URL at the first command: the
    app would serve, and answer every idempotent write and `/readyz` with a 500."""
    settings.REDIS_URL = url
    assert refused() == ["idempotency.E007"]
    for url in ("redis://127.0.0.1:6379/5", "rediss://h:6380/0", "unix:///r.sock"):
        settings.REDIS_URL = url
        assert refused() == []


@pytest.mark.parametrize(
    ("name", "value", "minimum", "default"),
    [
        ("IDEMPOTENCY_TTL_SECONDS", "0", 1, 86400),
        ("IDEMPOTENCY_LEASE_SECONDS", "-5", 1, 30),
        ("IDEMPOTENCY_REPLAY_CACHE_SECONDS", "-1", 0, 3600),
        ("SNOWFLAKE_LEASE_SECONDS", "0", 1, 30),
        # These ended in the system checks' report of several lines, or (a
        # pre-order's life, the timeouts) were taken as they came.
        (
            "PREORDER_PURGE_AFTER_SECONDS",
            "60",
            PREORDER_PURGE_MIN_GRACE_SECONDS,
            86400,
        ),
        ("PREORDER_TTL_SECONDS", "0", 1, 3600),
        ("PAYMENT_RECONCILE_WINDOW_SECONDS", "0", 1, 2592000),
        ("PAYMENT_RECONCILE_EVERY_SECONDS", "-1", 1, 3600),
        ("PAYMENT_RECONCILE_BATCH", "0", 1, 100),
        ("BEAT_LEASE_SECONDS", "0", 1, 30),
        ("ORDER_UNPAID_EXPIRY_SECONDS", "0", 1, 86400),
        ("PAYMENT_PENDING_TIMEOUT_SECONDS", "0", 1, 600),
        ("PROVIDER_EVENT_MAX_ATTEMPTS", "0", 1, 10),
    ],
)
def test_a_number_below_what_a_variable_takes_is_one_line_naming_it(
    name, value, minimum, default
):
    """As for a number that is none: not the system checks' report of several
    lines, but one line naming the variable and what it takes."""
    refused_in_one_line(
        manage_py_check(**{name: value}),
        f"ImproperlyConfigured: {name}={value!r} is below {minimum}: give a whole "
        f"number of at least {minimum}, or leave it unset for {default}",
    )


@pytest.mark.parametrize(
    ("name", "value", "minimum", "maximum", "default"),
    [
        ("HOLD_TTL_SECONDS", "59", HOLD_SECONDS_MIN, HOLD_SECONDS_MAX, 604800),
        ("HOLD_TTL_SECONDS", "2592001", HOLD_SECONDS_MIN, HOLD_SECONDS_MAX, 604800),
        ("PAYMENT_REDRIVE_MAX_ATTEMPTS", "0", 1, REDRIVE_ATTEMPTS_MAX, 10),
        ("PAYMENT_REDRIVE_MAX_ATTEMPTS", "32768", 1, REDRIVE_ATTEMPTS_MAX, 10),
        ("MERCHANT_SUB_ACCOUNTS", "-1", 0, MERCHANT_SUB_ACCOUNTS_MAX, 0),
        ("MERCHANT_SUB_ACCOUNTS", "1025", 0, MERCHANT_SUB_ACCOUNTS_MAX, 0),
    ],
)
def test_a_number_outside_what_a_variable_takes_is_one_line_naming_it(
    name, value, minimum, maximum, default
):
    refused_in_one_line(
        manage_py_check(**{name: value}),
        f"ImproperlyConfigured: {name}={value!r} is outside {minimum}..{maximum}: "
        f"give a whole number from {minimum} to {maximum}, or leave it unset for "
        f"{default}",
    )


@pytest.mark.parametrize(
    ("bounds", "value", "refusal"),
    [
        ({"maximum": 10}, "11", "is above 10: give a whole number of at most 10"),
        ({"minimum": 1}, "0", "is below 1: give a whole number of at least 1"),
        ({"minimum": 1, "maximum": 10}, "11", "is outside 1..10: give"),
    ],
)
def test_each_bound_a_number_setting_names_is_held(monkeypatch, bounds, value, refusal):
    """A maximum alone was not checked at all (only beside a minimum)."""
    monkeypatch.setenv("LEDGER_SOME_NUMBER", value)
    with pytest.raises(ImproperlyConfigured, match=refusal):
        env_int("LEDGER_SOME_NUMBER", 5, **bounds)
    monkeypatch.setenv("LEDGER_SOME_NUMBER", "5")
    assert env_int("LEDGER_SOME_NUMBER", 7, **bounds) == 5


def test_the_lowest_number_a_variable_takes_is_taken():
    result = manage_py_check(
        IDEMPOTENCY_LEASE_SECONDS="1",
        IDEMPOTENCY_REPLAY_CACHE_SECONDS="0",
        PREORDER_PURGE_AFTER_SECONDS=str(PREORDER_PURGE_MIN_GRACE_SECONDS),
        HOLD_TTL_SECONDS=str(HOLD_SECONDS_MIN),
        PAYMENT_REDRIVE_MAX_ATTEMPTS="1",
        MERCHANT_SUB_ACCOUNTS="0",
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_highest_number_a_variable_takes_is_taken():
    result = manage_py_check(
        HOLD_TTL_SECONDS=str(HOLD_SECONDS_MAX),
        PAYMENT_REDRIVE_MAX_ATTEMPTS=str(REDRIVE_ATTEMPTS_MAX),
        MERCHANT_SUB_ACCOUNTS=str(MERCHANT_SUB_ACCOUNTS_MAX),
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_service_variable_set_but_empty_is_unset():
    """`DATABASE_URL=` or `CELERY_BROKER_URL=` (an empty line in a .env) means the
    embedded default, not a URL with no scheme."""
    env = {**os.environ, "DATABASE_URL": "", "CELERY_BROKER_URL": ""}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    program = (
        "from django.conf import settings; "
        "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)"
    )
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {program}"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "ledger.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.sqlite3",
        "filesystem://localhost/",
    ]


def refused_in_one_line(result: subprocess.CompletedProcess, line: str) -> None:
    """`manage.py check` stopped with `line` alone: not the system checks' report
    of several lines, nor a traceback."""
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [line], result.stderr[-3000:]
