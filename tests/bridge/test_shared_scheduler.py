"""HTTP long polls and NATS pull requests of one consumer wait in one scheduler: the process's
`PullScheduler` (app/services/scheduler.py). The bridge here runs on the test's own Runtime, as
the HTTP app does, so both transports queue their requests on `runtime.scheduler`: they share
max_waiting, are served round-robin among each other, and end together when the consumer is
deleted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from sqlalchemy import select

from app.bridge.bridge import Bridge
from app.runtime import Runtime
from app.store.schema import consumer
from tests.bridge.conftest import nats_config, publish_http, seed, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import until_waiting

MAX_WAITING = 2
NEXT = "$JS.API.CONSUMER.MSG.NEXT.orders.workers"
PULL = "/channel/orders/consumer/workers/pull"
AUTH = {"X-Broker-Channel-Token": "orders-token", "X-Broker-Consumer-Token": "workers-token"}
# How long a request that should get nothing is watched (the scheduler hands out in ms).
QUIET = 0.4


@pytest.fixture
def extra_config(cap: str) -> str:
    # A long ack wait: no lease lapses (and no job comes back) while a test runs.
    return seed(cap, ack_wait=60) + f"\n[pull]\nmax-waiting={MAX_WAITING}\n"


@pytest.fixture
async def bridge(runtime: Runtime, hub: NatsServer) -> AsyncIterator[Bridge]:
    """A client-mode bridge on the test's Runtime: the same scheduler as the HTTP app."""
    started = Bridge(runtime, nats_config(hub, "client"), name="shared")
    await started.start()
    yield started
    await started.stop()


@pytest.fixture
async def nc(hub: NatsServer) -> AsyncIterator[Client]:
    connection = await nats.connect(hub.url)
    yield connection
    await connection.close()


async def workers_pk(runtime: Runtime) -> int:
    async with runtime.db.transaction() as tx:
        query = select(consumer.c.pk).where(
            consumer.c.channel_id == "orders", consumer.c.consumer_id == "workers"
        )
        return int((await tx.conn.execute(query)).scalar_one())


def status_of(msg: Msg) -> tuple[str, str] | None:
    headers = msg.headers or {}
    if "Status" not in headers:
        return None
    return headers["Status"], headers.get("Description", "")


class HttpPoll:
    """One HTTP long poll on `workers`, running as a task."""

    def __init__(self, client: httpx.AsyncClient, *, batch: int, expires: float) -> None:
        body = {"batch": batch, "expires": expires}
        self.task = asyncio.create_task(client.post(PULL, json=body, headers=AUTH))

    async def response(self, within: float = 5.0) -> httpx.Response:
        return await asyncio.wait_for(asyncio.shield(self.task), within)

    async def payloads(self, within: float = 5.0) -> list[str]:
        response = await self.response(within)
        assert response.status_code == 200, response.text
        return [job["Message"]["Payload"] for job in response.json()["Jobs"]]

    async def quiet(self) -> None:
        await asyncio.sleep(QUIET)
        assert not self.task.done(), self.task.result().text

    def cancel(self) -> None:
        self.task.cancel()


class NatsPull:
    """One JetStream pull request (MSG.NEXT) on `workers`, answered on its own inbox."""

    def __init__(self, nc: Client, sub: Subscription) -> None:
        self.nc = nc
        self.sub = sub

    @classmethod
    async def send(cls, nc: Client, *, batch: int, expires: float) -> NatsPull:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        body = f'{{"batch": {batch}, "expires": {int(expires * 1_000_000_000)}}}'
        await nc.publish(NEXT, body.encode(), reply=inbox)
        await nc.flush()
        return cls(nc, sub)

    async def next(self, within: float = 5.0) -> Msg:
        return await self.sub.next_msg(timeout=within)

    async def payload(self, within: float = 5.0) -> str:
        msg = await self.next(within)
        assert status_of(msg) is None and msg.reply, (msg.headers, msg.data)
        return msg.data.decode()

    async def status(self, within: float = 5.0) -> tuple[str, str] | None:
        return status_of(await self.next(within))

    async def quiet(self) -> None:
        with pytest.raises(NatsTimeoutError):
            msg = await self.next(QUIET)
            pytest.fail(f"unexpected message: {msg.headers} {msg.data!r}")


async def test_max_waiting_is_counted_across_both_transports(
    bridge: Bridge, nc: Client, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    pk = await workers_pk(runtime)
    polls: list[HttpPoll] = []
    try:
        nats_waiter = await NatsPull.send(nc, batch=1, expires=5)
        await until_waiting(runtime, pk, 1)
        polls.append(HttpPoll(client, batch=1, expires=5))
        await until_waiting(runtime, pk, 2)
        assert runtime.scheduler.waiting(pk) == MAX_WAITING
        assert bridge.engine.num_waiting(pk) == MAX_WAITING  # what CONSUMER.INFO reports

        # A third request is refused on either transport: the two waiting fill the queue.
        refused = await client.post(PULL, json={"batch": 1, "expires": 5}, headers=AUTH)
        assert refused.status_code == 409, refused.text
        assert "waiting" in refused.json()["detail"]
        third = await NatsPull.send(nc, batch=1, expires=5)
        assert await third.status() == ("409", "Exceeded MaxWaiting")
        await third.quiet()
        assert runtime.scheduler.waiting(pk) == MAX_WAITING
        http_waiter = polls[0]
        assert not http_waiter.task.done()

        await publish_http(client, ["a", "b"])
        from_nats = await nats_waiter.payload()
        from_http = await http_waiter.payloads()
        assert len(from_http) == 1
        assert {from_nats, *from_http} == {"a", "b"}
        await nats_waiter.quiet()  # batch 1 filled: nothing more, no status
        assert runtime.scheduler.waiting(pk) == 0
    finally:
        for poll in polls:
            poll.cancel()


@pytest.mark.parametrize("first", ["http", "nats"])
async def test_one_job_goes_to_one_waiter_across_transports_round_robin(
    first: str, bridge: Bridge, nc: Client, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    pk = await workers_pk(runtime)
    poll: HttpPoll | None = None
    try:
        if first == "nats":
            request = await NatsPull.send(nc, batch=10, expires=5)
            await until_waiting(runtime, pk, 1)
            poll = HttpPoll(client, batch=10, expires=5)
        else:
            poll = HttpPoll(client, batch=10, expires=5)
            await until_waiting(runtime, pk, 1)
            request = await NatsPull.send(nc, batch=10, expires=5)
        await until_waiting(runtime, pk, 2)
        assert runtime.scheduler.waiting(pk) == 2

        # One job: the request that came first (the head of the queue) takes it.
        await publish_http(client, ["j1"])
        if first == "nats":
            assert await request.payload() == "j1"
            await poll.quiet()  # the long poll is still waiting, and still counted
            assert runtime.scheduler.waiting(pk) == 2
        else:
            assert await poll.payloads() == ["j1"]  # a long poll ends with its first hand-out
            await request.quiet()
            assert runtime.scheduler.waiting(pk) == 1

        # The next job goes to the other one.
        await publish_http(client, ["j2"])
        if first == "nats":
            assert await poll.payloads() == ["j2"]
            await request.quiet()
        else:
            assert await request.payload() == "j2"
            await request.quiet()
        # The NATS request waits on with batch left; the long poll has ended.
        assert runtime.scheduler.waiting(pk) == 1
    finally:
        if poll is not None:
            poll.cancel()


@uncapped_only
async def test_consumer_deleted_ends_waiting_requests_of_both_transports(
    bridge: Bridge, nc: Client, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    pk = await workers_pk(runtime)
    loop = asyncio.get_running_loop()
    poll = HttpPoll(client, batch=5, expires=20)
    try:
        await until_waiting(runtime, pk, 1)
        request = await NatsPull.send(nc, batch=5, expires=20)
        await until_waiting(runtime, pk, 2)

        found = await client.get("/channel/orders/consumer/workers")
        assert found.status_code == 200, found.text
        deleted = await client.delete(
            "/channel/orders/consumer/workers",
            headers={"If-Unmodified-Since": found.headers["Last-Modified"]},
        )
        assert deleted.status_code == 204, deleted.text
        at = loop.time()

        # Both end at once, long before their 20 s expiry.
        response = await poll.response(within=3)
        assert response.status_code == 200, response.text
        assert response.json()["Jobs"] == []
        assert await request.status(within=3) == ("409", "Consumer Deleted")
        assert loop.time() - at < 3
        await request.quiet()
        assert runtime.scheduler.waiting(pk) == 0
    finally:
        poll.cancel()
