"""Drive one endpoint from several client threads for a while: the measuring loop
that `idempotency_overhead.py` and `load.py` share."""

import http.client
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

# (client number, request number) -> (body, extra headers) or (body, extra headers,
# path): a request may go to a path of its own (an order's pay URL), and its extra
# headers win over the defaults (another customer's Authorization).
MakeRequest = Callable[
    [int, int], tuple[str, dict[str, str]] | tuple[str, dict[str, str], str]
]


@dataclass
class Hammered:
    latencies: list[float] = field(default_factory=list)  # seconds, one per request
    elapsed: float = 0.0  # seconds, wall clock
    # Answers other than the expected status, by status.
    unexpected: Counter[int] = field(default_factory=Counter)

    @property
    def errors(self) -> int:
        return self.unexpected.total()

    def add(self, other: "Hammered") -> "Hammered":
        return Hammered(
            self.latencies + other.latencies,
            self.elapsed + other.elapsed,
            self.unexpected + other.unexpected,
        )

    def figures(self) -> dict:
        ordered = sorted(self.latencies) or [0.0]
        served = len(self.latencies)
        return {
            "rps": round(served / self.elapsed, 1) if served else 0.0,
            # Only the answers that were the expected status (a 423 is no execution).
            "ok_rps": round((served - self.errors) / self.elapsed, 1)
            if served
            else 0.0,
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 2),
            "requests": served,
            "errors": self.errors,
            "unexpected": dict(sorted(self.unexpected.items())),
        }


def hammer(
    url: str,
    path: str,
    token: str,
    clients: int,
    seconds: float,
    make_request: MakeRequest,
    expect: int = 201,
) -> Hammered:
    """POST to `url` + `path` from `clients` threads for `seconds`. Each thread keeps
    one connection, which http.client reopens whenever the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    unexpected = Counter[int]()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(n: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        mine, i = [], 0
        while time.monotonic() < stop_at:
            body, extra, *where = make_request(n, i)
            headers = {
                "Authorization": f"Token {token}",
                "Content-Type": "application/json",
                **extra,
            }
            started = time.perf_counter()
            conn.request("POST", where[0] if where else path, body, headers)
            response = conn.getresponse()
            response.read()
            mine.append(time.perf_counter() - started)
            if response.status != expect:
                with lock:
                    unexpected[response.status] += 1
            i += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    begun = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return Hammered(latencies, time.perf_counter() - begun, unexpected)
