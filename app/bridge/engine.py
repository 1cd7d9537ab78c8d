"""The pull request life cycle of a JetStream consumer, served from database claims.

One `ConsumerPump` per consumer with waiting requests (in this process). It follows what
nats-server 2.15 does (protocol doc section 4): requests wait FIFO and are served round-robin,
one message at a time; a request ends when its batch is filled, when it expires (`408` with
`Nats-Pending-*`), when a `no_wait` request finds the queue drained (`404`), or when its byte
budget runs out (`409`). Idle requests get `100 Idle Heartbeat` every `idle_heartbeat`.

Jobs are claimed only while some request has budget left, with one claim statement for the
whole budget of the waiting requests. A pump sleeps until a request arrives, one expires or
needs a heartbeat, a delayed job falls due, or a wake-up (PostgreSQL NOTIFY) says the
consumer's queue changed: it never polls the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from app.bridge import protocol as p
from app.domain.models import Consumer, ConsumerType, PulledJob
from app.services.bridge import BridgeService, ClaimBatch, Delivery
from app.services.signals import Signals

log = logging.getLogger(__name__)

# A pump whose next job falls due later re-checks no sooner than this (clock skew guard).
MIN_RECHECK_SECONDS = 0.02
# After a failed claim (database down), wait this long before trying again.
RETRY_SECONDS = 0.5
# Claim statements one consumer's waiting requests may have running at once (each up to
# max_claim jobs): only demand beyond one statement is split.
PARALLEL_CLAIMS = 2
# A pump whose requests are all answered stays this long for the next one.
PUMP_LINGER_SECONDS = 5.0
# Jobs claimed ahead for the next requests are given back when none comes within this long,
# and are never handed out once they have waited longer than READY_MAX_AGE_SECONDS.
READY_GRACE_SECONDS = 0.2
READY_MAX_AGE_SECONDS = 1.0
# While requests wait, the consumer is looked up this often: a deleted one ends them with
# `409 Consumer Deleted`, a changed one (ack wait, max ack pending) is picked up.
CONSUMER_CHECK_SECONDS = 1.0


class Outbound(Protocol):
    """Where deliveries and statuses go: the client connection, or the leafnode link."""

    def ready(self) -> bool: ...

    def send(self, subject: str, reply: str | None, header: bytes | None, payload: bytes) -> None:
        """Queue one message; it is written soon, in order with everything sent before."""

    async def flush(self) -> None: ...

    def interest(self, subject: str) -> bool | None:
        """False when the subject is known to have no subscriber; None when unknown."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_batch: int
    max_expires: int  # ns, 0 = no limit
    max_waiting: int
    max_claim: int  # jobs per claim statement
    unbounded_cap: float | None = None  # seconds a request without `expires` may wait


@dataclass(eq=False, slots=True)
class Waiter:
    reply: str
    batch_left: int
    bytes_left: int | None
    no_wait: bool
    client_expires: bool
    expires_at: float | None
    heartbeat: float | None
    delivered: int = 0
    expiry: asyncio.TimerHandle | None = None
    beat: asyncio.TimerHandle | None = None

    def cancel_timers(self) -> None:
        for timer in (self.expiry, self.beat):
            if timer is not None:
                timer.cancel()
        self.expiry = self.beat = None


def delivery_headers(job: PulledJob, subject: str) -> list[tuple[str, str]]:
    headers = dict(job.headers)
    headers["Content-Type"] = job.content_type
    headers["Nats-Msg-Id"] = job.message_id
    headers["Nats-Subject"] = subject
    return list(headers.items())


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp_ns(moment: datetime) -> int:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    delta = aware - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


class PullEngine:
    """Accepts MSG.NEXT requests and runs one pump per consumer that has waiting requests."""

    def __init__(
        self,
        service: BridgeService,
        signals: Signals,
        out: Outbound,
        ack_prefix: str,
        limits: EngineLimits,
    ) -> None:
        self.service = service
        self.signals = signals
        self.out = out
        self.ack_prefix = ack_prefix
        self.limits = limits
        self._pumps: dict[int, ConsumerPump] = {}
        self._closed = False

    def status(
        self, reply: str, code: int, description: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.out.send(reply, None, p.status_block(code, description, headers), b"")

    def submit(self, consumer: Consumer, reply: str, body: bytes) -> None:
        """Validate a pull request in the server's order and queue it (or answer at once)."""
        if not reply or self._closed:
            return
        if consumer.type is not ConsumerType.PULL:
            self.status(reply, *p.PUSH_BASED)
            return
        try:
            spec = p.parse_pull_request(body)
        except p.BadRequest as exc:
            self.status(reply, 400, exc.description)
            return
        limits = self.limits
        if spec.batch > limits.max_batch:
            self.status(reply, 409, f"Exceeded MaxRequestBatch of {limits.max_batch}")
            return
        if limits.max_expires and spec.expires > limits.max_expires:
            self.status(
                reply,
                409,
                f"Exceeded MaxRequestExpires of {p.format_go_duration(limits.max_expires)}",
            )
            return
        pump = self._pumps.get(consumer.pk)
        if pump is not None and not pump.finished:
            pump.consumer = consumer
        else:
            pump = ConsumerPump(self, consumer)
            self._pumps[consumer.pk] = pump
        if len(pump.waiters) >= limits.max_waiting:
            if not spec.heartbeat:  # the server drops a heartbeat request silently
                self.status(reply, *p.EXCEEDED_MAX_WAITING)
            return
        now = asyncio.get_running_loop().time()
        expires_at: float | None = None
        if spec.expires:
            expires_at = now + spec.expires / p.NANOS
        elif limits.unbounded_cap is not None:
            expires_at = now + limits.unbounded_cap
        heartbeat = spec.heartbeat / p.NANOS if spec.heartbeat else None
        pump.add(
            Waiter(
                reply=reply,
                batch_left=spec.batch,
                bytes_left=spec.max_bytes or None,
                no_wait=spec.no_wait,
                client_expires=bool(spec.expires),
                expires_at=expires_at,
                heartbeat=heartbeat,
            )
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def claimed_ahead(self) -> int:
        """Jobs claimed for requests yet to come: ready to hand out, or being claimed."""
        return sum(pump.claimed_ahead for pump in self._pumps.values())

    def num_waiting(self, consumer_pk: int) -> int:
        pump = self._pumps.get(consumer_pk)
        return len(pump.waiters) if pump is not None and not pump.finished else 0

    def interest_gone(self, subject: str) -> None:
        """The requester's inbox lost its last subscriber: its requests are dropped silently."""
        for pump in list(self._pumps.values()):
            pump.drop(lambda w: w.reply == subject)

    def drop_all(self) -> None:
        """The connection carrying deliveries went away: nobody can be answered any more."""
        for pump in list(self._pumps.values()):
            pump.drop(lambda w: True)

    def _pump_done(self, pump: ConsumerPump) -> None:
        if self._pumps.get(pump.consumer.pk) is pump:
            del self._pumps[pump.consumer.pk]

    async def close(self) -> None:
        self._closed = True
        pumps = list(self._pumps.values())
        for pump in pumps:
            pump.drop(lambda w: True)
            pump.wake()
        tasks = [pump.task for pump in pumps]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
        self._pumps.clear()


def _in_stream_order(parts: list[list[Delivery]]) -> list[Delivery]:
    """Deliveries of claims that ran side by side, merged into queue order (priority, then
    oldest), with their sequence numbers handed out again in that order."""
    if len(parts) == 1:
        return parts[0]
    merged = sorted((d for part in parts for d in part), key=lambda d: (-d.job.priority, d.job.id))
    seqs = sorted(d.seq for d in merged)
    return [d._replace(seq=seq) for d, seq in zip(merged, seqs, strict=True)]


@dataclass(eq=False)
class ConsumerPump:
    engine: PullEngine
    consumer: Consumer
    waiters: deque[Waiter] = field(default_factory=deque)
    finished: bool = False
    last_seq: int = 0
    last_stream_seq: int = 0

    def __post_init__(self) -> None:
        self._kick = asyncio.Event()
        self._dirty = True
        self._next_due: float | None = None
        self._next_check = asyncio.get_running_loop().time() + CONSUMER_CHECK_SECONDS
        self._loaded = False
        # Claims started ahead (for budget still wanted, or for the requests a consumer
        # pulling in a loop sends next), with the sizes asked for; and claimed deliveries
        # not handed out yet, oldest first, with the time they were claimed.
        self._ahead: tuple[list[int], asyncio.Future[list[ClaimBatch]]] | None = None
        self._ready: deque[tuple[float, Delivery]] = deque()
        self.task = asyncio.create_task(self._run(), name=f"bridge-pump-{self.consumer.pk}")

    @property
    def claimed_ahead(self) -> int:
        return len(self._ready) + (sum(self._ahead[0]) if self._ahead is not None else 0)

    # -- requests ---------------------------------------------------------------------------

    def add(self, waiter: Waiter) -> None:
        # Expiry and heartbeats run on loop timers, so they go out on time even while the
        # pump waits for the database.
        loop = asyncio.get_running_loop()
        if waiter.expires_at is not None:
            waiter.expiry = loop.call_at(waiter.expires_at, self._expired, waiter)
        self._schedule_beat(waiter)
        self.waiters.append(waiter)
        self._dirty = True
        self._kick.set()

    def drop(self, which: Callable[[Waiter], bool]) -> None:
        for waiter in [w for w in self.waiters if which(w)]:
            self._remove(waiter)
            self._kick.set()

    def _remove(self, waiter: Waiter) -> None:
        waiter.cancel_timers()
        with contextlib.suppress(ValueError):
            self.waiters.remove(waiter)

    def _expired(self, waiter: Waiter) -> None:
        waiter.expiry = None
        if waiter in self.waiters:
            self._remove(waiter)
            self._status(waiter, *p.REQUEST_TIMEOUT, self._pending_headers(waiter))
            self._kick.set()

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
            block = p.heartbeat_block(self.last_seq, self.last_stream_seq)
            self.engine.out.send(waiter.reply, None, block, b"")
            self._schedule_beat(waiter)

    def _status(
        self, waiter: Waiter, code: int, description: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.engine.status(waiter.reply, code, description, headers)

    def _pending_headers(self, waiter: Waiter) -> list[tuple[str, str]]:
        return p.pending_headers(waiter.batch_left, waiter.bytes_left or 0)

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            with self.engine.signals.subscribe(self.consumer.pk) as woken:
                relay = asyncio.create_task(self._relay(woken))
                try:
                    await self._loop(loop)
                finally:
                    relay.cancel()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pull pump of consumer %s failed", self.consumer.id)
        finally:
            self.finished = True
            for waiter in self.waiters:
                waiter.cancel_timers()
            self.engine._pump_done(self)
            with contextlib.suppress(Exception):
                await self._give_back()
            with contextlib.suppress(Exception):
                await self.engine.out.flush()

    async def _relay(self, woken: asyncio.Event) -> None:
        while True:
            await woken.wait()
            woken.clear()
            self._kick.set()

    async def _loop(self, loop: asyncio.AbstractEventLoop) -> None:
        out = self.engine.out
        while self.waiters or await self._linger(loop):
            now = loop.time()
            if now >= self._next_check:
                self._next_check = now + CONSUMER_CHECK_SECONDS
                if not await self._consumer_still_there():
                    break
                continue
            if self._next_due is not None and now >= self._next_due:
                self._next_due = None
                self._dirty = True
            if self.waiters and self._dirty and out.ready():
                self._dirty = False
                self._kick.clear()
                try:
                    await self._serve(loop)
                except Exception:
                    log.exception("claim for consumer %s failed; retrying", self.consumer.id)
                    self._dirty = True
                    await asyncio.sleep(RETRY_SECONDS)
                await out.flush()
                continue
            if not self.waiters:
                continue
            await out.flush()
            timeout = self._timeout(loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)
            if self._kick.is_set():
                self._kick.clear()
                self._dirty = True

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait a while for the next request: a consumer pulling in a loop sends it within
        moments, and a new pump would look its sequences up in the database again."""
        start = loop.time()
        deadline = start + PUMP_LINGER_SECONDS
        while not self.waiters:
            now = loop.time()
            if now - start >= READY_GRACE_SECONDS or self.engine.closed:
                await self._give_back()
            left = deadline - now
            if left <= 0 or self.engine.closed:
                return False
            if self._ahead or self._ready:
                left = min(left, max(start + READY_GRACE_SECONDS - now, 0.001))
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), left)
        self._dirty = True
        return True

    def wake(self) -> None:
        self._kick.set()

    def _timeout(self, now: float) -> float | None:
        moment = self._next_check
        if self._next_due is not None:
            moment = min(moment, self._next_due)
        return max(moment - now, 0.0)

    async def _consumer_still_there(self) -> bool:
        try:
            found = await self.engine.service.lookup(self.consumer.channel_id, self.consumer.id)
        except Exception:
            log.exception("consumer check for %s failed", self.consumer.id)
            return True
        current = found.consumer
        if (
            current is not None
            and current.pk == self.consumer.pk
            and current.type is ConsumerType.PULL
        ):
            self.consumer = current
            return True
        for waiter in list(self.waiters):
            self._remove(waiter)
            self._status(waiter, *p.CONSUMER_DELETED)
        return False

    # -- claims and hand-out --------------------------------------------------------------------

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        service = self.engine.service
        if not self._loaded:
            self._loaded = True
            seq, stream_seq = await service.last_delivery(self.consumer)
            self.last_seq = max(self.last_seq, seq)
            self.last_stream_seq = max(self.last_stream_seq, stream_seq)
        max_claim = self.engine.limits.max_claim
        self._next_due = None  # the claims below say when queued jobs fall due next
        plain = [w for w in self.waiters if w.bytes_left is None and self._alive(w)]
        if not plain:
            await self._give_back()
        else:
            if self._ahead is not None:
                # Whatever the claim ahead found is older than the wake-up that brought us
                # here: a queue it saw drained may have jobs again (a NAK'd job falling due, a
                # publish), so the requests still short claim afresh below, and that claim
                # says when the next job falls due.
                await self._take_ahead(loop)
            drained = False
            await self._release(self._stale_ready(loop.time()))
            wanted = sum(w.batch_left for w in plain)
            if not drained and len(self._ready) < wanted:
                sizes = self._claim_sizes(wanted - len(self._ready))
                drained = self._keep(sizes, await self._claims(sizes), loop)
            deliveries = [d for _, d in self._ready]
            self._ready.clear()
            leftovers = self._hand_out(deliveries)
            now = loop.time()
            self._ready.extend((now, d) for d in leftovers)
            still = sum(w.batch_left for w in self.waiters if w.bytes_left is None)
            if not drained:
                # While these are sent, the database claims what the requests still want or,
                # when they are filled, as much again for the next requests of a consumer
                # pulling in a loop (given back if none comes within READY_GRACE_SECONDS).
                # Whatever is claimed ahead is handed out after what is ready now, so the
                # order stays the queue's.
                ahead = max(still, wanted) - len(self._ready)
                if ahead > 0:
                    sizes = self._claim_sizes(ahead)
                    self._ahead = (sizes, asyncio.ensure_future(self._claims(sizes)))
            if drained:
                for w in list(self.waiters):
                    if w.bytes_left is None and w.no_wait and (w.delivered or not w.client_expires):
                        self._remove(w)
                        self._status(w, *p.NO_MESSAGES)
            elif still > 0:
                self._dirty = True
        for w in [w for w in self.waiters if w.bytes_left is not None]:
            if w not in self.waiters or not self._alive(w):
                continue
            assert w.bytes_left is not None
            batch = await service.claim(
                self.consumer, min(w.batch_left, max_claim), max_bytes=w.bytes_left
            )
            self._note(batch, loop)
            leftovers = self._fill_bytes(w, batch.deliveries)
            if (
                w in self.waiters
                and w.no_wait
                and (w.delivered or not w.client_expires)
                and batch.due == 0
            ):
                self._remove(w)
                self._status(w, *p.NO_MESSAGES)
            await self._release(leftovers)

    def _claim_sizes(self, wanted: int) -> list[int]:
        max_claim = self.engine.limits.max_claim
        limit = min(wanted, max_claim * PARALLEL_CLAIMS)
        parts = -(-limit // max_claim)
        return [limit // parts + (1 if i < limit % parts else 0) for i in range(parts)]

    async def _claims(self, sizes: list[int]) -> list[ClaimBatch]:
        # Claims of one consumer run side by side (SKIP LOCKED keeps them apart): the
        # waiting requests are filled in the time of one statement instead of several.
        service = self.engine.service
        return list(await asyncio.gather(*(service.claim(self.consumer, n) for n in sizes)))

    async def _take_ahead(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for the claims started ahead and add them to the ready deliveries."""
        assert self._ahead is not None
        (sizes, claims), self._ahead = self._ahead, None
        self._keep(sizes, await claims, loop)

    def _keep(
        self, sizes: list[int], batches: list[ClaimBatch], loop: asyncio.AbstractEventLoop
    ) -> bool:
        drained = False
        for size, batch in zip(sizes, batches, strict=True):
            self._note(batch, loop)
            drained = drained or len(batch.deliveries) < size or batch.due == 0
        now = loop.time()
        self._ready.extend((now, d) for d in _in_stream_order([b.deliveries for b in batches]))
        return drained

    def _stale_ready(self, now: float) -> list[Delivery]:
        """Ready deliveries kept too long to hand out: their leases have run on meanwhile."""
        stale: list[Delivery] = []
        while self._ready and now - self._ready[0][0] > READY_MAX_AGE_SECONDS:
            stale.append(self._ready.popleft()[1])
        return stale

    async def _give_back(self) -> None:
        """Claims made ahead for requests that did not come (or have gone since)."""
        batches: list[ClaimBatch] = []
        if self._ahead is not None:
            (_, claims), self._ahead = self._ahead, None
            batches = await claims
        held = [d for _, d in self._ready] + [d for b in batches for d in b.deliveries]
        self._ready.clear()
        await self._release(held)

    def _note(self, batch: ClaimBatch, loop: asyncio.AbstractEventLoop) -> None:
        if batch.deliveries:
            self.last_seq = max(self.last_seq, batch.last_seq)
            self.last_stream_seq = max(self.last_stream_seq, batch.last_stream_seq)
        if batch.due == 0 and batch.next_due_at is not None:
            until = (batch.next_due_at - datetime.now(UTC)).total_seconds()
            due = loop.time() + max(until, MIN_RECHECK_SECONDS)
            self._next_due = due if self._next_due is None else min(self._next_due, due)

    def _alive(self, waiter: Waiter) -> bool:
        if self.engine.out.interest(waiter.reply) is False:
            self._remove(waiter)
            return False
        return True

    def _next_plain(self) -> Waiter | None:
        for _ in range(len(self.waiters)):
            head = self.waiters[0]
            if head.bytes_left is None and self._alive(head):
                return head
            if self.waiters and self.waiters[0] is head:
                self.waiters.rotate(-1)
        return None

    def _hand_out(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Round-robin: each delivery goes to the head request, which then moves to the back."""
        leftovers: list[Delivery] = []
        for index, delivery in enumerate(deliveries):
            waiter = self._next_plain()
            if waiter is None or not self.engine.out.ready():
                leftovers.extend(deliveries[index:])
                break
            self._send(waiter, delivery)
            self.waiters.popleft()
            waiter.batch_left -= 1
            if waiter.batch_left > 0:
                self.waiters.append(waiter)
            else:
                waiter.cancel_timers()  # filled: the request ends with no status
        return leftovers

    def _fill_bytes(self, waiter: Waiter, deliveries: list[Delivery]) -> list[Delivery]:
        for index, delivery in enumerate(deliveries):
            if waiter not in self.waiters or not self.engine.out.ready():
                return deliveries[index:]
            reply, header = self._encode(delivery)
            size = len(self.consumer.channel_id) + len(reply) + len(header)
            size += len(delivery.job.payload)
            assert waiter.bytes_left is not None
            if size > waiter.bytes_left:
                self._remove(waiter)
                self._status(waiter, *p.MESSAGE_SIZE_EXCEEDS, self._pending_headers(waiter))
                return deliveries[index:]
            self.engine.out.send(waiter.reply, reply, header, delivery.job.payload)
            self._delivered(waiter)
            waiter.bytes_left -= size
            waiter.batch_left -= 1
            if waiter.batch_left == 0:
                self._remove(waiter)
                if waiter.bytes_left > 0:
                    self._status(waiter, *p.BATCH_COMPLETED, self._pending_headers(waiter))
        return []

    def _encode(self, delivery: Delivery) -> tuple[str, bytes]:
        job = delivery.job
        token = p.AckToken(
            stream=self.consumer.channel_id,
            consumer=self.consumer.id,
            delivered=job.attempt,
            stream_seq=job.id,
            consumer_seq=delivery.seq,
            timestamp=timestamp_ns(job.created_at),
            pending=delivery.pending,
        )
        reply = p.ack_subject(self.engine.ack_prefix, token)
        return reply, p.message_header_block(delivery_headers(job, self.consumer.channel_id))

    def _send(self, waiter: Waiter, delivery: Delivery) -> None:
        reply, header = self._encode(delivery)
        self.engine.out.send(waiter.reply, reply, header, delivery.job.payload)
        self._delivered(waiter)

    def _delivered(self, waiter: Waiter) -> None:
        waiter.delivered += 1
        self._schedule_beat(waiter)  # the idle timer restarts after each delivery

    async def _release(self, leftovers: list[Delivery]) -> None:
        if leftovers:
            await self.engine.service.release(
                self.consumer, [(d.job.id, d.job.attempt) for d in leftovers]
            )
