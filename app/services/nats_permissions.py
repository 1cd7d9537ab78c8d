"""The pull consumers NATS workers need users for (`webhook-broker nats-permissions`)."""

from __future__ import annotations

from app.domain.models import ConsumerType
from app.domain.nats_permissions import WorkerConsumer
from app.store.bridge import BridgeStore
from app.store.db import Database
from app.store.stakeholders import ConsumerStore


async def pull_consumers(db: Database) -> list[WorkerConsumer]:
    """Every consumer a NATS worker reaches, by channel then consumer id: the pull consumers,
    with the deliver subject and group of those that NATS push delivers to. The broker's
    webhook (HTTP push) consumers never talk to NATS."""
    found: list[WorkerConsumer] = []
    async with db.transaction() as tx:
        consumers = ConsumerStore(tx)
        for channel_id in await BridgeStore(tx).channel_ids():
            found += sorted(
                WorkerConsumer(
                    item.channel_id,
                    item.id,
                    item.options.deliver_subject or "",
                    item.options.deliver_group or "",
                )
                for item in await consumers.for_channel(channel_id)
                if item.type is ConsumerType.PULL
            )
    return found
