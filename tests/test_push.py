"""Push delivery to a real HTTP receiver on loopback, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.config import Config
from app.runtime import Runtime
from tests.helpers.metrics import a_dispatcher_round
from tests.helpers.push import broker, job_of, publish, setup_push, wait_for_status
from tests.helpers.receiver import Receiver, running_receiver
from tests.helpers.waiting import eventually

CHANNEL_AUTH = {"X-Broker-Channel-Token": "ct"}
CONSUMER_AUTH = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=2\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=4\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=1\n"
        "token-header-name=X-Hook-Token\nuser-agent=wb-test-agent\n"
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
async def push_client(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    async with broker(config, sweeper=True, dispatcher=True) as http:
        yield http


async def test_delivers_payload_headers_and_a_verifiable_signature(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    await setup_push(push_client, receiver.url + "/hook")
    await publish(
        push_client,
        b'{"hello": "world"}',
        "m-1",
        **{
            "Content-Type": "application/json",
            "X-Broker-Message-Priority": "7",
            "X-Broker-Metadata-Headers": "X-Tenant,X-Trace",
            "X-Tenant": "acme",
            "X-Trace": "abc123",
        },
    )
    job = await wait_for_status(push_client, "m-1", "DELIVERED")
    assert job["Attempt"] == 1
    assert receiver.count("/hook") == 1
    got = receiver.requests[0]
    assert got.body == b'{"hello": "world"}'
    h = got.headers
    assert h["content-type"] == "application/json"
    assert h["x-broker-message-priority"] == "7"
    assert h["x-broker-message-id"] == "m-1"
    assert h["x-broker-channel-id"] == "c1"
    assert h["x-broker-consumer-id"] == "k1"
    assert h["x-hook-token"] == "kt"
    assert h["user-agent"] == "wb-test-agent"
    assert h["x-request-id"]
    assert h["x-broker-delivery-attempt"] == "1"
    assert h["x-tenant"] == "acme" and h["x-trace"] == "abc123"
    assert set(h["x-broker-metadata-headers"].split(",")) == {"X-Tenant", "X-Trace"}
    # What a receiver does to verify: recompute the HMAC over "<t>.<body>" with its token.
    parts = dict(item.split("=", 1) for item in h["x-broker-signature"].split(","))
    expected = hmac.new(b"kt", parts["t"].encode() + b"." + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(parts["v1"], expected)
    assert abs(int(parts["t"]) - time.time()) < 60


async def test_two_failures_then_success_take_three_attempts(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, n: (503 if n <= 2 else 200, 0.0)
    await setup_push(push_client, receiver.url + "/flaky")
    await publish(push_client, b"payload", "m-flaky")
    job = await wait_for_status(push_client, "m-flaky", "DELIVERED")
    assert receiver.count("/flaky") == 3
    assert job["Attempt"] == 3 and job["RetryCount"] == 2
    attempts = [r.headers["x-broker-delivery-attempt"] for r in receiver.requests]
    assert attempts == ["1", "2", "3"]


async def test_always_failing_receiver_dead_letters_with_last_status(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, _n: (500, 0.0)
    await setup_push(push_client, receiver.url + "/broken")
    await publish(push_client, b"payload", "m-dead")
    job = await wait_for_status(push_client, "m-dead", "DEAD")
    # max-retry=2: one first attempt and two retries.
    assert receiver.count("/broken") == 3
    assert job["LastError"] == "HTTP 500"
    r = await push_client.get("/channel/c1/consumer/k1/dlq", headers=CONSUMER_AUTH)
    assert r.status_code == 200
    dead = r.json()["DeadJobs"]
    assert len(dead) == 1 and dead[0]["LastError"] == "HTTP 500"


async def test_receiver_slower_than_timeout_is_a_failure(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, n: (200, 2.0 if n == 1 else 0.0)
    await setup_push(push_client, receiver.url + "/slow")
    await publish(push_client, b"payload", "m-slow")
    job = await wait_for_status(push_client, "m-slow", "DELIVERED")
    assert receiver.count("/slow") == 2
    assert job["LastError"] == "timed out"


async def test_redirects_are_not_followed(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, _n: (302, 0.0)
    await setup_push(push_client, receiver.url + "/moved")
    await publish(push_client, b"payload", "m-moved")
    job = await wait_for_status(push_client, "m-moved", "DEAD")
    assert job["LastError"] == "HTTP 302"


async def test_priority_order_holds_when_workers_are_saturated(
    config: Config, receiver: Receiver
) -> None:
    import dataclasses

    one_worker = dataclasses.replace(
        config, broker=dataclasses.replace(config.broker, max_workers=1)
    )
    async with broker(one_worker) as http:
        await setup_push(http, receiver.url + "/ordered")
        priorities = [1, 5, 3, 5, 1, 9, 3]
        for n, priority in enumerate(priorities):
            await publish(http, b"x", f"m{n}", **{"X-Broker-Message-Priority": str(priority)})

    dispatcher = Runtime(one_worker, run_dispatcher=True)
    await dispatcher.start()
    try:
        await eventually(
            lambda: receiver.count("/ordered") >= len(priorities), 20, what="every delivery"
        )
    finally:
        await dispatcher.stop()
    order = [r.headers["x-broker-message-id"] for r in receiver.requests]
    expected = sorted(range(len(priorities)), key=lambda n: (-priorities[n], n))
    assert order == [f"m{n}" for n in expected]


async def test_switching_a_consumer_to_pull_stops_pushes(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, _n: (500, 0.0)
    await setup_push(push_client, receiver.url + "/switch")
    r = await push_client.get("/channel/c1/consumer/k1")
    r = await push_client.put(
        "/channel/c1/consumer/k1",
        data={"token": "kt", "type": "pull"},
        headers={"If-Unmodified-Since": r.headers["Last-Modified"]},
    )
    assert r.status_code == 200, r.text
    await publish(push_client, b"payload", "m-pull")
    await a_dispatcher_round(push_client)  # a push consumer's job would be claimed in it
    assert receiver.count("/switch") == 0
    r = await push_client.post(
        "/channel/c1/consumer/k1/pull", json={"batch": 1, "no_wait": True}, headers=CONSUMER_AUTH
    )
    assert r.status_code == 200 and len(r.json()["Jobs"]) == 1


async def test_answers_for_several_consumers_are_all_recorded_once(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    await setup_push(push_client, receiver.url + "/a")
    r = await push_client.put(
        "/channel/c1/consumer/k2", data={"token": "kt2", "callbackUrl": receiver.url + "/b"}
    )
    assert r.status_code == 200, r.text
    ids = [f"many-{n}" for n in range(12)]
    for message_id in ids:
        await publish(push_client, b"x", message_id)
    for message_id in ids:

        async def delivered(message_id: str = message_id) -> list[dict[str, Any]]:
            r = await push_client.get(f"/channel/c1/message/{message_id}")
            jobs: list[dict[str, Any]] = r.json()["Jobs"]
            assert {j["Status"] for j in jobs} == {"DELIVERED"}, jobs
            return jobs

        jobs = await eventually(delivered, 20, what=f"every job of {message_id} delivered")
        assert len(jobs) == 2
    await asyncio.sleep(0.3)  # a second delivery of any job would arrive by now
    assert receiver.count("/a") == receiver.count("/b") == len(ids)
    assert set(receiver.by_message().values()) == {2}


async def test_stopping_records_the_answers_of_deliveries_in_flight(
    config: Config, receiver: Receiver
) -> None:
    # Each POST is answered 200 after 0.5 s: the dispatcher is stopped while all four wait.
    receiver.respond = lambda _path, _n: (200, 0.5)
    ids = [f"inflight-{n}" for n in range(4)]
    async with broker(config, dispatcher=True) as http:
        await setup_push(http, receiver.url + "/slow")
        for message_id in ids:
            await publish(http, b"x", message_id)
        await eventually(lambda: receiver.count("/slow") >= len(ids), 10, 0.01, what="every call")

    async with broker(config) as http:
        statuses = [(await job_of(http, message_id))["Status"] for message_id in ids]
    assert statuses == ["DELIVERED"] * len(ids)


async def _attempts_of(config: Config, job_id: object) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from app.store.db import Database
    from app.store.schema import job

    db = Database.from_config(config.database)
    try:
        async with db.transaction() as tx:
            query = select(job.c.attempts).where(job.c.id == int(str(job_id)))
            found: list[dict[str, Any]] = (await tx.conn.execute(query)).scalar_one() or []
    finally:
        await db.dispose()
    return found


async def test_each_push_outcome_is_in_the_jobs_attempt_history(
    push_client: httpx.AsyncClient, receiver: Receiver, config: Config
) -> None:
    receiver.respond = lambda _path, n: (500, 0.0) if n <= 2 else (201, 0.0)
    await setup_push(push_client, receiver.url + "/history")
    await publish(push_client, b"payload", "m-history")
    job = await wait_for_status(push_client, "m-history", "DELIVERED")
    entries = await _attempts_of(config, job["ID"])
    assert [(e["outcome"], e.get("code")) for e in entries] == [
        ("failed", 500),
        ("failed", 500),
        ("delivered", 201),
    ]
    assert entries[0]["error"].startswith("HTTP 500")
    assert all(e["ms"] >= 0 for e in entries)


async def test_a_paused_push_consumer_is_not_pushed_until_resumed(
    push_client: httpx.AsyncClient, receiver: Receiver
) -> None:
    await setup_push(push_client, receiver.url + "/paused")
    r = await push_client.put("/channel/c1/consumer/k1/pause")
    assert r.status_code == 200 and r.json()["Paused"] is True, r.text
    await publish(push_client, b"payload", "m-paused")
    await a_dispatcher_round(push_client)  # a running consumer's job would be claimed in it
    await a_dispatcher_round(push_client)
    assert receiver.count("/paused") == 0
    assert (await job_of(push_client, "m-paused"))["Status"] == "QUEUED"
    r = await push_client.delete("/channel/c1/consumer/k1/pause")
    assert r.status_code == 200 and r.json()["Paused"] is False, r.text
    await wait_for_status(push_client, "m-paused", "DELIVERED")
    assert receiver.count("/paused") == 1
