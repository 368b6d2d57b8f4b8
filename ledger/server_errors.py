"""gunicorn's own refusals, answered as problem+json like every other error.

gunicorn refuses some requests before Django sees them: a header value with a control
character (DEL, for one), a request line over its limit (414), too many or too long
headers (431), a broken chunked body. It answers each with a little HTML page, all
written by one function, `gunicorn.util.write_error`. `install()`, called by
`ledger.wsgi` in every process that serves the app, puts `write_problem` in its place:
the same status, reason and message, as RFC 9457 problem details with a stable `code`
(`ledger.problems.HTTP_CODES`), whether or not nginx stands in front.

What no writer can change: a connection gunicorn drops without an answer (a client
that stops sending, a worker killed for its timeout) stays dropped; behind nginx that
is nginx's 502 or 504, problem+json too (deploy/nginx.conf).
"""

import json
from typing import Any

from idempotency.exceptions import IdempotencyKeyInvalid

from .problems import HTTP_CODES, problem

KEY_HEADER = "IDEMPOTENCY-KEY"  # as gunicorn names a header it refuses


def write_problem(sock: object, status_int: int, reason: str, mesg: str) -> None:
    """`gunicorn.util.write_error`, with a problem+json body instead of HTML."""
    from gunicorn import util

    fallback = "bad_request" if status_int < 500 else "internal_error"
    code, title, detail = HTTP_CODES.get(status_int, fallback), reason, mesg
    if status_int == 400 and mesg.upper().endswith(f"{KEY_HEADER!r}"):
        # A control character in the key (gunicorn's "Invalid HTTP Header:
        # 'IDEMPOTENCY-KEY'"): the contract's malformed key, as the app says it.
        refusal = IdempotencyKeyInvalid()
        code, title, detail = refusal.code, refusal.title, refusal.detail
    # ASCII only: gunicorn's message may quote what the client sent.
    body = json.dumps(problem(status_int, code, title, detail)).encode("ascii")
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


def install() -> None:
    """Make gunicorn, if it is what serves this process, answer its refusals as
    problem+json, and close the connection after the app's `413`."""
    try:
        from gunicorn import util
        from gunicorn.http import wsgi
    except ImportError:  # served by something else
        return
    util.write_error = write_problem
    keeps_open = wsgi.Response.should_close

    def should_close(response: Any) -> bool:
        # A 413 leaves the body unread: what follows on the connection is the rest
        # of it, not a next request, and gunicorn drains only 64 KiB of it before
        # it closes. So say `Connection: close` (an app's own Connection header is
        # dropped as hop-by-hop) rather than promise a keep-alive it will not keep.
        return getattr(response, "status_code", None) == 413 or keeps_open(response)

    wsgi.Response.should_close = should_close  # type: ignore[method-assign]
