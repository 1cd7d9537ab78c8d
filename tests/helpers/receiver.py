"""A real HTTP receiver on loopback for push-delivery tests (threads, no mocks)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """Records every POST; `respond(path, attempt_number)` picks (status, delay seconds) or
    (status, delay seconds, response headers)."""

    url: str
    requests: list[Received] = field(default_factory=list)
    respond: Callable[[str, int], tuple[int, float] | tuple[int, float, dict[str, str]]] = (
        lambda _path, _n: (200, 0.0)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.path == path)

    def by_message(self) -> Counter[str]:
        with self.lock:
            return Counter(r.headers.get("x-broker-message-id", "") for r in self.requests)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.requests.append(
                    Received(
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.monotonic(),
                    )
                )
                n = sum(1 for r in receiver.requests if r.path == self.path)
            answer = receiver.respond(self.path, n)
            status, delay = answer[0], answer[1]
            extra = answer[2] if len(answer) > 2 else {}
            if delay:
                time.sleep(delay)
            try:
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler, "receiver") as base_url:
        receiver.url = base_url
        yield receiver


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], name: str) -> Iterator[str]:
    """A threaded HTTP server for `handler` on a free loopback port, for as long as the block
    runs; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
