"""The operator console's use cases that no other service has: the overview, the bounded job
search, bulk requeue and delete of the dead jobs a filter matches, resetting a push breaker,
and the audit log. The console's other actions call the services the HTTP API uses (seed_jobs,
redrives, pinning), and record them here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from app.domain.attempts import Attempt, attempts_of
from app.domain.console import (
    BULK_LIMIT,
    PAGE_SIZE,
    PAYLOAD_BUDGET,
    SCAN_ROWS,
    Actor,
    AuditEntry,
    ConsumerRow,
    JobFilter,
    SearchPage,
)
from app.domain.errors import Forbidden, InvalidInput, NotFound
from app.domain.jobs import JobStatus
from app.domain.models import ClaimedJob, Consumer, ConsumerType, LedgerEntry
from app.services.pausing import FOREVER
from app.services.reads import Reads
from app.store.console import ConsoleStore
from app.store.db import Database, Tx
from app.store.jobs import JobStore
from app.store.ledger import LedgerStore
from app.store.pauses import PauseStore
from app.store.push_state import PushStateStore
from app.store.stakeholders import ConsumerStore

AUDIT_PAGE = 100


@dataclass(frozen=True, slots=True)
class Overview:
    """Every consumer's counters, and its ledger's unaccounted jobs (0 when it balances),
    read in one transaction."""

    consumers: list[ConsumerRow]
    unaccounted: dict[tuple[str, str], int]
    at: datetime


@dataclass(frozen=True, slots=True)
class Matching:
    """The dead jobs a bulk action would touch now; `more`: the filter matches more than
    BULK_LIMIT, and the action takes the newest BULK_LIMIT."""

    ids: list[int]
    more: bool
    # A field search read PAYLOAD_BUDGET bytes of payloads before the window's end: older
    # jobs were not looked at (a narrower window reaches them).
    cut: bool = False


class ConsoleService:
    def __init__(self, db: Database, reads: Reads | None = None) -> None:
        self._db = db
        # The pages' reads (overview, search, job page) may go to the replica; what an action
        # reads to decide (consumer, matching) and the audit log stay on the primary.
        self._reads = reads or Reads.primary_only(db)

    async def overview(self) -> Overview:
        async def read(tx: Tx) -> tuple[list[ConsumerRow], list[LedgerEntry]]:
            return await ConsoleStore(tx).overview(), list(await LedgerStore(tx).entries())

        rows, ledger = await self._reads.read(read)
        return Overview(
            rows,
            {(e.channel_id, e.consumer_id): e.unaccounted for e in ledger},
            datetime.now(UTC),
        )

    async def consumer(self, channel_id: str, consumer_id: str) -> Consumer:
        async with self._db.transaction() as tx:
            return await _consumer(tx, channel_id, consumer_id)

    async def search(
        self, channel_id: str, consumer_id: str, which: JobFilter, before: int | None
    ) -> SearchPage:
        async def read(tx: Tx) -> tuple[list[ClaimedJob], int | None, int, bool]:
            found = await _consumer(tx, channel_id, consumer_id)
            return await ConsoleStore(tx).search(
                found.pk,
                channel_id,
                which,
                before=before,
                limit=PAGE_SIZE + 1,
                scan=SCAN_ROWS,
                budget=PAYLOAD_BUDGET,
            )

        rows, lowest, scanned, cut = await self._reads.read(read)
        if which.payload is None:
            more = len(rows) > PAGE_SIZE
            rows = rows[:PAGE_SIZE]
            return SearchPage(rows, rows[-1].job.id if more and rows else None)
        query = which.payload
        if query.field:
            # Matched here, then the payloads dropped: the page lists no payload.
            hits = [
                ClaimedJob(r.job, r.message._replace(payload=b""))
                for r in rows
                if query.matches(r.message.payload)
            ]
        else:
            hits = rows  # the database's byte match is exact
        if len(hits) > PAGE_SIZE:
            return SearchPage(hits[:PAGE_SIZE], hits[PAGE_SIZE - 1].job.id, scanned)
        # The read ended above the window's end (the row limit, or a field search's byte
        # budget): the next page reads on from the lowest id it read.
        more = cut or scanned >= SCAN_ROWS
        next_before = lowest if more and lowest is not None else None
        return SearchPage(hits, next_before, scanned)

    async def job(self, channel_id: str, consumer_id: str, job_id: int) -> ClaimedJob:
        async def read(tx: Tx) -> ClaimedJob:
            found = await _consumer(tx, channel_id, consumer_id)
            claimed = await JobStore(tx).get_with_message(job_id, found.pk)
            if claimed is None:  # raised inside: a replica's miss is asked of the primary
                raise NotFound(f"job {job_id} not found for consumer {consumer_id!r}")
            return claimed

        return await self._reads.read(read)

    async def attempts(self, claimed: ClaimedJob) -> list[Attempt]:
        """The job's attempt history, newest first (read apart from the job: nothing else
        reads the column)."""

        async def read(tx: Tx) -> object:
            return await ConsoleStore(tx).attempts(claimed.job.id)

        return attempts_of(await self._reads.read(read), claimed.job.attempt)

    async def set_pause(
        self, actor: Actor, channel_id: str, consumer_id: str, paused: bool
    ) -> Consumer:
        """Pause (until resumed) or resume the consumer, audited in the same transaction."""
        _admin(actor)
        async with self._db.transaction() as tx:
            found = await _consumer(tx, channel_id, consumer_id)
            changed = await PauseStore(tx).set(found.pk, FOREVER if paused else None)
            if changed is None:
                raise NotFound(f"consumer {consumer_id!r} not found in channel {channel_id!r}")
            tx.announce_change([changed.pk])
            action = "pause" if paused else "resume"
            await ConsoleStore(tx).record(
                actor.role, actor.session, action, f"{channel_id}/{consumer_id}", None, ""
            )
            return changed

    async def matching(self, channel_id: str, consumer_id: str, which: JobFilter) -> Matching:
        """The dead jobs of the filter a bulk requeue or delete would touch now."""
        _dead_only(which)
        async with self._db.transaction() as tx:
            found = await _consumer(tx, channel_id, consumer_id)
            return await _matching(tx, found, which)

    async def requeue_matching(
        self, actor: Actor, channel_id: str, consumer_id: str, which: JobFilter
    ) -> int:
        return await self._bulk(actor, "requeue-matching", channel_id, consumer_id, which)

    async def delete_matching(
        self, actor: Actor, channel_id: str, consumer_id: str, which: JobFilter
    ) -> int:
        return await self._bulk(actor, "delete-matching", channel_id, consumer_id, which)

    async def _bulk(
        self, actor: Actor, action: str, channel_id: str, consumer_id: str, which: JobFilter
    ) -> int:
        """The filter evaluated again now (the confirmation's count may have moved), the
        matching jobs moved in one conditional statement that leaves any no longer DEAD, and
        the audit entry written in the same transaction."""
        _dead_only(which)
        _admin(actor)
        async with self._db.transaction() as tx:
            found = await _consumer(tx, channel_id, consumer_id)
            ids = (await _matching(tx, found, which)).ids
            store = ConsoleStore(tx)
            if action == "requeue-matching":
                count = await store.requeue_dead(found.pk, ids)
                if count:
                    tx.announce([found.pk])
            else:
                count = await store.delete_dead(found.pk, ids)
            await store.record(
                actor.role,
                actor.session,
                action,
                f"{channel_id}/{consumer_id}",
                count,
                _describe(which),
            )
            return count

    async def reset_breaker(self, actor: Actor, channel_id: str, consumer_id: str) -> bool:
        """A push consumer's breaker closed and its endpoint enabled again (what a PUT with
        enabled=true does); False when it was closed and enabled already."""
        _admin(actor)
        async with self._db.transaction() as tx:
            found = await _consumer(tx, channel_id, consumer_id)
            if found.type is not ConsumerType.PUSH:
                raise InvalidInput(
                    f"consumer {consumer_id!r} is a pull consumer: it has no breaker"
                )
            changed = await PushStateStore(tx).enable(found.pk)
            if changed:
                # Dispatchers drop the state they read and try the endpoint again at once.
                tx.announce_change([found.pk])
            await ConsoleStore(tx).record(
                actor.role,
                actor.session,
                "reset-breaker",
                f"{channel_id}/{consumer_id}",
                None,
                "closed" if changed else "was closed already",
            )
            return changed

    async def record(
        self, actor: Actor, action: str, target: str, jobs: int | None, detail: str = ""
    ) -> None:
        """An action another service took, in the audit log."""
        async with self._db.transaction() as tx:
            await ConsoleStore(tx).record(actor.role, actor.session, action, target, jobs, detail)

    async def audit(self, before: int | None = None) -> list[AuditEntry]:
        async with self._db.transaction() as tx:
            return await ConsoleStore(tx).audit(before, AUDIT_PAGE)


async def _consumer(tx: Tx, channel_id: str, consumer_id: str) -> Consumer:
    found = await ConsumerStore(tx).get(channel_id, consumer_id)
    if found is None:
        raise NotFound(f"consumer {consumer_id!r} not found in channel {channel_id!r}")
    return found


async def _matching(tx: Tx, found: Consumer, which: JobFilter) -> Matching:
    # One more than the limit read, to tell "exactly the limit" from "more".
    scan = BULK_LIMIT + 1 if which.payload is None else SCAN_ROWS * 10
    rows, cut = await ConsoleStore(tx).matching(
        found.pk, found.channel_id, which, scan=scan, budget=PAYLOAD_BUDGET
    )
    query = which.payload
    # No payload: the database settled it (no search, or a text search's exact byte match).
    ids = [i for i, payload in rows if payload is None or query is None or query.matches(payload)]
    return Matching(ids[:BULK_LIMIT], len(ids) > BULK_LIMIT, cut)


def _dead_only(which: JobFilter) -> None:
    if which.status is not JobStatus.DEAD:
        raise InvalidInput(
            "bulk requeue and delete act on DEAD jobs: filter by status DEAD (a redrive "
            "replays DELIVERED ones)"
        )


def _admin(actor: Actor) -> None:
    if not actor.can_act:
        raise Forbidden("the reader token allows reads only")


def _describe(which: JobFilter) -> str:
    return " ".join(f"{k}={v}" for k, v in which.query().items())
