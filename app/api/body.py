"""Reading bodies by hand: every malformed body is a 400 that says what is wrong, and every
body is read through app/api/limits.read_body, bounded while it is read."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request

from app.api.limits import already_buffered, read_body
from app.config import Config
from app.domain.errors import InvalidInput, PayloadTooLarge

T = TypeVar("T")

# Column ranges: job ids are BIGINT; attempts and timeouts are INTEGER. A delay or timeout
# beyond MAX_INT32 seconds (68 years) would also push a lease past what timestamps hold.
MAX_ID = 2**63 - 1
MAX_INT32 = 2**31 - 1


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


async def json_object(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    raw = await request_body(request)
    if not raw.strip():
        if empty_ok:
            return {}
        raise InvalidInput("the request body must be a JSON object")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, bad UTF-8 and integers too long to convert.
        raise InvalidInput(f"malformed JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("the request body must be a JSON object")
    return value


def whole_number(value: object, name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer (10 or 10.0) within bounds; booleans, fractions and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be an integer")
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidInput(f"{name} must be a whole number")
        value = int(value)
    if value < minimum:
        raise InvalidInput(f"{name} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidInput(f"{name} must be at most {maximum}")
    return value


def job_id(value: object, name: str = "id") -> int:
    """A job id, as a string of digits (what responses give: JavaScript rounds integers past
    2^53) or a JSON integer."""
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit() or len(value) > 19:
            raise InvalidInput(f"{name} must be a job id: a string of digits or an integer")
        value = int(value)
    return whole_number(value, name, minimum=1, maximum=MAX_ID)


def seconds(value: object, name: str, *, maximum: float = MAX_INT32) -> float:
    """A finite, non-negative number of seconds, at most `maximum`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number of seconds")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number of seconds")
    if value < 0:
        raise InvalidInput(f"{name} must not be negative")
    if value > maximum:
        raise InvalidInput(f"{name} must be at most {maximum} seconds")
    return float(value)


def optional_str(value: object, name: str) -> str | None:
    """A string or null. NUL characters are refused here, on every database: PostgreSQL cannot
    store them, and SQLite would keep what PostgreSQL refuses."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string")
    if "\x00" in value:
        raise InvalidInput(f"{name} must not contain NUL characters")
    return value


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
