"""A consumer's pause: the one rule every claim follows, and the statement that sets it.

A claim acts for the consumer row it selects first (app/store/queue.py's NAMED, SQLite's
`_sqlite_named`); a paused consumer's row is simply not selected, so the claim finds no
consumer and leases nothing, whichever path it came by (an HTTP pull, a waiting pull, the
NATS bridge, the push dispatcher, a capped consumer's locked claim). Acks, naks and lease
expiries are not claims: they go on while a consumer is paused, as on a paused JetStream
consumer.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ColumnElement, or_, update

from app.domain.models import Consumer
from app.store.db import Tx, now
from app.store.schema import consumer
from app.store.stakeholders import consumer_from_row

# PostgreSQL's text of the rule, for the statements written as text.
NOT_PAUSED_SQL = "(consumer.paused_until IS NULL OR consumer.paused_until <= now())"


def not_paused(dialect: str) -> ColumnElement[bool]:
    """The rule as an expression, on the database's clock."""
    return or_(consumer.c.paused_until.is_(None), consumer.c.paused_until <= now(dialect))


class PauseStore:
    def __init__(self, tx: Tx) -> None:
        self._tx = tx

    async def set(self, consumer_pk: int, until: datetime | None) -> Consumer | None:
        """Pause the consumer until `until` (None: resume); the consumer as it is now (None:
        deleted meanwhile). One statement: the last of two racing calls wins, as on JetStream."""
        query = (
            update(consumer)
            .where(consumer.c.pk == consumer_pk)
            .values(paused_until=until)
            .returning(consumer)
        )
        row = (await self._tx.conn.execute(query)).first()
        return consumer_from_row(row) if row else None
