"""The pin of a pinned_client consumer's group: each change is one conditional statement, so
that processes pinning, touching, unpinning and expiring the same pin side by side agree."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update

from app.domain.priority import DEFAULT_PRIORITY_TIMEOUT
from app.store.db import Tx, now, plus_seconds, upsert
from app.store.schema import consumer, consumer_group_state

state = consumer_group_state


@dataclass(frozen=True, slots=True)
class Pin:
    group: str
    pinned_id: str
    pinned_at: datetime


class PinStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._now = now(tx.dialect)

    async def current(self, consumer_pk: int) -> Pin | None:
        query = select(state.c.group_name, state.c.pinned_id, state.c.pinned_at).where(
            state.c.consumer_pk == consumer_pk, state.c.pinned_id.is_not(None)
        )
        row = (await self._tx.conn.execute(query)).first()
        return Pin(row.group_name, row.pinned_id, row.pinned_at) if row else None

    async def assign(self, consumer_pk: int, group: str, pin_id: str) -> bool:
        """Pin `pin_id` unless the group is pinned already (False: someone else was first)."""
        values = {"pinned_id": pin_id, "pinned_at": self._now, "last_pull_at": self._now}
        statement = (
            upsert(self._tx.dialect, state)
            .values(consumer_pk=consumer_pk, group_name=group, **values)
            .on_conflict_do_update(
                index_elements=[state.c.consumer_pk],
                set_={**values, "group_name": group},
                where=state.c.pinned_id.is_(None),
            )
            .returning(state.c.pinned_id)
        )
        return (await self._tx.conn.execute(statement)).first() is not None

    async def touch(self, consumer_pk: int, pin_id: str) -> bool:
        """The pinned client pulled: its pin lasts another timeout (False: not its pin)."""
        result = await self._tx.conn.execute(
            update(state)
            .where(state.c.consumer_pk == consumer_pk, state.c.pinned_id == pin_id)
            .values(last_pull_at=self._now)
        )
        return bool(result.rowcount)

    async def unpin(self, consumer_pk: int) -> bool:
        """Clear the pin (False: nothing was pinned)."""
        result = await self._tx.conn.execute(
            update(state)
            .where(state.c.consumer_pk == consumer_pk, state.c.pinned_id.is_not(None))
            .values(pinned_id=None, pinned_at=None)
        )
        return bool(result.rowcount)

    async def expire(self) -> list[tuple[int, str]]:
        """Clear every pin whose client has not pulled for its consumer's priority timeout;
        the (consumer, group) pairs unpinned."""
        timeout = (
            select(func.coalesce(consumer.c.priority_timeout_seconds, DEFAULT_PRIORITY_TIMEOUT))
            .where(consumer.c.pk == state.c.consumer_pk)
            .scalar_subquery()
        )
        lapsed = plus_seconds(self._tx.dialect, state.c.last_pull_at, timeout) < self._now
        rows = await self._tx.conn.execute(
            update(state)
            .where(state.c.pinned_id.is_not(None), lapsed)
            .values(pinned_id=None, pinned_at=None)
            .returning(state.c.consumer_pk, state.c.group_name)
        )
        return [(row.consumer_pk, row.group_name) for row in rows]
