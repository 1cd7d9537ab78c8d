"""The client against a real broker process: administration, publishing, fetch / next, acks."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import pytest
from webhook_broker_client import (
    Broker,
    ConsumerGone,
    InvalidRequest,
    Job,
    JobNotFound,
    PinLost,
    Published,
    StaleAck,
    Unauthorized,
)
from webhook_broker_client.sync import SyncBroker

from tests.helpers.processes import BrokerProcess, Setup, job_state


async def test_admin_and_publish(setup: Setup) -> None:
    broker = setup.broker
    got = await broker.get_consumer(setup.channel, "billing")
    assert got["ID"] == "billing" and got["Type"] == "pull" and "Token" not in got
    # a PUT of an existing consumer sends the version it changes, by itself
    changed = await broker.put_consumer(setup.channel, "billing", token="billing-token", ackWait=7)
    assert changed["AckWait"] == 7
    first = await broker.publish(setup.channel, {"order": 1}, message_id="order-1", priority=3)
    again = await broker.publish(setup.channel, {"order": 1}, message_id="order-1")
    assert first == Published(f"/channel/{setup.channel}/message/order-1", created=True)
    assert again.created is False and again.message_id == "order-1"
    results = await broker.publish_many(setup.channel, [f"m{n}" for n in range(40)], connections=4)
    assert len(results) == 40 and all(isinstance(r, Published) and r.created for r in results)
    info = await setup.consumer.info()
    assert (info.pending, info.ack_pending, info.waiting) == (41, 0, 0)
    (job,) = await setup.consumer.fetch(1, no_wait=True)
    assert job.json() == {"order": 1} and job.priority == 3  # the highest priority first
    assert job.content_type == "application/json"
    with pytest.raises(Unauthorized):
        await broker.publish(setup.channel, "x", channel_token="wrong")


async def test_fetch_and_next(setup: Setup) -> None:
    consumer = setup.consumer
    started = time.monotonic()
    assert await consumer.fetch(5, expires=0.5) == []
    assert time.monotonic() - started >= 0.5  # it waited for jobs until it expired
    assert await consumer.fetch(5, no_wait=True) == []
    await setup.broker.publish(setup.channel, b"\xff\x00binary", headers={"X-Trace": "t1"})
    for n in range(3):
        await setup.broker.publish(setup.channel, f"m{n}")
    started = time.monotonic()
    jobs = await consumer.fetch(2, expires=20)
    assert time.monotonic() - started < 10  # a filled batch ends the fetch, not its expiry
    assert [j.payload for j in jobs] == [b"\xff\x00binary", b"m0"]
    assert jobs[0].headers == {"X-Trace": "t1"}
    assert all(isinstance(j.id, str) and j.attempt == 1 for j in jobs)
    assert isinstance(jobs[0].lease_expires_at, datetime)
    job = await consumer.next(expires=5)
    assert job is not None and job.text == "m1"
    rest = await consumer.fetch(10, no_wait=True)
    assert [j.text for j in rest] == ["m2"]
    assert await consumer.next(expires=0.2) is None
    info = await consumer.info()
    assert (info.pending, info.ack_pending) == (0, 4)


@pytest.mark.parametrize("consumer_settings", [{"ackWait": "1"}])
async def test_acks_fence_on_the_attempt(setup: Setup) -> None:
    consumer = setup.consumer
    for n in range(3):
        await setup.broker.publish(setup.channel, f"m{n}")
    first = await consumer.next(expires=5)
    assert first is not None
    # Its lease (ackWait 1 s) runs out; the sweeper gives it back, it is handed out again.
    again = await consumer.next(expires=10)
    while again is not None and again.id != first.id:
        await again.ack()
        again = await consumer.next(expires=10)
    assert again is not None and again.attempt == first.attempt + 1
    with pytest.raises(StaleAck):
        await first.ack()
    before = consumer.acks.requests
    await again.ack()
    await again.ack()  # settled: ignored locally
    await again.nak()
    assert consumer.acks.requests == before + 1
    assert (await job_state(setup, again.id))["Status"] == "DELIVERED"


async def test_nak_term_progress_and_hand_back(setup: Setup) -> None:
    consumer = setup.consumer
    for n in range(4):
        await setup.broker.publish(setup.channel, f"m{n}")
    naked, termed, extended, handed = await consumer.fetch(4, no_wait=True)
    await naked.nak(delay=60)
    await termed.term(reason="poison")
    lease = extended.lease_expires_at
    await asyncio.sleep(0.01)
    assert await extended.in_progress() > lease
    await handed.hand_back()
    states = [await job_state(setup, j.id) for j in (naked, termed, extended, handed)]
    assert [(s["Status"], s["RetryCount"]) for s in states] == [
        ("QUEUED", 1),
        ("DEAD", 0),
        ("INFLIGHT", 0),
        ("QUEUED", 0),
    ]
    assert states[1]["DeadReason"] == "poison"
    (back,) = await consumer.fetch(5, no_wait=True)  # the handed back job, due at once
    assert back.id == handed.id and back.attempt == 2
    with pytest.raises(ValueError):
        await back.nak(delay=-1)
    await back.ack()
    with pytest.raises(JobNotFound):
        await consumer.job(
            {"ID": "999999", "Attempt": 1, "LeaseExpiresAt": lease.isoformat(), "Message": {}}
        ).ack()


async def test_acks_of_many_workers_are_coalesced(setup: Setup) -> None:
    consumer = setup.consumer
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(150)])
    jobs = await consumer.fetch(150, no_wait=True)
    assert len(jobs) == 150
    before = consumer.acks.requests
    stale = jobs[0]
    await asyncio.gather(*(job.ack() for job in jobs))
    # 150 acks at once: one batch (up to the broker's default max-batch, 256), not 150 requests
    assert consumer.acks.requests - before <= 3
    info = await consumer.info()
    assert (info.pending, info.ack_pending) == (0, 0)
    assert (await job_state(setup, stale.id))["Status"] == "DELIVERED"


SMALL_MAX_BATCH = 40  # below the client's batch of acks (up to 256)


@pytest.mark.parametrize("private_config", [f"[pull]\nmax-batch={SMALL_MAX_BATCH}\n"])
async def test_acks_keep_to_a_lower_max_batch(private_setup: Setup) -> None:
    setup = private_setup
    consumer = setup.consumer
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(3 * SMALL_MAX_BATCH)])
    jobs: list[Job] = []
    for _ in range(3):  # a fetch takes at most max-batch jobs too
        jobs += await consumer.fetch(SMALL_MAX_BATCH, no_wait=True)
    assert len(jobs) == 3 * SMALL_MAX_BATCH
    before = consumer.acks.requests
    await asyncio.gather(*(job.ack() for job in jobs[: 2 * SMALL_MAX_BATCH]))
    # The batch of 80 was refused whole (nothing applied), then sent as two of 40.
    assert consumer.acks.requests - before == 3
    await asyncio.gather(*(job.ack() for job in jobs[2 * SMALL_MAX_BATCH :]))
    assert consumer.acks.requests - before == 4  # 40 from the start now
    info = await consumer.info()
    assert (info.pending, info.ack_pending) == (0, 0)
    for job in (jobs[0], jobs[-1]):
        assert (await job_state(setup, job.id))["Status"] == "DELIVERED"


async def test_each_caller_gets_its_own_outcome(setup: Setup) -> None:
    consumer = setup.consumer
    await setup.broker.publish_many(setup.channel, ["a", "b"])
    good, other = await consumer.fetch(2, no_wait=True)
    await other.hand_back()
    # `other`'s attempt is no longer in flight: in one batch with `good`, only it fails
    other._settled = None
    outcomes = await asyncio.gather(good.ack(), other.ack(), return_exceptions=True)
    assert outcomes[0] is None and isinstance(outcomes[1], StaleAck)


async def test_a_deleted_consumer_is_gone(setup: Setup) -> None:
    await setup.broker.delete_consumer(setup.channel, "billing")
    with pytest.raises(Unauthorized):
        await setup.consumer.fetch(1, no_wait=True)
    assert issubclass(ConsumerGone, Exception)


@pytest.mark.parametrize(
    "consumer_settings", [{"priorityGroups": "jobs", "priorityPolicy": "pinned_client"}]
)
async def test_unpin_hands_the_group_to_the_next_client(setup: Setup) -> None:
    consumer = setup.consumer
    for n in range(2):
        await setup.broker.publish(setup.channel, f"m{n}")
    (first,) = await consumer.fetch(1, no_wait=True, group="jobs")
    pin = consumer.pin_id
    assert pin is not None and first.text == "m0"
    assert (await consumer.info()).pin_id == pin
    assert await consumer.unpin("jobs") is True
    assert (await consumer.info()).pin_id is None
    assert await consumer.unpin("jobs") is False  # nobody holds it now
    with pytest.raises(InvalidRequest):
        await consumer.unpin("")
    # Its next pull names the pin that is gone: told so, it forgets it and pulls afresh.
    with pytest.raises(PinLost):
        await consumer.fetch(1, no_wait=True, group="jobs")
    assert consumer.pin_id is None
    (second,) = await consumer.fetch(1, no_wait=True, group="jobs")
    assert second.text == "m1" and consumer.pin_id not in (None, pin)


def test_the_sync_client(shared_process: BrokerProcess) -> None:
    channel = "sync-channel"
    with SyncBroker(shared_process.url, producer_id="shop") as broker:
        broker.put_channel(channel, token="orders-token")
        broker.broker.producer_token = broker.put_producer("shop")["Token"]
        broker.put_consumer(channel, "billing", token="billing-token")
        broker.publish(channel, {"n": 1})
        consumer = broker.consumer(channel, "billing", consumer_token="billing-token")
        (job,) = consumer.fetch(10, expires=0.5)
        assert job.json() == {"n": 1}
        job.ack()
        assert consumer.next(expires=0.1) is None
        assert consumer.info().ack_pending == 0
        with pytest.raises(InvalidRequest, match="priority group"):
            consumer.unpin("jobs")  # a consumer without priority groups has no pin to clear


async def test_publish_needs_its_credentials(shared_process: BrokerProcess) -> None:
    async with Broker(shared_process.url) as broker:
        with pytest.raises(ValueError, match="channel's token"):
            await broker.publish("orders", "x")
