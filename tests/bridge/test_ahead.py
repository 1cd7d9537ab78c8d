"""Claims ahead: while a round is handed out the bridge claims what the waiting requests still
want, or as much again for the next requests of a consumer pulling in a loop. Requests are
still served in queue order, and what nobody asks for is given back."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import nats
import pytest
from nats.aio.msg import Msg
from sqlalchemy import text

from app.bridge.bridge import Bridge
from app.runtime import Runtime
from app.services import claim_ahead
from tests.bridge.conftest import BridgeFactory, seed
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import bulk_publish
from tests.helpers.waiting import eventually

REQUESTS = 5
BATCH = 10  # = [pull] max-batch, so a round (two claims) covers two requests' budgets
QUEUED = 60


@pytest.fixture
def extra_config(cap: str) -> str:
    return seed(cap, ack_wait=120) + f"\n[pull]\nmax-batch={BATCH}\n"


@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_requests_beyond_one_round_get_the_queue_in_order(
    mode: str, hub: NatsServer, make_bridge: BridgeFactory, runtime: Runtime
) -> None:
    bridge = await make_bridge(mode, sweeper=False)
    await bulk_publish(runtime, QUEUED, channel="orders", producer="shop")
    arrived: list[tuple[str, int, int]] = []  # (request inbox, stream seq, consumer seq)
    done = asyncio.Event()

    def on_message(inbox: str) -> Callable[[Msg], Awaitable[None]]:
        # One subscription per request: in hybrid mode a delivery's subject is the channel id
        # (as JetStream's), so the inbox it reached is known only by who received it.
        async def received(msg: Msg) -> None:
            if msg.reply:  # a delivery; statuses (408 at expiry) have none
                tokens = msg.reply.split(".")
                arrived.append((inbox, int(tokens[-4]), int(tokens[-3])))
                if len(arrived) == REQUESTS * BATCH:
                    done.set()

        return received

    nc = await nats.connect(hub.url)
    try:
        for n in range(REQUESTS):
            await nc.subscribe(f"_INBOX.ahead.{n}", cb=on_message(f"_INBOX.ahead.{n}"))
        await nc.flush()
        request = json.dumps({"batch": BATCH, "expires": 5_000_000_000}).encode()
        for n in range(REQUESTS):
            await nc.publish(
                "$JS.API.CONSUMER.MSG.NEXT.orders.workers", request, reply=f"_INBOX.ahead.{n}"
            )
        await asyncio.wait_for(done.wait(), timeout=10)
    finally:
        await nc.close()

    # The queue's order, numbered in it: sorted by job (stream sequence), the delivery
    # sequences ascend; and each request got its jobs in that order. (Each inbox has its own
    # subscription, whose callbacks nats-py runs on their own, so the order across inboxes is
    # not the wire order.)
    by_job = sorted(arrived, key=lambda a: a[1])
    stream_seqs = [s for _, s, _ in by_job]
    assert len(set(stream_seqs)) == len(stream_seqs) == REQUESTS * BATCH
    consumer_seqs = [c for _, _, c in by_job]
    assert consumer_seqs == sorted(consumer_seqs) and len(set(consumer_seqs)) == len(arrived)
    for n in range(REQUESTS):
        mine = [(s, c) for inbox, s, c in arrived if inbox == f"_INBOX.ahead.{n}"]
        assert mine == sorted(mine)
    assert Counter(inbox for inbox, _, _ in arrived) == {
        f"_INBOX.ahead.{n}": BATCH for n in range(REQUESTS)
    }

    # Once no request comes, what was claimed ahead is given back: exactly the delivered jobs
    # are leased, once each, and the rest wait unclaimed.
    await eventually(lambda: settled(bridge, runtime, REQUESTS * BATCH, QUEUED), timeout=10)
    async with runtime.db.transaction() as tx:
        leased = set(
            (await tx.conn.execute(text("SELECT id FROM job WHERE status = 'INFLIGHT'"))).scalars()
        )
    assert leased == set(stream_seqs)


async def job_counts(runtime: Runtime) -> dict[tuple[str, int], int]:
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text("SELECT status, attempt, count(*) FROM job GROUP BY status, attempt")
        )
        return {(status, attempt): n for status, attempt, n in rows.all()}


async def settled(bridge: Bridge, runtime: Runtime, delivered: int, queued: int) -> bool:
    if bridge.engine.claimed_ahead():
        return False
    expected = {("INFLIGHT", 1): delivered, ("QUEUED", 0): queued - delivered}
    return await job_counts(runtime) == {k: n for k, n in expected.items() if n}


async def test_the_next_request_gets_jobs_claimed_ahead_and_the_rest_go_back(
    hub: NatsServer, make_bridge: BridgeFactory, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claim_ahead, "READY_GRACE_SECONDS", 1.0)
    bridge = await make_bridge("client", sweeper=False)
    await bulk_publish(runtime, 3 * BATCH, channel="orders", producer="shop")
    nc = await nats.connect(hub.url)
    try:
        psub = await nc.jetstream().pull_subscribe_bind("workers", stream="orders")
        first = await psub.fetch(BATCH, timeout=5)

        async def held() -> bool:
            counts = await job_counts(runtime)
            return bridge.engine.claimed_ahead() == BATCH and counts[("INFLIGHT", 1)] == 2 * BATCH

        # A consumer that pulled 10 is likely to pull 10 again: they are claimed already.
        await eventually(held, timeout=0.9)
        second = await psub.fetch(BATCH, timeout=5)
    finally:
        await nc.close()
    # (In client mode the ack subject has the bridge's prefix, so nats-py cannot parse it.)
    tokens = [m.reply.split(".") for m in first + second]
    assert [int(t[-4]) for t in tokens] == list(range(1, 2 * BATCH + 1))  # stream sequences
    consumer_seqs = [int(t[-3]) for t in tokens]
    assert consumer_seqs == sorted(consumer_seqs)
    # The ten claimed after the second fetch are given back when no third request comes.
    await eventually(lambda: settled(bridge, runtime, 2 * BATCH, 3 * BATCH), timeout=10)
