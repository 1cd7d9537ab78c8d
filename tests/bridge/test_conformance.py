"""One nats-py scenario, run against real JetStream and against the bridge (both transports):
the observable results must be the same.

The JetStream side: nats-server 2.15.1 with JetStream, stream `orders` (subject `orders`) and a
durable pull consumer `workers` configured like the broker's seeded consumer (ack wait 2 s,
max deliver = max-retry + 1, and the max ack pending of the consumer's variant, which
consumer_info reports: no limit when uncapped, 1000 when capped). The bridge side: the broker
holding the same messages (published over HTTP, so waiting pulls are woken by PostgreSQL
NOTIFY), the requeue sweeper running, and a bridge on a JetStream-less server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx
import nats
import pytest
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from app.runtime import Runtime
from app.store.jobs import JobStore
from tests.bridge.conftest import ACK_WAIT, MAX_ACK_PENDING, BridgeFactory
from tests.helpers.jetstream import until_consumer
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import (
    Publish,
    add_workers,
    as_http,
    http_publisher,
    on_jetstream,
)

COMPARED_HEADERS = ("Content-Type", "X-Order", "Nats-Msg-Id")
# The lingering fetch's timeout: long enough that being woken and expiring cannot be confused.
LINGER = 5.0


@dataclass
class Run:
    """What one run of the scenario observed."""

    results: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    metadata: list[tuple[Any, ...]] = field(default_factory=list)
    metadata_error: str | None = None
    subjects: list[str] = field(default_factory=list)  # of every message received
    header_names: list[list[str]] = field(default_factory=list)  # of every message received


def reply_fields(msg: Msg) -> tuple[str, str, int, int, int, int]:
    """(stream, consumer, delivered, stream seq, consumer seq, pending) from the ack subject."""
    tokens = msg.reply.split(".")
    return (
        tokens[-7],
        tokens[-6],
        int(tokens[-5]),
        int(tokens[-4]),
        int(tokens[-3]),
        int(tokens[-1]),
    )


def describe(msg: Msg, run: Run) -> dict[str, Any]:
    headers = msg.headers or {}
    run.subjects.append(msg.subject)
    run.header_names.append(sorted(headers))
    try:
        md = msg.metadata
    except NatsError as exc:  # client mode: the ack subject is not $JS.ACK
        run.metadata_error = type(exc).__name__
    else:
        run.metadata.append(
            (
                md.stream,
                md.consumer,
                md.num_delivered,
                md.sequence.stream,
                md.sequence.consumer,
                md.num_pending,
            )
        )
        # The metadata and the raw reply agree (nats-py parsed our subject).
        assert run.metadata[-1] == reply_fields(msg)
    return {
        "data": msg.data.decode(),
        "headers": {k: headers.get(k) for k in COMPARED_HEADERS},
        "reply": reply_fields(msg),
    }


async def outcome(awaitable: Awaitable[Any]) -> tuple[str, float]:
    start = time.monotonic()
    try:
        result = await awaitable
    except Exception as exc:
        elapsed = time.monotonic() - start
        # The 408 of a fetch that timed out lands about when the client gives up, on
        # JetStream too; if the next fetch starts in that instant, nats-py takes the stale
        # status as its answer and sends a second, lingering request. A short pause keeps
        # every fetch of the scenario on its own statuses (both sides get the same pause).
        await asyncio.sleep(0.05)
        return type(exc).__name__, elapsed
    return f"result {result!r}", time.monotonic() - start


async def scenario(url: str, publish: Publish) -> Run:
    run = Run()
    r, s = run.results, run.seconds
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        # Three ways to bind: with stream=, through STREAM.NAMES, and bind (no API call).
        psub = await js.pull_subscribe("orders", durable="workers", stream="orders")
        auto = await js.pull_subscribe("orders", durable="workers")
        bound = await js.pull_subscribe_bind("workers", stream="orders")
        r["stream_by_subject"] = await js.find_stream_name_by_subject("orders")
        with pytest.raises(NotFoundError):
            await js.find_stream_name_by_subject("nothing-here")
        info = await js.consumer_info("orders", "workers")
        r["bound_info"] = (info.name, info.stream_name, info.config.durable_name)

        await publish(["m1", "m2", "m3", "m4"])
        # (JetStream's consumer takes in new messages asynchronously; a no_wait pull in the
        # same instant as the publish may see fewer. Both sides wait for them alike.)
        await until_consumer(js, "orders", "workers", num_pending=4)
        [m1] = await psub.fetch(1, timeout=2)
        r["fetch1"] = describe(m1, run)
        await m1.ack()

        start = time.monotonic()
        three = await auto.fetch(5, timeout=2)
        s["fetch5_of_3"] = time.monotonic() - start
        r["fetch5_of_3"] = [describe(m, run) for m in three]
        r["ack_sync_reply"] = (await three[0].ack_sync()).data
        for m in three[1:]:
            await m.ack()

        r["empty_fetch5"], s["empty_fetch5"] = await outcome(bound.fetch(5, timeout=1))
        r["empty_fetch1"], s["empty_fetch1"] = await outcome(bound.fetch(1, timeout=1))
        r["heartbeat_fetch"], s["heartbeat_fetch"] = await outcome(
            psub.fetch(3, timeout=2, heartbeat=0.5)
        )

        # A lingering fetch served by a message published while it waits: it ends with the
        # message, long before its expiry.
        lingering = asyncio.ensure_future(psub.fetch(3, timeout=LINGER))
        await until_consumer(js, "orders", "workers", num_waiting=1)
        start = time.monotonic()
        await publish(["m5"])
        late = await lingering
        s["late"] = time.monotonic() - start
        r["late"] = [describe(m, run) for m in late]

        # nak with a delay: redelivered after it, as delivery 2.
        await late[0].nak(delay=0.3)
        start = time.monotonic()
        [again] = await psub.fetch(1, timeout=2)
        s["nak_redelivery"] = time.monotonic() - start
        r["nak_redelivery"] = describe(again, run)
        await again.ack()

        # in_progress keeps m6 past its ack wait; m7, left alone, lapses and comes back.
        await publish(["m6", "m7"])
        await until_consumer(js, "orders", "workers", num_pending=2)
        held, lapsing = await psub.fetch(2, timeout=2)
        r["held"] = [describe(held, run), describe(lapsing, run)]
        for _ in range(2):
            await asyncio.sleep(ACK_WAIT * 0.6)
            await held.in_progress()
        await asyncio.sleep(ACK_WAIT * 0.55)  # 3.5 s after the fetch, ack wait is 2 s
        r["held_ack"] = (await held.ack_sync()).data
        [lapsed] = await psub.fetch(1, timeout=3)
        r["lapsed"] = describe(lapsed, run)
        await lapsed.ack_sync()
        r["after_progress"], _ = await outcome(psub.fetch(1, timeout=0.5))

        # term: never redelivered.
        await publish(["m8"])
        await until_consumer(js, "orders", "workers", num_pending=1)
        [doomed] = await psub.fetch(1, timeout=2)
        r["doomed"] = describe(doomed, run)
        await doomed.term()
        r["after_term"], _ = await outcome(psub.fetch(1, timeout=0.5))

        ci = await until_consumer(js, "orders", "workers", acks_settled=True, num_waiting=0)
        config = ci.config
        assert config is not None and ci.delivered is not None and ci.ack_floor is not None
        r["consumer_info"] = {
            "name": ci.name,
            "stream_name": ci.stream_name,
            "durable_name": config.durable_name,
            "ack_policy": config.ack_policy,
            "ack_wait": config.ack_wait,
            "max_deliver": config.max_deliver,
            "max_waiting": config.max_waiting,
            "max_ack_pending": config.max_ack_pending,
            "filter_subject": config.filter_subject,
            "delivered": (ci.delivered.consumer_seq, ci.delivered.stream_seq),
            "ack_floor": (ci.ack_floor.consumer_seq, ci.ack_floor.stream_seq),
            "num_ack_pending": ci.num_ack_pending,
            "num_redelivered": ci.num_redelivered,
            "num_waiting": ci.num_waiting,
            "num_pending": ci.num_pending,
        }
        run.results["created_is_datetime"] = ci.created is not None
    finally:
        await nc.close()
    return run


_reference: dict[str, Run] = {}


async def reference(server: NatsServer, cap: str) -> Run:
    """The JetStream run, done once per session and variant and shared by both transports."""
    if cap not in _reference:
        async with on_jetstream(server, workers=False, headers=as_http) as side:
            await add_workers(
                side.nc,
                max_ack_pending=MAX_ACK_PENDING[cap],
                max_waiting=512,
                filter_subject="orders",
            )
            _reference[cap] = await scenario(side.url, side.publish)
    return _reference[cap]


def assert_same(expected: Run, actual: Run, *, metadata: bool) -> None:
    for key, value in expected.results.items():
        assert actual.results[key] == value, key
    assert actual.results.keys() == expected.results.keys()
    # The timing the issue pins: an empty fetch(5, timeout=1) within 10% of the server's time.
    for key in ("empty_fetch5", "empty_fetch1", "heartbeat_fetch"):
        assert abs(actual.seconds[key] - expected.seconds[key]) <= 0.1 * expected.seconds[key], (
            key,
            actual.seconds[key],
            expected.seconds[key],
        )
    assert actual.seconds["fetch5_of_3"] < 0.5
    # Woken by the publish: an expiry would come LINGER seconds after the fetch began.
    assert actual.seconds["late"] < LINGER / 2, actual.seconds["late"]
    assert 0.25 < actual.seconds["nak_redelivery"] < 1.0, actual.seconds["nak_redelivery"]
    if metadata:
        assert actual.metadata == expected.metadata
        assert actual.metadata_error is None
        # Delivered with the stored subject, as JetStream delivers: the channel id; and
        # with the headers JetStream delivers, no more.
        assert actual.subjects == expected.subjects
        assert set(expected.subjects) == {"orders"}
        assert actual.header_names == expected.header_names
    else:
        # A client connection cannot give a delivery another subject than the inbox: the
        # stored subject travels in a header of its own.
        assert all(subject.startswith("_INBOX.") for subject in actual.subjects)
        assert actual.header_names == [
            sorted([*names, "Nats-Subject"]) for names in expected.header_names
        ]
        assert actual.metadata == []
        assert actual.metadata_error == "NotJSMessageError"


@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_conformance(
    cap: str,
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    expected = await reference(jetstream_server, cap)
    # Sanity of the reference itself, so a broken scenario cannot pass by matching nothing.
    assert expected.results["fetch1"]["reply"] == ("orders", "workers", 1, 1, 1, 3)
    assert [m["data"] for m in expected.results["fetch5_of_3"]] == ["m2", "m3", "m4"]
    assert expected.results["empty_fetch5"] == "TimeoutError"
    assert expected.results["heartbeat_fetch"] == "FetchTimeoutError"
    assert expected.results["nak_redelivery"]["reply"][2] == 2
    assert expected.results["lapsed"]["reply"][2] == 2
    assert expected.results["after_term"] == "TimeoutError"
    assert len(expected.metadata) > 5
    assert expected.results["consumer_info"]["max_ack_pending"] == MAX_ACK_PENDING[cap]

    await make_bridge(mode)
    actual = await scenario(hub.url, http_publisher(client))
    assert_same(expected, actual, metadata=mode == "hybrid")

    # The database agrees: m1..m7 delivered, m8 dead with its reason, m7 needed two attempts.
    async with runtime.db.transaction() as tx:
        store = JobStore(tx)
        jobs = [await store.get(i) for i in range(1, 9)]
    assert [j.status.value for j in jobs if j] == ["DELIVERED"] * 7 + ["DEAD"]
    assert [j.attempt for j in jobs if j] == [1, 1, 1, 1, 2, 1, 2, 1]
