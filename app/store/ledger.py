"""The delivery ledger: what each consumer should hold, counted apart from its job rows.

A consumer is owed one job per message published to its channel since it was created (plus
the jobs it held when counting began, `ledger_opening`); the jobs deleted on purpose are
counted as they go. What it holds is the trigger-kept job_count. Owed - removed - held is 0
unless a job was lost or made twice: `/metrics` exports it so an alert can say so. Why the
generations make "since it was created" exact under concurrent publishes: migration 0008.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, func, literal, select, update

from app.domain.counters import COUNTER_SHARDS
from app.domain.models import LedgerEntry
from app.store.db import Tx, upsert
from app.store.schema import channel, consumer, job_count, job_removed, published_count

# A generation no channel reaches: a consumer copying its history is owed no publish.
SUSPENDED = 2**62


def _shard(dialect: str) -> ColumnElement[Any]:
    """The connection's own counter row, so concurrent writers never queue on one row (SQLite
    has one writer at a time: one row)."""
    if dialect == "postgresql":
        return func.pg_backend_pid() % COUNTER_SHARDS
    return literal(0)


class LedgerStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def next_generation(self, channel_id: str) -> int | None:
        """The channel's generation bumped for a consumer created in this transaction (None: no
        such channel); publishes that saw the consumer count under it or later."""
        bumped = (
            update(channel)
            .where(channel.c.id == channel_id)
            .values(generation=channel.c.generation + 1)
            .returning(channel.c.generation)
        )
        value: int | None = (await self._tx.conn.execute(bumped)).scalar_one_or_none()
        return value

    async def suspend(self, consumer_pk: int) -> None:
        """A consumer that copies its channel's history first (app/bridge/backfill.py): owed no
        publish until it goes live (publishes do not fan out to it meanwhile); each job copied
        is added to its opening balance instead (app/store/backfill.py)."""
        await self._tx.conn.execute(
            update(consumer).where(consumer.c.pk == consumer_pk).values(ledger_from=SUSPENDED)
        )

    async def counted_before(self, channel_id: str, generation: int) -> int:
        """Publishes to the channel counted under generations before `generation`."""
        query = select(func.coalesce(func.sum(published_count.c.n), 0)).where(
            published_count.c.channel_id == channel_id,
            published_count.c.generation < generation,
        )
        return int((await self._tx.conn.execute(query)).scalar_one())

    async def published(self, channel_id: str) -> None:
        """One message published to the channel, under the generation this transaction sees
        (SQLite's publish; PostgreSQL's counts inside its one statement, app/store/queue.py)."""
        generation = (
            select(channel.c.generation).where(channel.c.id == channel_id).scalar_subquery()
        )
        counted = upsert(self._tx.dialect, published_count).from_select(
            ["channel_id", "generation", "shard", "n"],
            select(literal(channel_id), generation, _shard(self._tx.dialect), literal(1)),
        )
        await self._tx.conn.execute(
            counted.on_conflict_do_update(
                index_elements=[
                    published_count.c.channel_id,
                    published_count.c.generation,
                    published_count.c.shard,
                ],
                set_={"n": published_count.c.n + 1},
            )
        )

    async def removed(self, counts: Mapping[int, int]) -> None:
        """Jobs deleted on purpose, by consumer pk: one statement whatever the fan-out, its rows
        in key order (two connections sharing a shard take their row locks in the same
        order)."""
        shard = _shard(self._tx.dialect)
        rows = [
            {"consumer_pk": consumer_pk, "shard": shard, "n": n}
            for consumer_pk, n in sorted(counts.items())
            if n
        ]
        if not rows:
            return
        added = upsert(self._tx.dialect, job_removed).values(rows)
        await self._tx.conn.execute(
            added.on_conflict_do_update(
                index_elements=[job_removed.c.consumer_pk, job_removed.c.shard],
                set_={"n": job_removed.c.n + added.excluded.n},
            )
        )

    async def forget(self, consumer_pk: int) -> None:
        """A deleted consumer's removals (SQLite may give its pk to the next consumer)."""
        await self._tx.conn.execute(
            delete(job_removed).where(job_removed.c.consumer_pk == consumer_pk)
        )

    async def entries(self, consumer_pk: int | None = None) -> Sequence[LedgerEntry]:
        """Every consumer's ledger (or one's), read in one statement (one snapshot: a publish or
        removal commits its counts with its rows, so a balanced ledger reads balanced)."""
        query = select(
            consumer.c.channel_id,
            consumer.c.consumer_id,
            (consumer.c.ledger_opening + _owed()).label("published"),
            _removed().label("removed"),
            _held().label("held"),
        ).order_by(consumer.c.channel_id, consumer.c.consumer_id)
        if consumer_pk is not None:
            query = query.where(consumer.c.pk == consumer_pk)
        rows = await self._tx.conn.execute(query)
        return [LedgerEntry(r[0], r[1], int(r[2]), int(r[3]), int(r[4])) for r in rows]

    async def settle(self, consumer_pk: int) -> None:
        """The consumer's opening balance taken again, so that what it holds and had removed
        is all it is owed: its ledger reads 0 from here (once a mismatch has been looked into).
        One statement: the counts it reads and the balance it writes are of one snapshot."""
        await self._tx.conn.execute(
            update(consumer)
            .where(consumer.c.pk == consumer_pk)
            .values(ledger_opening=_removed() + _held() - _owed())
        )


def _owed() -> ColumnElement[Any]:
    """Jobs a consumer was owed by publishes since its creation (its opening balance apart)."""
    return (
        select(func.coalesce(func.sum(published_count.c.n), 0))
        .where(
            published_count.c.channel_id == consumer.c.channel_id,
            published_count.c.generation >= consumer.c.ledger_from,
        )
        .scalar_subquery()
    )


def _removed() -> ColumnElement[Any]:
    return (
        select(func.coalesce(func.sum(job_removed.c.n), 0))
        .where(job_removed.c.consumer_pk == consumer.c.pk)
        .scalar_subquery()
    )


def _held() -> ColumnElement[Any]:
    return (
        select(func.coalesce(func.sum(job_count.c.n), 0))
        .where(job_count.c.consumer_pk == consumer.c.pk)
        .scalar_subquery()
    )
