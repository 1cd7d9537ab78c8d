"""JetStream pull requests (MSG.NEXT) in and out of the shared pull scheduler.

A request is checked as nats-server checks it (protocol doc section 4) and handed to the
process's `PullScheduler` as a `Waiter` whose sink is a `NatsRequest`: the scheduler serves it
with the HTTP long polls of the same consumer, and the sink writes what it is told as
JetStream does: deliveries with `$JS.ACK`-style reply subjects, `100 Idle Heartbeat`, and the
status a request ends with (`408` with `Nats-Pending-*`, `404`, `409`, or nothing once filled).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from app.bridge import protocol as p
from app.bridge.activity import Activity
from app.domain.models import Consumer, ConsumerType, PulledJob
from app.domain.nats_consumers import backoff_lease
from app.domain.priority import PullRefused, check_pull
from app.domain.pulls import Delivery, PullEnd
from app.logging import log_failure
from app.services.scheduler import PullScheduler, Waiter

log = logging.getLogger(__name__)
# (consumer pk, {lease seconds: [(job id, attempt)]}): writes the leases.
ApplyBackoff = Callable[[int, dict[int, list[tuple[int, int]]]], Awaitable[None]]
# Settles a delivery of an AckNone consumer as it is sent (the ack processor's, as an ack).
Settle = Callable[[p.AckToken], None]


class Outbound(Protocol):
    """Where deliveries and statuses go: the client connection, or the leafnode link."""

    def ready(self) -> bool: ...

    def send(self, subject: str, reply: str | None, header: bytes | None, payload: bytes) -> None:
        """Queue one message; it is written soon, in order with everything sent before."""

    async def flush(self) -> None: ...

    def interest(self, subject: str) -> bool | None:
        """False when the subject is known to have no subscriber; None when unknown."""


class PushHooks(Protocol):
    """What the engine asks of the bridge's push deliveries."""

    def bound(self, consumer: Consumer) -> bool: ...

    def changed(self, consumer: Consumer) -> None: ...

    def delivers(self, consumer_pk: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_batch: int
    max_expires: int  # ns, 0 = no limit
    unbounded_cap: float | None = None  # seconds a request without `expires` may wait


def delivery_headers(job: PulledJob, subject: str | None) -> list[tuple[str, str]]:
    """A delivery's headers: the message's own, its content type and id, and `Nats-Subject`
    where the delivery's subject cannot be the stored subject (client mode: the requester's
    inbox). Over a leafnode link it is, as from nats-server, which adds no such header: a
    header fewer for every client to parse (bench/journal, 2026-11-27)."""
    headers = [("Content-Type", job.content_type), ("Nats-Msg-Id", job.message_id)]
    if subject is not None:
        headers.append(("Nats-Subject", subject))
    if not job.headers:  # most messages: nothing of their own to merge
        return headers
    # The message's own first, in their order; ours replace any of the same name.
    return list((dict(job.headers) | dict(headers)).items())


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def timestamp_ns(moment: datetime) -> int:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return (aware - _EPOCH) // _MICROSECOND * 1_000


# How each ending is told to the requester (nothing for a filled batch or a dropped request).
ENDINGS: dict[PullEnd, tuple[int, str] | None] = {
    PullEnd.FILLED: None,
    PullEnd.DELIVERED: None,
    PullEnd.DROPPED: None,
    PullEnd.EXPIRED: p.REQUEST_TIMEOUT,
    PullEnd.NO_MESSAGES: p.NO_MESSAGES,
    PullEnd.TOO_LARGE: p.MESSAGE_SIZE_EXCEEDS,
    PullEnd.BYTES_LEFT: p.BATCH_COMPLETED,
    PullEnd.CONSUMER_DELETED: p.CONSUMER_DELETED,
    PullEnd.PIN_MISMATCH: p.PIN_ID_MISMATCH,
    PullEnd.WRONG_PIN: p.WRONG_PIN_ID,
}
# Endings whose status carries what the request had left.
WITH_PENDING = {PullEnd.EXPIRED, PullEnd.TOO_LARGE, PullEnd.BYTES_LEFT, PullEnd.WRONG_PIN}


class NatsRequest:
    """The scheduler's sink for one JetStream pull request: its reply inbox on `engine`'s
    connection."""

    numbered = True
    __slots__ = ("claims_ahead", "engine", "reply", "uncounted")

    def __init__(
        self, engine: PullEngine, reply: str, *, batch_unset: bool = False, ack_none: bool = False
    ) -> None:
        self.engine = engine
        self.reply = reply
        # A claim made ahead and given back has used up delivery sequence numbers: an ordered
        # consumer (AckNone) takes the skip for a gap and recreates itself from scratch.
        self.claims_ahead = not ack_none
        # nats-server counts a request without a batch as batch 0 in its pending headers.
        self.uncounted = 1 if batch_unset else 0

    @property
    def outlet(self) -> Hashable:
        return self.engine

    def alive(self) -> bool:
        return self.engine.out.interest(self.reply) is not False

    def ready(self) -> bool:
        return self.engine.out.ready()

    def offer(self, consumer: Consumer, delivery: Delivery, bytes_left: int | None) -> int | None:
        return self.engine.deliver(consumer, delivery, self.reply, bytes_left)

    def end(self, outcome: PullEnd, waiter: Waiter, pending: int) -> None:
        status = ENDINGS[outcome]
        if status is None:
            return
        headers = (
            p.pending_headers(waiter.batch_left - self.uncounted, waiter.bytes_left or 0)
            if outcome in WITH_PENDING
            else []
        )
        self.engine.status(self.reply, *status, headers)

    def heartbeat(self, last_seq: int, last_stream_seq: int) -> None:
        self.engine.out.send(self.reply, None, p.heartbeat_block(last_seq, last_stream_seq), b"")

    async def flush(self) -> None:
        await self.engine.out.flush()


class PullEngine:
    """Checks MSG.NEXT requests and queues them on the shared pull scheduler."""

    def __init__(
        self,
        scheduler: PullScheduler,
        out: Outbound,
        ack_prefix: str,
        limits: EngineLimits,
        *,
        stored_subject: bool = False,
        apply_backoff: ApplyBackoff | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.out = out
        self.ack_prefix = ack_prefix
        self.limits = limits
        self.stored_subject = stored_subject
        self._closed = False
        # A backoff consumer's redeliveries: their leases, set after the claim in one statement
        # per consumer and length (`apply_backoff`, the bridge service's).
        self.apply_backoff = apply_backoff
        self._leases: dict[int, dict[int, list[tuple[int, int]]]] = {}
        # Set by the bridge: expiring consumers' use, and AckNone consumers' acks.
        self.activity: Activity | None = None
        self.settle: Settle | None = None
        # Set by the bridge: its push consumers' deliveries (app/bridge/push.py).
        self.push: PushHooks | None = None
        self._leasing: asyncio.Task[None] | None = None

    def lease_for(self, consumer: Consumer, job_id: int, attempt: int) -> None:
        """Delivery `attempt` of a backoff consumer's job stays unacknowledged for its backoff
        step, as nats-server times it, not for the ack wait the claim leased it for."""
        seconds = backoff_lease(consumer.options.backoff, attempt)
        if self.apply_backoff is None or seconds is None or seconds == consumer.ack_wait_seconds:
            return
        by_length = self._leases.setdefault(consumer.pk, {})
        by_length.setdefault(seconds, []).append((job_id, attempt))
        if self._leasing is None:
            self._leasing = asyncio.get_running_loop().create_task(self._write_leases())

    async def _write_leases(self) -> None:
        try:
            while self._leases and self.apply_backoff is not None:
                leases, self._leases = self._leases, {}
                for consumer_pk, by_length in leases.items():
                    try:
                        await self.apply_backoff(consumer_pk, by_length)
                    except Exception:  # the ack wait's lease stands: redelivered sooner
                        log_failure(log, "backoff leases of consumer %s", consumer_pk)
        finally:
            self._leasing = None

    def deliver(
        self, consumer: Consumer, delivery: Delivery, to: str, bytes_left: int | None
    ) -> int | None:
        """Send a delivery to `to` (a request's inbox, a push consumer's deliver subject) as
        JetStream sends it, and say how many bytes it counts against max_bytes; None (and
        nothing sent) when that exceeds `bytes_left`."""
        # Once per job handed out (hundreds a round): fields by position, each read once.
        job = delivery.job
        options = consumer.options
        channel = consumer.channel_id
        ack_none = options.ack_policy == "none"
        token = p.AckToken(
            channel,
            consumer.id,
            job.attempt,
            job.message_pk,
            delivery.seq,
            timestamp_ns(job.created_at),
            delivery.pending,
            job.id,
        )
        # nats-server's form where nats-py reads fixed tokens: AckNone and push deliveries.
        form = p.server_ack_subject if ack_none or options.deliver_subject else p.ack_subject
        reply = form(self.ack_prefix, token)
        if options.backoff and job.attempt > 1:
            self.lease_for(consumer, job.id, job.attempt)
        headers = delivery_headers(job, None if self.stored_subject else channel)
        if delivery.pin is not None:
            headers.append(("Nats-Pin-Id", delivery.pin))
        header = p.message_header_block(headers)
        payload = job.payload
        # What nats-server counts against max_bytes: subject, reply, headers and payload.
        size = len(channel) + len(reply) + len(header) + len(payload)
        if bytes_left is not None and size > bytes_left:
            return None
        if self.stored_subject:
            # Over a leafnode link, nats-server delivers a message whose reply is
            # `$JS.ACK...@<subject>` to the inbox with `<subject>` as its subject and the
            # suffix taken off the reply, as it delivers from a stream (server/client.go):
            # clients that tell deliveries from statuses by the subject (the JS client) see
            # the stored subject, the channel id.
            reply = f"{reply}@{channel}"
        self.out.send(to, reply, header, payload)
        if self.activity is not None:
            self.activity.touch(consumer)
        if ack_none and self.settle is not None:
            self.settle(token)  # AckNone: DELIVERED once sent, as nats-server counts it
        return size

    def status(
        self, reply: str, code: int, description: str, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.out.send(reply, None, p.status_block(code, description, headers), b"")

    def submit(self, consumer: Consumer, reply: str, body: bytes) -> None:
        """Validate a pull request in the server's order and queue it (or answer at once)."""
        if not reply or self._closed:
            return
        if consumer.type is not ConsumerType.PULL or consumer.options.deliver_subject:
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
        try:
            terms = check_pull(consumer.priority, spec.terms)
        except PullRefused as exc:
            self.status(reply, 400, exc.description)
            return
        if self.activity is not None:
            self.activity.touch(consumer)
        if self.scheduler.full(consumer):
            if not spec.heartbeat:  # the server drops a heartbeat request silently
                self.status(reply, *p.EXCEEDED_MAX_WAITING)
            return
        now = asyncio.get_running_loop().time()
        expires_at: float | None = None
        if spec.expires:
            expires_at = now + spec.expires / p.NANOS
        elif limits.unbounded_cap is not None:
            expires_at = now + limits.unbounded_cap
        self.scheduler.submit(
            consumer,
            Waiter(
                NatsRequest(
                    self,
                    reply,
                    batch_unset=spec.batch_unset,
                    ack_none=consumer.options.ack_policy == "none",
                ),
                batch_left=spec.batch,
                bytes_left=spec.max_bytes or None,
                no_wait=spec.no_wait,
                expires_given=bool(spec.expires),
                expires_at=expires_at,
                heartbeat=spec.heartbeat / p.NANOS if spec.heartbeat else None,
                terms=terms,
            ),
        )

    def push_bound(self, consumer: Consumer) -> bool:
        return self.push is not None and self.push.bound(consumer)

    def consumer_changed(self, consumer: Consumer) -> None:
        """Created or changed through this bridge: a push consumer is delivered from now."""
        if self.push is not None:
            self.push.changed(consumer)

    def claimed_ahead(self) -> int:
        """Jobs claimed for requests yet to come: ready to hand out, or being claimed."""
        return self.scheduler.claimed_ahead()

    def num_waiting(self, consumer_pk: int) -> int:
        """Pull requests waiting (a push consumer's standing request is none)."""
        if self.push is not None and self.push.delivers(consumer_pk):
            return 0
        return self.scheduler.waiting(consumer_pk)

    def interest_gone(self, subject: str) -> None:
        """The requester's inbox lost its last subscriber: its requests are dropped silently."""
        self.scheduler.drop(lambda w: self._owns(w, subject))

    def drop_all(self) -> None:
        """The connection carrying deliveries went away: nobody can be answered any more."""
        self.scheduler.drop(self._owns)

    def _owns(self, waiter: Waiter, reply: str | None = None) -> bool:
        sink = waiter.sink
        return (
            isinstance(sink, NatsRequest)
            and sink.engine is self
            and (reply is None or sink.reply == reply)
        )

    async def close(self) -> None:
        self._closed = True
        self.drop_all()
        await self.scheduler.settle()
