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
switch read those counts holding the lock; a later snapshot sees G): so the counts before G
rising past what the switch read says how many such messages there are. `make_up` (run by
the bridge a few times in the seconds after a switch) gives the consumer a job for each, the
newest messages of the channel it has none for, and adds them to its opening balance. Those
jobs come after the ones publishes made meanwhile: the only place where a consumer's jobs are
not in message order. SQLite writes one transaction at a time and has no such window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from app.store.backfill import BackfillStore
from app.store.db import Database, Tx

# Messages per chunk: a transaction short enough that a publish never waits on it (publishes
# do not touch a copying consumer's row) and a crash loses little.
CHUNK = 500
# A publish that raced a switch stamped its message before the switch committed: make_up looks
# at messages this much older than the switch at most (never at the history long delivered).
RACE_LOOKBACK = timedelta(seconds=60)
# Chunks copied without the channel locked stop at messages this young: a publish still
# running may hold a smaller id than one that committed (ids are taken before commit), and a
# cursor moved past it would skip it. The switch, channel locked, copies the young ones.
FRESH = timedelta(seconds=5)


@dataclass(frozen=True, slots=True)
class Switched:
    """A consumer set live: what make_up compares against."""

    consumer_pk: int
    channel_id: str
    start: int  # its first message pk
    generation: int  # the consumer's ledger_from
    counted: int  # publishes counted before `generation` when it went live (and made up since)
    at: datetime


@dataclass(frozen=True, slots=True)
class Step:
    copied: int
    live: bool  # the consumer is live now (or gone, or another process copies it)
    cursor: int  # where the next chunk starts
    switched: Switched | None = None  # this step set it live


async def finish(
    tx: Tx, consumer_pk: int, channel_id: str, cursor: int, chunk: int
) -> tuple[int, Switched | None]:
    """With the channel row locked in `tx`: the rest copied, the consumer live. How many were
    copied, and what make_up needs (None: another process moved the cursor first)."""
    store = BackfillStore(tx)
    total = 0
    while (done := await store.copy(consumer_pk, cursor, chunk)) is not None:
        copied, cursor = done
        total += copied
        if copied < chunk:
            break
    if done is None:
        return total, None
    generation = await store.go_live(consumer_pk, channel_id, cursor)
    if generation is None:
        return total, None
    counted = await store.counted_before(channel_id, generation)
    start = await store.start_of(consumer_pk)
    return total, Switched(consumer_pk, channel_id, start, generation, counted, datetime.now(UTC))


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

    async def make_up(self, switched: Switched) -> Switched:
        """Jobs for the publishes that raced the switch and have committed since (see the
        module's doc); the record to compare against next time."""
        async with self._db.transaction() as tx:
            store = BackfillStore(tx)
            counted = await store.counted_before(switched.channel_id, switched.generation)
            missing = counted - switched.counted
            if missing <= 0:
                return switched
            made = await store.make_up(
                switched.consumer_pk,
                switched.channel_id,
                switched.start,
                missing,
                switched.at - RACE_LOOKBACK,
            )
            if made:
                tx.announce([switched.consumer_pk])
        return replace(switched, counted=switched.counted + made)
