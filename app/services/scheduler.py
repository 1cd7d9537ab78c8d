"""The pull scheduler: every waiting pull request of this process, HTTP long polls and NATS
pull requests alike, held per consumer as plain data and served from shared claims.

One `ConsumerQueue` per consumer with waiting requests. What a round does (claims, which job
goes to which request, which requests end and how, when to look again) is planned without
I/O in `app/domain/pull_round.py`, after nats-server 2.15 (protocol doc section 4), by the
consumer's wait policy and the pin and overflow terms of `app/domain/pull_policies.py`. The
queue is the loop that carries the plan out against the claim source and the sinks, and
sleeps until a request arrives, one expires, a delayed job falls due, or a wake-up
(PostgreSQL NOTIFY, in-process signal) says the consumer's queue changed: it never polls the
table. Heartbeats and expiry run on loop timers, so they go out on time while a claim runs.
Each transport hands in a `PullSink` per request and translates what the scheduler tells it
(deliveries, heartbeats, how the request ended) into its own terms; the scheduler knows no
status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import string
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from app.domain import pull_policies
from app.domain.models import Consumer
from app.domain.priority import PLAIN, PriorityPolicy, PullPriority
from app.domain.pull_policies import Overflow, Pinned, Prioritized, RoundRobin, Terms
from app.domain.pull_round import (
    MIN_RECHECK_SECONDS,
    OVERFLOW_RECHECK_SECONDS,
    PARALLEL_CLAIMS,
    Adopt,
    AssignPin,
    Claim,
    ClaimAlone,
    Clock,
    Command,
    End,
    FinishAhead,
    Give,
    GiveBack,
    GiveWithin,
    KeepAhead,
    Limits,
    LoadSequences,
    Phase,
    QueueState,
    ReadBacklog,
    ReadPin,
    Recheck,
    Rechecked,
    Release,
    ReleaseStale,
    StartAhead,
    TakeAhead,
    TouchPin,
    in_stream_order,
    round_steps,
)
from app.domain.pulls import ClaimBatch, Delivery, PullEnd
from app.logging import log_failure
from app.services import claim_ahead
from app.services.claim_ahead import ClaimAhead, Sized
from app.services.claiming import ClaimSource
from app.services.signals import Signals

log = logging.getLogger(__name__)

__all__ = [
    "MIN_RECHECK_SECONDS",
    "OVERFLOW_RECHECK_SECONDS",
    "PARALLEL_CLAIMS",
    "ConsumerQueue",
    "Overflow",
    "Pinned",
    "Prioritized",
    "PullObserver",
    "PullScheduler",
    "PullSink",
    "RoundRobin",
    "WaitPolicy",
    "Waiter",
    "new_pin_id",
    "policy_for",
]

# After a failed claim (database down), or while no requester can take a delivery.
RETRY_SECONDS = 0.5
# A queue whose requests are all answered stays this long for the next one (a consumer
# pulling in a loop sends it within moments; a new queue would read its sequences again).
LINGER_SECONDS = 5.0
# How long closing waits for idle queues to give back what they claimed ahead.
SETTLE_SECONDS = 5.0

# Claims that ran side by side, merged into queue order (the round planner's; kept here for
# the tests that name it so).
_in_stream_order = in_stream_order


class PullSink(Protocol):
    """Where one waiting request's deliveries and ending go: its transport."""

    @property
    def numbered(self) -> bool:
        """Deliveries need the consumer's delivery sequence numbers (JetStream's)."""

    @property
    def claims_ahead(self) -> bool:
        """The requester pulls in a loop: claim for its next request while this one is sent."""

    @property
    def outlet(self) -> Hashable:
        """Sinks with the same outlet are flushed once (one connection)."""

    def alive(self) -> bool:
        """False once nobody can receive the deliveries (the requester went away)."""

    def ready(self) -> bool:
        """The transport can take a delivery now."""

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        """Send the delivery and say how many bytes it counts; None (and nothing sent) when
        it would exceed `bytes_left`."""

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        """The request is over; `pending` is the due jobs its consumer had at the last claim."""

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None: ...

    async def flush(self) -> None: ...


@dataclass(eq=False, slots=True)
class Waiter:
    """One waiting pull request."""

    sink: PullSink
    batch_left: int
    bytes_left: int | None = None
    no_wait: bool = False
    expires_given: bool = True  # JetStream: a no_wait request with expires waits once served
    expires_at: float | None = None  # loop time
    heartbeat: float | None = None  # seconds of idleness between heartbeats
    incremental_timeout: int = 0
    ends_on_delivery: bool = False
    terms: PullPriority = PLAIN
    pin_checked: bool = False  # pinned_client: its pin id was compared with the pin
    delivered: int = 0
    arrived: float = 0.0  # loop time it began to wait
    expiry: asyncio.TimerHandle | None = None
    beat: asyncio.TimerHandle | None = None

    @property
    def own_claim(self) -> bool:
        """Its claim terms differ from the consumer's: it cannot share a claim."""
        return self.bytes_left is not None or self.incremental_timeout > 0

    def cancel_timers(self) -> None:
        for timer in (self.expiry, self.beat):
            if timer is not None:
                timer.cancel()
        self.expiry = self.beat = None

    # What the round planner asks of a request's transport.

    @property
    def numbered(self) -> bool:
        return self.sink.numbered

    @property
    def pulls_in_a_loop(self) -> bool:
        return self.sink.claims_ahead

    def alive(self) -> bool:
        return self.sink.alive()

    def ready(self) -> bool:
        return self.sink.ready()


# Which waiting request takes the next job (`app/domain/pull_policies.py` has the policies).
WaitPolicy = pull_policies.WaitPolicy[Waiter]


def new_pin_id() -> str:
    """A pin id as nats-server makes them: 22 characters of [0-9A-Za-z]."""
    alphabet = string.digits + string.ascii_letters
    return "".join(secrets.choice(alphabet) for _ in range(22))


def policy_for(consumer: Consumer) -> WaitPolicy:
    return pull_policies.policy_for(consumer.priority)


# (transport "http" or "nats", how the request ended, seconds it waited, jobs it was given)
PullObserver = Callable[[str, PullEnd, float, int], None]


class PullScheduler:
    """The waiting pull requests of this process, one queue per consumer."""

    def __init__(
        self,
        claims: ClaimSource,
        signals: Signals,
        *,
        max_claim: int,
        max_waiting: int,
        max_waiting_total: int | None = None,
        policy: Callable[[Consumer], WaitPolicy] = policy_for,
        observe_end: PullObserver | None = None,
    ) -> None:
        self.claims = claims
        self.signals = signals
        self.max_claim = max_claim
        self.max_waiting = max_waiting
        self.max_waiting_total = max_waiting_total
        self._policy = policy
        self.observe_end = observe_end
        self._queues: dict[int, ConsumerQueue] = {}
        self._lingering = True
        self.draining = False

    def waiting(self, consumer_pk: int) -> int:
        queue = self._queues.get(consumer_pk)
        return len(queue.waiters) if queue is not None and not queue.finished else 0

    def waiting_total(self) -> int:
        """Requests waiting in this process, over every consumer."""
        return sum(self.waiting(pk) for pk in self._queues)

    def max_waiting_of(self, consumer: Consumer) -> int:
        """The consumer's own max_waiting (set over NATS), else the process's `[pull]
        max-waiting` (consumers made over HTTP have none)."""
        return consumer.options.max_waiting or self.max_waiting

    def full(self, consumer: Consumer) -> bool:
        """As many requests wait on this consumer, or in this process, as may."""
        return self.full_reason(consumer) is not None

    def full_reason(self, consumer: Consumer) -> str | None:
        """Why one more request may not wait on this consumer: its max_waiting, or
        max_waiting_total over every consumer (what one process's waiting pulls may hold)."""
        limit = self.max_waiting_of(consumer)
        if self.waiting(consumer.pk) >= limit:
            return f"{limit} pull requests are already waiting on this consumer"
        total = self.max_waiting_total
        if total is not None and self.waiting_total() >= total:
            return f"{total} pull requests are already waiting in this process (max-waiting-total)"
        return None

    def claimed_ahead(self) -> int:
        return sum(queue.ahead.held for queue in self._queues.values())

    @property
    def lingering(self) -> bool:
        return self._lingering

    def submit(self, consumer: Consumer, waiter: Waiter) -> None:
        queue = self._queues.get(consumer.pk)
        if queue is not None and not queue.finished:
            queue.consumer = consumer
        else:
            queue = ConsumerQueue(self, consumer, self._policy(consumer))
            self._queues[consumer.pk] = queue
        queue.add(waiter)

    def wake(self, consumer_pk: int) -> None:
        """A request of this consumer can take jobs again (its transport caught up)."""
        queue = self._queues.get(consumer_pk)
        if queue is not None:
            queue.wake()

    def drop(self, which: Callable[[Waiter], bool]) -> None:
        """End the requests `which` picks without an answer (their requester is gone)."""
        for queue in list(self._queues.values()):
            queue.drop(which)

    def drain(self) -> None:
        """Shutting down: every waiting request ends now, and none waits from here on."""
        self.draining = True
        self.drop(lambda w: True)

    async def settle(self) -> None:
        """Queues left without requests give back what they claimed ahead and stop."""
        self._lingering = False
        try:
            idle = [q for q in self._queues.values() if not q.waiters]
            for queue in idle:
                queue.wake()
            tasks = [queue.task for queue in idle]
            if tasks:
                await asyncio.wait(tasks, timeout=SETTLE_SECONDS)
        finally:
            self._lingering = not self.draining

    async def close(self) -> None:
        self.drain()
        await self.settle()
        for queue in list(self._queues.values()):
            queue.task.cancel()
        self._queues.clear()

    def _done(self, queue: ConsumerQueue) -> None:
        if self._queues.get(queue.consumer.pk) is queue:
            del self._queues[queue.consumer.pk]


class ConsumerQueue:
    """The loop that runs one consumer's rounds: it carries out what `round_steps` plans
    against the claim source and the sinks, and sleeps between rounds."""

    def __init__(self, scheduler: PullScheduler, consumer: Consumer, policy: WaitPolicy) -> None:
        self.scheduler = scheduler
        self.consumer = consumer
        self.policy = policy
        self.waiters: deque[Waiter] = deque()
        pinning = consumer.priority.policy is PriorityPolicy.PINNED_CLIENT
        self.state = QueueState(terms=Terms(pinning=pinning))
        self.ahead = ClaimAhead()
        self._kick = asyncio.Event()  # something changed: a request, a wake-up, an ending
        self._flushable: list[PullSink] = []  # sinks of requests ended since the last flush
        self.task = asyncio.create_task(self._run(), name=f"pull-queue-{consumer.pk}")

    @property
    def finished(self) -> bool:
        return self.state.phase is Phase.FINISHED

    # -- requests ---------------------------------------------------------------------------

    def add(self, waiter: Waiter) -> None:
        loop = asyncio.get_running_loop()
        waiter.arrived = loop.time()
        if waiter.expires_at is not None:
            waiter.expiry = loop.call_at(waiter.expires_at, self._expired, waiter)
        self._schedule_beat(waiter)
        self.waiters.append(waiter)
        self.state.dirty = True
        self._kick.set()

    def drop(self, which: Callable[[Waiter], bool]) -> None:
        for waiter in [w for w in self.waiters if which(w)]:
            self._end(waiter, PullEnd.DROPPED)

    def wake(self) -> None:
        self._kick.set()

    def _end(self, waiter: Waiter, outcome: PullEnd) -> None:
        waiter.cancel_timers()
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)
        self._kick.set()
        self._flushable.append(waiter.sink)
        waiter.sink.end(outcome, waiter, self.state.due)
        observe = self.scheduler.observe_end
        if observe is not None:
            # Numbered deliveries are JetStream's (the bridge); HTTP pulls carry none.
            transport = "nats" if waiter.sink.numbered else "http"
            waited = asyncio.get_running_loop().time() - waiter.arrived
            observe(transport, outcome, waited, waiter.delivered)

    def _expired(self, waiter: Waiter) -> None:
        waiter.expiry = None
        if waiter in self.waiters:
            self._end(waiter, PullEnd.EXPIRED)

    def _schedule_beat(self, waiter: Waiter) -> None:
        if waiter.beat is not None:
            waiter.beat.cancel()
            waiter.beat = None
        if waiter.heartbeat:
            waiter.beat = asyncio.get_running_loop().call_later(
                waiter.heartbeat, self._heartbeat, waiter
            )

    def _heartbeat(self, waiter: Waiter) -> None:
        waiter.beat = None
        if waiter in self.waiters:
            waiter.sink.heartbeat(self.state.last_seq, self.state.last_stream_seq)
            self._schedule_beat(waiter)

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            with self.scheduler.signals.subscribe(self.consumer.pk) as woken:
                relay = asyncio.create_task(self._relay(woken))
                try:
                    await self._loop(loop)
                finally:
                    relay.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:
            log_failure(log, "pull queue of consumer %s failed", self.consumer.id)
        finally:
            self.state.phase = Phase.FINISHED
            self.scheduler._done(self)
            for waiter in list(self.waiters):
                self._end(waiter, PullEnd.DROPPED)
            with contextlib.suppress(Exception):
                await self._give_back()
            with contextlib.suppress(Exception):
                await self._flush()

    async def _relay(self, woken: asyncio.Event) -> None:
        while True:
            await woken.wait()
            woken.clear()
            self._kick.set()

    async def _loop(self, loop: asyncio.AbstractEventLoop) -> None:
        state = self.state
        while self.waiters or await self._linger(loop):
            if state.next_due is not None and loop.time() >= state.next_due:
                state.next_due = None
                state.dirty = True
            deliverable = any(w.sink.ready() for w in self.waiters)
            if state.dirty and deliverable:
                state.dirty = False
                self._kick.clear()
                state.phase = Phase.SERVING
                try:
                    await self._serve(loop)
                except Exception:
                    log_failure(log, "claim for consumer %s failed; retrying", self.consumer.id)
                    state.dirty = True
                    await asyncio.sleep(RETRY_SECONDS)
                finally:
                    state.phase = Phase.WAITING
                await self._flush()
                continue
            if not self.waiters:
                continue
            await self._flush()
            timeout = None if deliverable else RETRY_SECONDS
            if state.next_due is not None:
                until = max(state.next_due - loop.time(), 0.0)
                timeout = until if timeout is None else min(timeout, until)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)
            if self._kick.is_set():
                self._kick.clear()
                state.dirty = True

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait a while for the next request; give back what was claimed ahead for it when it
        does not come within READY_GRACE_SECONDS."""
        self.state.phase = Phase.LINGERING
        start = loop.time()
        deadline = start + LINGER_SECONDS
        while not self.waiters:
            lingering = self.scheduler.lingering
            now = loop.time()
            if now - start >= claim_ahead.READY_GRACE_SECONDS or not lingering:
                await self._give_back()
            left = deadline - now
            if left <= 0 or not lingering:
                return False
            if self.ahead.held:
                left = min(left, max(start + claim_ahead.READY_GRACE_SECONDS - now, 0.001))
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), left)
        self.state.phase = Phase.WAITING
        self.state.dirty = True
        return True

    async def _flush(self) -> None:
        outlets: dict[Hashable, PullSink] = {}
        for waiter in self.waiters:
            outlets.setdefault(waiter.sink.outlet, waiter.sink)
        for sink in self._flushable:
            outlets.setdefault(sink.outlet, sink)
        self._flushable.clear()
        for sink in outlets.values():
            await sink.flush()

    # -- carrying out a round ---------------------------------------------------------------

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        limits = Limits.of(self.consumer, self.scheduler.max_claim)
        steps = round_steps(self.state, self.waiters, self.policy, limits)
        answer: Any = None
        while True:
            try:
                command = steps.send(answer)
            except StopIteration:
                return
            # Hand-outs and endings are most of a round's commands and need no await.
            if isinstance(command, Give):
                command.waiter.sink.offer(self.consumer, command.delivery, None)
                self._schedule_beat(command.waiter)  # the idle timer restarts after each
                answer = None
            elif isinstance(command, End):
                self._end(command.waiter, command.outcome)
                answer = None
            else:
                answer = await self._carry_out(command, loop)

    async def _carry_out(self, command: Command, loop: asyncio.AbstractEventLoop) -> Any:
        claims = self.scheduler.claims
        pk = self.consumer.pk
        match command:
            case GiveWithin(waiter=waiter, delivery=delivery):
                size = waiter.sink.offer(self.consumer, delivery, waiter.bytes_left)
                if size is not None:
                    self._schedule_beat(waiter)
                return size
            case LoadSequences():
                return await claims.last_delivery(pk)
            case ReadBacklog(pending_cap=pending_cap, ack_cap=ack_cap):
                return await claims.backlog(pk, pending_cap, ack_cap)
            case ReadPin():
                return await claims.pin(pk)
            case TouchPin(pin=pin):
                return await claims.touch_pin(pk, pin)
            case AssignPin():
                pin_id = new_pin_id()
                if await claims.assign_pin(self.consumer, pin_id):
                    return pin_id, True
                return await claims.pin(pk), False
            case GiveBack():
                await self._give_back()
            case FinishAhead():
                return await self.ahead.finish()
            case KeepAhead(deliveries=deliveries):
                self.ahead.keep(deliveries, loop.time())
                return self.ahead.ready
            case ReleaseStale():
                await self._release(self.ahead.stale(loop.time()))
                return self.ahead.ready
            case TakeAhead():
                return self.ahead.take()
            case Claim(sizes=sizes, numbered=numbered):
                return await self._claims(sizes, numbered)
            case StartAhead(sizes=sizes, numbered=numbered):
                self.ahead.start(sizes, self._claims(sizes, numbered))
            case ClaimAlone(waiter=waiter, limit=limit, numbered=numbered):
                batch: ClaimBatch = await claims.claim(
                    self.consumer,
                    limit,
                    numbered=numbered,
                    max_bytes=waiter.bytes_left,
                    incremental_timeout=waiter.incremental_timeout,
                )
                return batch
            case Release(deliveries=deliveries):
                await self._release(deliveries)
            case Recheck(next_due=next_due):
                fresh, due_at = await claims.recheck(pk, next_due=next_due)
                until = None
                if due_at is not None:
                    until = (due_at - datetime.now(UTC)).total_seconds()
                return Rechecked(fresh, self.consumer, until, loop.time())
            case Adopt(consumer=consumer):
                self.consumer = consumer
            case Clock():
                return loop.time()
        return None

    async def _claims(self, sizes: list[int], numbered: bool) -> Sized:
        # Claims of one consumer run side by side (SKIP LOCKED keeps them apart): the
        # waiting requests are filled in the time of one statement instead of several.
        claims = self.scheduler.claims
        batches = await asyncio.gather(
            *(claims.claim(self.consumer, n, numbered=numbered) for n in sizes)
        )
        return list(zip(sizes, batches, strict=True))

    async def _give_back(self) -> None:
        """Claims made ahead for requests that did not come (or have gone since)."""
        await self._release(await self.ahead.give_back())

    async def _release(self, leftovers: Iterable[Delivery]) -> None:
        targets = [(d.job.id, d.job.attempt) for d in leftovers]
        if targets:
            await self.scheduler.claims.release(self.consumer.pk, targets)
