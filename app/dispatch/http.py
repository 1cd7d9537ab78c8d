"""The dispatcher's HTTP client: pyreqwest (Rust's reqwest and hyper), chosen from the bare POST
loops in bench/post_clients.py (README, Push: the client comparison), with the guard against
callbacks that resolve to link-local (cloud metadata) addresses."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import PyreqwestError, RequestTimeoutError

from app.domain.callbacks import blocked_address, literal_host

RESOLVED_FOR = 30.0  # seconds a name's check is trusted


# Statuses with which a receiver asks for time (with Retry-After) rather than fails.
PUSHED_BACK = (429, 503)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | None  # None: no HTTP answer (see error)
    retry_after: str | None = None
    error: str | None = None
    refused: bool = False  # not sent: the callback is or resolves to a link-local address


# One answer per status for those with nothing else to tell (the immutable answers are shared:
# one made per delivery showed in the dispatcher's profile).
_PLAIN: dict[int, Answer] = {}


class Poster:
    def __init__(self, timeout_seconds: float, max_connections: int) -> None:
        self._client: Client = (
            ClientBuilder()
            .timeout(timedelta(seconds=timeout_seconds))
            .max_connections(max_connections)
            .follow_redirects(False)
            .build()
        )
        # By URL (the per-delivery look-up): when its check stops being trusted, and why the
        # URL may not be called (None: it may).
        self._checked: dict[str, tuple[float, str | None]] = {}

    async def _refusal(self, url: str) -> str | None:
        """Why a URL may not be called (its host is or resolves to a blocked address),
        checked again once the last check is no longer trusted."""
        reason = await self._check(url)
        self._checked[url] = (time.monotonic() + RESOLVED_FOR, reason)
        return reason

    @staticmethod
    async def _check(url: str) -> str | None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        literal = literal_host(host)
        if literal is not None:
            return "callback is a link-local address" if blocked_address(literal) else None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, parts.port or 80, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            return f"cannot resolve {host}: {exc}"
        blocked = any(blocked_address(str(info[4][0])) for info in infos)
        return f"callback host {host} resolves to a link-local address" if blocked else None

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        # The look-up of a trusted check stays out of a coroutine: it runs on every delivery.
        known = self._checked.get(url)
        if known is not None and known[0] > time.monotonic():
            refusal = known[1]
        else:
            refusal = await self._refusal(url)
        if refusal is not None:
            return Answer(None, error=refusal, refused=True)
        try:
            request = self._client.post(url).headers(headers).body_bytes(body).build()
            response = await request.send()
        except RequestTimeoutError:
            return Answer(None, error="timed out")
        except PyreqwestError as exc:
            return Answer(None, error=f"{type(exc).__name__}: {exc}"[:500])
        status = response.status
        if status in PUSHED_BACK:
            retry_after = None
            with contextlib.suppress(KeyError):
                retry_after = response.headers["retry-after"]
            return Answer(status, retry_after)
        answer = _PLAIN.get(status)
        if answer is None:
            answer = _PLAIN[status] = Answer(status)
        return answer

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._client.close()
