"""/metrics and the JSON logs, from a real gunicorn with two workers and in-process."""

import hashlib
import json
import logging
import threading
import uuid

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ledger.celery import app as celery_app
from ledger.logging import JsonFormatter
from tests.helpers import Customer
from tests.servers import gunicorn


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_metrics_are_summed_and_each_request_logs_one_json_line(
    tmp_path,
):
    alice = Customer("alice")
    prometheus_dir = tmp_path / "prometheus"
    prometheus_dir.mkdir()
    keys = [f"secret-key-{uuid.uuid4()}" for _ in range(4)]
    with gunicorn(
        tmp_path,
        "tests.idempotency.server_settings",
        workers=2,
        PROMETHEUS_MULTIPROC_DIR=str(prometheus_dir),
    ) as (url, _master):
        answers: dict[str, httpx.Response] = {}

        def deposit(key: str, request_id: str) -> None:
            answers[request_id] = httpx.post(
                f"{url}/test/deposits",
                json={"amount": 10, "sleep": 0.5},
                headers={
                    "Authorization": f"Token {alice.token}",
                    "Idempotency-Key": key,
                    "X-Request-ID": request_id,
                },
                timeout=30,
            )

        # Four at once: two sync workers must share them.
        threads = [
            threading.Thread(target=deposit, args=(key, f"rid-{i}"))
            for i, key in enumerate(keys)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        deposit(keys[0], "rid-replay")
        assert [answers[f"rid-{i}"].status_code for i in range(4)] == [201] * 4
        assert answers["rid-replay"].headers["Idempotent-Replayed"] == "true"
        assert answers["rid-replay"].headers["X-Request-ID"] == "rid-replay"

        # Whichever worker answers the scrape, it reports both workers' samples.
        for _ in range(3):
            samples = scrape(url)
            route = "test/deposits"
            assert (
                sample(
                    samples,
                    "http_requests_total",
                    method="POST",
                    route=route,
                    status="201",
                )
                == 5
            )
            assert (
                sample(
                    samples,
                    "http_request_duration_seconds_count",
                    method="POST",
                    route=route,
                )
                == 5
            )
            executed = sample(samples, "idempotency_requests_total", outcome="executed")
            assert executed == 4
            replayed = sample(samples, "idempotency_requests_total", outcome="replayed")
            assert replayed == 1
        assert len(list(prometheus_dir.glob("*.db"))) >= 2  # both workers wrote

    log = (tmp_path / f"gunicorn-{url.rsplit(':', 1)[1]}.log").read_text()
    for key in keys:
        assert key not in log  # never the raw key
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    requests = [line for line in lines if line.get("event") == "http_request"]
    by_id = {}
    for line in requests:
        assert line["request_id"] not in by_id, "two lines for one request"
        by_id[line["request_id"]] = line
    first = by_id["rid-0"]
    assert (
        first["idempotency_key_sha256"]
        == (hashlib.sha256(keys[0].encode()).hexdigest()[:16])
    )
    assert first["user_id"] == alice.user.pk
    assert first["status"] == 201
    assert first["method"] == "POST"
    assert first["route"] == "test/deposits"
    assert first["idempotency_outcome"] == "executed"
    assert first["duration_ms"] >= 500
    assert by_id["rid-replay"]["idempotency_outcome"] == "replayed"
    assert (
        by_id["rid-replay"]["idempotency_key_sha256"]
        == (first["idempotency_key_sha256"])
    )
    generated = [line for line in requests if line["route"] == "metrics"]
    assert generated and all(len(line["request_id"]) == 32 for line in generated)


@pytest.mark.django_db
def test_request_line_for_an_anonymous_refusal(client, caplog):
    caplog.set_level(logging.INFO)
    logger = logging.getLogger("ledger.requests")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        answer = client.post(
            "/api/v1/orders",
            "{}",
            content_type="application/json",
            headers={"Idempotency-Key": "raw-key-123", "X-Request-ID": "bad id!"},
        )
    finally:
        logger.removeHandler(handler)
    assert answer.status_code == 401
    (record,) = records
    line = json.loads(JsonFormatter().format(record))
    assert line["status"] == 401
    assert line["user_id"] is None
    assert line["request_id"] == answer["X-Request-ID"] != "bad id!"  # not trusted
    assert "raw-key-123" not in json.dumps(line)
    assert (
        line["idempotency_key_sha256"]
        == (hashlib.sha256(b"raw-key-123").hexdigest()[:16])
    )


@pytest.mark.django_db
def test_metrics_include_the_callback_inbox_depth(client):
    from orders.services import order_create, preorder_create
    from payments.models import Payment, ProviderEvent

    def depth() -> float:
        text = client.get("/metrics").content.decode()
        (family,) = [
            f
            for f in text_string_to_metric_families(text)
            if f.name == "payments_callback_inbox_depth"
        ]
        return family.samples[0].value

    assert depth() == 0
    user = Customer("carol").user
    preorder = preorder_create(owner=user)
    order = order_create(
        owner=user,
        merchant_order_no=preorder.merchant_order_no,
        amount=100,
        currency="CNY",
        description="",
    )
    payment = Payment.objects.create(
        order=order, method="provider", amount=100, currency="CNY"
    )
    for n, status in enumerate(["received", "received", "processed"]):
        ProviderEvent.objects.create(
            event_id=f"ev-{n}",
            payment=payment,
            kind="SUCCESS",
            payload={},
            raw_body="{}",
            status=status,
        )
    assert depth() == 2


@celery_app.task(bind=True, name="tests.ops.flaky", max_retries=1)
def flaky(self, mode: str) -> str:
    if mode == "fail":
        raise ValueError("boom")
    if mode == "retry":
        raise self.retry(countdown=0)
    return "ok"


def test_celery_task_outcomes_are_counted_and_logged():
    def count(outcome: str) -> float:
        labels = {"task": "tests.ops.flaky", "outcome": outcome}
        return REGISTRY.get_sample_value("celery_tasks_total", labels) or 0.0

    lines: list[dict] = []
    handler = logging.Handler()
    handler.emit = lambda r: lines.append(json.loads(JsonFormatter().format(r)))  # type: ignore[method-assign]
    logger = logging.getLogger("ledger.tasks")
    logger.addHandler(handler)
    before = {o: count(o) for o in ("succeeded", "failed", "retried")}
    try:
        assert flaky.apply(args=["ok"]).get() == "ok"
        assert flaky.apply(args=["fail"]).failed()
        # Retried once, then out of retries: a failure.
        assert flaky.apply(args=["retry"]).failed()
    finally:
        logger.removeHandler(handler)
    assert count("succeeded") == before["succeeded"] + 1
    assert count("failed") == before["failed"] + 2
    assert count("retried") == before["retried"] + 1
    succeeded = [line for line in lines if line["outcome"] == "succeeded"]
    assert succeeded[0]["task"] == "tests.ops.flaky"
    assert succeeded[0]["task_id"]
    assert succeeded[0]["duration_ms"] is not None
    assert {line["outcome"] for line in lines} >= {"succeeded", "failed", "retried"}


@pytest.mark.django_db
def test_metrics_token_set_requires_the_bearer_token(client, settings):
    assert client.get("/metrics").status_code == 200  # unset: open
    settings.METRICS_TOKEN = "scrape-me"
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Token scrape-me"},
        {"Authorization": "scrape-me"},
    ):
        answer = client.get("/metrics", headers=headers)
        assert answer.status_code == 401, headers
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["code"] == "metrics_token_required"
        assert answer["WWW-Authenticate"] == 'Bearer realm="metrics"'
    answer = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert answer.status_code == 200
    assert b"idempotency_requests_total" in answer.content


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/favicon.ico"])
def test_operations_endpoints_answer_another_method_with_405(path):
    """A POST, with a session cookie or without, is refused for its method (not a
    CSRF page): these endpoints only ever read."""
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.cookies["csrftoken"] = "x" * 32
    for method in ("post", "put", "delete"):
        answer = getattr(browser, method)(path)
        assert answer.status_code == 405, (method, answer.content)
        assert answer["Content-Type"] == "application/problem+json"
        assert answer.json()["code"] == "method_not_allowed"
        assert answer["Allow"] == "GET, HEAD"
    assert browser.head("/healthz").status_code == 200


@pytest.mark.django_db
def test_probes_answer_whatever_host_they_are_asked_by(client):
    """A load balancer's health check and Prometheus's scrape name the host by its
    address, which ALLOWED_HOSTS does not list; every other page still refuses it."""
    for host in ("10.0.3.7:8000", "[fd00::7]:8000", "evil.example"):
        for path in ("/healthz", "/readyz", "/metrics"):
            answer = client.get(path, HTTP_HOST=host)
            assert answer.status_code == 200, (host, path, answer.content[:200])
        assert client.get("/", HTTP_HOST=host).status_code == 400
        assert client.get("/api/v1/accounts/me", HTTP_HOST=host).status_code == 400
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.django_db
def test_probes_carry_the_security_headers_of_every_other_answer(client):
    """Answered before `CommonMiddleware` asks for the host, but after
    `SecurityMiddleware`: a probe's answer is no exception to its headers."""
    page = client.get("/api/v1/accounts/me")
    expected = (
        "X-Content-Type-Options",
        "Referrer-Policy",
        "Cross-Origin-Opener-Policy",
    )
    for path in ("/healthz", "/readyz", "/metrics"):
        for host in ("10.0.3.7:8000", "testserver"):
            answer = client.get(path, HTTP_HOST=host)
            assert answer.status_code == 200, (host, path)
            for header in expected:
                assert answer.get(header) == page[header], (path, host, header)
