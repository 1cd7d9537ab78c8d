"""The dispatcher's HTTP client: pyreqwest (Rust's reqwest and hyper), chosen from the bare POST
loops in bench/post_clients.py (docs/performance.md, "Push delivery"), behind the SSRF guard.

The guard: a callback URL is read once (app.domain.callbacks, the same reading as at PUT time)
and its canonical form is what the client is given; a name is resolved once, every address it
resolves to is checked, and the connection goes to a checked address through a client that has
the name pinned to it (reqwest's ``resolve`` override), so the client never resolves the name
again (DNS rebinding) while the Host header and the TLS server name stay the name's. The check
and its client are trusted for RESOLVED_FOR seconds per URL; a client per (name, address) keeps
its pooled connections across checks.

The answer: at most max_response_bytes of it are read, never decompressed (no Accept-Encoding
is sent, and a Content-Encoding is not undone), so a receiver cannot make a dispatcher hold more
than that; what the job's last error keeps of it is short and printable.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import PyreqwestError, RequestTimeoutError
from pyreqwest.response import ResponseBodyReader

from app.config import PushConfig
from app.domain.callbacks import CallbackPolicy, CallbackUrl, parse_callback_url
from app.domain.errors import InvalidInput

MAX_CHECKED_URLS = 10_000
RESOLVED_FOR = 30.0  # seconds a name's check (and the address it pinned) is trusted

# Clients kept for (name, address) pairs; beyond this the oldest is dropped (a dropped client's
# in-flight requests finish; only its idle connections go).
MAX_PINNED_CLIENTS = 512

# How much of a failed answer's body the job's last error keeps.
ERROR_EXCERPT_BYTES = 200

# Statuses with which a receiver asks for time (with Retry-After) rather than fails.
PUSHED_BACK = (429, 503)

# Resolves a host name (and port) to the addresses a connection may go to, as text.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """getaddrinfo, off the event loop's thread."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | None  # None: no HTTP answer (see error)
    retry_after: str | None = None
    error: str | None = None
    refused: bool = False  # not sent: the callback URL or an address it resolves to is refused


# One answer per status for those with nothing else to tell (the immutable answers are shared:
# one made per delivery showed in the dispatcher's profile).
_PLAIN: dict[int, Answer] = {}


@dataclass(frozen=True, slots=True)
class _Route:
    """A URL's trusted check: until when, why it may not be called (None: it may), and the
    canonical URL and the client (pinned to the checked address) that call it."""

    until: float
    refusal: str | None
    url: str = ""
    client: Client | None = None


def printable(raw: bytes | str, limit: int) -> str:
    """At most ``limit`` characters of ``raw``, with anything unprintable escaped (a receiver's
    text goes into logs and the job's last error)."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Poster:
    def __init__(
        self,
        timeout_seconds: float,
        max_connections: int,
        push: PushConfig | None = None,
        *,
        resolve: Resolver = system_resolver,
    ) -> None:
        push = push or PushConfig()
        self._policy = CallbackPolicy.of(
            push.deny_callback_networks,
            deny_private=push.deny_private_callbacks,
            allow=push.allow_callback_networks,
        )
        self._max_response = push.max_response_bytes
        self._resolve = resolve
        self._timeout = timedelta(seconds=timeout_seconds)
        self._max_connections = max_connections
        # For URLs whose host is an address: no look-up, nothing to pin.
        self._client = self._build()
        self._pinned: dict[tuple[str, str], Client] = {}
        self._checked: dict[str, _Route] = {}

    def _build(self, pin: tuple[str, str] | None = None) -> Client:
        builder = (
            ClientBuilder()
            .timeout(self._timeout)
            .max_connections(self._max_connections)
            .follow_redirects(False)
            # A proxy would resolve the name itself, past the check.
            .no_proxy()
            # Nothing inflated: a small gzip answer must not become a large one in memory.
            .gzip(False)
            .brotli(False)
            .zstd(False)
            .deflate(False)
        )
        if pin is not None:
            # The port is the URL's: the connector sets it on the address.
            builder = builder.resolve(pin[0], pin[1], 0)
        return builder.build()

    def _pinned_client(self, host: str, address: str) -> Client:
        key = (host, address)
        client = self._pinned.get(key)
        if client is None:
            if len(self._pinned) >= MAX_PINNED_CLIENTS:
                del self._pinned[next(iter(self._pinned))]
            client = self._pinned[key] = self._build(key)
        return client

    async def _route(self, url: str) -> _Route:
        """Reads, resolves and checks a URL, and trusts the result for RESOLVED_FOR seconds."""
        route = await self._check(url, time.monotonic() + RESOLVED_FOR)
        if len(self._checked) >= MAX_CHECKED_URLS:  # old callback URLs do not pile up
            self._checked.clear()
        self._checked[url] = route
        return route

    async def _check(self, raw: str, until: float) -> _Route:
        try:
            url = parse_callback_url(raw)
        except InvalidInput as exc:
            return _Route(until, f"callback URL refused: {exc.detail}")
        if url.address is not None:
            refusal = self._policy.refusal(url.address)
            return _Route(until, refusal, url.url, self._client)
        return await self._check_name(url, until)

    async def _check_name(self, url: CallbackUrl, until: float) -> _Route:
        try:
            found = await self._resolve(url.host, url.port)
        except OSError as exc:
            return _Route(until, printable(f"cannot resolve {url.host}: {exc}", 300))
        addresses = []
        for text in found:
            try:
                addresses.append(ipaddress.ip_address(text.split("%", 1)[0]))
            except ValueError:
                return _Route(until, printable(f"{url.host} resolved to {text!r}", 300))
        if not addresses:
            return _Route(until, f"cannot resolve {url.host}: no address")
        # Every address, not only the one used: a name that leads anywhere denied is refused.
        for address in addresses:
            refusal = self._policy.refusal(address)
            if refusal is not None:
                return _Route(
                    until, f"callback host {url.host} resolves to a refused address; {refusal}"
                )
        client = self._pinned_client(url.host, str(addresses[0]))
        return _Route(until, None, url.url, client)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        # The look-up of a trusted check stays out of a coroutine: it runs on every delivery.
        route = self._checked.get(url)
        if route is None or route.until <= time.monotonic():
            route = await self._route(url)
        if route.refusal is not None or route.client is None:
            return Answer(None, error=route.refusal, refused=True)
        cap = self._max_response
        try:
            request = (
                route.client.post(route.url)
                .headers(headers)
                .body_bytes(body)
                .streamed_read_buffer_limit(cap)
                .build_streamed()
            )
            async with request as response:
                status = response.status
                retry_after = response.get_header("retry-after") if status in PUSHED_BACK else None
                kept = await self._read(response.body_reader, cap, 200 <= status < 300)
        except RequestTimeoutError:
            return Answer(None, error="timed out")
        except PyreqwestError as exc:
            return Answer(None, error=printable(f"{type(exc).__name__}: {exc}", 500))
        except ValueError as exc:
            # A header the client cannot send (stored before ids and tokens were checked as
            # header values): recorded as a failed delivery, never an escaped exception.
            return Answer(None, error=printable(f"not sent: {exc}", 500), refused=True)
        if status in PUSHED_BACK:
            return Answer(status, retry_after)
        if kept:
            return Answer(status, error=f"HTTP {status}: {printable(kept, ERROR_EXCERPT_BYTES)}")
        answer = _PLAIN.get(status)
        if answer is None:
            answer = _PLAIN[status] = Answer(status)
        return answer

    @staticmethod
    async def _read(reader: ResponseBodyReader, cap: int, success: bool) -> bytes:
        """Reads the body up to ``cap`` bytes (to its end, the connection can serve another
        delivery; beyond the cap it is closed unread) and keeps the start of a failure's."""
        kept = b""
        total = 0
        while total < cap:
            chunk = await reader.read_chunk()
            if chunk is None:
                break
            if not success and len(kept) < ERROR_EXCERPT_BYTES:
                kept += chunk[: ERROR_EXCERPT_BYTES - len(kept)].to_bytes()
            total += len(chunk)
        return kept

    async def close(self) -> None:
        for client in (self._client, *self._pinned.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._pinned.clear()
        self._checked.clear()
