"""Finding: the NATS bridge had no authentication of its own and compose ran nats-server without
any, so whoever reached port 4222 could pull, ack or term any consumer's jobs, read every
delivery or join the bridge's queue group.

A compose-like deployment: a real nats-server whose users come from `webhook-broker
nats-permissions` run against a real database with two pull consumers and a push consumer
(made over NATS, with flow control), the bridge logged in as its user. Each worker pulls and
acks its own consumer's jobs with nats-py, the push consumer's worker receives its jobs with
`js.subscribe` and answers flow control; every reach for the other consumers' subjects or the
bridge's is a permissions violation, and nothing arrives."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from app.bridge import protocol as p
from app.bridge.bridge import Bridge
from app.config import Config, NatsConfig
from app.domain.jobs import JobStatus
from app.domain.nats_consumers import CreateRequest, ProcessLimits
from app.runtime import Runtime
from app.services.admin import AdminService
from app.services.consumer_management import ConsumerManagement
from app.store.jobs import JobStore
from app.store.stakeholders import ConsumerStore
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
BRIDGE_USER = "webhook-broker-bridge"
QUEUE = "webhook-broker-bridge"

SEED = """
[initial-channels]
orders=Orders
hooks=Hooks
[initial-channel-tokens]
orders=orders-token
hooks=hooks-token
[initial-producers]
shop=Shop
[initial-producer-tokens]
shop=shop-token
[initial-consumers]
workers=
auditors=
mailer=http://127.0.0.1:9/hook
[workers]
token=workers-token
channel=orders
type=pull
[auditors]
token=auditors-token
channel=orders
type=pull
[mailer]
token=mailer-token
channel=hooks
"""

# What nats-server finds in its environment (compose: .env and nats-workers.env).
PASSWORDS = {
    "NATS_BRIDGE_PASSWORD": "bridge-secret",
    "WORKER_ORDERS_WORKERS_PASSWORD": "workers-secret",
    "WORKER_ORDERS_AUDITORS_PASSWORD": "auditors-secret",
    "WORKER_ORDERS_PUSHERS_PASSWORD": "pushers-secret",
}
# The push consumer's deliver subject: outside the inboxes, so granted by name.
DELIVER = "push.orders.pushers"

PUBLISH_HEADERS = {
    "X-Broker-Channel-Token": "orders-token",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "shop-token",
    "Content-Type": "text/plain",
}


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture
def extra_config() -> str:
    return SEED


async def nats_permissions(rdbms: str, mode: str, root: Path, *flags: str) -> str:
    """`webhook-broker nats-permissions`, run as an operator runs it: its own process, reading
    the database through its config file."""
    nats_section = f"[nats]\nmode={mode}\nuser={BRIDGE_USER}\n"
    if mode == "hybrid":
        nats_section += "leaf-url=nats-leaf://127.0.0.1:7422\n"
    config_file = root / "broker.cfg"
    config_file.write_text(rdbms + nats_section)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_BROKER__")}
    environment["PYTHONPATH"] = str(ROOT)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "--config",
        str(config_file),
        "nats-permissions",
        *flags,
        cwd=root,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    return out.decode()


def server_with(block: str) -> NatsServer:
    """A nats-server like deploy/nats.conf: clients, a leafnode listener that authenticates
    with the same users, and the generated block included."""
    server = NatsServer(leafnodes=True)
    (server.root / "nats-permissions.conf").write_text(block)
    server.conf.write_text(
        f"server_name: {server.name}\n"
        f"listen: 127.0.0.1:{server.port}\n"
        f"leafnodes {{ listen: 127.0.0.1:{server.leaf_port} }}\n"
        "include nats-permissions.conf\n"
    )
    return server


async def job_status(runtime: Runtime, consumer_id: str, message_pk: int) -> JobStatus:
    async with runtime.db.transaction() as tx:
        consumer = await ConsumerStore(tx).get("orders", consumer_id)
        assert consumer is not None
        jobs = await JobStore(tx).for_message(message_pk)
    [job] = [job for job in jobs if job.consumer_pk == consumer.pk]
    return job.status


async def publish(client: httpx.AsyncClient, name: str) -> None:
    response = await client.post(
        "/channel/orders/broadcast",
        content=name.encode(),
        headers={**PUBLISH_HEADERS, "X-Broker-Message-ID": name},
    )
    assert response.status_code == 201, response.text


async def create_push_consumer(runtime: Runtime) -> None:
    """Push consumer `pushers`, made as a CONSUMER.CREATE over NATS makes it (an operator's,
    before the permissions are written): flow control, idle heartbeats, a short ack wait."""
    management = ConsumerManagement(
        runtime.db,
        AdminService(runtime.db, runtime.tokens),
        ProcessLimits(
            max_waiting=512, max_batch=256, max_expires=0, default_ack_wait=30, max_retry=4
        ),
    )
    config = {
        "durable_name": "pushers",
        "deliver_subject": DELIVER,
        "ack_policy": "explicit",
        "ack_wait": p.NANOS,
        "flow_control": True,
        "idle_heartbeat": p.NANOS,
        "filter_subject": "orders",
    }
    await management.create("orders", CreateRequest("orders", config, "", False))


class Worker:
    """A worker's nats-py connection as its user, with the inbox prefix its user may read;
    the permission errors the server sends it are collected."""

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.errors: list[str] = []
        self.received: list[Msg] = []
        self.nc = Client()

    async def connect(self, server: NatsServer) -> None:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        await self.nc.connect(
            server.url,
            user=f"orders.{self.consumer}",
            password=PASSWORDS[f"WORKER_ORDERS_{self.consumer.upper()}_PASSWORD"],
            inbox_prefix=f"_INBOX.orders.{self.consumer}",
            error_cb=on_error,
            allow_reconnect=False,
        )

    async def catch(self, msg: Msg) -> None:
        self.received.append(msg)

    async def refused(self, operation: str, subject: str) -> None:
        """The server answered `operation` on `subject` with a permissions violation (it
        reaches the client before the answer to the PING that flush sends)."""
        await self.nc.flush(timeout=5)
        wanted = f'permissions violation for {operation} to "{subject.lower()}"'
        await eventually(lambda: any(wanted in error for error in self.errors))


@pytest.mark.parametrize(
    ("mode", "form"),
    [("client", "authorization"), ("hybrid", "authorization"), ("client", "accounts")],
)
async def test_a_worker_reaches_only_its_own_consumer(
    mode: str,
    form: str,
    rdbms: str,
    config: Config,
    runtime: Runtime,
    client: httpx.AsyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ack_prefix = "$JS.ACK" if mode == "hybrid" else "$WB.ACK"
    await create_push_consumer(runtime)
    block = await nats_permissions(
        rdbms, mode, tmp_path, *(["--accounts"] if form == "accounts" else [])
    )
    # Users named and passwords as references only: the file holds no secret.
    assert "$WORKER_ORDERS_WORKERS_PASSWORD" in block and "mailer" not in block
    assert not any(secret in block for secret in PASSWORDS.values())
    for name, value in PASSWORDS.items():
        monkeypatch.setenv(name, value)
    server = server_with(block)
    server.start()
    bridge_runtime = Runtime(config, run_sweeper=False)
    await bridge_runtime.start(seed=False)
    bridge = Bridge(
        bridge_runtime,
        NatsConfig(
            mode=mode,
            url=server.url,
            leaf_url=server.leaf_url if mode == "hybrid" else "",
            user=BRIDGE_USER,
            password=PASSWORDS["NATS_BRIDGE_PASSWORD"],
        ),
        name="bridge",
    )
    workers, auditors, pushers = Worker("workers"), Worker("auditors"), Worker("pushers")
    caplog.set_level(logging.WARNING)
    try:
        await bridge.start()
        # Nobody gets in without a user now.
        with pytest.raises(Exception, match="(?i)authorization"):
            await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0)
        await workers.connect(server)
        await auditors.connect(server)
        await pushers.connect(server)
        # The push consumer's worker binds to it with js.subscribe (it reads the consumer's
        # info, then subscribes to the deliver subject) before anything is published (a
        # client-mode bridge cannot see whether anyone listens).
        pushed: asyncio.Queue[Msg] = asyncio.Queue()
        await pushers.nc.jetstream().subscribe(
            "orders", durable="pushers", stream="orders", cb=pushed.put, manual_ack=True
        )
        await pushers.nc.flush(timeout=5)

        await publish(client, "job-1")
        # Each worker pulls and acks its own consumer's job.
        own = await workers.nc.jetstream().pull_subscribe("orders", "workers", stream="orders")
        [msg] = await own.fetch(1, timeout=5)
        # The reply: `<prefix>._.<job id>.<stream>.<consumer>...` (app/bridge/protocol.py).
        assert msg.data == b"job-1" and msg.reply.startswith(f"{ack_prefix}._.")
        assert msg.reply.split(".")[4:6] == ["orders", "workers"]
        await msg.ack_sync(timeout=5)
        assert await job_status(runtime, "workers", 1) is JobStatus.DELIVERED
        theirs = await auditors.nc.jetstream().pull_subscribe("orders", "auditors", stream="orders")
        [held] = await theirs.fetch(1, timeout=5)
        assert held.data == b"job-1" and held.reply.split(".")[4:6] == ["orders", "auditors"]
        if mode == "hybrid":
            assert held.metadata.stream == "orders" and held.metadata.consumer == "auditors"

        # The bridge's queue group, the API, the acks and other workers' inboxes: no
        # subscription of the worker's is made.
        for subject, queue in (
            ("$JS.API.CONSUMER.MSG.NEXT.*.*", QUEUE),
            ("$JS.API.>", QUEUE),
            ("$JS.API.>", ""),
            (f"{ack_prefix}.>", QUEUE),
            (f"{ack_prefix}.orders.auditors.>", ""),
            ("_INBOX.>", ""),
            ("_INBOX.orders.auditors.>", ""),
            # Another consumer's deliver subject, and the flow control replies.
            (DELIVER, ""),
            ("$JS.FC.>", ""),
        ):
            await workers.nc.subscribe(subject, queue=queue, cb=workers.catch)
            await workers.refused("subscription", subject)

        # The other consumer's pull request: refused, so its next job stays for its owner.
        await publish(client, "job-2")
        inbox = workers.nc.new_inbox()
        await workers.nc.subscribe(inbox, cb=workers.catch)
        other_next = "$JS.API.CONSUMER.MSG.NEXT.orders.auditors"
        await workers.nc.publish(other_next, b'{"batch": 5, "no_wait": true}', reply=inbox)
        await workers.refused("publish", other_next)

        # Answering the push consumer's flow control for it: refused.
        foreign_fc = "$JS.FC.orders.pushers.AbCd"
        await workers.nc.publish(foreign_fc, b"")
        await workers.refused("publish", foreign_fc)

        # Terminating the other consumer's delivery: refused, the job stays in flight.
        await workers.nc.publish(held.reply, b"+TERM stolen")
        await workers.refused("publish", held.reply)
        assert await job_status(runtime, "auditors", 1) is JobStatus.INFLIGHT

        # The owner still acks its job and gets the next one: nothing went to the intruder.
        await held.ack_sync(timeout=5)
        assert await job_status(runtime, "auditors", 1) is JobStatus.DELIVERED
        [second] = await theirs.fetch(1, timeout=5)
        assert second.data == b"job-2"
        await second.ack_sync(timeout=5)
        assert await job_status(runtime, "auditors", 2) is JobStatus.DELIVERED
        # The push consumer's worker got both jobs and acks them; its flow control replies
        # are its own to send.
        got: dict[bytes, Msg] = {}
        while len(got) < 2:
            one = await asyncio.wait_for(pushed.get(), 15)
            got[one.data] = one
        assert sorted(got) == [b"job-1", b"job-2"]
        for one in got.values():
            # A push delivery's reply is nats-server's form: `<prefix>.<stream>.<consumer>...`.
            assert one.reply.split(".")[2:4] == ["orders", "pushers"]
            await one.ack_sync(timeout=5)
        assert await job_status(runtime, "pushers", 2) is JobStatus.DELIVERED
        await pushers.nc.publish("$JS.FC.orders.pushers.AbCd", b"")
        await pushers.nc.flush(timeout=5)

        await workers.nc.flush(timeout=5)
        assert workers.received == []
        assert auditors.errors == [] and pushers.errors == []
        # The bridge itself was refused nothing (it would log the server's error).
        assert not [r for r in caplog.records if "ermissions" in r.getMessage()]
    finally:
        for worker in (workers, auditors, pushers):
            if worker.nc.is_connected:
                await worker.nc.close()
        await bridge.stop()
        await bridge_runtime.stop()
        server.cleanup()
