"""Copying a new consumer's history (deliver policies all, last, by_start_sequence and
by_start_time): one chunk per transaction, then the switch to live.

The switch: once a chunk comes back short, one transaction locks the channel row (which waits
for the publishes in flight and holds the next ones at their commit), copies what committed
meanwhile, and sets the consumer live under the channel's next generation G. Publishes from
then on fan out to it; the delivery ledger owes it exactly those (app/store/ledger.py).

One window is left on PostgreSQL: a publish statement that took its snapshot before the switch
committed but reached the channel row's lock after the switch took it (the foreign key check
runs at the end of its statement) neither fans out to the consumer (its snapshot saw it
copying) nor was copied (it was uncommitted then). Every such publish counts itself in the
ledger under a generation before G, after the switch committed, and nothing else can (the
switch read those counts holding the lock; a later snapshot sees G). So the switch records
itself in the consumer's row: those counts, and the cursor it locked the channel at (such a
publish's message pk is at or above it). `make_up`, run by every bridge after its copies
(app/bridge/backfill.py) while a switch is recorded, gives the consumer a job for each such
message that has committed, as many as the counts rose, adds them to its opening balance, and
clears the record once the switch is SETTLE old: a bridge stopping in between leaves the record
to the next. Those jobs come after the ones publishes made meanwhile: the only place where a
consumer's jobs are not in message order. SQLite writes one transaction at a time and has no
such window (its records find nothing to make up).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.store.backfill import BackfillStore
from app.store.db import Database, Tx

# Messages per chunk: a transaction short enough that a publish never waits on it (publishes
# do not touch a copying consumer's row) and a crash loses little.
CHUNK = 500
# Chunks copied without the channel locked stop at messages this young: a publish still
# running may hold a smaller id than one that committed (ids are taken before commit), and a
# cursor moved past it would skip it. The switch, channel locked, copies the young ones.
FRESH = timedelta(seconds=5)
# A switch's record is cleared this long after it: a publish that raced it started before it
# and, as FRESH assumes of every publish, commits within FRESH of its start (twice, to spare).
SETTLE = 2 * FRESH


@dataclass(frozen=True, slots=True)
class Switched:
    """A consumer set live, its switch recorded for make_up."""

    consumer_pk: int


@dataclass(frozen=True, slots=True)
class Step:
    copied: int
    live: bool  # the consumer is live now (or gone, or another process copies it)
    cursor: int  # where the next chunk starts
    switched: Switched | None = None  # this step set it live


async def finish(
    tx: Tx, consumer_pk: int, channel_id: str, cursor: int, chunk: int
) -> tuple[int, Switched | None]:
    """With the channel row locked in `tx`: the rest copied, the consumer live and its switch
    recorded. How many were copied, and the switch (None: another process moved the cursor
    first)."""
    store = BackfillStore(tx)
    locked_at = cursor
    total = 0
    while (done := await store.copy(consumer_pk, cursor, chunk)) is not None:
        copied, cursor = done
        total += copied
        if copied < chunk:
            break
    if done is None or not await store.go_live(consumer_pk, channel_id, locked_at, cursor):
        return total, None
    return total, Switched(consumer_pk)


class BackfillService:
    def __init__(self, db: Database, chunk: int = CHUNK, fresh: timedelta = FRESH) -> None:
        self._db = db
        self._chunk = chunk
        self._fresh = fresh

    async def copying(self, limit: int = 100) -> list[tuple[int, int]]:
        async with self._db.transaction() as tx:
            return await BackfillStore(tx).copying(limit)

    async def step(self, consumer_pk: int, cursor: int) -> Step:
        """One chunk from `cursor`; the switch when it came back short."""
        async with self._db.transaction() as tx:
            done = await BackfillStore(tx).copy(
                consumer_pk, cursor, self._chunk, fresh_from=datetime.now(UTC) - self._fresh
            )
            if done is not None and done[0]:
                tx.announce([consumer_pk])
        if done is None:
            return Step(0, True, cursor)
        copied, cursor = done
        if copied == self._chunk:
            return Step(copied, False, cursor)
        more, switched = await self._switch(consumer_pk)
        return Step(copied + more, True, cursor, switched)

    async def _switch(self, consumer_pk: int) -> tuple[int, Switched | None]:
        async with self._db.transaction() as tx:
            store = BackfillStore(tx)
            channel_id = await store.channel_of(consumer_pk)
            if channel_id is None or not await store.lock_channel(channel_id):
                return 0, None
            cursor = await store.cursor(consumer_pk)
            if cursor is None:
                return 0, None
            total, switched = await finish(tx, consumer_pk, channel_id, cursor, self._chunk)
            if switched is not None:
                tx.announce_change([consumer_pk])
            elif total:
                tx.announce([consumer_pk])
        return total, switched

    async def switches(self, limit: int = 100) -> list[tuple[int, int]]:
        """(consumer pk, what make_up is given) of the switches still recorded."""
        async with self._db.transaction() as tx:
            return await BackfillStore(tx).switches(limit)

    async def make_up(self, consumer_pk: int, counted: int) -> int | None:
        """Jobs for the publishes that raced the consumer's switch and have committed since
        (see the module's doc): how many, None when another process had moved the record on."""
        async with self._db.transaction() as tx:
            made = await BackfillStore(tx).make_up(consumer_pk, counted, SETTLE.total_seconds())
            if made:
                tx.announce([consumer_pk])
        return made
