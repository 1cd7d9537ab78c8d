"""Requests whose budgets outrun one round of claims: the next claims start while a round is
handed out, and still every request is served in queue order with nothing over-claimed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import nats
import pytest
from nats.aio.msg import Msg
from sqlalchemy import text

from app.runtime import Runtime
from tests.bridge.conftest import SEED, BridgeFactory, NatsServer, eventually
from tests.bridge.test_drain import bulk_publish

REQUESTS = 5
BATCH = 10  # = [pull] max-batch, so a round (two claims) covers two requests' budgets
QUEUED = 60


@pytest.fixture
def extra_config() -> str:
    return SEED.replace("ack-wait=2", "ack-wait=120") + f"\n[pull]\nmax-batch={BATCH}\n"


@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_requests_beyond_one_round_get_the_queue_in_order(
    mode: str, hub: NatsServer, make_bridge: BridgeFactory, runtime: Runtime
) -> None:
    await make_bridge(mode, sweeper=False)
    await bulk_publish(runtime, QUEUED)
    arrived: list[tuple[str, int, int]] = []  # (request inbox, stream seq, consumer seq)
    done = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        if msg.reply:  # a delivery; statuses (408 at expiry) have none
            tokens = msg.reply.split(".")
            arrived.append((msg.subject, int(tokens[-4]), int(tokens[-3])))
            if len(arrived) == REQUESTS * BATCH:
                done.set()

    nc = await nats.connect(hub.url)
    try:
        await nc.subscribe("_INBOX.ahead.*", cb=on_message)
        await nc.flush()
        request = json.dumps({"batch": BATCH, "expires": 5_000_000_000}).encode()
        for n in range(REQUESTS):
            await nc.publish(
                "$JS.API.CONSUMER.MSG.NEXT.orders.workers", request, reply=f"_INBOX.ahead.{n}"
            )
        await asyncio.wait_for(done.wait(), timeout=10)
    finally:
        await nc.close()

    # One connection, so arrival order is delivery order: the queue's, numbered ascending.
    stream_seqs = [s for _, s, _ in arrived]
    consumer_seqs = [c for _, _, c in arrived]
    assert stream_seqs == sorted(stream_seqs) and len(set(stream_seqs)) == len(stream_seqs)
    assert consumer_seqs == sorted(consumer_seqs) and len(set(consumer_seqs)) == len(arrived)
    assert Counter(inbox for inbox, _, _ in arrived) == {
        f"_INBOX.ahead.{n}": BATCH for n in range(REQUESTS)
    }

    async def settled() -> bool:
        async with runtime.db.transaction() as tx:
            rows = await tx.conn.execute(
                text("SELECT status, attempt, count(*) FROM job GROUP BY status, attempt")
            )
            counts = {(status, attempt): n for status, attempt, n in rows.all()}
        # Exactly the delivered jobs are leased, once each; the rest wait unclaimed.
        return counts == {
            ("INFLIGHT", 1): REQUESTS * BATCH,
            ("QUEUED", 0): QUEUED - REQUESTS * BATCH,
        }

    await eventually(settled, within=10)
    async with runtime.db.transaction() as tx:
        leased = set(
            (await tx.conn.execute(text("SELECT id FROM job WHERE status = 'INFLIGHT'"))).scalars()
        )
    assert leased == set(stream_seqs)
