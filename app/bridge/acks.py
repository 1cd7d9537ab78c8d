"""Acks from JetStream clients, turned into the shared ack statements in batches.

Acks are queued as they arrive and applied by one task: everything queued so far for one
consumer goes into one statement when all are plain acks, else one transaction (one
conditional UPDATE per ack kind: AckService.ack_for). A job named twice in a batch (`+WPI`
then `+ACK`) is split into consecutive rounds so both apply, in order. Fencing: the ack
subject carries the attempt; an ack whose attempt or job no longer matches the current claim
changes nothing and is ignored.
After the commit: an empty reply to every ack that had a reply subject (nats-py `ack_sync`),
`+NXT` requests go to the pull engine, and advisories are published.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import NamedTuple

from nats.nuid import NUID

from app.bridge import protocol as p
from app.bridge.engine import Outbound, PullEngine
from app.domain.errors import InvalidInput
from app.domain.jobs import AckType
from app.domain.models import Consumer, ConsumerType, Job
from app.domain.pulls import AckItem, AckOutcome, AckResult
from app.logging import log_failure
from app.services.acking import AckBatch
from app.services.bridge import BridgeService, Lookup

log = logging.getLogger(__name__)

MAX_ACKS_PER_ROUND = 500
# Client acks held at most, queued or in the statement being applied (the database slow or
# away): beyond it one is dropped, as nats-py drops what a subscription too far behind is sent,
# and it is as if lost on the way: an ack's job is delivered again when its ack wait ends, a
# `+WPI` does not extend the lease, an `+NXT` asks for nothing, an ack_sync waits in vain.
MAX_QUEUED_ACKS = 65_536

ConsumerLookup = Callable[[str, str], Awaitable[Lookup]]
Publish = Callable[[str, bytes], Awaitable[None]]

_KINDS: dict[p.AckKind, AckType] = {
    p.AckKind.ACK: AckType.ACK,
    p.AckKind.NEXT: AckType.ACK,
    p.AckKind.NAK: AckType.NAK,
    p.AckKind.TERM: AckType.TERM,
    p.AckKind.PROGRESS: AckType.PROGRESS,
}


# Only NAK and TERM are advised (as on the server); plain acks skip the advisory work.
_ADVISED = frozenset({p.AckKind.NAK, p.AckKind.TERM})
# nats-server answers no +ACK or +TERM for a sequence it never delivered (a NAK or +WPI it
# answers whatever the sequence).
_SILENT_WHEN_UNKNOWN = frozenset({p.AckKind.ACK, p.AckKind.TERM})


class InboundAck(NamedTuple):
    token: p.AckToken
    command: p.AckCommand
    reply: str | None
    # The bridge's own settle of an AckNone delivery as it was sent (app/bridge/engine.py).
    sent: bool = False


class AckProcessor:
    def __init__(
        self,
        service: BridgeService,
        lookup: ConsumerLookup,
        engine: PullEngine,
        replies: Outbound,
        publish: Publish,
    ) -> None:
        self._service = service
        self._lookup = lookup
        self._engine = engine
        self._replies = replies
        self._publish = publish
        self._queue: list[InboundAck] = []
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._dropping = False
        self._applying = 0  # acks in the batch being applied
        self.applied = 0
        self._nuid = NUID()

    def submit(self, ack: InboundAck) -> None:
        held = len(self._queue) + self._applying
        if held >= MAX_QUEUED_ACKS and not ack.sent:
            if not self._dropping:  # once while the bound holds
                log.warning("%d acks wait for the database; dropping more", held)
            self._dropping = True
            return
        self._dropping = False
        self._queue.append(ack)
        self._idle.clear()
        self._ready.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self, stop: asyncio.Event) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                if stop.is_set():
                    return
                waiter = asyncio.ensure_future(self._ready.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                self._ready.clear()
                continue
            batch, self._queue = self._queue, []
            self._applying = len(batch)
            try:
                await self._process(batch)
            except Exception:
                log_failure(log, "applying %d acks failed; they are retried", len(batch))
                self._applying = 0  # queued again: counted there
                self._queue = batch + self._queue
                await asyncio.sleep(0.5)
            finally:
                self._applying = 0

    async def _process(self, batch: list[InboundAck]) -> None:
        by_consumer: defaultdict[tuple[str, str], list[InboundAck]] = defaultdict(list)
        for ack in batch:
            by_consumer[(ack.token.stream, ack.token.consumer)].append(ack)
        for (stream, name), acks in by_consumer.items():
            found = await self._lookup(stream, name)
            consumer = found.consumer
            if consumer is None or consumer.type is not ConsumerType.PULL:
                self._reply_all(acks)
                continue
            if self._engine.activity is not None:
                self._engine.activity.touch(consumer)
            if consumer.options.ack_policy == "none":
                # A client's acks on an AckNone consumer change nothing, as on nats-server;
                # its replies carry no job id (p.server_ack_subject), so none is looked for.
                self._reply_all([a for a in acks if not a.sent])
                acks = [a for a in acks if a.sent]
            elif consumer.options.deliver_subject:
                acks = await self._by_message(consumer, acks)
            applicable = [a for a in acks if a.command.kind in _KINDS]
            unanswered: set[int] = set()
            for round_ in _rounds(applicable):
                # Hundreds of acks a round: one pass over them after the statement, and the
                # advisories looked at only when an applied ack asks for one.
                items = [
                    AckItem(
                        a.token.job_id,
                        _KINDS[a.command.kind],
                        a.token.delivered,
                        a.command.delay,
                        a.command.reason,
                    )
                    for a in round_
                ]
                result = await apply_acks(self._service, consumer, items)
                results = [o.result for o in result.outcomes]
                advised = False
                for ack, outcome in zip(round_, results, strict=True):
                    kind = ack.command.kind
                    if outcome.applied:
                        self.applied += 1
                        advised = advised or kind in _ADVISED
                    elif outcome is AckResult.UNKNOWN_JOB and kind in _SILENT_WHEN_UNKNOWN:
                        unanswered.add(id(ack))
                if advised:
                    await self._advise(round_, results, result.dead)
            self._reply_all([a for a in acks if id(a) not in unanswered] if unanswered else acks)
            for ack in acks:
                if ack.command.kind is p.AckKind.NEXT and ack.reply:
                    self._engine.submit(consumer, ack.reply, ack.command.next_request)
        await self._replies.flush()

    async def _by_message(self, consumer: Consumer, acks: list[InboundAck]) -> list[InboundAck]:
        """A push delivery's ack names its message (p.server_ack_subject): each gets the
        consumer's job for that message, or none (0: no job has it, so the ack meets nothing,
        as an ack of a job that is gone)."""
        named = {a.token.stream_seq for a in acks if a.token.server_form and not a.sent}
        if not named:
            return acks
        jobs = await self._service.jobs_of_messages(consumer, sorted(named))
        return [
            a._replace(token=a.token._replace(job_id=jobs.get(a.token.stream_seq, 0)))
            if a.token.server_form and not a.sent
            else a
            for a in acks
        ]

    def _reply_all(self, acks: list[InboundAck]) -> None:
        for ack in acks:
            if ack.reply and ack.command.kind is not p.AckKind.NEXT:
                self._replies.send(ack.reply, None, None, b"")

    async def _advise(
        self, acks: list[InboundAck], results: list[AckResult], dead: list[Job]
    ) -> None:
        now = datetime.now(UTC)
        dead_ids = {j.id for j in dead}
        for ack, result in zip(acks, results, strict=True):
            if result is not AckResult.DONE or ack.command.kind not in _ADVISED:
                continue
            token = ack.token
            common: dict[str, object] = {
                "stream": token.stream,
                "consumer": token.consumer,
                "consumer_seq": token.consumer_seq,
                "stream_seq": token.stream_seq,
                "deliveries": token.delivered,
            }
            suffix = f"{token.stream}.{token.consumer}"
            if ack.command.kind is p.AckKind.NAK:
                await self._emit(f"MSG_NAKED.{suffix}", p.NAK_ADVISORY, now, common)
                if token.job_id in dead_ids:
                    fields = {k: v for k, v in common.items() if k != "consumer_seq"}
                    await self._emit(
                        f"MAX_DELIVERIES.{suffix}", p.MAX_DELIVER_ADVISORY, now, fields
                    )
            elif ack.command.kind is p.AckKind.TERM:
                fields = dict(common, reason=ack.command.reason or "")
                await self._emit(f"MSG_TERMINATED.{suffix}", p.TERMINATED_ADVISORY, now, fields)

    async def _emit(
        self, subject: str, kind: str, now: datetime, fields: dict[str, object]
    ) -> None:
        body = p.advisory(kind, self._nuid.next().decode(), now, fields)
        try:
            await self._publish(f"{p.ADVISORY_PREFIX}.{subject}", body)
        except Exception as exc:  # advisories are best effort, as on the server
            log.debug("advisory %s not published: %s", subject, exc)


async def apply_acks(service: BridgeService, consumer: Consumer, items: list[AckItem]) -> AckBatch:
    """The acks of one round; one the database refuses is dropped alone (nothing could ever
    store it) instead of holding back every ack queued with it."""
    try:
        return await service.acks(consumer, items)
    except InvalidInput:
        if len(items) == 1:
            log.warning("ack of job %s dropped: the database refuses it", items[0].id)
            return AckBatch([AckOutcome(items[0].id, AckResult.UNKNOWN_JOB, "refused")], [])
    singles = [await apply_acks(service, consumer, [item]) for item in items]
    return AckBatch(
        [o for one in singles for o in one.outcomes], [j for one in singles for j in one.dead]
    )


def _rounds(acks: list[InboundAck]) -> list[list[InboundAck]]:
    """Split into consecutive rounds in which each job appears at most once."""
    rounds: list[list[InboundAck]] = []
    current: list[InboundAck] = []
    seen: set[int] = set()
    for ack in acks:
        if ack.token.job_id in seen or len(current) >= MAX_ACKS_PER_ROUND:
            rounds.append(current)
            current, seen = [], set()
        current.append(ack)
        seen.add(ack.token.job_id)
    if current:
        rounds.append(current)
    return rounds
