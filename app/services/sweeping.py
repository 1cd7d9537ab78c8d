"""The requeue sweep: expired leases go back to the queue, or to the dead letters; and
consumers past their inactive threshold (ephemeral ones made over NATS) are deleted."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.domain import advisories
from app.domain.errors import NotFound
from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import Job, Observe, ignore
from app.services.admin import AdminService
from app.services.advisories import Advisories
from app.services.pinning import PinService
from app.services.tokens import TokenKeys
from app.store import upkeep
from app.store.bridge import BridgeStore
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.stakeholders import ConsumerStore


@dataclass(frozen=True, slots=True)
class LeaseHorizon:
    """When the next sweep has work: the earliest running lease's end, and the shortest lease
    a claim may start meanwhile (a consumer's own ack wait; None: only the default)."""

    next_end: datetime | None
    shortest_ack_wait: int | None
    next_inactive: datetime | None = None  # the earliest a consumer may run out


class SweepService:
    def __init__(
        self,
        db: Database,
        policy: RetryPolicy,
        batch_size: int,
        advisories: Advisories | None = None,
        observe: Observe = ignore,
        tokens: TokenKeys | None = None,
    ) -> None:
        self._observe = observe
        self._db = db
        self._policy = policy
        self._batch = batch_size
        self._advisories = advisories or Advisories()
        self._pins = PinService(db, self._advisories)
        # Deleting an inactive consumer is the management API's delete (its jobs go the same
        # way); without the token keys (a root that passes none) consumers never expire here.
        self._admin = AdminService(db, tokens) if tokens is not None else None

    async def sweep_once(self) -> int:
        """Sweep one bounded batch; returns how many jobs it moved."""
        async with self._db.transaction() as tx:
            moved = await JobStore(tx).requeue_expired(self._policy, self._batch)
            tx.announce({j.consumer_pk for j in moved})
        dead = [j for j in moved if j.status is JobStatus.DEAD]
        if moved:
            self._observe("lease_expiry_requeue", len(moved) - len(dead))
            self._observe("dead_letter", len(dead))
        if dead and self._advisories.attached:
            await self._advise_dead(dead)
        return len(moved)

    async def _advise_dead(self, dead: list[Job]) -> None:
        """MAX_DELIVERIES for jobs whose last lease lapsed (as nats-server advises a message
        that reached max_deliver)."""
        async with self._db.transaction() as tx:
            store = ConsumerStore(tx)
            named = {pk: await store.get_by_pk(pk) for pk in {j.consumer_pk for j in dead}}
        for job in dead:
            consumer = named[job.consumer_pk]
            if consumer is not None:
                await self._advisories.emit(
                    advisories.max_deliveries(
                        consumer.channel_id, consumer.id, job.message_pk, job.attempt
                    )
                )

    async def expire_pins(self) -> list[tuple[int, str]]:
        """Pins of pinned_client consumers whose client stopped pulling: cleared."""
        return await self._pins.expire()

    async def lease_horizon(self) -> LeaseHorizon:
        async with self._db.transaction() as tx:
            return LeaseHorizon(
                await JobStore(tx).next_lease_end(),
                await ConsumerStore(tx).shortest_ack_wait(),
                await BridgeStore(tx).next_inactive_at() if self._admin else None,
            )

    async def expire_inactive(self, batch: int = 100) -> list[tuple[str, str]]:
        """Delete the consumers past their inactive threshold, each re-checked under its row
        lock (a pull arriving meanwhile keeps it); returns (channel, consumer) of those gone."""
        if self._admin is None:
            return []
        async with self._db.transaction() as tx:
            candidates = await BridgeStore(tx).inactive_consumers(batch)
        gone = []
        for channel_id, consumer_id in candidates:
            try:
                deleted = await self._admin.delete_consumer(
                    channel_id, consumer_id, None, unconditional=True, only_if_inactive=True
                )
            except NotFound:  # deleted meanwhile
                continue
            if deleted:
                gone.append((channel_id, consumer_id))
        return gone

    async def vacuum_if_needed(self, min_dead_jobs: int) -> bool:
        """Vacuum the job table (PostgreSQL) once `min_dead_jobs` row versions are dead: the
        partitions that hold dead ones. A partition waiting for the archive, whose jobs have
        all finished, changes no more, and its indexes are not walked again for nothing."""
        if self._db.dialect != "postgresql":
            return False
        dead = await upkeep.dead_jobs(self._db)
        holding = [name for name, n in dead.items() if n > 0]
        if not holding or sum(dead.values()) < min_dead_jobs:
            return False
        await upkeep.vacuum_jobs(self._db, holding)
        return True

    async def sweep_all(self) -> int:
        """Sweep batch after batch until no expired lease is left."""
        total = 0
        while True:
            moved = await self.sweep_once()
            total += moved
            if moved < self._batch:
                return total
