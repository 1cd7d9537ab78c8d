"""Reading bodies by hand: every body is read through app/api/limits.read_body, bounded while
it is read, and a JSON one is validated by its model (app/api/schemas) once the credentials
allow it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from app.api.limits import already_buffered, read_body
from app.config import Config
from app.domain.errors import InvalidInput, PayloadTooLarge

T = TypeVar("T")


def _config(request: Request) -> Config:
    config = request.app.state.runtime.config
    assert isinstance(config, Config)
    return config


def body_cap(request: Request) -> int:
    """A JSON or form body's cap: [http] max-body-bytes."""
    return _config(request).http.max_body_bytes


async def request_body(request: Request, limit: int | None = None) -> bytes:
    """The request's body, at most `limit` bytes ([http] max-body-bytes unless given)."""
    config = _config(request)
    return await read_body(
        request.receive,
        request.headers,
        limit=config.http.max_body_bytes if limit is None else limit,
        within=config.http.read_timeout,
    )


async def body_after_credentials(
    request: Request,
    parse: Callable[[], Awaitable[T]],
    authenticate: Callable[[], Awaitable[object]],
    limit: int | None = None,
) -> T:
    """Parse a body only once the credentials in its headers allow it: a body the server
    holds already (small, declared) is parsed first and the credentials checked only when it
    is bad, so their 404/403/401/412 win and a good request costs no extra round trip; any
    other body (chunked, large) is read only after the credentials are checked."""
    cap = body_cap(request) if limit is None else limit
    if not already_buffered(request.headers, cap):
        await authenticate()
        return await parse()
    try:
        return await parse()
    except (InvalidInput, PayloadTooLarge):
        await authenticate()
        raise
