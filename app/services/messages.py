"""Reading messages and their jobs (no tokens ever leave through here)."""

from __future__ import annotations

import builtins
from datetime import UTC, datetime

from app.domain.errors import Conflict, NotFound
from app.domain.models import Cursor, Job, Message, Page
from app.services.auth import publishing_producer
from app.services.reads import Reads
from app.store.db import Database, Tx
from app.store.job_counts import JobCountStore
from app.store.jobs import JobStore
from app.store.messages import MessageStore
from app.store.stakeholders import ConsumerStore, channels

PAGE_SIZE = 25


class MessageQueries:
    """Its reads go to the replica when it is within the limit (app/services/reads.py)."""

    def __init__(self, db: Database, reads: Reads | None = None) -> None:
        self._db = db
        self._reads = reads or Reads.primary_only(db)

    async def list(
        self, channel_id: str, cursor: Cursor, *, scheduled_only: bool = False, due: bool | None
    ) -> Page[Message]:
        """The channel's messages, or its scheduled ones; `due`: see MessageStore.list."""

        async def read(tx: Tx) -> Page[Message]:
            if await channels(tx).get(channel_id) is None:
                raise NotFound(f"channel {channel_id!r} not found")
            return await MessageStore(tx).list(
                channel_id, cursor, PAGE_SIZE, scheduled_only=scheduled_only, due=due
            )

        return await self._reads.read(read)

    async def cancel_scheduled(
        self,
        channel_id: str,
        message_id: str,
        credentials: tuple[str | None, str | None, str | None],
    ) -> None:
        """A scheduled message and its jobs are gone, if its time has not come (409 after).
        Whoever may publish to the channel may cancel: (channel token, producer, its token)."""
        async with self._db.transaction() as tx:
            await publishing_producer(tx, channel_id, *credentials)
            store = MessageStore(tx)
            if await store.cancel_scheduled(channel_id, message_id):
                return
            message = await store.get(channel_id, message_id)
            if message is None or message.scheduled_for is None:
                raise NotFound(f"no scheduled message {message_id!r} in channel {channel_id!r}")
            if message.scheduled_for > datetime.now(UTC):
                # Its message partition was exported whole (app/store/messages.py).
                raise Conflict(f"message {message_id!r} is archived: it can no longer be cancelled")
            raise Conflict(f"message {message_id!r} was dispatched already: its jobs are due")

    async def get(
        self, channel_id: str, message_id: str
    ) -> tuple[Message, builtins.list[tuple[Job, str]]]:
        """The message and its jobs, each with the id of the consumer it belongs to."""

        async def read(tx: Tx) -> tuple[Message, builtins.list[tuple[Job, str]]]:
            found = await MessageStore(tx).get(channel_id, message_id)
            if found is None:
                raise NotFound(f"message {message_id!r} not found in channel {channel_id!r}")
            jobs = await JobStore(tx).for_message(found.pk)
            consumers = {c.pk: c.id for c in await ConsumerStore(tx).for_channel(channel_id)}
            return found, [(j, consumers.get(j.consumer_pk, "")) for j in jobs]

        return await self._reads.read(read)

    async def status_counts(self, channel_id: str) -> dict[str, int]:
        async def read(tx: Tx) -> dict[str, int]:
            if await channels(tx).get(channel_id) is None:
                raise NotFound(f"channel {channel_id!r} not found")
            counts = await JobCountStore(tx).for_channel(channel_id)
            # SCHEDULED: those of the QUEUED ones whose scheduled message is yet to come.
            counts["SCHEDULED"] = await MessageStore(tx).scheduled_job_count(channel_id)
            return counts

        return await self._reads.read(read)
