"""The push consumers the NATS bridge delivers (a deliver subject set over NATS)."""

from __future__ import annotations

from sqlalchemy import select

from app.domain.models import Consumer, ConsumerType
from app.store.db import Tx
from app.store.schema import consumer
from app.store.stakeholders import consumer_from_row


async def nats_push_consumers(tx: Tx) -> list[Consumer]:
    """Every consumer with a deliver subject, oldest first."""
    query = (
        select(consumer)
        .where(consumer.c.deliver_subject.is_not(None))
        .where(consumer.c.type == ConsumerType.PULL.value)
        .order_by(consumer.c.pk)
    )
    rows = await tx.conn.execute(query)
    return [consumer_from_row(row) for row in rows]
