"""Claim-ahead: jobs leased before a request asks for them, so that a consumer pulling in a
loop finds its next batch ready instead of waiting for a claim statement.

The pull scheduler owns one per consumer and uses it for requests whose transport asks for
it (the NATS bridge: JetStream clients send the next pull as the last one fills). Whatever
is held here is handed out after what was ready before it, so the queue's order holds; what
no request takes within READY_GRACE_SECONDS is given back (no retry counted), and nothing is
handed out that has waited longer than READY_MAX_AGE_SECONDS (its lease has run on).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable

from app.domain.pulls import ClaimBatch, Delivery

READY_GRACE_SECONDS = 0.2
READY_MAX_AGE_SECONDS = 1.0

Sized = list[tuple[int, ClaimBatch]]  # each claim with the number of jobs it asked for


class ClaimAhead:
    def __init__(self) -> None:
        self._ready: deque[tuple[float, Delivery]] = deque()
        self._running: tuple[list[int], asyncio.Future[Sized]] | None = None

    @property
    def held(self) -> int:
        """Jobs claimed for requests yet to come: ready to hand out, or being claimed."""
        return len(self._ready) + (sum(self._running[0]) if self._running is not None else 0)

    @property
    def ready(self) -> int:
        return len(self._ready)

    def start(self, sizes: list[int], claims: Awaitable[Sized]) -> None:
        assert self._running is None
        self._running = (sizes, asyncio.ensure_future(claims))

    async def finish(self) -> Sized:
        """Wait for the claims running ahead; the caller keeps what they found."""
        if self._running is None:
            return []
        (_, claims), self._running = self._running, None
        return await claims

    def keep(self, deliveries: list[Delivery], now: float) -> None:
        self._ready.extend((now, d) for d in deliveries)

    def stale(self, now: float) -> list[Delivery]:
        """Ready deliveries kept too long to hand out: their leases have run on meanwhile."""
        stale: list[Delivery] = []
        while self._ready and now - self._ready[0][0] > READY_MAX_AGE_SECONDS:
            stale.append(self._ready.popleft()[1])
        return stale

    def take(self) -> list[Delivery]:
        taken = [d for _, d in self._ready]
        self._ready.clear()
        return taken

    async def give_back(self) -> list[Delivery]:
        """Everything held, the running claims' finds included, for the caller to release."""
        held = self.take()
        for _, batch in await self.finish():
            held.extend(batch.deliveries)
        return held
