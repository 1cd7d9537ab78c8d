"""Copying a new consumer's history (deliver policies all, last, by_start_sequence and
by_start_time): one chunk per transaction, then the switch to live.

The switch: once a chunk comes back short, one transaction locks the channel row (which waits
for the publishes in flight and holds the next ones at their commit), copies what committed
meanwhile, and sets the consumer live under the channel's next generation. Publishes from
then on fan out to it; the delivery ledger owes it exactly those (app/store/ledger.py).

What this leaves open on PostgreSQL: a publish statement that took its snapshot before the
switch committed but reached the channel row's lock after the switch took it (the foreign key
check runs at the end of its statement) neither fans out to the consumer (its snapshot saw it
copying) nor is copied (it was uncommitted then). Such a message, at most one per publisher
running at that instant, has no job for the consumer; the ledger does not count it either
(it is counted under the generation before the consumer's), so it reads balanced. SQLite
writes one transaction at a time and has no such window.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.store.backfill import BackfillStore
from app.store.db import Database

# Messages per chunk: a transaction short enough that a publish never waits on it (publishes
# do not touch a copying consumer's row) and a crash loses little.
CHUNK = 500


@dataclass(frozen=True, slots=True)
class Step:
    copied: int
    live: bool  # the consumer is live now (or gone, or another process copies it)
    cursor: int  # where the next chunk starts


class BackfillService:
    def __init__(self, db: Database, chunk: int = CHUNK) -> None:
        self._db = db
        self._chunk = chunk

    async def copying(self, limit: int = 100) -> list[tuple[int, int]]:
        async with self._db.transaction() as tx:
            return await BackfillStore(tx).copying(limit)

    async def step(self, consumer_pk: int, cursor: int) -> Step:
        """One chunk from `cursor`; the switch when it came back short."""
        async with self._db.transaction() as tx:
            done = await BackfillStore(tx).copy(consumer_pk, cursor, self._chunk)
            if done is not None and done[0]:
                tx.announce([consumer_pk])
        if done is None:
            return Step(0, True, cursor)
        copied, cursor = done
        if copied == self._chunk:
            return Step(copied, False, cursor)
        return Step(copied + await self._switch(consumer_pk), True, cursor)

    async def _switch(self, consumer_pk: int) -> int:
        total = 0
        async with self._db.transaction() as tx:
            store = BackfillStore(tx)
            channel_id = await store.channel_of(consumer_pk)
            if channel_id is None or not await store.lock_channel(channel_id):
                return 0
            cursor = await store.cursor(consumer_pk)
            if cursor is None:
                return 0
            while (done := await store.copy(consumer_pk, cursor, self._chunk)) is not None:
                copied, cursor = done
                total += copied
                if copied < self._chunk:
                    break
            if total:
                tx.announce([consumer_pk])
            if done is not None and await store.go_live(consumer_pk, channel_id, cursor):
                tx.announce_change([consumer_pk])
        return total
