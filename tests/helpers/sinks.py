"""A pull scheduler sink for tests: what the scheduler hands a request, kept."""

from __future__ import annotations

import asyncio

from app.domain.models import Consumer
from app.domain.pulls import Delivery, PullEnd
from app.services.scheduler import Waiter


class Recorder:
    """A sink that keeps what it is told."""

    claims_ahead = False
    outlet = None

    def __init__(self, *, numbered: bool = False) -> None:
        self.numbered = numbered
        self.deliveries: list[Delivery] = []
        self.ended: asyncio.Future[PullEnd] = asyncio.get_running_loop().create_future()
        self.heartbeats: list[tuple[int, int]] = []

    @property
    def ids(self) -> list[int]:
        return [d.job.id for d in self.deliveries]

    def alive(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        self.deliveries.append(delivery)
        return len(delivery.job.payload)

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        assert not self.ended.done(), "a request ends once"
        self.ended.set_result(outcome)

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None:
        self.heartbeats.append((last_seq, last_stream_seq))

    async def flush(self) -> None:
        pass
