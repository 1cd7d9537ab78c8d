"""Job transitions through the broker's own store code (what the API and sweeper run)."""

from __future__ import annotations

import asyncio
import threading

from app.config import Config
from app.store.db import Database
from app.store.jobs import JobStore
from app.store.queue import Named, Queue


async def _requeue(
    config: Config, consumer_pk: int, job_id: int, hold: float, locked: threading.Event | None
) -> int:
    db = Database.from_config(config.database)
    try:
        async with db.transaction() as tx:
            moved = await JobStore(tx).requeue_dead(consumer_pk, job_id)
            if locked is not None:
                locked.set()
            await asyncio.sleep(hold)  # keeps the row locked, uncommitted
        return len(moved)
    finally:
        await db.dispose()


def requeue_dead(config: Config, consumer_pk: int, job_id: int) -> int:
    """DEAD -> QUEUED for one job, committed before this returns."""
    return asyncio.run(_requeue(config, consumer_pk, job_id, 0.0, None))


def requeue_dead_slowly(
    config: Config, consumer_pk: int, job_id: int, hold: float
) -> threading.Thread:
    """Requeue in a thread whose transaction holds the job's row lock for `hold` seconds."""
    locked = threading.Event()
    thread = threading.Thread(
        target=lambda: asyncio.run(_requeue(config, consumer_pk, job_id, hold, locked)),
        name="slow-requeue",
    )
    thread.start()
    assert locked.wait(30), "the requeue never took its lock"
    return thread


async def _deliver(config: Config, consumer_pk: int, job_id: int) -> None:
    db = Database.from_config(config.database)
    try:
        queue = Queue(db)
        claimed = await queue.claim(Named(consumer_pk), limit=50, default_ack_wait=30)
        assert job_id in {j.id for j in claimed.jobs}
        assert await queue.ack(Named(consumer_pk), [(job_id, None)]) == {job_id}
    finally:
        await db.dispose()


def claim_and_deliver(config: Config, consumer_pk: int, job_id: int) -> None:
    asyncio.run(_deliver(config, consumer_pk, job_id))
