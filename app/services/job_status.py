"""Job counts across the broker for `/job-status` and `/dlq-status` (the Go original's)."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.errors import NotFound
from app.domain.models import DeadCount, LedgerEntry, StatusCount
from app.services.reads import Reads
from app.store.db import Database
from app.store.job_counts import JobCountStore
from app.store.ledger import LedgerStore
from app.store.stakeholders import ConsumerStore


class JobStatusQueries:
    """The counts and the ledger read from the replica when it is within the limit (they are
    eventually consistent by nature: each is a snapshot the next change moves)."""

    def __init__(self, db: Database, reads: Reads | None = None) -> None:
        self._db = db
        self._reads = reads or Reads.primary_only(db)

    async def by_consumer(self) -> Sequence[StatusCount]:
        return await self._reads.read(lambda tx: JobCountStore(tx).by_consumer_and_status())

    async def dead_by_consumer(self) -> Sequence[DeadCount]:
        return await self._reads.read(lambda tx: JobCountStore(tx).dead_by_consumer())

    async def ledger(self) -> Sequence[LedgerEntry]:
        return await self._reads.read(lambda tx: LedgerStore(tx).entries())

    async def settle_ledger(self, channel_id: str, consumer_id: str) -> LedgerEntry:
        """Take a consumer's holdings as its new opening balance (after a mismatch was looked
        into); returns its ledger as it read just before."""
        async with self._db.transaction() as tx:
            found = await ConsumerStore(tx).get(channel_id, consumer_id, for_update=True)
            if found is None:
                raise NotFound(f"no consumer {consumer_id} on channel {channel_id}")
            ledger = LedgerStore(tx)
            (before,) = await ledger.entries(found.pk)
            await ledger.settle(found.pk)
            return before
