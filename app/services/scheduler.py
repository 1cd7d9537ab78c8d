"""The pull scheduler: every waiting pull request of this process, HTTP long polls and NATS
pull requests alike, held per consumer as plain data and served from shared claims.

One `ConsumerQueue` per consumer with waiting requests. It follows what nats-server 2.15 does
(protocol doc section 4): requests wait in arrival order and are served round-robin, one job
at a time; a request ends when its batch is filled, when it expires, when a `no_wait` request
finds the queue drained, when its byte budget runs out, or, for a request that asked for it
(an HTTP long poll), with its first hand-out. Heartbeats and expiry run on loop timers, so
they go out on time while a claim runs. Each transport hands in a `PullSink` per request and
translates what the scheduler tells it (deliveries, heartbeats, how the request ended) into
its own terms; the scheduler knows no status codes.

Jobs are claimed only while some request has budget left, with one claim statement for the
whole budget of the waiting requests (requests with terms of their own, a byte budget or an
incremental lease, claim alone). A queue sleeps until a request arrives, one expires, a
delayed job falls due, or a wake-up (PostgreSQL NOTIFY, in-process signal) says the
consumer's queue changed: it never polls the table. When a round found nothing it looks at
the consumer again (one read): a deleted consumer ends its requests, a changed one (ack
wait, max ack pending) is claimed for with its new terms.

Which waiting request the next job goes to is a `WaitPolicy` per consumer: round-robin (no
policy, overflow), or lowest `priority` first (prioritized). Overflow requests that wait for a
backlog (min_pending, min_ack_pending) take a job only while the consumer's counts meet their
terms: the counts are read (capped) before each round that has such requests, and while they
wait for counts that another process may change, the round runs again every
OVERFLOW_RECHECK_SECONDS (an overflow queue claims nothing ahead, so that its counts hold).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import string
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from app.domain.models import Consumer, ConsumerType
from app.domain.priority import PLAIN, PriorityPolicy, PullPriority
from app.domain.pulls import ClaimBatch, Delivery, PullEnd
from app.logging import log_failure
from app.services import claim_ahead
from app.services.claim_ahead import ClaimAhead, Sized
from app.services.claiming import ClaimSource
from app.services.signals import Signals

log = logging.getLogger(__name__)

# A queue whose next job falls due later re-checks no sooner than this (clock skew guard).
MIN_RECHECK_SECONDS = 0.02
# After a failed claim (database down), or while no requester can take a delivery.
RETRY_SECONDS = 0.5
# Claim statements one consumer's waiting requests may have running at once (each up to
# max_claim jobs): only demand beyond one statement is split.
PARALLEL_CLAIMS = 2
# A queue whose requests are all answered stays this long for the next one (a consumer
# pulling in a loop sends it within moments; a new queue would read its sequences again).
LINGER_SECONDS = 5.0
# How long closing waits for idle queues to give back what they claimed ahead.
SETTLE_SECONDS = 5.0
# While overflow requests wait for counts they do not meet and jobs are pending, the counts
# are read again this often (in-flight counts change with other processes' claims, which
# wake nobody).
OVERFLOW_RECHECK_SECONDS = 1.0


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


class WaitPolicy(Protocol):
    """Which waiting request takes the next job (priority groups decide it their way)."""

    @property
    def claims_ahead(self) -> bool:
        """Jobs may be claimed for requests yet to come."""

    def pick(self, waiters: deque[Waiter], eligible: Callable[[Waiter], bool]) -> Waiter | None:
        """The request the next delivery goes to, or None when no request can take one."""

    def served(self, waiters: deque[Waiter], waiter: Waiter) -> None:
        """`waiter` (the one picked) was handed a delivery."""


class RoundRobin:
    """nats-server's order: the head request takes one job and goes to the back; a request
    that cannot take it (an overflow request whose terms are not met) goes to the back."""

    claims_ahead = True

    def pick(self, waiters: deque[Waiter], eligible: Callable[[Waiter], bool]) -> Waiter | None:
        for _ in range(len(waiters)):
            head = waiters[0]
            if eligible(head):
                return head
            if waiters and waiters[0] is head:  # `eligible` may have removed it
                waiters.rotate(-1)
        return None

    def served(self, waiters: deque[Waiter], waiter: Waiter) -> None:
        if waiters and waiters[0] is waiter:
            waiters.popleft()
            if waiter.batch_left > 0:
                waiters.append(waiter)


class Overflow(RoundRobin):
    """Round-robin, claiming nothing ahead: jobs held for requests to come would count as
    in flight and not as pending, which is what overflow requests decide by."""

    claims_ahead = False


class Pinned(RoundRobin):
    """Round-robin among the requests of the pinned client; nothing is claimed ahead, since
    the client that gets the next jobs is settled only when they are handed out."""

    claims_ahead = False


class Prioritized:
    """The request with the lowest priority value takes the next job (a request whose body
    was not JSON comes last), round-robin among requests of one priority."""

    claims_ahead = True

    def pick(self, waiters: deque[Waiter], eligible: Callable[[Waiter], bool]) -> Waiter | None:
        best: Waiter | None = None
        for waiter in list(waiters):
            if (best is None or waiter.terms.rank < best.terms.rank) and eligible(waiter):
                best = waiter
        return best

    def served(self, waiters: deque[Waiter], waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)
        if waiter.batch_left > 0:
            waiters.append(waiter)


def new_pin_id() -> str:
    """A pin id as nats-server makes them: 22 characters of [0-9A-Za-z]."""
    alphabet = string.digits + string.ascii_letters
    return "".join(secrets.choice(alphabet) for _ in range(22))


def policy_for(consumer: Consumer) -> WaitPolicy:
    if consumer.priority.policy is PriorityPolicy.PRIORITIZED:
        return Prioritized()
    if consumer.priority.policy is PriorityPolicy.OVERFLOW:
        return Overflow()
    if consumer.priority.policy is PriorityPolicy.PINNED_CLIENT:
        return Pinned()
    return RoundRobin()


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

    def full(self, consumer_pk: int) -> bool:
        """As many requests wait on this consumer, or in this process, as may."""
        return self.full_reason(consumer_pk) is not None

    def full_reason(self, consumer_pk: int) -> str | None:
        """Why one more request may not wait on this consumer: max_waiting of its own, or
        max_waiting_total over every consumer (what one process's waiting pulls may hold)."""
        if self.waiting(consumer_pk) >= self.max_waiting:
            return f"{self.max_waiting} pull requests are already waiting on this consumer"
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


def _in_stream_order(parts: list[list[Delivery]]) -> list[Delivery]:
    """Deliveries of claims that ran side by side, merged into queue order (priority, then
    oldest), with their sequence numbers handed out again in that order."""
    if len(parts) == 1:
        return parts[0]
    merged = sorted((d for part in parts for d in part), key=lambda d: (-d.job.priority, d.job.id))
    seqs = sorted(d.seq for d in merged)
    return [d._replace(seq=seq) for d, seq in zip(merged, seqs, strict=True)]


class ConsumerQueue:
    def __init__(self, scheduler: PullScheduler, consumer: Consumer, policy: WaitPolicy) -> None:
        self.scheduler = scheduler
        self.consumer = consumer
        self.policy = policy
        self.waiters: deque[Waiter] = deque()
        self.finished = False
        self.last_seq = 0
        self.last_stream_seq = 0
        self.due = 0  # due jobs left after the last claim
        self.ahead = ClaimAhead()
        self._kick = asyncio.Event()
        self._dirty = True
        self._next_due: float | None = None
        self._loaded = False
        self._found = 0  # jobs the current round's claims found
        # Overflow terms: the consumer's (pending, in flight) at the start of this round, when
        # some request waits for a backlog, and the jobs handed out since.
        self._backlog: tuple[int, int] | None = None
        self._handed = 0
        # pinned_client: the pin as read at the start of this round (None: nobody holds it).
        self._pinning = consumer.priority.policy is PriorityPolicy.PINNED_CLIENT
        self._pin: str | None = None
        self._flushable: list[PullSink] = []  # sinks of requests ended since the last flush
        self.task = asyncio.create_task(self._run(), name=f"pull-queue-{consumer.pk}")

    # -- requests ---------------------------------------------------------------------------

    def add(self, waiter: Waiter) -> None:
        loop = asyncio.get_running_loop()
        waiter.arrived = loop.time()
        if waiter.expires_at is not None:
            waiter.expiry = loop.call_at(waiter.expires_at, self._expired, waiter)
        self._schedule_beat(waiter)
        self.waiters.append(waiter)
        self._dirty = True
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
        waiter.sink.end(outcome, waiter, self.due)
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
            waiter.sink.heartbeat(self.last_seq, self.last_stream_seq)
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
            self.finished = True
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
        while self.waiters or await self._linger(loop):
            if self._next_due is not None and loop.time() >= self._next_due:
                self._next_due = None
                self._dirty = True
            deliverable = any(w.sink.ready() for w in self.waiters)
            if self._dirty and deliverable:
                self._dirty = False
                self._kick.clear()
                try:
                    await self._serve(loop)
                except Exception:
                    log_failure(log, "claim for consumer %s failed; retrying", self.consumer.id)
                    self._dirty = True
                    await asyncio.sleep(RETRY_SECONDS)
                await self._flush()
                continue
            if not self.waiters:
                continue
            await self._flush()
            timeout = None if deliverable else RETRY_SECONDS
            if self._next_due is not None:
                until = max(self._next_due - loop.time(), 0.0)
                timeout = until if timeout is None else min(timeout, until)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)
            if self._kick.is_set():
                self._kick.clear()
                self._dirty = True

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait a while for the next request; give back what was claimed ahead for it when it
        does not come within READY_GRACE_SECONDS."""
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
        self._dirty = True
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

    # -- claims and hand-out --------------------------------------------------------------------

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        claims = self.scheduler.claims
        numbered = any(w.sink.numbered for w in self.waiters)
        if numbered and not self._loaded:
            self._loaded = True
            seq, stream_seq = await claims.last_delivery(self.consumer.pk)
            self.last_seq = max(self.last_seq, seq)
            self.last_stream_seq = max(self.last_stream_seq, stream_seq)
        self._next_due = None  # the claims below say when queued jobs fall due next
        self._found = 0
        self._backlog = await self._read_backlog()
        self._handed = 0
        if self._pinning:
            await self._read_pin()
        plain = [w for w in self.waiters if not w.own_claim and self._alive(w)]
        if not plain:
            await self._give_back()
        else:
            # Whatever the claim ahead found is older than the wake-up that brought us here:
            # a queue it saw drained may have jobs again (a NAK'd job falling due, a publish),
            # so the requests still short claim afresh below.
            self._keep(await self.ahead.finish(), loop.time())
            await self._release(self.ahead.stale(loop.time()))
            wanted = self._demand(plain)
            drained = False
            if self.ahead.ready < wanted:
                sizes = self._claim_sizes(wanted - self.ahead.ready)
                drained = self._keep(await self._claims(sizes, numbered), loop.time())
            if self._pinning and self._pin is None and self.ahead.ready:
                await self._pin_standby()
            leftovers = self._hand_out(self.ahead.take())
            # Jobs a request could not take yet (its transport is behind) are still there.
            drained = drained and not leftovers
            if numbered and self.policy.claims_ahead:
                self.ahead.keep(leftovers, loop.time())
            else:  # unnumbered jobs cannot wait for a request that wants numbers
                await self._release(leftovers)
            still = self._demand([w for w in self.waiters if not w.own_claim])
            if not drained and self.policy.claims_ahead and any(w.sink.claims_ahead for w in plain):
                # While these are sent, the database claims what the requests still want or,
                # when they are filled, as much again for the next requests of a consumer
                # pulling in a loop. It is handed out after what is ready now.
                more = max(still, wanted) - self.ahead.ready
                if more > 0:
                    sizes = self._claim_sizes(more)
                    self.ahead.start(sizes, self._claims(sizes, numbered))
            if drained:
                for w in list(self.waiters):
                    if not w.own_claim and w.no_wait and (w.delivered or not w.expires_given):
                        self._end(w, PullEnd.NO_MESSAGES)
            elif still > 0:
                self._dirty = True
        for w in [w for w in self.waiters if w.own_claim]:
            if w not in self.waiters or not self._alive(w) or not self._may_take(w):
                continue
            if self._pinning and self._pin is None:
                continue  # a request with a byte budget takes jobs under a pin only
            limit = min(self._demand([w]), self.scheduler.max_claim)
            if limit <= 0:
                continue
            batch = await claims.claim(
                self.consumer,
                limit,
                numbered=numbered,
                max_bytes=w.bytes_left,
                incremental_timeout=w.incremental_timeout,
            )
            self._note(batch)
            leftovers = self._fill(w, batch.deliveries)
            if w in self.waiters and batch.deliveries and batch.due > 0:
                # Its claim stopped at its byte budget with jobs left: the next one claimed
                # ends it (too large for what is left) or fills it further.
                self._dirty = True
            if (
                w in self.waiters
                and w.no_wait
                and (w.delivered or not w.expires_given)
                and batch.due == 0
            ):
                self._end(w, PullEnd.NO_MESSAGES)
            await self._release(leftovers)
        if self._backlog is not None or self._pinning:
            self._after_terms(loop)
        # Requests still waiting after a round that found nothing, or that took every job
        # due so far: no one announces a backoff running out, so the round reads when the
        # next queued job falls due.
        if self.waiters and (not self._found or self.due == 0):
            await self._recheck(loop)

    # -- overflow terms -------------------------------------------------------------------------

    async def _read_backlog(self) -> tuple[int, int] | None:
        """The consumer's (pending, in flight) counts, when some request waits for a backlog.
        Counted up to what the requests' terms and budgets can use, never the whole queue."""
        waiting = [w for w in self.waiters if w.terms.conditional]
        if not waiting:
            return None
        budget = sum(w.batch_left for w in self.waiters)
        pending_cap = max(w.terms.min_pending for w in waiting) + budget
        ack_cap = max(w.terms.min_ack_pending for w in waiting)
        return await self.scheduler.claims.backlog(self.consumer.pk, pending_cap, ack_cap)

    # -- pinned_client -----------------------------------------------------------------------

    async def _read_pin(self) -> None:
        """The pin as it is now; a request that arrived naming another pin is told at once,
        and the pinned client's new requests keep its pin from lapsing."""
        claims = self.scheduler.claims
        self._pin = await claims.pin(self.consumer.pk)
        touched = False
        for w in list(self.waiters):
            named = w.terms.pin_id
            if named is None:
                continue
            arrived, w.pin_checked = not w.pin_checked, True
            if named == self._pin:
                if arrived and not touched:
                    touched = await claims.touch_pin(self.consumer.pk, named)
            elif arrived and self._pin is not None:
                self._end(w, PullEnd.PIN_MISMATCH)
            else:
                # The pin it names is gone (unpinned, lapsed, or another client's since).
                # nats-server says so when a dispatch meets the request; this says it when
                # the pin is read, which a client takes the same way.
                self._end(w, PullEnd.WRONG_PIN)

    async def _pin_standby(self) -> None:
        """Jobs are here and nobody holds the pin: the first waiting request without a pin id
        gets a new one, unless another process pinned the group first."""
        standby = next(
            (w for w in self.waiters if w.terms.pin_id is None and not w.own_claim), None
        )
        if standby is None:
            return
        pin_id = new_pin_id()
        if await self.scheduler.claims.assign_pin(self.consumer, pin_id):
            standby.terms = dataclasses.replace(standby.terms, pin_id=pin_id)
            self._pin = pin_id
        else:
            self._pin = await self.scheduler.claims.pin(self.consumer.pk)

    def _may_take(self, waiter: Waiter) -> bool:
        """Whether the request may take the next job now: under a pin, only the pinned
        client's requests; under overflow terms, while the counts meet them (the job counts
        as pending; those handed out this round count as in flight)."""
        if self._pinning:
            return waiter.terms.pin_id == self._pin if self._pin else waiter.terms.pin_id is None
        if self._backlog is None or not waiter.terms.conditional:
            return True
        pending, inflight = self._backlog
        return waiter.terms.overflows(pending - self._handed, inflight + self._handed)

    def _demand(self, waiters: list[Waiter]) -> int:
        """Jobs these requests can take: their budgets, or, under overflow terms, as many as
        handing them out one by one would place (each leaves pending for in flight)."""
        if self._pinning:
            if self._pin is None:  # the first standby will be pinned
                first = next((w for w in waiters if w.terms.pin_id is None), None)
                return first.batch_left if first is not None else 0
            return sum(w.batch_left for w in waiters if w.terms.pin_id == self._pin)
        if self._backlog is None:
            return sum(w.batch_left for w in waiters)
        pending, inflight = self._backlog
        pending, inflight = pending - self._handed, inflight + self._handed
        budgets = {id(w): w.batch_left for w in waiters}
        placed = 0
        while pending - placed > 0:
            taker = next(
                (
                    w
                    for w in waiters
                    if budgets[id(w)] > 0 and w.terms.overflows(pending - placed, inflight + placed)
                ),
                None,
            )
            if taker is None:
                break
            budgets[id(taker)] -= 1
            placed += 1
        return placed

    def _after_terms(self, loop: asyncio.AbstractEventLoop) -> None:
        """Requests whose terms (overflow counts, the pin) keep them from jobs: one that does
        not wait ends (404, or an empty HTTP answer); the others wait, and while jobs are
        pending overflow counts are read again soon, since other processes' claims change
        them without waking anyone."""
        unmet = [w for w in self.waiters if not self._may_take(w)]
        for w in unmet:
            if w.no_wait and (w.delivered or not w.expires_given):
                self._end(w, PullEnd.NO_MESSAGES)
        backlog = self._backlog
        waiting = any(w in self.waiters for w in unmet)
        if backlog is not None and backlog[0] - self._handed > 0 and waiting:
            self._next_due = loop.time() + OVERFLOW_RECHECK_SECONDS

    async def _recheck(self, loop: asyncio.AbstractEventLoop) -> None:
        """The consumer may be gone or changed (nothing was claimed), and when nothing is due,
        when the next job falls due says how long to sleep."""
        fresh, next_due = await self.scheduler.claims.recheck(
            self.consumer.pk, next_due=self.due == 0
        )
        if fresh is None or fresh.type is not ConsumerType.PULL:
            # A request that comes later is told the same by its own round.
            for waiter in list(self.waiters):
                self._end(waiter, PullEnd.CONSUMER_DELETED)
            return
        if (fresh.max_ack_pending, fresh.ack_wait_seconds) != (
            self.consumer.max_ack_pending,
            self.consumer.ack_wait_seconds,
        ):
            self._dirty = True
        self.consumer = fresh
        if next_due is not None:
            until = (next_due - datetime.now(UTC)).total_seconds()
            at = loop.time() + max(until, MIN_RECHECK_SECONDS)
            self._next_due = at if self._next_due is None else min(self._next_due, at)

    def _claim_sizes(self, wanted: int) -> list[int]:
        max_claim = self.scheduler.max_claim
        limit = min(wanted, max_claim * PARALLEL_CLAIMS)
        parts = -(-limit // max_claim)
        return [limit // parts + (1 if i < limit % parts else 0) for i in range(parts)]

    async def _claims(self, sizes: list[int], numbered: bool) -> Sized:
        # Claims of one consumer run side by side (SKIP LOCKED keeps them apart): the
        # waiting requests are filled in the time of one statement instead of several.
        claims = self.scheduler.claims
        batches = await asyncio.gather(
            *(claims.claim(self.consumer, n, numbered=numbered) for n in sizes)
        )
        return list(zip(sizes, batches, strict=True))

    def _keep(self, sized: Sized, now: float) -> bool:
        """Note what the claims found and keep it ready in queue order; True when they
        drained the queue (fewer jobs than asked, or nothing more due)."""
        drained = False
        for size, batch in sized:
            self._note(batch)
            drained = drained or len(batch.deliveries) < size or batch.due == 0
        self.ahead.keep(_in_stream_order([b.deliveries for _, b in sized]), now)
        return drained

    def _note(self, batch: ClaimBatch) -> None:
        self.due = batch.due
        self._found += len(batch.deliveries)
        if batch.deliveries:
            self.last_seq = max(self.last_seq, batch.last_seq)
            self.last_stream_seq = max(self.last_stream_seq, batch.last_stream_seq)

    async def _give_back(self) -> None:
        """Claims made ahead for requests that did not come (or have gone since)."""
        await self._release(await self.ahead.give_back())

    def _alive(self, waiter: Waiter) -> bool:
        if not waiter.sink.alive():
            self._end(waiter, PullEnd.DROPPED)
            return False
        return True

    def _takes_next(self, waiter: Waiter) -> bool:
        if self._pinning and waiter.terms.pin_id not in (None, self._pin):
            self._end(waiter, PullEnd.WRONG_PIN)  # pinned in this round to another client
            return False
        return not waiter.own_claim and self._alive(waiter) and self._may_take(waiter)

    def _hand_out(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Each delivery goes to the request the policy picks (round-robin by default)."""
        leftovers: list[Delivery] = []
        for index, delivery in enumerate(deliveries):
            waiter = self.policy.pick(self.waiters, self._takes_next)
            if waiter is None or not waiter.sink.ready():
                leftovers = deliveries[index:]
                break
            if self._pin is not None:
                delivery = delivery._replace(pin=self._pin)
            waiter.sink.offer(self.consumer, delivery, None)
            self._delivered(waiter)
            waiter.batch_left -= 1
            self.policy.served(self.waiters, waiter)
            if waiter.batch_left == 0:
                self._end(waiter, PullEnd.FILLED)
        for waiter in [w for w in self.waiters if w.ends_on_delivery and w.delivered]:
            self._end(waiter, PullEnd.DELIVERED)
        return leftovers

    def _fill(self, waiter: Waiter, deliveries: list[Delivery]) -> list[Delivery]:
        """A request with its own claim takes that claim's jobs while its budget lasts."""
        for index, delivery in enumerate(deliveries):
            if waiter not in self.waiters or not waiter.sink.ready():
                return deliveries[index:]
            if self._pin is not None:
                delivery = delivery._replace(pin=self._pin)
            size = waiter.sink.offer(self.consumer, delivery, waiter.bytes_left)
            if size is None:
                self._end(waiter, PullEnd.TOO_LARGE)
                return deliveries[index:]
            self._delivered(waiter)
            if waiter.bytes_left is not None:
                waiter.bytes_left -= size
            waiter.batch_left -= 1
            if waiter.batch_left == 0:
                self._end(waiter, PullEnd.BYTES_LEFT if waiter.bytes_left else PullEnd.FILLED)
        if waiter in self.waiters and waiter.ends_on_delivery and waiter.delivered:
            self._end(waiter, PullEnd.DELIVERED)
        return []

    def _delivered(self, waiter: Waiter) -> None:
        waiter.delivered += 1
        self._handed += 1
        self._schedule_beat(waiter)  # the idle timer restarts after each delivery

    async def _release(self, leftovers: Iterable[Delivery]) -> None:
        targets = [(d.job.id, d.job.attempt) for d in leftovers]
        if targets:
            await self.scheduler.claims.release(self.consumer.pk, targets)
