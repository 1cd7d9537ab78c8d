"""When consumers that expire (an inactive threshold: ephemeral ones, and durables that set
one) were last in use, written for the sweeper (app/services/sweeping.py).

In use, as nats-server counts a pull consumer's activity (server/consumer.go, deleteNotActive
and suppressDeletion): a pull request arriving or still waiting, a delivery, an ack. Each
event only marks the consumer here; every FLUSH_SECONDS one statement writes the marks, so the
pull path writes nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from app.domain.models import Consumer
from app.logging import log_failure

log = logging.getLogger(__name__)

# Far below any threshold a client sets in practice (nats-server adds 0.1-1 s of jitter to a
# pull consumer's threshold, so a mark this late never tips a consumer over).
FLUSH_SECONDS = 0.25


class Activity:
    def __init__(
        self,
        mark_active: Callable[[list[int]], Awaitable[None]],
        num_waiting: Callable[[int], int],
    ) -> None:
        self._mark_active = mark_active
        self._num_waiting = num_waiting
        self._touched: set[int] = set()
        # Expiring consumers this process has served: those with pulls still waiting are in use.
        self._known: set[int] = set()

    def touch(self, consumer: Consumer) -> None:
        if consumer.options.inactive_threshold:
            self._touched.add(consumer.pk)
            self._known.add(consumer.pk)

    def take(self) -> list[int]:
        waiting = {pk for pk in self._known if self._num_waiting(pk) > 0}
        self._known = waiting | self._touched
        marks, self._touched = self._touched | waiting, set()
        return sorted(marks)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=FLUSH_SECONDS)
            await self.flush()

    async def flush(self) -> None:
        marks = self.take()
        if not marks:
            return
        try:
            await self._mark_active(marks)
        except Exception:
            self._touched.update(marks)  # written next round
            log_failure(log, "marking %d consumers active failed", len(marks))
