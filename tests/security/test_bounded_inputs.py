"""Bounded inputs, against a real `webhook-broker serve` process and raw sockets: a body is read
only once the credentials in the headers allow it and never past its cap (counted as the
client sends it, and as the server process reads it), a request head that does not arrive in
time closes its connection (slowloris), a body that does not arrive in time is a 408; the
waiting pulls of a process have a global cap; a stream's unwritten buffer is capped in bytes;
the bridge refuses an idle heartbeat under the HTTP pull's minimum."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats
import pytest

from app.domain.models import PulledJob
from app.domain.pulls import Delivery
from app.runtime import Runtime
from app.services.streaming import StreamSink
from tests.bridge.conftest import BridgeFactory, hub, make_bridge, seed
from tests.helpers.bounded import (
    KERNEL_SLACK,
    MESSAGE_CAP,
    READ_SLACK,
    send_endless,
    server_reads,
    start_process,
)
from tests.helpers.natsproc import NatsServer
from tests.helpers.processes import BrokerProcess
from tests.helpers.waiting import eventually

__all__ = ["hub", "make_bridge"]  # fixtures of the bridge suite, used here too

BODY_CAP = 131_072  # [http] max-body-bytes
ADMIN = "admin-secret"


@pytest.fixture(scope="module")
def broker(
    sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    http = f"admin-token={ADMIN}\nmax-body-bytes={BODY_CAP}\n"
    process = start_process(sqlite_template, tmp_path_factory.mktemp("bounded"), http)
    try:
        yield process
    finally:
        process.stop()


PUBLISH = "/channel/orders/broadcast"
PULL = "/channel/orders/consumer/workers/pull"
ACK = "/channel/orders/consumer/workers/ack"
JOB_ACK = "/channel/orders/consumer/workers/job/1/ack"
PUT_CHANNEL = "/channel/other"
CREDENTIALS = {
    PUBLISH: "X-Broker-Channel-Token: orders-token\r\nX-Broker-Producer-ID: shop\r\n"
    "X-Broker-Producer-Token: shop-token",
    PULL: "X-Broker-Channel-Token: orders-token\r\nX-Broker-Consumer-Token: workers-token",
    ACK: "X-Broker-Channel-Token: orders-token\r\nX-Broker-Consumer-Token: workers-token",
    JOB_ACK: "X-Broker-Channel-Token: orders-token\r\nX-Broker-Consumer-Token: workers-token",
    PUT_CHANNEL: f"Authorization: Bearer {ADMIN}",
}
CAPS = {
    PUBLISH: MESSAGE_CAP,
    PULL: BODY_CAP,
    ACK: BODY_CAP,
    JOB_ACK: BODY_CAP,
    PUT_CHANNEL: BODY_CAP,
}
METHODS = {PUT_CHANNEL: "PUT"}
TYPES = {PUBLISH: "text/plain", PUT_CHANNEL: "application/x-www-form-urlencoded"}
# A credential that is there but wrong, or none at all: refused by the credential order.
UNAUTHENTICATED = {
    PUBLISH: ("X-Broker-Channel-Token: orders-token\r\nX-Broker-Producer-ID: shop", 403),
    PULL: ("", 403),
    ACK: ("X-Broker-Channel-Token: orders-token", 403),
    JOB_ACK: ("X-Broker-Channel-Token: wrong", 403),
    PUT_CHANNEL: ("", 401),
}


def head_for(process: BrokerProcess, path: str, credentials: str) -> str:
    lines = [
        f"{METHODS.get(path, 'POST')} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{process.port}",
        f"Content-Type: {TYPES.get(path, 'application/json')}",
    ]
    if credentials:
        lines.append(credentials)
    return "\r\n".join(lines)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("path", list(CAPS))
def test_a_gigabyte_body_without_credentials_is_refused_unread(
    broker: BrokerProcess, path: str, chunked: bool
) -> None:
    credentials, status = UNAUTHENTICATED[path]
    before = server_reads(broker)
    outcome = send_endless(
        broker.port, head_for(broker, path, credentials), chunked=chunked, give_up=64 << 20
    )
    read = server_reads(broker) - before
    assert outcome.status == status, outcome
    # Nothing of the body was needed: the credentials came first.
    assert outcome.sent <= KERNEL_SLACK, outcome
    assert read <= READ_SLACK, read


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
@pytest.mark.parametrize("path", list(CAPS))
def test_a_gigabyte_body_with_credentials_is_read_up_to_its_cap(
    broker: BrokerProcess, path: str, chunked: bool
) -> None:
    cap = CAPS[path]
    before = server_reads(broker)
    outcome = send_endless(
        broker.port, head_for(broker, path, CREDENTIALS[path]), chunked=chunked, give_up=64 << 20
    )
    read = server_reads(broker) - before
    assert outcome.status == 413, outcome
    assert str(cap) in outcome.text
    assert outcome.sent <= cap + KERNEL_SLACK, outcome
    assert read <= cap + READ_SLACK, read


def test_small_bodies_still_work(broker: BrokerProcess) -> None:
    """The caps refuse what is over them only: a publish, a pull and a PUT under them pass."""
    with httpx.Client(base_url=broker.url) as http:
        r = http.post(
            PUBLISH,
            content=b"y" * MESSAGE_CAP,
            headers={
                "X-Broker-Channel-Token": "orders-token",
                "X-Broker-Producer-ID": "shop",
                "X-Broker-Producer-Token": "shop-token",
            },
        )
        assert r.status_code == 201, r.text

        def chunks() -> Iterator[bytes]:
            yield b'{"batch": 1, '
            yield b'"no_wait": true}'

        r = http.post(PULL, content=chunks(), headers=consumer_headers("workers"))
        assert r.status_code == 200 and len(r.json()["Jobs"]) == 1, r.text
        r = http.put(
            PUT_CHANNEL,
            data={"token": "t" * 100, "name": "Other"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code in (200, 201), r.text


# -- slow clients -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_broker(
    sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    http = "read-header-timeout=1\nread-timeout=1\n"
    process = start_process(sqlite_template, tmp_path_factory.mktemp("slow"), http)
    try:
        yield process
    finally:
        process.stop()


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes `sock` while a byte of `trickle` is sent every 0.1 s;
    None if it is still open after `seconds`."""
    started = time.monotonic()
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started
        if sent < len(trickle):
            try:
                sock.send(trickle[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
            sent += 1
    return None


def test_a_slow_request_head_is_disconnected(slow_broker: BrokerProcess) -> None:
    trickle = ("X-Slow: " + "a" * 200 + "\r\n").encode()
    with socket.create_connection(("127.0.0.1", slow_broker.port)) as loris:
        loris.sendall(b"GET /_status HTTP/1.1\r\nHost: x\r\n")
        # Meanwhile a normal request is served.
        assert httpx.get(f"{slow_broker.url}/_status").status_code == 200
        after = closed_within(loris, 6.0, trickle)
    assert after is not None, "a head trickled a byte at a time kept its connection"
    assert 0.8 <= after <= 3.0, after
    # A connection that sends nothing at all, and an idle one after its answer, are closed too.
    with socket.create_connection(("127.0.0.1", slow_broker.port)) as silent:
        assert closed_within(silent, 6.0) is not None
    with socket.create_connection(("127.0.0.1", slow_broker.port)) as idle:
        idle.sendall(b"GET /_status HTTP/1.1\r\nHost: x\r\n\r\n")
        idle.settimeout(5)
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        # Bytes that never make a head do not keep it open past the deadline.
        after = closed_within(idle, 6.0, b"G" * 60)
        assert after is not None and after <= 3.0, after


def test_a_body_that_does_not_arrive_in_time_is_a_408(slow_broker: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", slow_broker.port)) as slow:
        slow.sendall(
            b"PUT /channel/late HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n"
            b"token=abc"
        )
        slow.settimeout(5)
        answer = slow.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer


# -- waiting pulls and streams ------------------------------------------------------------------


TWO_CONSUMERS = """
[pull]
max-waiting=5
max-waiting-total=2
[initial-channels]
orders=Orders
[initial-channel-tokens]
orders=orders-token
[initial-consumers]
first=
second=
[first]
token=first-token
channel=orders
type=pull
[second]
token=second-token
channel=orders
type=pull
"""


def consumer_headers(name: str) -> dict[str, str]:
    return {"X-Broker-Channel-Token": "orders-token", "X-Broker-Consumer-Token": f"{name}-token"}


@pytest.mark.parametrize("extra_config", [TWO_CONSUMERS])
async def test_the_waiting_pulls_of_a_process_have_a_global_cap(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    async def wait(name: str) -> httpx.Response:
        return await client.post(
            f"/channel/orders/consumer/{name}/pull",
            json={"batch": 1, "expires": 5},
            headers=consumer_headers(name),
        )

    waiting = [asyncio.create_task(wait("first")), asyncio.create_task(wait("second"))]
    await eventually(lambda: runtime.scheduler.waiting_total() >= 2, 10, 0.02, what="two waiting")
    try:
        # Each consumer is far below its own max-waiting (5); the process is at its 2.
        r = await asyncio.wait_for(wait("first"), 3)
        assert r.status_code == 409, r.text
        assert "max-waiting-total" in r.json()["detail"]
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


def test_a_streams_unwritten_buffer_is_capped_in_bytes() -> None:
    sink = StreamSink(lambda: None, max_bytes=1000)
    job = PulledJob(
        id=1, attempt=1, priority=0, lease_expires_at=None, created_at=datetime.now(UTC),
        message_id="m", payload=b"z" * 400, content_type="text/plain", headers={},
    )  # fmt: skip
    delivery = Delivery(job=job, seq=0, pending=0)
    taken = 0
    while sink.ready() and taken < 10:
        sink.offer(None, delivery, None)  # type: ignore[arg-type]
        taken += 1
    assert taken == 3  # 1200 bytes: the job that crosses the cap is kept, then no more


# -- the bridge's heartbeat minimum -------------------------------------------------------------


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize("extra_config", [seed("uncapped")])
async def test_the_bridge_refuses_a_heartbeat_under_the_http_minimum(
    make_bridge: BridgeFactory, hub: NatsServer
) -> None:
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        body = {"batch": 1, "expires": 1_000_000_000, "idle_heartbeat": 50_000_000}
        await nc.publish(
            "$JS.API.CONSUMER.MSG.NEXT.orders.workers", json.dumps(body).encode(), reply=inbox
        )
        msg = await sub.next_msg(timeout=5)
        assert msg.headers is not None
        assert msg.headers.get("Status") == "400", msg.headers
        assert msg.headers.get("Description", "").startswith(
            "Bad Request - heartbeat value too small"
        )
        # At the minimum it is a pull like any other (it expires with 408).
        body["idle_heartbeat"] = 100_000_000
        await nc.publish(
            "$JS.API.CONSUMER.MSG.NEXT.orders.workers", json.dumps(body).encode(), reply=inbox
        )
        msg = await sub.next_msg(timeout=5)
        assert msg.headers is not None and msg.headers.get("Status") in ("100", "408")
    finally:
        await nc.close()
