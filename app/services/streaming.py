"""Streaming pulls over HTTP: one request that waits in the pull scheduler like a JetStream
pull request, receiving jobs as they are claimed, idle heartbeats, and how it ended.

The scheduler hands deliveries to a `StreamSink`; the transport takes them out as `StreamEvent`s
and writes them. A requester that goes away mid-stream leaves jobs it may never have seen:
they go back to the queue without a retry counted, as the bridge does with claims nobody took.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from app.domain.models import Consumer, PulledJob
from app.domain.pulls import Delivery, PullEnd, exceeds_max_bytes
from app.services.claiming import ClaimSource
from app.services.scheduler import PullScheduler, Waiter

# Jobs handed to a stream and not yet written that make it stop taking more: a client that
# reads slowly holds back its own stream only (the rest are claimed for other requests).
BUFFER_JOBS = 1024
# The same in payload bytes ([pull] max-stream-buffer-bytes): 1024 jobs of the largest message
# size would otherwise be gigabytes held for one slow reader. The job that crosses it is kept.
BUFFER_BYTES = 8_388_608


@dataclass(frozen=True, slots=True)
class StreamedJob:
    job: PulledJob
    pending: int
    pin: str | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class StreamEnd:
    outcome: PullEnd
    batch_left: int
    bytes_left: int | None


StreamEvent = StreamedJob | Heartbeat | StreamEnd


class StreamSink:
    """The scheduler's sink for one streaming pull: events wait here until written."""

    numbered = False
    claims_ahead = False

    def __init__(self, wake: Callable[[], None], max_bytes: int = BUFFER_BYTES) -> None:
        self._events: deque[StreamEvent] = deque()
        self._buffered = 0  # jobs among the events
        self._buffered_bytes = 0  # and their payloads' bytes
        self._max_bytes = max_bytes
        self._changed = asyncio.Event()
        self._wake = wake  # the consumer's queue, once this stream can take jobs again
        self.gone = False
        self.ended = False
        self.written: list[tuple[int, int]] = []  # (id, attempt) of jobs taken out to write

    @property
    def outlet(self) -> Hashable:
        return self

    def alive(self) -> bool:
        return not self.gone

    def ready(self) -> bool:
        return self._buffered < BUFFER_JOBS and self._buffered_bytes < self._max_bytes

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        size = len(delivery.job.payload)
        if exceeds_max_bytes(size, bytes_left):
            return None
        self._events.append(StreamedJob(delivery.job, delivery.pending, delivery.pin))
        self._buffered += 1
        self._buffered_bytes += size
        return size

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        self.ended = True
        self._events.append(StreamEnd(outcome, waiter.batch_left, waiter.bytes_left))
        self._changed.set()

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None:
        self._events.append(Heartbeat())
        self._changed.set()

    async def flush(self) -> None:
        if self._events:
            self._changed.set()

    async def take(self) -> list[StreamEvent]:
        """The events not yet taken, waiting for one when there is none."""
        while not self._events:
            self._changed.clear()
            await self._changed.wait()
        events = list(self._events)
        self._events.clear()
        full = not self.ready()
        for event in events:
            if isinstance(event, StreamedJob):
                self.written.append((event.job.id, event.job.attempt))
        self._buffered = 0
        self._buffered_bytes = 0
        if full and not self.ended:
            self._wake()
        return events

    def unwritten(self) -> list[tuple[int, int]]:
        return [(e.job.id, e.job.attempt) for e in self._events if isinstance(e, StreamedJob)]


class PullStream:
    """One streaming pull in the scheduler. `events()` until a StreamEnd; `close()` always."""

    def __init__(
        self, scheduler: PullScheduler, claims: ClaimSource, consumer: Consumer, waiter: Waiter
    ) -> None:
        assert isinstance(waiter.sink, StreamSink)
        self._scheduler = scheduler
        self._claims = claims
        self._consumer = consumer
        self._waiter = waiter
        self.sink: StreamSink = waiter.sink
        self._finished = False

    async def events(self) -> list[StreamEvent]:
        return await self.sink.take()

    def finished(self) -> None:
        """The last event (its StreamEnd) reached the requester: its jobs are its own."""
        self._finished = True

    async def close(self) -> None:
        """The requester is done, or gone: when gone before the end reached it, every job it
        was given and has not settled goes back to the queue, no retry counted."""
        sink = self.sink
        sink.gone = True
        if not sink.ended:
            self._scheduler.drop(lambda w: w is self._waiter)
        pk = self._consumer.pk
        await self._claims.release(pk, sink.unwritten())
        if not self._finished:
            await self._claims.release(pk, sink.written, sent=True)
