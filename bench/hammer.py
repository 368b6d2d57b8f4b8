"""Drive one endpoint from several client threads for a while: the measuring loop
that `idempotency_overhead.py` and `load.py` share."""

import http.client
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# (client number, request number) -> (body, extra headers)
MakeRequest = Callable[[int, int], tuple[str, dict[str, str]]]


@dataclass
class Hammered:
    latencies: list[float]  # seconds, one per request
    elapsed: float  # seconds, wall clock
    errors: int  # answers other than the expected status

    def add(self, other: "Hammered") -> "Hammered":
        return Hammered(
            self.latencies + other.latencies,
            self.elapsed + other.elapsed,
            self.errors + other.errors,
        )

    def figures(self) -> dict:
        ordered = sorted(self.latencies)
        if not ordered:
            return {
                "rps": 0.0,
                "ok_rps": 0.0,
                "p50_ms": 0.0,
                "p99_ms": 0.0,
                "requests": 0,
            }
        return {
            "rps": round(len(ordered) / self.elapsed, 1),
            # Only the answers that were the expected status (a 423 is no execution).
            "ok_rps": round((len(ordered) - self.errors) / self.elapsed, 1),
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000, 2),
            "requests": len(ordered),
            "errors": self.errors,
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
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(n: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        mine, i = [], 0
        while time.monotonic() < stop_at:
            body, extra = make_request(n, i)
            headers = {
                **extra,
                "Authorization": f"Token {token}",
                "Content-Type": "application/json",
            }
            started = time.perf_counter()
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            response.read()
            mine.append(time.perf_counter() - started)
            if response.status != expect:
                with lock:
                    errors[0] += 1
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
    return Hammered(latencies, time.perf_counter() - begun, errors[0])
