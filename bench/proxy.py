"""A TCP proxy on loopback that sometimes cuts a reply half-way.

Clients talk to the proxy; the proxy passes every request to the upstream untouched,
so the server runs it in full. When the answer comes back, with probability
`cut_probability` the proxy forwards only the first half of the response's first
chunk and then closes both sockets: the client sees a broken reply and cannot tell
whether its request took effect, which is exactly the "unknown" outcome an
idempotency key exists for. Cutting is switched on and off with `cutting`.
"""

import random
import socket
import threading
from contextlib import suppress

CHUNK = 65536


class CuttingProxy:
    def __init__(self, upstream_port: int, *, cut_probability: float) -> None:
        self.upstream_port = upstream_port
        self.cut_probability = cut_probability
        self.cutting = False
        self.cuts = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        with suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), 5)
        except OSError:
            client.close()  # the server is down (a worker restarting): a refusal
            return
        upstream.settimeout(None)
        with self._lock:
            self.connections += 1
        threading.Thread(
            target=self._pump, args=(client, upstream), daemon=True
        ).start()
        self._replies(upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Requests, client -> server, unchanged."""
        with suppress(OSError):
            while data := source.recv(CHUNK):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        """Responses, server -> client, each one maybe cut after half a chunk."""
        try:
            while data := upstream.recv(CHUNK):
                if data.startswith(b"HTTP/") and self._cut_now():
                    client.sendall(data[: len(data) // 2])
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _cut_now(self) -> bool:
        if not self.cutting or random.random() >= self.cut_probability:
            return False
        with self._lock:
            self.cuts += 1
        return True
