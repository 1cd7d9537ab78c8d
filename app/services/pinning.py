"""The pins of pinned_client consumers: unpinned by an operator, or lapsed when the pinned
client stopped pulling (the sweeper). Each clears the pin in one statement and wakes the
consumer's waiting requests, so that a standby is pinned at the next dispatch."""

from __future__ import annotations

from app.domain import advisories
from app.domain.models import Consumer
from app.domain.priority import check_unpin
from app.domain.pulls import ConsumerCredentials
from app.services.advisories import Advisories
from app.services.auth import pull_consumer
from app.store.db import Database
from app.store.pins import Pin, PinStore
from app.store.stakeholders import ConsumerStore


class PinService:
    def __init__(self, db: Database, advisories: Advisories | None = None) -> None:
        self._db = db
        self._advisories = advisories or Advisories()

    async def current(self, consumer_pk: int) -> Pin | None:
        async with self._db.transaction() as tx:
            return await PinStore(tx).current(consumer_pk)

    async def unpin(self, consumer: Consumer, group: str) -> bool:
        """Clear the group's pin; False when nobody held it."""
        check_unpin(consumer.priority, group)
        async with self._db.transaction() as tx:
            unpinned = await PinStore(tx).unpin(consumer.pk)
            if unpinned:
                tx.announce([consumer.pk])
        if unpinned:
            await self._advisories.emit(
                advisories.unpinned(consumer.channel_id, consumer.id, group, "admin")
            )
        return unpinned

    async def unpin_as(self, creds: ConsumerCredentials, group: str) -> bool:
        """An unpin over HTTP, with the consumer's credentials."""
        async with self._db.transaction() as tx:
            consumer = await pull_consumer(tx, creds)
        return await self.unpin(consumer, group)

    async def expire(self) -> list[tuple[int, str]]:
        """Clear the pins whose clients have not pulled for their timeout: (consumer, group)."""
        async with self._db.transaction() as tx:
            lapsed = await PinStore(tx).expire()
            tx.announce({pk for pk, _ in lapsed})
            consumers = ConsumerStore(tx)
            named = [(await consumers.get_by_pk(pk), group) for pk, group in lapsed]
        for consumer, group in named:
            if consumer is not None:
                await self._advisories.emit(
                    advisories.unpinned(consumer.channel_id, consumer.id, group, "timeout")
                )
        return lapsed
