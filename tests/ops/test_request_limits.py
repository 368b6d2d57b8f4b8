"""What a real gunicorn, started as `make run` starts it (the Procfile's `web:` line),
answers to requests no view may see: a body over the limit (413), a chunked body, and
gunicorn's own refusals (a DEL in a header value, a request line over its limit), all
problem+json.
"""

import io
import json
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from django.conf import settings
from django.http import HttpResponse

from idempotency.models import IdempotencyRecord
from ledger.openapi import problem_codes
from orders.models import Order
from tests.helpers import Customer
from tests.servers import dechunk, gunicorn, procfile_options, raw_exchange

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIMIT = settings.DATA_UPLOAD_MAX_MEMORY_SIZE


@pytest.fixture(scope="module")
def url(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """One gunicorn for the module, on the test database."""
    workers, _ = procfile_options()
    tmp = tmp_path_factory.mktemp("limits")
    with gunicorn(tmp, "ledger.settings.test", workers=workers) as (url, _):
        yield url


def assert_problem(status: int, headers: dict, body: bytes, expected: int, code: str):
    assert status == expected, body
    assert headers["content-type"] == "application/problem+json", (headers, body)
    problem = json.loads(body)
    assert {"type", "title", "status", "detail", "code"} <= set(problem)
    assert (problem["status"], problem["code"]) == (expected, code), problem
    assert code in problem_codes()


def order_body(customer: Customer, url: str, description: str = "Tea") -> bytes:
    answer = httpx.post(
        f"{url}/api/v1/preorders",
        headers={"Authorization": f"Token {customer.token}"},
        timeout=10,
    )
    no = answer.json()["merchant_order_no"]
    body = {"merchant_order_no": no, "amount": 100, "description": description}
    return json.dumps(body).encode()


def post_order(customer: Customer, url: str, content, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/orders",
        content=content,
        headers={
            "Authorization": f"Token {customer.token}",
            "Idempotency-Key": key,
            "Content-Type": "application/json",
        },
        timeout=30,
    )


def test_a_body_over_the_limit_is_413_and_its_key_stays_free(url):
    alice = Customer("alice")
    for _ in range(3):  # an answer every time, never a dropped connection
        key = f"big-{uuid.uuid4()}"
        big = order_body(alice, url, description="x" * 3_000_000)
        answer = post_order(alice, url, big, key)
        assert_problem(
            answer.status_code,
            dict(answer.headers),
            answer.content,
            413,
            "payload_too_large",
        )
        # The rest of the body is not read: the connection closes, and says so.
        assert answer.headers["connection"] == "close"
        # Refused before the view: nothing stored under the key, which the
        # corrected request may use.
        assert not IdempotencyRecord.objects.filter(key=key).exists()
        fixed = post_order(alice, url, order_body(alice, url), key)
        assert fixed.status_code == 201, fixed.content
        assert "Idempotent-Replayed" not in fixed.headers
    assert Order.objects.count() == 3


@pytest.mark.parametrize("joined", [False, True])
def test_a_key_sent_twice_is_one_key(url, joined):
    """A client library or a proxy that repeats the Idempotency-Key field (as two
    lines, or as one joined with ", "): the request runs once under the key, and
    the retry that sends the field once is its replay, not a second execution."""
    alice = Customer("alice")
    key = f"twice-{uuid.uuid4()}".encode()
    content = order_body(alice, url)
    fields = (
        [b"Idempotency-Key: " + key + b", " + key]
        if joined
        else [b"Idempotency-Key: " + key] * 2
    )
    status, _, body, _ = raw_exchange(
        url,
        b"POST /api/v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Token "
        + alice.token.encode()
        + b"\r\n"
        + b"".join(field + b"\r\n" for field in fields)
        + b"Content-Type: application/json\r\n"
        + b"Content-Length: "
        + str(len(content)).encode()
        + b"\r\n\r\n"
        + content,
    )
    assert status == 201, body
    again = post_order(alice, url, content, key.decode())
    assert again.status_code == 201, again.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == body
    assert Order.objects.count() == 1
    assert IdempotencyRecord.objects.filter(key=key.decode()).count() == 1


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(url):
    alice = Customer("alice")
    started = time.monotonic()
    status, headers, body, _ = raw_exchange(
        url,
        b"POST /api/v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Token " + alice.token.encode() + b"\r\n"
        b"Idempotency-Key: k-1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 3000000\r\n\r\n",  # and not one byte of it
    )
    assert_problem(status, headers, body, 413, "payload_too_large")
    assert headers["connection"] == "close"
    assert time.monotonic() - started < 5


def sent_then_closed(url: str, request: bytes) -> tuple[int, dict, bytes]:
    """Send `request` and close our side, as a client that gives up mid-upload."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head_of, _, body = answer.partition(b"\r\n\r\n")
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (
            line.partition(":") for line in head_of.decode().split("\r\n")[1:]
        )
    }
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return int(head_of.split()[1]), headers, body


# How a body can end before its end: what came may parse as a whole JSON object.
CUT_SHORT = {
    # 40 bytes fewer than the Content-Length declares.
    "declared length": lambda body: (
        b"Content-Length: %d\r\n\r\n%s" % (len(body) + 40, body)
    ),
    # A chunk that declares 40 bytes more than came.
    "chunk cut short": lambda body: (
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s" % (len(body) + 40, body)
    ),
    # Every chunk whole, but no last chunk (`0`) after them.
    "no last chunk": lambda body: (
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(body), body)
    ),
    # A chunk whose size is no hexadecimal number.
    "malformed chunk": lambda body: (
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n%s\r\n0\r\n\r\n" % body
    ),
}


@pytest.mark.parametrize("cut", CUT_SHORT)
def test_a_body_cut_short_is_refused_though_what_came_parses(url, cut):
    """The client sends a whole JSON object but not the body it announced, and
    closes its side: an upload given up, not a request to run."""
    alice = Customer("alice")
    body = order_body(alice, url)
    key = f"cut-{uuid.uuid4()}"
    head = (
        b"POST /api/v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Token " + alice.token.encode() + b"\r\n"
        b"Idempotency-Key: " + key.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
    )
    status, headers, problem = sent_then_closed(url, head + CUT_SHORT[cut](body))
    assert_problem(status, headers, problem, 400, "request_body_incomplete")
    assert not Order.objects.exists()
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    # The same request, whole, with the same key: it runs.
    answer = post_order(alice, url, body, key)
    assert answer.status_code == 201, answer.content


def test_a_compressed_body_is_415_and_its_key_stays_free(url):
    """Nothing decodes a content coding: read as it is, the body is no JSON."""
    import gzip

    alice = Customer("alice")
    body, key = order_body(alice, url), f"gz-{uuid.uuid4()}"
    headers = {
        "Authorization": f"Token {alice.token}",
        "Idempotency-Key": key,
        "Content-Type": "application/json",
    }
    answer = httpx.post(
        f"{url}/api/v1/orders",
        content=gzip.compress(body),
        headers={**headers, "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert_problem(
        answer.status_code,
        dict(answer.headers),
        answer.content,
        415,
        "unsupported_media_type",
    )
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    plain = httpx.post(
        f"{url}/api/v1/orders",
        content=body,
        headers={**headers, "Content-Encoding": "identity"},
        timeout=30,
    )
    assert plain.status_code == 201, plain.content


class ResetStream(io.BytesIO):
    """A connection reset mid-body, as the WSGI server's stream raises it."""

    def read(self, *args: object) -> bytes:
        raise ConnectionResetError("reset by peer")


def limits_answer(method: str, **meta: str):
    from django.test import RequestFactory

    from ledger.middleware import RequestLimitsMiddleware

    request = getattr(RequestFactory(), method)("/api/v1/orders")
    request.META.update(meta)
    request._stream = ResetStream()
    return RequestLimitsMiddleware(lambda request: HttpResponse("ran"))(request)


def test_a_body_reset_mid_upload_is_the_same_refusal_not_a_500():
    answer = limits_answer("post", CONTENT_LENGTH="100000")
    assert answer.status_code == 400
    assert json.loads(answer.content)["code"] == "request_body_incomplete"


def test_with_no_limit_a_chunked_body_is_read_whole():
    from django.test import RequestFactory, override_settings

    from ledger.middleware import RequestLimitsMiddleware

    request = RequestFactory().post("/api/v1/orders")
    del request.META["CONTENT_LENGTH"]
    request.META["HTTP_TRANSFER_ENCODING"] = "chunked"
    request.META["wsgi.input"] = io.BytesIO(b'{"a": 1}')
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=None):
        answer = RequestLimitsMiddleware(lambda request: HttpResponse(request.body))(
            request
        )
    assert (answer.status_code, answer.content) == (200, b'{"a": 1}')


def test_a_get_s_declared_body_is_not_waited_for():
    # (Read, it would block until the client gave up: here it would raise.)
    assert limits_answer("get", CONTENT_LENGTH="10").content == b"ran"


def test_a_chunked_body_is_read_up_to_the_limit_only(url):
    alice = Customer("alice")
    piece = b"x" * 65536
    chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(10 * LIMIT // 65536))
    status, headers, body, sent = raw_exchange(
        url,
        b"POST /api/v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Token " + alice.token.encode() + b"\r\n"
        b"Idempotency-Key: k-2\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n",
        chunks,
    )
    assert_problem(status, headers, body, 413, "payload_too_large")
    # It answered once it had read past the limit, long before the end.
    assert LIMIT < sent < 5 * LIMIT
    assert not IdempotencyRecord.objects.exists()


def test_a_chunked_body_within_the_limit_is_the_request_body(url):
    alice = Customer("alice")
    body = order_body(alice, url)
    pieces = iter([body[:10], body[10:]])  # httpx sends an iterator chunked
    answer = post_order(alice, url, pieces, f"chunked-{uuid.uuid4()}")
    assert answer.status_code == 201, answer.content
    assert (
        Order.objects.get().merchant_order_no == json.loads(body)["merchant_order_no"]
    )


@pytest.mark.parametrize(
    ("request_line", "extra", "status", "code"),
    [
        # DEL in a header value: gunicorn refuses it before Django sees it.
        (b"GET /healthz HTTP/1.1", b"X-Note: a\x7fb\r\n", 400, "bad_request"),
        # In the Idempotency-Key, any control character: the contract's malformed key.
        *(
            (
                b"POST /api/v1/preorders HTTP/1.1",
                b"Idempotency-Key: a%cb\r\n" % c,
                400,
                "idempotency_key_invalid",
            )
            for c in (0x01, 0x1B, 0x7F)
        ),
        # A request line over gunicorn's 4094 bytes.
        (b"GET /healthz?" + b"a" * 5000 + b" HTTP/1.1", b"", 414, "uri_too_long"),
        # More header fields than gunicorn takes (100).
        (
            b"GET /healthz HTTP/1.1",
            b"".join(b"X-H%d: 1\r\n" % i for i in range(101)),
            431,
            "request_header_fields_too_large",
        ),
    ],
)
def test_gunicorns_own_refusals_are_problems(url, request_line, extra, status, code):
    answer = raw_exchange(
        url,
        request_line
        + b"\r\nHost: 127.0.0.1\r\n"
        + extra
        + b"Connection: close\r\n\r\n",
    )
    assert_problem(*answer[:3], status, code)
