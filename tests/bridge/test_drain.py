"""Two bridges side by side and eight nats-py workers drain 5,000 jobs: every job is delivered
exactly once and every ack lands in the database."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from sqlalchemy import text

from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, seed
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import bulk_publish
from tests.helpers.waiting import eventually

JOBS = 5000
WORKERS = 8


@pytest.fixture
def extra_config(cap: str) -> str:
    # A long ack wait: a redelivery here could only mean a lost or late ack.
    return seed(cap, ack_wait=120)


@pytest.mark.parametrize("mode", ["hybrid", "client"])
async def test_two_bridges_eight_workers_drain_5000(
    mode: str, hub: NatsServer, make_bridge: BridgeFactory, runtime: Runtime
) -> None:
    bridges = [await make_bridge(mode, sweeper=False), await make_bridge(mode, sweeper=False)]
    await bulk_publish(runtime, JOBS, channel="orders", producer="shop")
    received: list[int] = []
    done = asyncio.Event()

    async def worker() -> None:
        nc = await nats.connect(hub.url)
        try:
            psub = await nc.jetstream().pull_subscribe_bind("workers", stream="orders")
            while not done.is_set():
                try:
                    batch = await psub.fetch(50, timeout=1)
                except TimeoutError:  # nats' own, or asyncio's from fetch()
                    continue
                for msg in batch:
                    received.append(int(msg.reply.split(".")[-4]))
                    await msg.ack()
                if len(received) >= JOBS:
                    done.set()
            await nc.flush()
        finally:
            await nc.close()

    start = time.monotonic()
    tasks = [asyncio.create_task(worker()) for _ in range(WORKERS)]
    await asyncio.wait_for(done.wait(), timeout=60)
    await asyncio.gather(*tasks)

    async def all_delivered() -> bool:
        async with runtime.db.transaction() as tx:
            counts: dict[str, int] = dict(
                (
                    await tx.conn.execute(text("SELECT status, count(*) FROM job GROUP BY status"))
                ).all()
            )
        return counts == {"DELIVERED": JOBS}

    await eventually(all_delivered, timeout=30)
    elapsed = time.monotonic() - start
    async with runtime.db.transaction() as tx:
        attempts = (
            await tx.conn.execute(text("SELECT attempt, count(*) FROM job GROUP BY attempt"))
        ).all()
        ids = sorted((await tx.conn.execute(text("SELECT id FROM job"))).scalars())
    assert sorted(received) == ids and len(ids) == JOBS  # each job handed out exactly once
    assert [tuple(row) for row in attempts] == [(1, JOBS)]  # ... and claimed exactly once
    # Both bridges did part of the work (queue groups spread requests and acks).
    assert all(b.acks.applied > 0 for b in bridges), [b.acks.applied for b in bridges]
    assert sum(b.acks.applied for b in bridges) == JOBS
    assert elapsed < 50, elapsed
