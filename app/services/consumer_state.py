"""What a pull consumer's state is, as JetStream's CONSUMER.INFO reports it: read once for the
bridge and for the HTTP consumer info endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.models import Consumer
from app.store.bridge import BridgeStore, DeliveryState
from app.store.db import Database
from app.store.jobs import JobStore, QueueStats
from app.store.pins import Pin, PinStore


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    consumer: Consumer
    stats: QueueStats
    state: DeliveryState
    pin: Pin | None = None


async def snapshot(db: Database, consumer: Consumer) -> ConsumerSnapshot:
    async with db.transaction() as tx:
        stats = await JobStore(tx).stats(consumer.pk)
        state = await BridgeStore(tx).delivery_state(consumer.pk)
        pin = await PinStore(tx).current(consumer.pk) if consumer.priority.active else None
    return ConsumerSnapshot(consumer, stats, state, pin)
