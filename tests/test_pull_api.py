"""Our pull API: batch claims, limits, long polling and its wake-ups, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text

from app.api.app import create_app
from app.config import Config
from app.runtime import Runtime
from app.store.jobs import PENDING_COUNT_CAP
from app.store.queue import Named
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    job_row,
    publish,
    publish_many,
    pull,
    pull_jobs,
    put_consumer,
    setup_channel,
    until_waiting,
    update_consumer,
)
from tests.helpers.waiting import eventually

DEFAULT_LEASE = 32  # connection-timeout-in-seconds 30 + rational-delay-in-seconds 2


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


def lease_seconds(pulled: dict[str, Any], row: Any) -> float:
    assert pulled["LeaseExpiresAt"] == row.lease_expires_at.isoformat()
    return float((row.lease_expires_at - row.claimed_at).total_seconds())


class StatementCounter:
    """Counts the SQL statements an engine runs, to tell waiting from polling."""

    def __init__(self, rt: Runtime) -> None:
        self.count = 0
        self._engine = rt.db.engine.sync_engine

    def _seen(self, *_args: object) -> None:
        self.count += 1

    def __enter__(self) -> StatementCounter:
        event.listen(self._engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self._engine, "before_cursor_execute", self._seen)


# -- claims ------------------------------------------------------------------------------------


async def test_pull_shape_and_claim(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(3):
        await publish(
            client,
            f"payload {n}",
            message_id=f"m{n}",
            headers={"X-Broker-Metadata-Headers": "X-Trace", "X-Trace": f"t{n}"},
        )
    r = await pull(client, k1, batch=2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["Pending"] == 1
    assert len(body["Jobs"]) == 2
    first = body["Jobs"][0]
    assert set(first) == {"ID", "Attempt", "Priority", "LeaseExpiresAt", "Message"}
    assert first["Attempt"] == 1
    assert first["Priority"] == 0
    assert first["Message"] == {
        "MessageID": "m0",
        "Payload": "payload 0",
        "ContentType": "text/plain",
        "Headers": {"X-Trace": "t0"},
    }
    row = await job_row(runtime, first["ID"])
    assert (row.status, row.attempt) == ("INFLIGHT", 1)
    assert lease_seconds(first, row) == pytest.approx(DEFAULT_LEASE, abs=0.01)
    rest = await pull_jobs(client, k1, batch=10)
    assert [j["Message"]["MessageID"] for j in rest] == ["m2"]
    assert await pull_jobs(client, k1, batch=10) == []


async def test_pulled_binary_payload_comes_back_base64_and_intact(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    await publish(client, b"\x00\xffraw", message_id="bin")
    (pulled,) = await pull_jobs(client, k1, batch=5)
    message = pulled["Message"]
    assert message["PayloadEncoding"] == "base64"
    assert base64.b64decode(message["Payload"]) == b"\x00\xffraw"
    assert (message["MessageID"], message["Headers"]) == ("bin", {})


async def test_pull_takes_highest_priority_then_oldest(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    for priority, name in [(1, "a"), (3, "b"), (1, "c"), (2, "d"), (3, "e"), (0, "f")]:
        await publish(client, name, priority=priority, message_id=name)
    got = [j["Message"]["MessageID"] for j in await pull_jobs(client, k1, batch=4)]
    assert got == ["b", "e", "d", "a"]
    got = [j["Message"]["MessageID"] for j in await pull_jobs(client, k1, batch=4)]
    assert got == ["c", "f"]


async def test_empty_body_pulls_one_job(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    await publish(client, "a")
    await publish(client, "b")
    r = await client.post(f"{k1.base}/pull", headers=k1.auth)
    assert r.status_code == 200, r.text
    assert len(r.json()["Jobs"]) == 1
    assert r.json()["Pending"] == 1


async def test_incremental_timeout_and_ack_wait_make_the_lease(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    r = await update_consumer(client, k2, ackWait="5")
    assert r.status_code == 200, r.text
    await publish(client, "x")
    [a] = await pull_jobs(client, k1, incremental_timeout=40)
    [b] = await pull_jobs(client, k2, incremental_timeout=3)
    assert lease_seconds(a, await job_row(runtime, a["ID"])) == pytest.approx(72, abs=0.01)
    assert lease_seconds(b, await job_row(runtime, b["ID"])) == pytest.approx(8, abs=0.01)
    assert (await job_row(runtime, a["ID"])).incremental_timeout == 40


async def test_pull_does_not_take_jobs_of_other_consumers_or_not_due(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    await publish(client, "x")
    await publish(client, "y")
    [a, _] = await pull_jobs(client, k1, batch=5)
    r = await client.post(
        f"{k1.job(a['ID'])}/ack", json={"type": "nak", "delay": 3600}, headers=k1.auth
    )
    assert r.status_code == 202
    r = await pull(client, k1, batch=5, no_wait=True)
    assert r.json() == {"Jobs": [], "Pending": 0}
    assert len(await pull_jobs(client, k2, batch=5)) == 2


# -- max_bytes -----------------------------------------------------------------------------------


async def test_pending_counts_due_jobs_left_up_to_the_cap(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish_many(runtime, PENDING_COUNT_CAP + 7)
    body = (await pull(client, k1, batch=5, no_wait=True)).json()
    assert len(body["Jobs"]) == 5
    assert body["Pending"] == PENDING_COUNT_CAP
    # Drain all but 8, then: a full batch of 5 leaves 3; a short batch leaves none.
    left = PENDING_COUNT_CAP + 2
    while left > 8:
        take = min(100, left - 8)
        assert len((await pull(client, k1, batch=take, no_wait=True)).json()["Jobs"]) == take
        left -= take
    body = (await pull(client, k1, batch=5, no_wait=True)).json()
    assert (len(body["Jobs"]), body["Pending"]) == (5, 3)
    body = (await pull(client, k1, batch=5, no_wait=True)).json()
    assert (len(body["Jobs"]), body["Pending"]) == (3, 0)


async def test_max_bytes_caps_the_batch(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    for n in range(4):
        await publish(client, "x" * 10, message_id=f"m{n}")
    r = await pull(client, k1, batch=10, max_bytes=25, no_wait=True)
    body = r.json()
    assert [j["Message"]["MessageID"] for j in body["Jobs"]] == ["m0", "m1"]
    assert body["Pending"] == 2
    body = (await pull(client, k1, batch=10, max_bytes=30, no_wait=True)).json()
    assert [j["Message"]["MessageID"] for j in body["Jobs"]] == ["m2", "m3"]


@pytest.mark.parametrize("no_wait", [True, False])
async def test_a_first_job_larger_than_max_bytes_is_a_409_as_in_the_stream(
    client: httpx.AsyncClient, k1: PullConsumer, no_wait: bool
) -> None:
    # One rule for the pull answered at once, the streaming pull and JetStream
    # (app/domain/pulls.py, exceeds_max_bytes): the job stays queued, its attempt unspent.
    await publish(client, "y" * 100, message_id="big")
    await publish(client, "y", message_id="small")
    r = await pull(client, k1, batch=10, max_bytes=5, no_wait=no_wait, expires=5)
    assert r.status_code == 409, r.text
    assert "Message Size Exceeds MaxBytes" in r.json()["detail"]
    body = (await pull(client, k1, batch=10, max_bytes=200, no_wait=True)).json()
    assert [(j["Message"]["MessageID"], j["Attempt"]) for j in body["Jobs"]] == [
        ("big", 1),
        ("small", 1),
    ]


async def test_max_bytes_stops_at_the_first_job_that_does_not_fit(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    # Delivery order is kept: a later small job never jumps over an earlier big one.
    await publish(client, "a" * 4, message_id="a")
    await publish(client, "b" * 50, message_id="b")
    await publish(client, "c" * 4, message_id="c")
    body = (await pull(client, k1, batch=10, max_bytes=20, no_wait=True)).json()
    assert [j["Message"]["MessageID"] for j in body["Jobs"]] == ["a"]


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"batch": 0}, "batch"),
        ({"batch": 257}, "batch"),
        ({"batch": 1.5}, "batch"),
        ({"batch": "3"}, "batch"),
        ({"expires": 301}, "expires"),
        ({"expires": -1}, "expires"),
        ({"expires": "soon"}, "expires"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"no_wait": "yes"}, "no_wait"),
        ({"incremental_timeout": -1}, "incremental_timeout"),
        ({"incremental_timeout": 2.5}, "incremental_timeout"),
        ({"incremental_timeout": 2**31}, "incremental_timeout"),
        ({"incremental_timeout": 10**30}, "incremental_timeout"),
        ({"max_bytes": 1.5}, "max_bytes"),
        ({"bogus": 1}, "bogus"),
    ],
)
async def test_bad_pull_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, body: dict[str, Any], reason: str
) -> None:
    await publish(client, "x")
    r = await pull(client, k1, **body)
    assert r.status_code == 400, r.text
    assert reason in r.json()["detail"]
    assert len(await pull_jobs(client, k1)) == 1  # nothing was claimed


@pytest.mark.parametrize(
    "raw",
    [b"{", b"[]", b"null", b'"x"', b'{"expires": NaN}', b'{"batch": 1' + b"0" * 5000 + b"}"],
)
async def test_pull_body_must_be_a_json_object(
    client: httpx.AsyncClient, k1: PullConsumer, raw: bytes
) -> None:
    r = await client.post(f"{k1.base}/pull", content=raw, headers=k1.auth)
    assert r.status_code == 400


@pytest.mark.parametrize(
    "extra_config", ["[pull]\nmax-batch=3\nmax-expires-seconds=2\n"], ids=["config"]
)
async def test_limits_come_from_the_pull_section(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    for n in range(5):
        await publish(client, f"m{n}")
    r = await pull(client, k1, batch=4, no_wait=True)
    assert r.status_code == 400
    assert "batch must be between 1 and 3" in r.json()["detail"]
    r = await pull(client, k1, expires=3)
    assert r.status_code == 400
    assert "expires must be between 0 and 2" in r.json()["detail"]
    assert len(await pull_jobs(client, k1, batch=3, expires=2)) == 3
    # Without "expires" the default 30 s wait is cut to the 2 s limit, not refused.
    r = await client.post(f"{k1.base}/pull", json={"batch": 3}, headers=k1.auth)
    assert r.status_code == 200, r.text
    assert len(r.json()["Jobs"]) == 2
    started = time.monotonic()
    r = await client.post(f"{k1.base}/pull", json={"batch": 3}, headers=k1.auth)
    assert r.json()["Jobs"] == []
    assert 1.5 <= time.monotonic() - started < 8


# -- long polling --------------------------------------------------------------------------------


async def test_no_wait_returns_at_once(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    # Well before the 30 s it could wait: no_wait answered at once.
    r = await asyncio.wait_for(pull(client, k1, batch=5, no_wait=True, expires=30), timeout=15)
    assert r.status_code == 200
    assert r.json() == {"Jobs": [], "Pending": 0}


async def test_expired_wait_returns_empty_after_expires(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    started = time.monotonic()
    with StatementCounter(runtime) as statements:
        r = await pull(client, k1, batch=5, expires=1.5)
    elapsed = time.monotonic() - started
    assert r.status_code == 200
    assert r.json() == {"Jobs": [], "Pending": 0}
    assert 1.4 <= elapsed < 6
    # One claim on entry and at most a couple more: waiting is not polling the table.
    assert statements.count < 20


async def test_waiting_pull_holds_no_connection(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    pk = await consumer_pk(runtime, "k1")
    waiting = asyncio.create_task(pull(client, k1, expires=10))
    await until_waiting(runtime, pk)
    pool = runtime.db.engine.pool
    await eventually(lambda: pool.checkedout() == 0, what="no connection checked out")  # type: ignore[attr-defined]
    assert not waiting.done()
    await publish(client, "x")
    assert len((await waiting).json()["Jobs"]) == 1


async def test_long_poll_wakes_when_a_job_is_published(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, backend: str
) -> None:
    pk = await consumer_pk(runtime, "k1")
    waiting = asyncio.create_task(pull(client, k1, batch=10, expires=30))
    await until_waiting(runtime, pk)
    # The queue's first round (a claim that finds nothing) runs just after the request is
    # queued, and nothing outside the scheduler tells when it ended: the quiet window starts
    # after a moment, and is long enough that a poller would query in it.
    await asyncio.sleep(0.3)
    with StatementCounter(runtime) as statements:
        await asyncio.sleep(0.5)
    assert statements.count == 0  # nothing polls the table while nothing happens
    assert not waiting.done()  # it really is waiting, not returning
    with runtime.signals.subscribe(pk) as woken:
        await publish(client, "wake up", message_id="w")
        published = time.monotonic()
        await asyncio.wait_for(woken.wait(), timeout=10)  # the publish announced the job
    # Well before the 30 s expiry: the wake-up ended the wait, not the clock.
    r = await asyncio.wait_for(waiting, timeout=15)
    latency = time.monotonic() - published
    print(f"\n{backend}: long-poll wake-up latency {latency * 1000:.1f} ms")
    assert r.status_code == 200
    assert [j["Message"]["MessageID"] for j in r.json()["Jobs"]] == ["w"]


async def test_long_poll_returns_after_the_first_job_without_filling_the_batch(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    pk = await consumer_pk(runtime, "k1")
    waiting = asyncio.create_task(pull(client, k1, batch=50, expires=30))
    await until_waiting(runtime, pk)
    await publish(client, "one")
    r = await asyncio.wait_for(waiting, timeout=10)
    assert len(r.json()["Jobs"]) == 1


async def test_long_poll_wakes_when_a_delayed_job_falls_due(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    """No one announces a backoff running out: the waiter re-checks when the job falls due."""
    await publish(client, "later")
    [job] = await pull_jobs(client, k1)
    r = await client.post(
        f"{k1.job(job['ID'])}/ack", json={"type": "nak", "delay": 1.5}, headers=k1.auth
    )
    assert r.status_code == 202
    started = time.monotonic()
    r = await pull(client, k1, expires=20)
    elapsed = time.monotonic() - started
    [again] = r.json()["Jobs"]
    assert (again["ID"], again["Attempt"]) == (job["ID"], 2)
    assert 1.0 <= elapsed < 8


async def test_concurrent_waiters_each_get_a_different_job(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    pk = await consumer_pk(runtime, "k1")
    waiters = [asyncio.create_task(pull(client, k1, expires=20)) for _ in range(3)]
    await until_waiting(runtime, pk, 3)
    for n in range(3):
        await publish(client, f"m{n}")
    results = await asyncio.wait_for(asyncio.gather(*waiters), timeout=15)
    ids = [j["ID"] for r in results for j in r.json()["Jobs"]]
    assert sorted(ids) == sorted(set(ids))
    assert len(ids) == 3


@pytest.fixture
async def second_runtime(
    config: Config, runtime: Runtime
) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """Another broker process on the same database: its own engine, signals and listener."""
    other = Runtime(config)
    await other.start()
    transport = httpx.ASGITransport(app=create_app(config, other))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://other.test") as http:
            yield other, http
    finally:
        await other.stop()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_notify_from_another_runtime_wakes_a_waiting_pull(
    client: httpx.AsyncClient,
    k1: PullConsumer,
    runtime: Runtime,
    second_runtime: tuple[Runtime, httpx.AsyncClient],
) -> None:
    other, other_client = second_runtime
    assert other.signals is not runtime.signals
    assert other.listener is not None and other.listener.ready.is_set()
    pk = await consumer_pk(other, "k1")
    waiting = asyncio.create_task(pull(other_client, k1, batch=5, expires=30))
    await until_waiting(other, pk)
    assert not waiting.done()
    with other.signals.subscribe(pk) as woken:
        await publish(client, "from the first process", message_id="cross")
        published = time.monotonic()
        await asyncio.wait_for(woken.wait(), timeout=10)  # the NOTIFY reached the other process
    # Well before the 30 s expiry: the NOTIFY ended the wait, not the clock.
    r = await asyncio.wait_for(waiting, timeout=15)
    latency = time.monotonic() - published
    print(f"\ncross-runtime NOTIFY wake-up latency {latency * 1000:.1f} ms")
    assert [j["Message"]["MessageID"] for j in r.json()["Jobs"]] == ["cross"]


# -- max-waiting ---------------------------------------------------------------------------------


@pytest.mark.parametrize("extra_config", ["[pull]\nmax-waiting=2\n"], ids=["config"])
async def test_max_waiting_refuses_one_waiter_too_many(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    pk = await consumer_pk(runtime, "k1")
    waiters = [asyncio.create_task(pull(client, k1, expires=20)) for _ in range(2)]
    await until_waiting(runtime, pk, 2)
    r = await pull(client, k1, expires=5)
    assert r.status_code == 409
    assert "waiting" in r.json()["detail"]
    # A no_wait pull never waits, so it is not refused; another consumer has its own limit.
    assert (await pull(client, k1, no_wait=True)).status_code == 200
    k2_waiter = asyncio.create_task(pull(client, k2, expires=20))
    await until_waiting(runtime, await consumer_pk(runtime, "k2"))
    await publish(client, "a")
    await publish(client, "b")
    results = await asyncio.wait_for(asyncio.gather(*waiters, k2_waiter), timeout=15)
    assert all(r.status_code == 200 for r in results)
    assert sum(len(r.json()["Jobs"]) for r in results) == 3
    # Once they are gone, waiting is allowed again.
    assert runtime.scheduler.waiting(pk) == 0
    assert (await pull(client, k1, expires=0.2)).status_code == 200


# -- consumer settings -------------------------------------------------------------------------


async def test_consumer_settings_by_put_are_shown_on_get(client: httpx.AsyncClient) -> None:
    [k1] = await setup_channel(client, "k1")
    body = (await client.get(k1.base)).json()
    assert body["AckWait"] == DEFAULT_LEASE
    assert body["MaxAckPending"] is None
    r = await update_consumer(client, k1, ackWait="9", maxAckPending="4")
    assert r.status_code == 200, r.text
    body = (await client.get(k1.base)).json()
    assert (body["AckWait"], body["MaxAckPending"]) == (9, 4)
    k2 = await put_consumer(client, "k2", ackWait="3")
    assert (await client.get(k2.base)).json()["AckWait"] == 3
    for field in ("ackWait", "maxAckPending"):
        for bad in ("0", "-1", "x"):
            r = await update_consumer(client, k1, **{field: bad})
            assert r.status_code == 400, (field, bad)
    body = (await client.get(k1.base)).json()
    assert (body["AckWait"], body["MaxAckPending"]) == (9, 4)


SEEDED = """
[initial-channels]
c1 = Channel one
[initial-channel-tokens]
c1 = channel-token
[initial-producers]
p1 = Producer one
[initial-producer-tokens]
p1 = producer-token
[initial-consumers]
k1 =
[k1]
token = k1-token
channel = c1
type = pull
ack-wait = 6
max-ack-pending = 1
"""


@pytest.mark.parametrize("extra_config", [SEEDED], ids=["config"])
async def test_seeded_ack_wait_and_max_ack_pending(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    body = (await client.get("/channel/c1/consumer/k1")).json()
    assert (body["Type"], body["AckWait"], body["MaxAckPending"]) == ("pull", 6, 1)
    k1 = PullConsumer("k1", "k1-token")
    await publish(client, "a")
    await publish(client, "b")
    r = await pull(client, k1, batch=5, no_wait=True)
    [job] = r.json()["Jobs"]
    assert r.json()["Pending"] == 1
    assert lease_seconds(job, await job_row(runtime, job["ID"])) == pytest.approx(6, abs=0.01)


# -- maxAckPending -------------------------------------------------------------------------------


async def test_max_ack_pending_caps_jobs_in_flight(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", maxAckPending="2")
    pk = await consumer_pk(runtime, "k1")
    for n in range(5):
        await publish(client, f"m{n}", message_id=f"m{n}")
    first = await pull_jobs(client, k1, batch=5)
    assert [j["Message"]["MessageID"] for j in first] == ["m0", "m1"]
    r = await pull(client, k1, batch=5, no_wait=True)
    assert r.json() == {"Jobs": [], "Pending": 3}
    # A waiting pull gets a job as soon as an ack frees a slot, and only one.
    waiting = asyncio.create_task(pull(client, k1, batch=5, expires=30))
    await until_waiting(runtime, pk)
    assert not waiting.done()
    r = await client.post(f"{k1.job(first[0]['ID'])}/ack", json={"type": "ack"}, headers=k1.auth)
    assert r.status_code == 202
    # Well before the 30 s expiry: the ack ended the wait, not the clock.
    r = await asyncio.wait_for(waiting, timeout=10)
    assert [j["Message"]["MessageID"] for j in r.json()["Jobs"]] == ["m2"]
    # term and nak free slots too.
    r = await client.post(f"{k1.job(first[1]['ID'])}/ack", json={"type": "term"}, headers=k1.auth)
    assert r.status_code == 202
    assert [j["Message"]["MessageID"] for j in await pull_jobs(client, k1, batch=5)] == ["m3"]


async def test_max_ack_pending_holds_under_concurrent_pulls(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", maxAckPending="3")
    for n in range(30):
        await publish(client, f"m{n}")
    results = await asyncio.gather(*(pull_jobs(client, k1, batch=2) for _ in range(12)))
    assert sum(len(r) for r in results) == 3


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_listener_reconnects_and_wakes_waiters_after_losing_its_connection(
    client: httpx.AsyncClient,
    k1: PullConsumer,
    runtime: Runtime,
    second_runtime: tuple[Runtime, httpx.AsyncClient],
) -> None:
    other, other_client = second_runtime
    assert other.listener is not None
    pk = await consumer_pk(other, "k1")
    waiting = asyncio.create_task(pull(other_client, k1, batch=5, expires=30))
    await until_waiting(other, pk)
    # Kill every LISTENing backend: both runtimes' listeners lose their connections.
    async with runtime.db.transaction() as tx:
        killed = (
            await tx.conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
                )
            )
        ).scalar_one()
    assert killed == 2
    listener = other.listener
    await eventually(lambda: not listener.ready.is_set(), 10, 0.01, what="the listener lost")
    await asyncio.wait_for(other.listener.ready.wait(), timeout=10)  # ... and comes back
    await until_waiting(other, pk)
    assert not waiting.done()  # woken by the reconnect, found nothing, waits again
    with other.signals.subscribe(pk) as woken:
        await publish(client, "after the reconnect", message_id="again")
        await asyncio.wait_for(woken.wait(), timeout=10)  # the new LISTEN hears the NOTIFY
    # Well before the 30 s expiry: the NOTIFY ended the wait, not the clock.
    r = await asyncio.wait_for(waiting, timeout=15)
    assert [j["Message"]["MessageID"] for j in r.json()["Jobs"]] == ["again"]


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_capped_claim_in_progress_does_not_block_publishers(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """The max-ack-pending lock on the consumer row must not stall broadcasts to its channel."""
    await setup_channel(client, "k1", maxAckPending="5")
    await publish(client, "first")
    pk = await consumer_pk(runtime, "k1")
    async with runtime.db.transaction() as tx:
        claimed = await runtime.queue.claim(
            Named(pk), limit=1, default_ack_wait=30, max_ack_pending=5, tx=tx
        )
        assert len(claimed.jobs) == 1
        # The claim's transaction is still open, holding its lock on the consumer row.
        await asyncio.wait_for(publish(client, "second"), timeout=5)


async def test_requeued_dead_jobs_wake_a_waiting_pull(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "a")
    await publish(client, "b")
    for job in await pull_jobs(client, k1, batch=2):
        r = await client.post(f"{k1.job(job['ID'])}/ack", json={"type": "term"}, headers=k1.auth)
        assert r.status_code == 202
    dead = [
        j["ID"] for j in (await client.get(f"{k1.base}/dlq", headers=k1.auth)).json()["DeadJobs"]
    ]
    pk = await consumer_pk(runtime, "k1")
    waiting = asyncio.create_task(pull(client, k1, batch=5, expires=30))
    await until_waiting(runtime, pk)
    r = await client.post(f"{k1.job(dead[0])}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 202
    r = await asyncio.wait_for(waiting, timeout=5)
    assert [str(j["ID"]) for j in r.json()["Jobs"]] == [dead[0]]
    waiting = asyncio.create_task(pull(client, k1, batch=5, expires=30))
    await until_waiting(runtime, pk)
    assert (await client.post(f"{k1.base}/dlq", headers=k1.auth)).status_code == 202
    r = await asyncio.wait_for(waiting, timeout=5)
    assert [str(j["ID"]) for j in r.json()["Jobs"]] == [dead[1]]


async def test_raising_max_ack_pending_frees_a_waiting_pull(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """A waiter stuck on the cap re-reads the consumer when its PUT wakes it."""
    [k1] = await setup_channel(client, "k1", maxAckPending="1")
    await publish(client, "a", message_id="a")
    await publish(client, "b", message_id="b")
    assert len(await pull_jobs(client, k1, batch=5)) == 1
    waiting = asyncio.create_task(pull(client, k1, batch=5, expires=30))
    await until_waiting(runtime, await consumer_pk(runtime, "k1"))
    assert not waiting.done()
    r = await update_consumer(client, k1, maxAckPending="2", ackWait="9")
    assert r.status_code == 200, r.text
    r = await asyncio.wait_for(waiting, timeout=5)
    [job] = r.json()["Jobs"]
    assert job["Message"]["MessageID"] == "b"
    # The new ackWait applies to that claim too.
    assert lease_seconds(job, await job_row(runtime, job["ID"])) == pytest.approx(9, abs=0.01)


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_listener_survives_foreign_notifies_and_hears_wake_all(
    client: httpx.AsyncClient,
    k1: PullConsumer,
    runtime: Runtime,
    second_runtime: tuple[Runtime, httpx.AsyncClient],
) -> None:
    other, other_client = second_runtime
    pk = await consumer_pk(other, "k1")
    async with runtime.db.transaction() as tx:
        for payload in ("hello", "1,x,,2", "", " "):
            await tx.conn.execute(
                text("SELECT pg_notify('webhook_broker_jobs', :p)"), {"p": payload}
            )
    listener = other.listener
    assert listener is not None
    # "*" wakes every waiter: a waiter with nothing to claim looks again and waits on.
    waiting = asyncio.create_task(pull(other_client, k1, batch=5, expires=30))
    await until_waiting(other, pk)
    with other.signals.subscribe(pk) as woken:
        async with runtime.db.transaction() as tx:
            await tx.conn.execute(text("SELECT pg_notify('webhook_broker_jobs', '*')"))
        await asyncio.wait_for(woken.wait(), timeout=5)
    # One connection delivers notifications in order: the garbage before the "*" was read,
    # and the listener that read it is still up.
    assert listener.ready.is_set()
    assert not waiting.done()
    await publish(client, "still listening", message_id="ok")
    r = await asyncio.wait_for(waiting, timeout=10)
    assert [j["Message"]["MessageID"] for j in r.json()["Jobs"]] == ["ok"]
