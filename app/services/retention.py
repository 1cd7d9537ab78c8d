"""The job and message tables' partitions over their life (PostgreSQL): made ahead, rotated
each interval (the two tables in the same round), job partitions drained of unfinished jobs once
their retention has passed, and, after the archive exported and read them back (job partitions)
or archived every message of them (message partitions, once no job points into them), detached
and dropped (a message partition's keys forgotten between the two). Each step is safe to
repeat and to run from several sweepers; whatever a crash interrupted, the next round finishes
(app/store/partitions.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from app.store.db import Database
from app.store.partitions import (
    ATTACHED,
    DETACHED,
    EXPORTED,
    MESSAGES,
    PENDING,
    ROTATE_AT,
    Partition,
    PartitionStore,
    partition_name,
)

log = logging.getLogger(__name__)

CHUNK = 1000  # jobs per moving statement, keys per deleting one: each its own short transaction

# Told after each round, per table: its partitions by state (the sweeper's metrics gauge).
StatesObserver = Callable[[str, dict[str, int]], None]


@dataclass
class RoundReport:
    created: list[str] = field(default_factory=list)
    rotated_to: str | None = None
    messages_rotated_to: str | None = None
    held: int = 0
    moved: int = 0
    detached: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


class RetentionService:
    def __init__(
        self,
        db: Database,
        interval_seconds: float,
        retention_days: int,
        *,
        hold_seconds: float,
        chunk: int = CHUNK,
        observe_states: StatesObserver | None = None,
    ) -> None:
        self._store = PartitionStore(db)
        self._messages = PartitionStore(db, MESSAGES)
        self._observe = observe_states
        self._retention_days = retention_days
        self._enabled = db.dialect == "postgresql"
        self._interval = interval_seconds
        self._retention = timedelta(days=retention_days)
        self._chunk = chunk
        # Longer than the rounds are apart, so that a held job is still held when moved.
        self._hold = hold_seconds

    @property
    def store(self) -> PartitionStore:
        return self._store

    @property
    def message_store(self) -> PartitionStore:
        return self._messages

    async def run_round(self) -> RoundReport:
        report = RoundReport()
        if not self._enabled:
            return report
        await self.maintain(report)
        await self.drain(report)
        await self.finish_exported(report)
        await self.finish_messages(report)
        await self.observe()
        return report

    async def observe(self) -> None:
        if self._observe is None:
            return
        for store in (self._store, self._messages):
            self._observe(store.of.table, await store.state_counts())

    async def maintain(self, report: RoundReport | None = None) -> None:
        """For the job table and then the message table: a partition ahead of the one taking
        ids, and the rotation once its interval ends (or three quarters of its ids are used)."""
        report = report or RoundReport()
        for store in (self._store, self._messages):
            await self._maintain(store, report)

    async def _maintain(self, store: PartitionStore, report: RoundReport) -> None:
        attached = [p for p in await store.partitions() if p.status == ATTACHED]
        if not attached:
            return
        position = await store.position()
        current = next((p for p in attached if p.low <= position < p.upper_id), None)
        table = store.of.table
        if current is None:  # the sequence past every partition: only a manual setval does it
            log.error("%s id %d is in no partition of the %s table", table, position, table)
            return
        if current.opened_at is None:  # a rotation's setval landed, its commit did not
            await store.mark_opened(current.name)
            current = next(p for p in await store.partitions() if p.name == current.name)
        ahead = [p for p in attached if p.low >= current.upper_id]
        if not ahead:
            if await store.create(current.upper_id):
                report.created.append(partition_name(current.upper_id, store.of))
            ahead = [p for p in await store.partitions() if p.low >= current.upper_id]
        now = await store.now()
        used = position - (current.lower_id if current.lower_id is not None else 0)
        timed_out = (
            self._interval > 0
            and current.opened_at is not None
            and current.opened_at + timedelta(seconds=self._interval) <= now
        )
        if (timed_out or used >= ROTATE_AT) and ahead:
            following = ahead[0]
            if await store.rotate(current.name, following):
                if store is self._store:
                    report.rotated_to = following.name
                else:
                    report.messages_rotated_to = following.name
                log.info("%s ids now go to partition %s", table, following.name)
                if await store.create(following.upper_id):
                    report.created.append(partition_name(following.upper_id, store.of))

    async def drain(self, report: RoundReport | None = None) -> RoundReport:
        """Unfinished jobs of partitions past their retention, moved to the current one."""
        report = report or RoundReport()
        now = await self._store.now()
        position = await self._store.position()
        for part in await self._store.partitions():
            if part.status != ATTACHED or part.closed_at is None:
                continue
            if part.low <= position < part.upper_id:
                continue  # still taking ids (a rotation half done): moving would stay in it
            if part.closed_at + self._retention > now:
                continue
            # Moves what an earlier round held (and dead and scheduled jobs), then holds the
            # due ones for the next round.
            while (moved := await self._store.move_forward(part, self._chunk)) > 0:
                report.moved += moved
                if moved < self._chunk:
                    break
            while (held := await self._store.hold_due(part, self._chunk, self._hold)) > 0:
                report.held += held
                if held < self._chunk:
                    break
        return report

    async def ready(self) -> list[Partition]:
        """Closed partitions past their retention that hold only delivered jobs: the archive's
        to export."""
        now = await self._store.now()
        return [
            part
            for part in await self._store.partitions()
            if part.status == ATTACHED
            and part.closed_at is not None
            and part.closed_at + self._retention <= now
            and not await self._store.has_unfinished(part)
        ]

    async def finish_exported(self, report: RoundReport | None = None) -> RoundReport:
        """Detach and drop what the archive exported and read back."""
        report = report or RoundReport()
        for part in await self._store.partitions():
            if part.status == EXPORTED:
                await self._store.detach(part.name)
                report.detached.append(part.name)
            if part.status in (EXPORTED, DETACHED) and await self._store.drop(part.name):
                report.dropped.append(part.name)
                log.info("job partition %s dropped after its archive", part.name)
        return report

    async def finish_messages(self, report: RoundReport | None = None) -> RoundReport:
        """Message partitions whose messages are all archived, and that no job points into
        any more: detached, their keys forgotten, dropped.

        A job can still come while one detaches (a history copy whose statement saw it
        attached): once detached, one that a job points into goes back, EXPORTED, with its
        keys, and waits for that job. A detach a crash stopped half way (pending, which keeps
        every other concurrent detach of message out) or that finished before its state said
        so is finished before anything else, whatever points into it now."""
        report = report or RoundReport()
        store = self._messages
        parts = await store.partitions()
        attachment = {p.name: await store.attachment(p.name) for p in parts if p.status == EXPORTED}
        # The pending first: a DETACH ... CONCURRENTLY of another fails while one is pending.
        parts.sort(key=lambda p: attachment.get(p.name) != PENDING)
        for part in parts:
            status = part.status
            if (
                status == ATTACHED
                and part.closed_at is not None
                and await store.mark_emptied(part, self._retention_days)
            ):
                status = EXPORTED
                attachment[part.name] = ATTACHED
            if status == EXPORTED:
                if attachment[part.name] == ATTACHED and await store.referenced(part):
                    continue  # a job (or a job partition on its way out) still points into it
                await store.detach(part.name)
                report.detached.append(part.name)
                status = DETACHED
            if status != DETACHED:
                continue
            if await store.reattach_if_pointed_into(part.name):
                log.info("message partition %s attached again: a job points into it", part.name)
                continue
            while (forgotten := await store.forget_keys(part, self._chunk)) > 0:
                if forgotten < self._chunk:
                    break
            if await store.drop(part.name):
                report.dropped.append(part.name)
                log.info("message partition %s dropped after its archive", part.name)
        return report
