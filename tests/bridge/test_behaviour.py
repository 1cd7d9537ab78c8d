"""Max deliveries and advisories, requesters that leave, NATS server restarts, the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import ServiceUnavailableError as ServiceUnavailable

from app.config import Config
from app.domain.jobs import JobStatus
from app.runtime import Runtime
from app.store.jobs import JobStore
from tests.bridge.conftest import (
    MAX_ACK_PENDING,
    MAX_RETRY,
    BridgeFactory,
    publish_http,
    uncapped_only,
)
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, add_workers, http_publisher, on_jetstream
from tests.helpers.waiting import eventually

REPO_ROOT = str(Path(__file__).resolve().parents[2])


async def advisories(nc: Client, seen: list[tuple[str, dict[str, Any]]]) -> None:
    async def record(msg: Any) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>", cb=record)
    await nc.flush()


async def nak_until_dead(url: str, publish: Publish) -> list[tuple[str, dict[str, Any]]]:
    """Nak one message max-retry + 1 times; return the advisories seen."""
    nc = await nats.connect(url)
    seen: list[tuple[str, dict[str, Any]]] = []
    try:
        await advisories(nc, seen)
        psub = await nc.jetstream().pull_subscribe_bind("workers", stream="orders")
        await publish(["doomed"])
        for attempt in range(1, MAX_RETRY + 2):
            [msg] = await psub.fetch(1, timeout=3)
            assert msg.data == b"doomed"
            assert int(msg.reply.split(".")[-5]) == attempt
            # The first nak is plain (the broker applies its backoff), the others delayed.
            await (msg.nak() if attempt == 1 else msg.nak(delay=0.05))
        # Never offered again.
        with pytest.raises(NatsTimeoutError):
            await psub.fetch(1, timeout=0.5)
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    return seen


def shape(seen: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str, int, int, list[str]]]:
    return [
        (
            subject,
            body["type"],
            body["stream_seq"],
            body["deliveries"],
            sorted(k for k in body if k not in ("domain", "account")),
        )
        for subject, body in seen
    ]


async def test_max_deliveries_end_dead_with_advisories(
    cap: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    # Reference: JetStream with max_deliver = max-retry + 1.
    async with on_jetstream(jetstream_server, workers=False) as side:
        await add_workers(side.nc, max_ack_pending=MAX_ACK_PENDING[cap])
        expected = shape(await nak_until_dead(side.url, side.publish))
    naked = "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.orders.workers"
    max_deliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.orders.workers"
    assert [s for s, *_ in expected].count(naked) == MAX_RETRY + 1
    assert max_deliveries in [s for s, *_ in expected]

    await make_bridge("hybrid")
    actual = shape(await nak_until_dead(hub.url, http_publisher(client)))
    # The same advisories with the same fields (the order of NAKED and MAX_DELIVERIES after the
    # last nak is not pinned: the server sends the latter when it next looks for work).
    assert sorted(actual) == sorted(expected)
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.attempt == MAX_RETRY + 1 and job.dead_reason == "nak with no retries left"


async def test_term_reason_and_advisory(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    seen: list[tuple[str, dict[str, Any]]] = []
    try:
        await advisories(nc, seen)
        psub = await nc.jetstream().pull_subscribe_bind("workers", stream="orders")
        await publish_http(client, ["bad"])
        [msg] = await psub.fetch(1, timeout=2)
        reply = await nc.request(msg.reply, b"+TERM bad payload, giving up", timeout=2)
        assert reply.data == b""
        await eventually(lambda: _has(seen, "MSG_TERMINATED"))
    finally:
        await nc.close()
    subject, body = seen[-1]
    assert subject == "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.orders.workers"
    assert body["type"] == "io.nats.jetstream.advisory.v1.terminated"
    assert (body["stream_seq"], body["deliveries"], body["reason"]) == (
        1,
        1,
        "bad payload, giving up",
    )
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DEAD
    assert job.dead_reason == "bad payload, giving up"


async def _has(seen: list[tuple[str, dict[str, Any]]], kind: str) -> bool:
    return any(kind in subject for subject, _ in seen)


async def test_stale_acks_are_ignored(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """An ack naming an attempt that is no longer the current claim changes nothing."""
    await make_bridge("hybrid")
    nc = await nats.connect(hub.url)
    try:
        psub = await nc.jetstream().pull_subscribe_bind("workers", stream="orders")
        await publish_http(client, ["j"])
        [first] = await psub.fetch(1, timeout=2)
        await first.nak(delay=0.05)
        [second] = await psub.fetch(1, timeout=2)
        assert second.metadata.num_delivered == 2
        # A late ack of delivery 1 (ack_sync: the bridge answers, and ignores it).
        stale = await nc.request(first.reply, b"+ACK", timeout=2)
        assert stale.data == b""
        async with runtime.db.transaction() as tx:
            job = await JobStore(tx).get(1)
        assert job is not None and job.status is JobStatus.INFLIGHT and job.attempt == 2
        # A forged ack for a job of no such consumer is ignored too.
        await nc.request("$JS.ACK.orders.ghost.2.1.9.1.0", b"", timeout=2)
        await second.ack_sync()
    finally:
        await nc.close()
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DELIVERED


async def test_requests_of_departed_clients_are_dropped(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """Hybrid mode sees the requester's inbox go away (LS-) and drops its waiting request, so
    a later job is not claimed for nobody."""
    bridge = await make_bridge("hybrid")
    leaving = await nats.connect(hub.url)
    inbox = leaving.new_inbox()
    await leaving.subscribe(inbox)
    # No expiry: JetStream would hold this request until the requester goes away.
    await leaving.publish("$JS.API.CONSUMER.MSG.NEXT.orders.workers", b"", reply=inbox)
    await leaving.flush()

    async def one_waiting() -> bool:
        return bridge.engine.num_waiting(1) == 1

    await eventually(one_waiting)
    await leaving.close()

    async def none_waiting() -> bool:
        return bridge.engine.num_waiting(1) == 0

    await eventually(none_waiting, timeout=5)
    staying = await nats.connect(hub.url)
    try:
        psub = await staying.jetstream().pull_subscribe_bind("workers", stream="orders")
        await publish_http(client, ["after"])
        [msg] = await psub.fetch(1, timeout=1.5)
        assert msg.metadata.num_delivered == 1  # nobody else was handed it first
        await msg.ack_sync()
    finally:
        await staying.close()


async def test_nats_server_restart_loses_and_duplicates_nothing(
    make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """The server restarts under a waiting request: nothing is claimed while the links are
    down, the request that can no longer be answered is forgotten, and after the reconnect
    the job goes, as its first delivery, to a requester that is really there."""
    server = NatsServer(leafnodes=True)
    server.start()
    try:
        bridge = await make_bridge("hybrid", server=server)
        assert bridge.leaf is not None
        worker = await nats.connect(server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        psub = await worker.jetstream().pull_subscribe_bind("workers", stream="orders")
        await publish_http(client, ["before"])
        [msg] = await psub.fetch(1, timeout=2)
        await msg.ack_sync()
        # Another requester waits with no expiry, then dies with the server.
        gone = await nats.connect(server.url, allow_reconnect=False)
        inbox = gone.new_inbox()
        await gone.subscribe(inbox)
        await gone.publish("$JS.API.CONSUMER.MSG.NEXT.orders.workers", b"", reply=inbox)
        await gone.flush()

        async def waiting() -> bool:
            return bridge.engine.num_waiting(1) == 1

        await eventually(waiting)
        server.stop()
        with contextlib.suppress(Exception):
            await gone.close()
        await publish_http(client, ["during"])
        await asyncio.sleep(0.5)
        async with runtime.db.transaction() as tx:
            during = await JobStore(tx).get(2)
        assert during is not None and during.status is JobStatus.QUEUED and during.attempt == 0
        server.start()

        async def reconnected() -> bool:
            leaf = bridge.leaf
            return bool(
                bridge.nc.is_connected and leaf is not None and leaf.ready() and worker.is_connected
            )

        await eventually(reconnected, timeout=15)
        assert bridge.leaf.connects == 2

        async def answering() -> bool:
            # Connected is not yet subscribed: the bridge's queue subscription reaches the
            # restarted server a moment later, and until then a request has no responders.
            try:
                await worker.jetstream().consumer_info("orders", "workers", timeout=1)
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError, ServiceUnavailable):
                return False
            return True

        await eventually(answering, timeout=15)
        [msg] = await psub.fetch(1, timeout=3)
        assert msg.data == b"during" and msg.metadata.num_delivered == 1
        await msg.ack_sync()
        await worker.close()
    finally:
        server.cleanup()
    async with runtime.db.transaction() as tx:
        jobs = [await JobStore(tx).get(i) for i in (1, 2)]
    assert [(j.status, j.attempt) for j in jobs if j] == [(JobStatus.DELIVERED, 1)] * 2


@uncapped_only
async def test_cli_bridge_process(
    hub: NatsServer, config: Config, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """`webhook-broker bridge` as its own process: serves a fetch, exits 0 on SIGTERM."""
    root = Path(tempfile.mkdtemp(prefix="wb-bridge-cli-"))
    cfg = root / "bridge.cfg"
    cfg.write_text(
        "[rdbms]\ndialect=postgresql\n"
        f"connection-url={config.database.connection_url}\n"
        f"[broker]\nmax-retry={MAX_RETRY}\n"
        "[nats]\nmode=hybrid\n"
        f"url={hub.url}\nleaf-url={hub.leaf_url}\nqueue-group=cli-bridge\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "--config",
        str(cfg),
        "bridge",
        cwd=root,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        nc = await nats.connect(hub.url)
        try:
            js = nc.jetstream()
            psub = None
            for _ in range(100):  # until the process answers the API
                try:
                    psub = await js.pull_subscribe("orders", durable="workers")
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            assert psub is not None
            await publish_http(client, ["via-cli"])
            [msg] = await psub.fetch(1, timeout=3)
            assert msg.data == b"via-cli" and msg.metadata.stream == "orders"
            await msg.ack_sync()
        finally:
            await nc.close()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=20)
        output = (await process.stdout.read()).decode() if process.stdout else ""
        assert code == 0, output
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DELIVERED


@uncapped_only
async def test_credentials_for_both_connections(
    make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """A server that wants a user and password from clients and other ones from leafnodes."""
    server = NatsServer(
        leafnodes=True,
        authorization="user: bridge, password: s3cret",
        leaf_authorization="user: leaf, password: l3af",
    )
    server.start()
    try:
        await make_bridge(
            "hybrid",
            server=server,
            user="bridge",
            password="s3cret",
            leaf_user="leaf",
            leaf_password="l3af",
        )
        nc = await nats.connect(f"nats://bridge:s3cret@127.0.0.1:{server.port}")
        try:
            psub = await nc.jetstream().pull_subscribe("orders", durable="workers")
            await publish_http(client, ["secret-job"])
            [msg] = await psub.fetch(1, timeout=2)
            assert msg.data == b"secret-job" and msg.metadata.num_delivered == 1
            await msg.ack_sync()
        finally:
            await nc.close()
    finally:
        server.cleanup()
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DELIVERED
