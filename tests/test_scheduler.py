"""The pull scheduler (app/services/scheduler.py) on its own: requests of any transport, here a
recording sink, wait per consumer and are served from shared claims, on both databases."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import httpx
import pytest

from app.domain.models import Consumer
from app.domain.pulls import PullEnd
from app.runtime import Runtime
from app.services.scheduler import PullScheduler, Waiter, WaitPolicy
from tests.helpers.pull import CHANNEL, PullConsumer, publish, setup_channel, until_waiting
from tests.helpers.sinks import Recorder
from tests.helpers.waiting import eventually


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    [k1] = await setup_channel(client, "k1")
    return k1


async def consumer(rt: Runtime, consumer_id: str = "k1") -> Consumer:
    return await rt.admin.get_consumer(CHANNEL, consumer_id)


def waiter(sink: Recorder, batch: int, **fields: object) -> Waiter:
    return Waiter(sink, batch_left=batch, **fields)  # type: ignore[arg-type]


async def ended(sink: Recorder) -> PullEnd:
    return await asyncio.wait_for(asyncio.shield(sink.ended), timeout=10)


async def test_requests_are_served_round_robin_one_job_at_a_time(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(6):
        await publish(client, f"m{n}")
    who = await consumer(runtime)
    sinks = [Recorder() for _ in range(3)]
    for sink in sinks:  # queued in one go: the first round sees all three
        runtime.scheduler.submit(who, waiter(sink, 2))
    assert [await ended(s) for s in sinks] == [PullEnd.FILLED] * 3
    assert [s.ids for s in sinks] == [[1, 4], [2, 5], [3, 6]]


async def test_a_request_that_does_not_end_on_delivery_waits_for_its_whole_batch(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    who = await consumer(runtime)
    whole, first = Recorder(), Recorder()
    runtime.scheduler.submit(who, waiter(whole, 3))
    runtime.scheduler.submit(who, waiter(first, 3, ends_on_delivery=True))
    await until_waiting(runtime, who.pk, 2)
    await publish(client, "a")
    await publish(client, "b")
    assert await ended(first) == PullEnd.DELIVERED
    await publish(client, "c")
    await publish(client, "d")
    assert await ended(whole) == PullEnd.FILLED
    assert len(whole.ids) == 3 and len(first.ids) == 1
    assert sorted(whole.ids + first.ids) == [1, 2, 3, 4]


async def test_expiry_no_wait_and_a_deleted_consumer_end_requests(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    who = await consumer(runtime)
    loop = asyncio.get_running_loop()
    expiring, no_wait, deleted = Recorder(), Recorder(), Recorder()
    runtime.scheduler.submit(who, waiter(no_wait, 5, no_wait=True, expires_given=False))
    assert await ended(no_wait) == PullEnd.NO_MESSAGES
    runtime.scheduler.submit(who, waiter(expiring, 5, expires_at=loop.time() + 0.3))
    runtime.scheduler.submit(who, waiter(deleted, 5))
    assert await ended(expiring) == PullEnd.EXPIRED
    assert not deleted.ended.done()
    modified = (await client.get(k1.base)).headers["Last-Modified"]
    r = await client.delete(k1.base, headers={"If-Unmodified-Since": modified})
    assert r.status_code == 204, r.text
    assert await ended(deleted) == PullEnd.CONSUMER_DELETED
    assert runtime.scheduler.waiting(who.pk) == 0


async def test_idle_requests_get_heartbeats_and_numbered_sinks_get_sequences(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    who = await consumer(runtime)
    sink = Recorder(numbered=True)
    runtime.scheduler.submit(who, waiter(sink, 2, heartbeat=0.1))
    await eventually(lambda: len(sink.heartbeats) >= 2, what="two heartbeats to an idle request")
    assert sink.heartbeats[0] == (0, 0)
    await publish(client, "a")
    await publish(client, "b")
    assert await ended(sink) == PullEnd.FILLED
    assert [d.seq for d in sink.deliveries] == [1, 2]


class NewestFirst:
    """A policy of its own: the request that came last is served first."""

    claims_ahead = True
    fills_whole_first = False

    def pick(self, waiters: deque[Waiter], eligible: Callable[[Waiter], bool]) -> Waiter | None:
        return next((w for w in reversed(waiters) if eligible(w)), None)

    def served(self, waiters: deque[Waiter], waiter: Waiter) -> None:
        if waiter.batch_left == 0:
            waiters.remove(waiter)


async def test_the_policy_decides_which_request_takes_the_next_job(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    """The seam priority groups plug into: the same queue, another WaitPolicy."""
    policy: WaitPolicy = NewestFirst()
    scheduler = PullScheduler(
        runtime.claims,
        runtime.signals,
        max_claim=10,
        max_waiting=10,
        policy=lambda _consumer: policy,
    )
    await publish(client, "only")
    who = await consumer(runtime)
    old, new = Recorder(), Recorder()
    scheduler.submit(who, waiter(old, 1, expires_at=asyncio.get_running_loop().time() + 1))
    scheduler.submit(who, waiter(new, 1))
    try:
        assert await ended(new) == PullEnd.FILLED
        assert new.ids == [1]
        assert await ended(old) == PullEnd.EXPIRED
    finally:
        await scheduler.close()
