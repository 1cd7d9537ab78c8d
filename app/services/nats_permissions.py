"""The pull consumers NATS workers need users for (`webhook-broker nats-permissions`)."""

from __future__ import annotations

from app.domain.models import ConsumerType
from app.store.bridge import BridgeStore
from app.store.db import Database
from app.store.stakeholders import ConsumerStore


async def pull_consumers(db: Database) -> list[tuple[str, str]]:
    """(channel id, consumer id) of every pull consumer, by channel then consumer id; push
    consumers never talk to NATS."""
    found: list[tuple[str, str]] = []
    async with db.transaction() as tx:
        consumers = ConsumerStore(tx)
        for channel_id in await BridgeStore(tx).channel_ids():
            found += sorted(
                (item.channel_id, item.id)
                for item in await consumers.for_channel(channel_id)
                if item.type is ConsumerType.PULL
            )
    return found
