"""How much of a request the broker reads, and for how long.

- `read_body`: the one function that reads a request body. It stops at its cap (413, the rest
  left unread) and at [http] read-timeout (408), chunked or not; the routes, the management
  forms and the gateway HMAC all read through it.
- `UnreadBodyCloses`: a request answered before its body was read to the end (a refusal, a
  413) is answered with `Connection: close`, so the server does not go on reading and
  discarding the rest of it to reach the next request.
- `head_timeout_protocol`: uvicorn's HTTP protocol with [http] read-header-timeout: a
  connection that has not delivered a whole request head that many seconds after it opened or
  after its previous response is closed (slowloris). uvicorn has no such option: its
  keep-alive timeout is reset by every byte, and a new connection has none at all.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.config import Config
from app.domain.errors import PayloadTooLarge

# What uvicorn buffers of a body before the application asks for it (its flow control's
# HIGH_WATER_LIMIT): a body no larger is, as a rule, already read with its head, so checking
# credentials before it is read would save nothing and cost a database round trip.
PREREAD_BYTES = 65_536

BROADCAST_SUFFIX = "/broadcast"


def declared_length(headers: Headers) -> int | None:
    """The Content-Length a request declares; None when chunked (or absent)."""
    if "transfer-encoding" in headers:
        return None
    raw = headers.get("content-length")
    return int(raw) if raw is not None and raw.isascii() and raw.isdigit() else None


def already_buffered(headers: Headers, limit: int) -> bool:
    """A body declared small enough that the server holds it already, and within `limit`:
    reading it first costs nothing, so its route may leave credentials to its one statement."""
    declared = declared_length(headers)
    if declared is None:
        return "transfer-encoding" not in headers  # no body at all
    return declared <= min(PREREAD_BYTES, limit)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the request body is larger than the limit of {limit} bytes")


def timed_out(seconds: float) -> HTTPException:
    return HTTPException(408, f"the request body did not arrive within {seconds:g} seconds")


async def read_body(receive: Receive, headers: Headers, *, limit: int, within: float) -> bytes:
    """The whole body, refused once it passes `limit` bytes (PayloadTooLarge, 413) or has not
    arrived `within` seconds (HTTPException 408); ClientDisconnect if the client left."""
    declared = declared_length(headers)
    if declared is not None and declared > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(within):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise ClientDisconnect()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise timed_out(within) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def body_limit(config: Config, path: str) -> int:
    """The cap of a request's body: a publish's is the message size limit, every other body's
    [http] max-body-bytes."""
    if path.endswith(BROADCAST_SUFFIX):
        return config.broker.max_message_size_bytes
    return config.http.max_body_bytes


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


class UnreadBodyCloses:
    """Adds `Connection: close` to the answer of a request whose body was not read to its end."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope["headers"]):
            await self._app(scope, receive, send)
            return
        read = False

        async def receiving() -> Message:
            nonlocal read
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                read = True
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and not read:
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self._app(scope, receiving, sending)


def head_timeout_protocol(seconds: float) -> type[asyncio.Protocol]:
    """The HTTP protocol uvicorn's "auto" would choose (httptools when installed, as
    uvicorn[standard] has it, else h11), closing a connection whose request head is late."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn without httptools
        return _h11_protocol(seconds)

    class HeadTimeoutHttpTools(_HeadDeadline, HttpToolsProtocol):
        head_timeout = seconds

        def on_headers_complete(self) -> None:
            self._head_arrived()
            super().on_headers_complete()

    return HeadTimeoutHttpTools


def _h11_protocol(seconds: float) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11(_HeadDeadline, H11Protocol):
        head_timeout = seconds

        def handle_events(self) -> None:
            # h11 makes a new cycle for each request whose head it has parsed.
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:
                self._head_arrived()

    return HeadTimeoutH11


class _HeadDeadline:
    """Counts request heads and responses; while every head has its response, the next head
    is due within `head_timeout` seconds, or the connection is closed. Bytes of a body after
    its answer, or a head trickled a byte at a time, do not move the deadline.

    One timer per connection at a time, not one per request: an answer only notes when it
    left, and a timer that finds the deadline moved sets itself again for the new one (at most
    once per `head_timeout` on a busy connection). Arming and cancelling a timer for every
    request cost an ack about 2% of its CPU."""

    head_timeout: float
    # Provided by uvicorn's protocol classes.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._heads = 0
        self._answers = 0
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)  # type: ignore[misc]
        self._idle_since = self.loop.time()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        self._answers += 1
        super().on_response_complete()  # type: ignore[misc]
        if self._heads == self._answers:
            self._idle_since = self.loop.time()
            if self._head_timer is None:
                self._arm()

    def _head_arrived(self) -> None:
        # The timer stays: when it fires it finds this head (or the deadline its answer set).
        self._heads += 1

    def _arm(self) -> None:
        if not self.transport.is_closing():
            due = self._idle_since + self.head_timeout
            self._head_timer = self.loop.call_at(due, self._late)

    def _late(self) -> None:
        self._head_timer = None
        if self._heads != self._answers:
            return  # a request is being answered: its answer sets the next deadline
        if self.loop.time() < self._idle_since + self.head_timeout:
            self._arm()  # heads came and were answered since: the deadline moved
        elif not self.transport.is_closing():
            self.transport.close()


def uvicorn_limits(config: Config) -> dict[str, Any]:
    """uvicorn.Config's keyword arguments for [http] max-concurrency and read-header-timeout."""
    return {
        "limit_concurrency": config.http.max_concurrency,
        "http": head_timeout_protocol(config.http.read_header_timeout),
    }
