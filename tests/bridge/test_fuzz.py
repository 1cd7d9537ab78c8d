"""A seeded fuzz of the bridge over a real nats-server: random subjects under `$JS.API.>` and
the ack prefix, random bodies, as requests and as plain publishes. Whatever it gets, the bridge
keeps serving: afterwards a plain nats-py fetch gets the next job and its ack is applied, and
no job is left in flight. A failure prints the seed; `FUZZ_SEED=<n>` replays it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import string

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError

from app.bridge.bridge import Bridge
from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, publish_http, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import status_counts

SEED = int(os.environ.get("FUZZ_SEED", "20261125"))
MESSAGES = 400
API_SUBJECTS = (
    "CONSUMER.MSG.NEXT.orders.workers",
    "CONSUMER.MSG.NEXT.orders",
    "CONSUMER.MSG.NEXT",
    "CONSUMER.INFO.orders.workers",
    "CONSUMER.CREATE.orders.workers",
    "CONSUMER.DURABLE.CREATE.orders.workers",
    "CONSUMER.DELETE.orders.workers",
    "CONSUMER.NAMES.orders",
    "CONSUMER.LIST.orders",
    "STREAM.INFO.orders",
    "STREAM.NAMES",
    "STREAM.MSG.GET.orders",
    "INFO",
)
TOKEN_CHARS = string.ascii_letters + string.digits + "-_$!\"'{}[]()#%&=~^|\\/?@+,;:"
BODIES = (
    b"",
    b"{",
    b"}",
    b"null",
    b"[]",
    b'{"batch": 1, "no_wait": true}',
    b'{"batch": 1e309}',
    b'{"expires": -1, "batch": 2}',
    b"+ACK",
    b"-NAK",
    b"+WPI",
    b"+TERM",
    b"+NXT",
    b'-NAK {"delay": "x"}',
)


def token(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return str(rng.choice([0, 1, -1, 2**31, 2**63, 10**30, rng.randrange(10**6)]))
    if kind < 0.4:
        return "x" * rng.choice([1, 255, 256, 1000])
    return "".join(rng.choice(TOKEN_CHARS) for _ in range(rng.randrange(1, 12)))


def subject(rng: random.Random, ack_prefix: str) -> str:
    if rng.random() < 0.5:
        base = "$JS.API." + rng.choice(API_SUBJECTS)
        extra = [token(rng) for _ in range(rng.choice([0, 0, 1, 2]))]
        return ".".join([base, *extra])
    tokens = [rng.choice(["orders", token(rng)]), rng.choice(["workers", token(rng)])]
    tokens += [token(rng) for _ in range(rng.choice([5, 5, 5, 3, 6, 9]))]
    return ".".join([ack_prefix, *tokens])


def body(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return rng.choice(BODIES)
    return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))


@uncapped_only
@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_the_bridge_survives_random_subjects_and_bodies(
    mode: str,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    bridge = await make_bridge(mode)
    rng = random.Random(SEED)
    await publish_http(client, [f"before-{n}" for n in range(5)])  # jobs the garbage may touch
    nc = await nats.connect(hub.url)
    try:
        requests = []
        for _ in range(MESSAGES):
            target, payload = subject(rng, bridge.ack_prefix), body(rng)
            if rng.random() < 0.5:
                requests.append(nc.request(target, payload, timeout=0.3))
            else:
                with contextlib.suppress(NatsError):
                    await nc.publish(target, payload)
        for outcome in await asyncio.gather(*requests, return_exceptions=True):
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, NatsError | asyncio.TimeoutError), (SEED, outcome)
        await settle(nc, bridge)

        # The plain nats-py way, after all of it: the bridge answers and applies the ack.
        js = nc.jetstream()
        psub = await js.pull_subscribe("orders", durable="workers", stream="orders")
        await publish_http(client, ["after-fuzz"])
        fetched = []
        for _ in range(10):
            with contextlib.suppress(NatsError, asyncio.TimeoutError):
                for msg in await psub.fetch(10, timeout=2):
                    await msg.ack_sync()
                    fetched.append(msg.data.decode())
            if "after-fuzz" in fetched:
                break
        assert "after-fuzz" in fetched, (SEED, fetched)
    finally:
        await nc.close()
    # Nothing the fuzz claimed stays leased past its ack wait: the sweeper gives it back, and a
    # fetch takes it. Every job ends DELIVERED (acked here) or DEAD (a fuzzed +TERM).
    for _ in range(50):
        statuses = await status_counts(runtime)
        if not statuses.get("INFLIGHT") and not statuses.get("QUEUED"):
            break
        await asyncio.sleep(0.2)
        await _drain(hub.url)
    assert set(statuses) <= {"DELIVERED", "DEAD"}, (SEED, statuses)


async def settle(nc: Client, bridge: Bridge) -> None:
    """Wait until the bridge has answered every request of the fuzz that can change a
    consumer. The fuzz gives up on a request after 0.3 s, but the bridge may still be at work on
    it (a CONSUMER.DELETE of workers waits out a deadlock with a claim for a second): done
    later, it would delete the consumer the check below has just declared. The bridge takes each
    subscription's requests in order, so once a probe on each is answered, every request sent
    before it is in hand, and `settled` waits for their answers."""
    for probe in ("CONSUMER.DELETE", "CONSUMER.CREATE", "CONSUMER.DURABLE.CREATE"):
        await nc.request(f"$JS.API.{probe}.orders.no-such-consumer", b"{", timeout=30)
    await bridge.settled()


async def _drain(url: str) -> None:
    """Fetch and ack whatever is due (jobs the fuzz left to be redelivered)."""
    nc = await nats.connect(url)
    try:
        psub = await nc.jetstream().pull_subscribe("orders", durable="workers", stream="orders")
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            for msg in await psub.fetch(10, timeout=0.5):
                await msg.ack_sync()
    finally:
        await nc.close()
