"""Job counts across the broker for `/job-status` and `/dlq-status` (the Go original's)."""

from __future__ import annotations

from collections.abc import Sequence

from app.domain.models import DeadCount, LedgerEntry, StatusCount
from app.store.db import Database
from app.store.job_counts import JobCountStore
from app.store.ledger import LedgerStore


class JobStatusQueries:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def by_consumer(self) -> Sequence[StatusCount]:
        async with self._db.transaction() as tx:
            return await JobCountStore(tx).by_consumer_and_status()

    async def dead_by_consumer(self) -> Sequence[DeadCount]:
        async with self._db.transaction() as tx:
            return await JobCountStore(tx).dead_by_consumer()

    async def ledger(self) -> Sequence[LedgerEntry]:
        async with self._db.transaction() as tx:
            return await LedgerStore(tx).entries()
