"""Waiting for an event, not for time: poll a condition until it holds or a deadline passes,
and fail saying what was awaited (and what was last seen), never a bare `sleep` that assumes a
state. `eventually` is the async form, `eventually_sync` the one for tests without a loop.

A condition returns something truthy when the awaited state holds; that value is returned, so
a test can wait for a row and use it. It may also raise AssertionError while the state is not
there yet: the last such error is quoted when the deadline passes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

TIMEOUT = 10.0
# Short enough that a test does not wait much past its event, long enough that polling a
# database or a process does not take the CPU the thing being waited for needs.
INTERVAL = 0.05


def _failure(what: str, timeout: float, last: object) -> AssertionError:
    seen = f"; last seen: {last!r}" if last is not None else ""
    return AssertionError(f"not reached within {timeout:g} s: {what}{seen}")


def _describe(condition: Callable[..., object], what: str | None) -> str:
    if what:
        return what
    return getattr(condition, "__qualname__", None) or repr(condition)


@overload
async def eventually(
    condition: Callable[[], Awaitable[T]],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    what: str | None = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    what: str | None = ...,
) -> T: ...


# The deadline is the point of this helper, and the message names it: asyncio.timeout would
# cancel a condition half way and say nothing of what was awaited.
async def eventually(
    condition: Callable[[], Any],
    timeout: float = TIMEOUT,  # noqa: ASYNC109
    interval: float = INTERVAL,
    *,
    what: str | None = None,
) -> Any:
    """Poll `condition` (a plain or a coroutine function) until it returns a truthy value,
    and return that value; AssertionError naming `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    while True:
        try:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = result
        except AssertionError as error:
            last = error
        if loop.time() >= deadline:
            raise _failure(_describe(condition, what), timeout, last)
        await asyncio.sleep(interval)


def eventually_sync(
    condition: Callable[[], T],
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    *,
    what: str | None = None,
) -> T:
    """The blocking form of `eventually`, for tests and helpers that run no event loop."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = condition()
            if result:
                return result
            last = result
        except AssertionError as error:
            last = error
        if time.monotonic() >= deadline:
            raise _failure(_describe(condition, what), timeout, last)
        time.sleep(interval)
