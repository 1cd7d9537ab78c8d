"""consume(): a buffer of jobs kept topped up by overlapping streaming pulls, as the simplified
consumer API (NATS ADR-37) has JetStream clients do it.

The count that decides everything is `pending`: jobs asked for and not yet received, plus jobs
received and not yet finished. Each pull adds what it asks for; each finished job takes one off;
each pull's end takes off what it did not deliver (its status line says how many). Whenever
pending falls below the threshold (25% of max_messages by default), a new pull asks for the
difference up to max_messages: never more than max_messages jobs are asked for or held
unfinished at once. The same goes for bytes when max_bytes is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from webhook_broker_client.errors import (
    BrokerError,
    ConsumerGone,
    HeartbeatError,
    InvalidRequest,
    NotFound,
    Unauthorized,
)
from webhook_broker_client.jobs import Job
from webhook_broker_client.pulls import stream_pull

if TYPE_CHECKING:
    from webhook_broker_client.consumer import PullConsumer

Handler = Callable[[Job], Awaitable[None] | None]
ErrorCallback = Callable[[Exception], None]

FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
# The most one streaming pull may ask for, by default ([pull] max-stream-batch).
MAX_STREAM_BATCH = 4096
# The longest heartbeat interval that consume() picks by itself (ADR-37's default, 30 s).
MAX_DEFAULT_HEARTBEAT = 30.0
# ADR-37's default buffer when neither max_messages nor max_bytes is given.
DEFAULT_MAX_MESSAGES = 1000


@dataclass(frozen=True, slots=True)
class ConsumeOptions:
    # ADR-37: max_messages and max_bytes are exclusive; neither given, max_messages is 1,000.
    # With max_bytes alone, the count is bounded only by one streaming pull's batch (4096).
    max_messages: int | None = None
    max_bytes: int | None = None
    expires: float = 60.0  # ADR-37's default
    idle_heartbeat: float | None = None  # default: half of expires, at most 30 s (ADR-37)
    threshold_messages: int | None = None  # default: 25% of max_messages, rounded up
    threshold_bytes: int | None = None  # default: 25% of max_bytes, rounded up
    concurrency: int = 10
    auto_ack: bool = True
    error_callback: ErrorCallback | None = None
    terms: dict[str, Any] = field(default_factory=dict)  # priority group fields of each pull
    on_pinned: Callable[[str], None] | None = None
    on_unpinned: Callable[[str], None] | None = None
    # ADR-37: a heartbeat error ends consume() (wait() raises it). False: it is only reported
    # to error_callback and the pull is issued again.
    stop_on_heartbeat_error: bool = True

    def __post_init__(self) -> None:
        if self.max_messages is not None and self.max_bytes is not None:
            raise ValueError("max_messages and max_bytes are exclusive (ADR-37): give one")
        if self.message_limit < 1:
            raise ValueError("max_messages must be at least 1")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 < self.heartbeat <= self.expires / 2:
            raise ValueError("idle_heartbeat must be positive and at most half of expires")
        if not 1 <= self.message_threshold <= self.message_limit:
            raise ValueError("threshold_messages must be between 1 and max_messages")

    @property
    def message_limit(self) -> int:
        """The most jobs asked for or held unfinished at once."""
        if self.max_messages is not None:
            return self.max_messages
        return DEFAULT_MAX_MESSAGES if self.max_bytes is None else MAX_STREAM_BATCH

    @property
    def heartbeat(self) -> float:
        if self.idle_heartbeat is not None:
            return self.idle_heartbeat
        return min(self.expires / 2, MAX_DEFAULT_HEARTBEAT)

    @property
    def message_threshold(self) -> int:
        if self.threshold_messages is not None:
            return self.threshold_messages
        return math.ceil(self.message_limit * 0.25)

    @property
    def byte_threshold(self) -> int | None:
        if self.max_bytes is None:
            return None
        if self.threshold_bytes is not None:
            return self.threshold_bytes
        return math.ceil(self.max_bytes * 0.25)


class ConsumeContext:
    """A running consume(). With a handler, `concurrency` workers call it for each job; without
    one, iterate it (`async for job in context`) and settle each job yourself. `stop()` ends it
    at once, `drain()` after the buffered jobs; `wait()` until it has ended (raising the error
    that ended it, if one did)."""

    def __init__(
        self, consumer: PullConsumer, handler: Handler | None, options: ConsumeOptions
    ) -> None:
        self._consumer = consumer
        self._handler = handler
        self.options = options
        self.pending = 0  # jobs asked for and not received, plus received and not finished
        self.pending_bytes = 0
        self.pulls_issued = 0
        # Heartbeats heard on its pulls: that a pull is open and the broker answering, seen
        # without a job (monitoring, tests).
        self.heartbeats = 0
        self._buffer: deque[Job] = deque()
        self._open: set[Job] = set()  # received, not finished
        self._arrived = asyncio.Event()  # the buffer has jobs, or the context is ending
        self._changed = asyncio.Event()  # pending fell, or the state changed
        self._idle = asyncio.Event()  # no handler is running
        self._idle.set()
        self._running_handlers = 0
        self._pulls: set[asyncio.Task[None]] = set()
        self._workers: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._state = "running"  # then "draining" or "stopping", then "closed"
        self._error: BrokerError | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The error that ended it goes to the error callback as well: nobody need wait().
        self._done.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._main = asyncio.create_task(self._run(), name="consume")

    # -- the caller's side ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._done.done()

    async def wait(self) -> None:
        await asyncio.shield(self._done)

    async def stop(self) -> None:
        """Pull nothing more; hand back the buffered jobs no worker has started (no retry
        counted); let the running handlers finish."""
        if self._state in ("running", "draining"):
            self._state = "stopping"
            self._wake()
        await self._settled_end()

    async def drain(self) -> None:
        """Pull nothing more; finish every buffered job, then end."""
        if self._state == "running":
            self._state = "draining"
            self._wake()
        await self._settled_end()

    async def __aenter__(self) -> ConsumeContext:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def __aiter__(self) -> ConsumeContext:
        if self._handler is not None:
            raise TypeError("a consume() with a handler is not iterated")
        return self

    async def __anext__(self) -> Job:
        while not self._buffer:
            if self._state in ("stopping", "closed") or (
                self._state == "draining" and not self._pulls
            ):
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._arrived.clear()
            await self._arrived.wait()
        return self._buffer.popleft()

    async def _settled_end(self) -> None:
        with contextlib.suppress(BrokerError):
            await self.wait()

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._handler is not None:
            self._workers = [
                asyncio.create_task(self._work(), name=f"consume-worker-{n}")
                for n in range(self.options.concurrency)
            ]
        try:
            while self._state == "running":
                wait = self._retry_at - loop.time()
                if wait <= 0:
                    self._top_up()
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait if wait > 0 else None)
            if self._state == "draining":
                await self._finish_buffer()
            await self._close()
        except asyncio.CancelledError:
            self._done.cancel()
            raise
        except Exception as exc:
            await self._close()
            self._done.set_exception(exc)
            return
        if self._error is not None:
            self._done.set_exception(self._error)
        else:
            self._done.set_result(None)

    def _top_up(self) -> None:
        o = self.options
        wanted = o.message_limit - self.pending
        low = self.pending < o.message_threshold
        byte_budget: int | None = None
        if o.max_bytes is not None:
            byte_budget = o.max_bytes - self.pending_bytes
            threshold = o.byte_threshold
            assert threshold is not None
            low = low or self.pending_bytes < threshold
            if byte_budget <= 0:
                return
        if wanted <= 0 or not low:
            return
        while wanted > 0:  # more than one stream may take when max_messages is that large
            batch = min(wanted, MAX_STREAM_BATCH)
            wanted -= batch
            self.pending += batch
            self.pending_bytes += byte_budget or 0
            self.pulls_issued += 1
            task = asyncio.create_task(self._pull(batch, byte_budget), name="consume-pull")
            self._pulls.add(task)
            task.add_done_callback(self._pulls.discard)
            if byte_budget is not None:
                break  # the byte budget went to that one

    async def _pull(self, batch: int, max_bytes: int | None) -> None:
        o = self.options
        consumer = self._consumer
        received = 0
        received_bytes = 0
        left, left_bytes = batch, max_bytes or 0

        def on_job(body: dict[str, Any], pin: str | None) -> None:
            nonlocal received, received_bytes
            job = consumer.job(body, pin)
            received += 1
            received_bytes += len(job.payload)
            self._pin_seen(pin)
            self._accept(job)

        body: dict[str, Any] = {
            "batch": batch,
            "expires": o.expires,
            "idle_heartbeat": o.heartbeat,
            **o.terms,
        }
        if max_bytes is not None:
            body["max_bytes"] = max_bytes
        if consumer.pin_id is not None:
            body["id"] = consumer.pin_id
        try:
            end = await stream_pull(
                consumer.http,
                consumer.path + "/pull",
                consumer.headers,
                body,
                on_job,
                silence=2 * o.heartbeat,
                on_heartbeat=self._heard_heartbeat,
            )
        except HeartbeatError as exc:
            if o.stop_on_heartbeat_error:
                self._terminal(exc)
            else:
                self._report(exc)  # issued again at once: the next one times out as well
            left, left_bytes = batch - received, max(0, (max_bytes or 0) - received_bytes)
        except (NotFound, Unauthorized) as exc:
            self._terminal(ConsumerGone(exc.status, exc.detail))
            left, left_bytes = batch - received, max(0, (max_bytes or 0) - received_bytes)
        except InvalidRequest as exc:
            self._terminal(exc)
            left, left_bytes = batch - received, max(0, (max_bytes or 0) - received_bytes)
        except BrokerError as exc:  # 5xx, a connection that failed, 409 too many pulls
            self._report(exc)
            self._back_off()
            left, left_bytes = batch - received, max(0, (max_bytes or 0) - received_bytes)
        except asyncio.CancelledError:
            left, left_bytes = batch - received, max(0, (max_bytes or 0) - received_bytes)
            raise
        else:
            self._failures = 0
            left, left_bytes = end.pending_messages, end.pending_bytes
            if end.status == 410:
                self._terminal(ConsumerGone(410, end.reason))
            elif end.status == 423:
                self._pin_lost(end.reason)
            elif end.status == 503:
                self._back_off()  # that process is shutting down: another may answer
        finally:
            self.pending -= left
            self.pending_bytes -= left_bytes if max_bytes is not None else 0
            self._changed.set()

    def _heard_heartbeat(self) -> None:
        self.heartbeats += 1

    def _accept(self, job: Job) -> None:
        self._open.add(job)
        job._on_settled = self._settled_by_hand
        if self._state == "stopping" or self.closed:
            self._hand_back(job)
            return
        self._buffer.append(job)
        self._arrived.set()

    def _settled_by_hand(self, job: Job) -> None:
        # An iterated job (or one the handler settled) is finished once settled.
        if self._handler is None:
            self._finished(job)

    def _finished(self, job: Job) -> None:
        if job in self._open:
            self._open.discard(job)
            self.pending -= 1
            if self.options.max_bytes is not None:
                self.pending_bytes -= len(job.payload)
            self._changed.set()

    # -- workers -----------------------------------------------------------------------------------

    async def _work(self) -> None:
        assert self._handler is not None
        while True:
            while not self._buffer:
                if self._state != "running" and (self._state == "stopping" or not self._pulls):
                    return
                self._arrived.clear()
                await self._arrived.wait()
            if self._state == "stopping":
                return
            job = self._buffer.popleft()
            self._running_handlers += 1
            self._idle.clear()
            try:
                await self._handle(job)
            finally:
                self._running_handlers -= 1
                if not self._running_handlers:
                    self._idle.set()
                self._finished(job)

    async def _handle(self, job: Job) -> None:
        assert self._handler is not None
        try:
            result = self._handler(job)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self._report(exc)
            if not job.settled:
                try:
                    await job.nak()
                except Exception as nak_error:
                    self._report(nak_error)
            return
        if self.options.auto_ack and not job.settled:
            try:
                await job.ack()
            except Exception as exc:
                self._report(exc)

    # -- ending --------------------------------------------------------------------------------

    async def _finish_buffer(self) -> None:
        """Draining: the workers (or the iterating caller) take what is buffered and what the
        pulls still open deliver; then the pulls are closed."""
        while self._buffer or self._running_handlers or (self._handler is None and self._open):
            self._changed.clear()
            self._arrived.set()
            waits = [asyncio.ensure_future(self._changed.wait())]
            if self._running_handlers:
                waits.append(asyncio.ensure_future(self._idle.wait()))
            _, undone = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in undone:
                task.cancel()
            if self._state == "stopping":
                return

    async def _close(self) -> None:
        self._state = "stopping" if self._state != "closed" else self._state
        self._arrived.set()
        while self._buffer:
            self._hand_back(self._buffer.popleft())
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        # The pulls are closed last, once nothing they delivered is being worked on: the broker
        # takes back the jobs of a stream closed early, the settled ones excepted.
        for task in list(self._pulls):
            task.cancel()
        if self._pulls:
            await asyncio.gather(*self._pulls, return_exceptions=True)
        while self._buffer:
            self._hand_back(self._buffer.popleft())
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self._consumer.acks.close()
        self._state = "closed"
        self._arrived.set()

    def _hand_back(self, job: Job) -> None:
        task = asyncio.create_task(self._give_back(job))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _give_back(self, job: Job) -> None:
        try:
            await job.hand_back()
        except BrokerError:
            pass  # the broker has it back already (its stream closed), or its lease ran out
        finally:
            self._finished(job)

    def _terminal(self, error: BrokerError) -> None:
        if self._error is None:
            self._error = error
            self._report(error)
        if self._state in ("running", "draining"):
            self._state = "stopping"
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._arrived.set()

    def _back_off(self) -> None:
        self._failures += 1
        delay = min(FIRST_BACKOFF * 2 ** (self._failures - 1), MAX_BACKOFF)
        loop = asyncio.get_running_loop()
        self._retry_at = max(self._retry_at, loop.time() + delay * random.uniform(0.5, 1.0))

    def _report(self, error: Exception) -> None:
        if self.options.error_callback is not None:
            # The callback's own failure must not end the consume.
            with contextlib.suppress(Exception):
                self.options.error_callback(error)

    # -- pinned_client ---------------------------------------------------------------------------

    def _pin_seen(self, pin: str | None) -> None:
        consumer = self._consumer
        if pin is not None and pin != consumer.pin_id:
            consumer.pin_id = pin
            if self.options.on_pinned is not None:
                self.options.on_pinned(pin)

    def _pin_lost(self, reason: str) -> None:
        consumer = self._consumer
        if consumer.pin_id is not None:
            lost, consumer.pin_id = consumer.pin_id, None
            if self.options.on_unpinned is not None:
                self.options.on_unpinned(lost)
