"""Channels, producers and consumers: plain Core statements returning domain records."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Row,
    Table,
    and_,
    delete,
    false,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.models import (
    Consumer,
    ConsumerOptions,
    ConsumerType,
    Cursor,
    Page,
    PushSettings,
    Stakeholder,
)
from app.domain.priority import PriorityPolicy, PrioritySettings
from app.store.db import Tx
from app.store.ledger import LedgerStore
from app.store.pagination import page_bounds, paginate
from app.store.schema import channel, consumer, producer


def _stakeholder(row: Row[Any]) -> Stakeholder:
    return Stakeholder(
        id=row.id,
        name=row.name,
        token=row.token,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def consumer_from_row(row: Row[Any]) -> Consumer:
    return Consumer(
        pk=row.pk,
        id=row.consumer_id,
        channel_id=row.channel_id,
        name=row.name,
        token=row.token,
        callback_url=row.callback_url,
        type=ConsumerType(row.type),
        ack_wait_seconds=row.ack_wait_seconds,
        max_ack_pending=row.max_ack_pending,
        created_at=row.created_at,
        updated_at=row.updated_at,
        priority=PrioritySettings(
            row.priority_group,
            PriorityPolicy(row.priority_policy),
            row.priority_timeout_seconds,
        ),
        push=PushSettings(
            signing_secret=row.signing_secret,
            previous_signing_secret=row.previous_signing_secret,
            previous_secret_until=row.previous_secret_until,
            max_in_flight=row.max_in_flight,
            rate_limit=row.rate_limit,
        ),
        options=ConsumerOptions(
            max_deliver=row.max_deliver,
            max_waiting=row.max_waiting,
            backoff=tuple(int(v) for v in row.backoff or ()),
            description=row.description,
            metadata=dict(row.metadata) if row.metadata else None,
            deliver_policy=row.deliver_policy,
            ephemeral=bool(row.ephemeral),
            ack_policy=row.ack_policy,
            inactive_threshold=row.inactive_threshold,
            deliver_subject=row.deliver_subject,
            deliver_group=row.deliver_group,
            idle_heartbeat=row.idle_heartbeat,
            flow_control=bool(row.flow_control),
            opt_start_seq=row.opt_start_seq,
            opt_start_time=row.opt_start_time,
            mem_storage=bool(row.mem_storage),
            backfilling=row.backfill_next is not None,
        ),
        paused_until=row.paused_until,
    )


class StakeholderStore:
    """Channels and producers share one shape: id, name, token, timestamps."""

    def __init__(self, tx: Tx, table: Table) -> None:
        self._tx = tx
        self._table = table

    async def get(self, id_: str, *, for_update: bool = False) -> Stakeholder | None:
        query = select(self._table).where(self._table.c.id == id_)
        if for_update:
            query = query.with_for_update()
        row = (await self._tx.conn.execute(query)).first()
        return _stakeholder(row) if row else None

    async def insert(self, id_: str, name: str, token: str, at: datetime) -> Stakeholder | None:
        """Insert a new row; None when another request created it first."""
        values = {"id": id_, "name": name, "token": token, "created_at": at, "updated_at": at}
        try:
            async with self._tx.conn.begin_nested():
                row = (
                    await self._tx.conn.execute(
                        insert(self._table).values(**values).returning(self._table)
                    )
                ).one()
        except IntegrityError:
            return None
        return _stakeholder(row)

    async def update(self, id_: str, name: str, token: str, at: datetime) -> Stakeholder:
        row = (
            await self._tx.conn.execute(
                update(self._table)
                .where(self._table.c.id == id_)
                .values(name=name, token=token, updated_at=at)
                .returning(self._table)
            )
        ).one()
        return _stakeholder(row)

    async def list(self, cursor: Cursor, limit: int) -> Page[Stakeholder]:
        query = paginate(select(self._table), self._table.c.id, cursor, limit)
        rows = (await self._tx.conn.execute(query)).all()
        items, next_cursor, previous_cursor = page_bounds(rows, cursor, limit, "id")
        return Page([_stakeholder(row) for row in items], next_cursor, previous_cursor)


def channels(tx: Tx) -> StakeholderStore:
    return StakeholderStore(tx, channel)


def producers(tx: Tx) -> StakeholderStore:
    return StakeholderStore(tx, producer)


class ConsumerStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def get(
        self, channel_id: str, consumer_id: str, *, for_update: bool = False
    ) -> Consumer | None:
        query = select(consumer).where(
            consumer.c.channel_id == channel_id, consumer.c.consumer_id == consumer_id
        )
        if for_update:
            query = query.with_for_update()
        row = (await self._tx.conn.execute(query)).first()
        return consumer_from_row(row) if row else None

    async def get_by_pk(self, pk: int) -> Consumer | None:
        row = (await self._tx.conn.execute(select(consumer).where(consumer.c.pk == pk))).first()
        return consumer_from_row(row) if row else None

    async def shortest_ack_wait(self) -> int | None:
        """The shortest ack wait a consumer sets for itself (None: all take the default)."""
        query = select(func.min(consumer.c.ack_wait_seconds))
        value: int | None = (await self._tx.conn.execute(query)).scalar_one()
        return value

    async def insert(self, values: dict[str, Any]) -> Consumer | None:
        try:
            async with self._tx.conn.begin_nested():
                born = await LedgerStore(self._tx).next_generation(values["channel_id"])
                row = (
                    await self._tx.conn.execute(
                        insert(consumer).values(**values, ledger_from=born).returning(consumer)
                    )
                ).one()
        except IntegrityError:
            return None
        return consumer_from_row(row)

    async def update(self, pk: int, values: dict[str, Any]) -> Consumer:
        query = update(consumer).where(consumer.c.pk == pk).values(**values).returning(consumer)
        return consumer_from_row((await self._tx.conn.execute(query)).one())

    async def delete(self, pk: int) -> None:
        await self._tx.conn.execute(delete(consumer).where(consumer.c.pk == pk))
        await LedgerStore(self._tx).forget(pk)

    async def for_channel(self, channel_id: str) -> Sequence[Consumer]:
        rows = await self._tx.conn.execute(
            select(consumer).where(consumer.c.channel_id == channel_id).order_by(consumer.c.pk)
        )
        return [consumer_from_row(row) for row in rows]

    async def push_consumers(self) -> list[Consumer]:
        rows = await self._tx.conn.execute(
            select(consumer).where(consumer.c.type == ConsumerType.PUSH.value)
        )
        return [consumer_from_row(row) for row in rows]

    async def list(self, channel_id: str, cursor: Cursor, limit: int) -> Page[Consumer]:
        base = select(consumer).where(consumer.c.channel_id == channel_id)
        rows = (
            await self._tx.conn.execute(paginate(base, consumer.c.consumer_id, cursor, limit))
        ).all()
        items, next_cursor, previous_cursor = page_bounds(rows, cursor, limit, "consumer_id")
        return Page([consumer_from_row(row) for row in items], next_cursor, previous_cursor)


# Tokens are compared by the database, here as in the queue statements (app/store/queue.py):
# the rows are found by their keys first, so each comparison is one short string equality, and
# no token leaves the database on a request's path.


class ConsumerCheck(NamedTuple):
    channel_token_ok: bool
    consumer: Consumer | None  # None: no such consumer in the channel
    consumer_token_ok: bool


async def check_consumer_tokens(
    tx: Tx, channel_id: str, channel_token: str | None, consumer_id: str, consumer_token: str | None
) -> ConsumerCheck | None:
    """Both tokens checked and the consumer read, in one round trip; None when no such channel.

    Every pull and ack that is not settled by its one statement comes here first."""
    query = (
        select(
            _matches(channel.c.token, channel_token).label("channel_token_ok"),
            _matches(consumer.c.token, consumer_token).label("consumer_token_ok"),
            *consumer.c,
        )
        .select_from(
            channel.outerjoin(
                consumer,
                and_(consumer.c.channel_id == channel.c.id, consumer.c.consumer_id == consumer_id),
            )
        )
        .where(channel.c.id == channel_id)
    )
    row = (await tx.conn.execute(query)).first()
    if row is None:
        return None
    found = consumer_from_row(row) if row.pk is not None else None
    return ConsumerCheck(bool(row.channel_token_ok), found, bool(row.consumer_token_ok))


async def channel_token_matches(tx: Tx, channel_id: str, stored_token: str) -> bool | None:
    """Whether the channel's stored token is this one; None when there is no such channel."""
    query = select(_matches(channel.c.token, stored_token)).where(channel.c.id == channel_id)
    row = (await tx.conn.execute(query)).first()
    return None if row is None else bool(row[0])


class ProducerCheck(NamedTuple):
    channel_token_ok: bool
    producer_found: bool
    producer_token_ok: bool


async def check_producer_tokens(
    tx: Tx, channel_id: str, channel_token: str | None, producer_id: str, producer_token: str | None
) -> ProducerCheck | None:
    """The channel's and the producer's tokens checked in one round trip; None when no such
    channel."""
    query = (
        select(
            _matches(channel.c.token, channel_token).label("channel_token_ok"),
            producer.c.id.is_not(None).label("producer_found"),
            _matches(producer.c.token, producer_token).label("producer_token_ok"),
        )
        .select_from(channel.outerjoin(producer, producer.c.id == producer_id))
        .where(channel.c.id == channel_id)
    )
    row = (await tx.conn.execute(query)).first()
    if row is None:
        return None
    return ProducerCheck(
        bool(row.channel_token_ok), bool(row.producer_found), bool(row.producer_token_ok)
    )


def _matches(column: ColumnElement[Any], given: str | None) -> ColumnElement[Any]:
    # No token given never matches (NULL = x is NULL, which reads as false).
    return func.coalesce(column == given, false()) if given is not None else false()
