"""Pausing and resuming a consumer (the management API, the console, JetStream's
CONSUMER.PAUSE): claims and pushes stop, publishes still give it jobs, acks go on.

The stop itself is the claims' rule (app/store/pauses.py). Here the change is announced, so
that every dispatcher drops the consumer from its round at once, and every waiting pull
re-reads it: on a pause they go on waiting (until the pause ends, their own expiry or a
resume), on a resume they claim at once.
"""

from __future__ import annotations

from datetime import UTC, datetime

from app.domain.errors import NotFound
from app.domain.models import Consumer
from app.store.db import Database
from app.store.pauses import PauseStore
from app.store.stakeholders import ConsumerStore

# A pause with no end (until resumed): stored as the latest time both databases hold, so the
# claims' one comparison serves it too.
FOREVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def pause_end(consumer: Consumer) -> datetime | None:
    """When the consumer's pause ends by itself (None: not paused now, or until resumed)."""
    until = consumer.paused_until
    if until is None or until >= FOREVER or until <= datetime.now(UTC):
        return None
    return until


class PauseService:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def pause(
        self, channel_id: str, consumer_id: str, until: datetime | None = None
    ) -> Consumer:
        """Paused until `until` (None: until resumed); a time already past resumes it, as
        JetStream's pause_until does."""
        return await self._set(channel_id, consumer_id, FOREVER if until is None else until)

    async def resume(self, channel_id: str, consumer_id: str) -> Consumer:
        return await self._set(channel_id, consumer_id, None)

    async def _set(self, channel_id: str, consumer_id: str, until: datetime | None) -> Consumer:
        async with self._db.transaction() as tx:
            found = await ConsumerStore(tx).get(channel_id, consumer_id)
            changed = await PauseStore(tx).set(found.pk, until) if found else None
            if changed is None:
                raise NotFound(f"consumer {consumer_id!r} not found in channel {channel_id!r}")
            tx.announce_change([changed.pk])
        return changed
