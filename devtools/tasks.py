"""Background tasks held for as long as an `async with` block lasts: the bench's and the tests'
loads (open console pages; a producer and a worker) share how they start and stop them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self


class Background:
    """A subclass sets up what its tasks need and starts them in `open`; `close` cancels and
    awaits every task, so none outlives the block, and then closes what `open` set up. A
    failed `open` is closed at once, so a half-opened load leaves nothing running."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    async def open(self) -> None:
        """Set up and `start` the tasks."""

    async def close(self) -> None:
        """Stop the tasks; a subclass then closes what it opened (and may raise `stop`'s
        errors: the tasks' own failures, which cancelling would otherwise hide)."""
        await self.stop()

    def start(self, *work: Coroutine[Any, Any, None]) -> None:
        self._tasks.extend(asyncio.create_task(w) for w in work)

    def failure(self) -> BaseException | None:
        """The first error a task has stopped on so far, if any."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def stop(self) -> list[BaseException]:
        """Cancel every task and wait for each to end; the errors they had stopped on before."""
        for task in self._tasks:
            task.cancel()
        errors: list[BaseException] = []
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except BaseException as exc:
                errors.append(exc)
        self._tasks = []
        return errors

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
