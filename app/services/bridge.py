"""Use cases of the NATS bridge, on the shared claim and ack statements.

Pull requests wait in the shared pull scheduler (app/services/scheduler.py), claimed with the
same statement as HTTP pulls, numbered; acks go through AckService, as HTTP acks do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.jobs import RetryPolicy
from app.domain.models import MAX_FIELD_LENGTH, Consumer, StreamState
from app.domain.nats_consumers import ProcessLimits
from app.domain.pulls import AckItem
from app.services.acking import AckBatch, AckService
from app.services.admin import AdminService
from app.services.backfill import BackfillService
from app.services.claiming import ClaimSource
from app.services.consumer_management import ConsumerManagement
from app.services.consumer_state import ConsumerSnapshot, snapshot
from app.services.pinning import PinService
from app.services.tokens import TokenKeys
from app.store.bridge import BridgeStore
from app.store.db import Database
from app.store.nats_push import nats_push_consumers
from app.store.stakeholders import ConsumerStore, channels


@dataclass(frozen=True, slots=True)
class Lookup:
    channel_found: bool
    consumer: Consumer | None


class BridgeService:
    def __init__(
        self,
        db: Database,
        claims: ClaimSource,
        acks: AckService,
        policy: RetryPolicy,
        pins: PinService,
    ) -> None:
        self._db = db
        self._claims = claims
        self._acks = acks
        self._policy = policy
        self._pins = pins

    @property
    def policy(self) -> RetryPolicy:
        return self._policy

    def ack_wait(self, consumer: Consumer) -> int:
        return self._claims.ack_wait(consumer)

    async def lookup(self, channel_id: str, consumer_id: str) -> Lookup:
        # A name no channel or consumer can have is not found, as nats-server says of a
        # stream or consumer it does not have, without asking the database (it refuses NUL).
        if not _nameable(channel_id):
            return Lookup(False, None)
        async with self._db.transaction() as tx:
            if await channels(tx).get(channel_id) is None:
                return Lookup(False, None)
            if not _nameable(consumer_id):
                return Lookup(True, None)
            return Lookup(True, await ConsumerStore(tx).get(channel_id, consumer_id))

    async def push_consumers(self) -> list[Consumer]:
        """The consumers the bridge delivers to a deliver subject (app/bridge/push.py)."""
        async with self._db.transaction() as tx:
            return await nats_push_consumers(tx)

    async def account_counts(self) -> tuple[int, int]:
        """Streams and consumers as JetStream counts them: channels, and pull consumers."""
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).account_counts()

    async def stream_state(self, channel_id: str) -> StreamState | None:
        if not _nameable(channel_id):
            return None
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).stream_state(channel_id)

    async def channel_ids(self) -> list[str]:
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).channel_ids()

    async def acks(self, consumer: Consumer, items: Sequence[AckItem]) -> AckBatch:
        return await self._acks.ack_for(consumer, items)

    async def jobs_of_messages(
        self, consumer: Consumer, message_pks: Sequence[int]
    ) -> dict[int, int]:
        """{message pk: job id} of the consumer's jobs for these messages (push acks)."""
        async with self._db.transaction() as tx:
            return await BridgeStore(tx).job_ids_by_message(consumer.pk, message_pks)

    async def snapshot(self, consumer: Consumer) -> ConsumerSnapshot:
        return await snapshot(self._db, consumer)

    async def unpin(self, consumer: Consumer, group: str) -> bool:
        return await self._pins.unpin(consumer, group)

    def management(self, tokens: TokenKeys, limits: ProcessLimits) -> ConsumerManagement:
        """Consumer management over NATS, deleting through the management API's service."""
        return ConsumerManagement(self._db, AdminService(self._db, tokens), limits)

    def backfill(self) -> BackfillService:
        """Copying new consumers' history (app/bridge/backfill.py)."""
        return BackfillService(self._db)

    async def mark_active(self, consumer_pks: list[int]) -> None:
        """Consumers with an inactive threshold in use just now (app/bridge/activity.py)."""
        async with self._db.transaction() as tx:
            await BridgeStore(tx).mark_active(consumer_pks)

    async def apply_backoff(
        self, consumer_pk: int, leases: dict[int, list[tuple[int, int]]]
    ) -> None:
        """Leases of a backoff consumer's deliveries, by seconds: each runs that long from its
        claim (see BridgeStore.extend_leases)."""
        async with self._db.transaction() as tx:
            store = BridgeStore(tx)
            for seconds, targets in leases.items():
                await store.extend_leases(consumer_pk, targets, seconds)


def _nameable(name: str) -> bool:
    """Could a channel or consumer id be this (ids are at most 255 characters, no NUL)."""
    return len(name) <= MAX_FIELD_LENGTH and "\x00" not in name
