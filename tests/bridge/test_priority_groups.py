"""Priority groups, by raw pull requests (nats-py cannot send their fields), against real
JetStream and against the bridge in both transports: the same who-gets-what, status lines and
pending headers for overflow and prioritized consumers, the same refusals, and the same
consumer info. Then the same scenarios as HTTP pulls."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client

from app.bridge import protocol as p
from app.domain.priority import PullPriority as Terms
from app.domain.pulls import ConsumerCredentials, PullRequest
from app.runtime import Runtime
from tests.bridge.conftest import (
    ACK_WAIT,
    MAX_RETRY,
    BridgeFactory,
    arriving,
    publish_http,
    uncapped_only,
)
from tests.helpers import side_by_side
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import expire_leases
from tests.helpers.side_by_side import Publish, http_publisher, with_msg_id
from tests.helpers.waiting import eventually

MS = 1_000_000  # ns
# Every request of these scenarios ends in an answer within its window, on either server; a
# busy CI machine held one (a 408 due at 400 ms) past a 600 ms window, read as no answer.
LATE_ANSWER = 10.0  # seconds a case with no answer in its window waits for a late one
POLICIES = {"over": "overflow", "prio": "prioritized"}
POLICY_OF: dict[str, str | None] = {"workers": None, **POLICIES}


def next_subject(consumer: str) -> str:
    return f"$JS.API.CONSUMER.MSG.NEXT.orders.{consumer}"


def seen(msg: Any) -> tuple[Any, ...]:
    headers = msg.headers or {}
    if "Status" not in headers:
        return ("msg", msg.data.decode())
    pending = headers.get("Nats-Pending-Messages")
    return ("status", headers["Status"], headers.get("Description"), pending)


class Requests:
    """Raw pull requests from their own inboxes; deliveries are acked only when asked."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.unacked: list[Any] = []

    async def send(self, consumer: str, body: dict[str, Any] | bytes) -> Any:
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        await self.nc.publish(next_subject(consumer), raw, reply=inbox)
        await self.nc.flush()
        return sub

    async def gather(self, sub: Any, window: float, *, ack: bool = True) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        async for msg in arriving(sub, window, late=LATE_ANSWER):
            got.append(seen(msg))
            if msg.reply:
                if ack:
                    await self.nc.publish(msg.reply, b"+ACK")
                else:
                    self.unacked.append(msg)
        await sub.unsubscribe()
        return got

    async def one(
        self, consumer: str, body: dict[str, Any] | bytes, window: float, *, ack: bool = True
    ) -> list[tuple[Any, ...]]:
        return await self.gather(await self.send(consumer, body), window, ack=ack)

    async def ack_all(self) -> None:
        for msg in self.unacked:
            await self.nc.publish(msg.reply, b"+ACK")
        self.unacked.clear()
        await self.nc.flush()


async def scenario(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r = Requests(nc)
    out: dict[str, Any] = {}
    expires = 400 * MS
    try:
        # Refusals, in the server's order of checks.
        out["group_missing"] = await r.one("over", {"batch": 1, "expires": expires}, 0.3)
        out["group_invalid"] = await r.one("over", {"group": "nope", "expires": expires}, 0.3)
        out["pin_id_not_pinned"] = await r.one("over", {"group": "jobs", "id": "x"}, 0.3)
        out["priority_range"] = await r.one("prio", {"group": "jobs", "priority": 10}, 0.3)
        out["overflow_terms_on_plain"] = await r.one("workers", {"min_pending": 1}, 0.3)
        out["group_on_plain_is_ignored"] = await r.one(
            "workers", {"group": "jobs", "priority": 3, "expires": expires}, 0.6
        )

        # overflow: two pending.
        await publish(["o1", "o2"])
        await asyncio.sleep(0.2)
        out["min_pending_unmet"] = await r.one(
            "over", {"group": "jobs", "min_pending": 5, "expires": expires}, 0.6
        )
        out["min_pending_met"] = await r.one(
            "over", {"group": "jobs", "min_pending": 2, "batch": 1, "expires": expires}, 0.6
        )
        # One left pending: min_pending 2 no longer holds for it.
        out["min_pending_now_unmet"] = await r.one(
            "over", {"group": "jobs", "min_pending": 2, "expires": expires}, 0.6
        )
        out["no_wait_unmet"] = await r.one(
            "over", {"group": "jobs", "min_pending": 5, "no_wait": True}, 0.3
        )
        # Two in flight, unacked.
        await publish(["o3", "o4"])
        await asyncio.sleep(0.2)
        out["plain_pull_on_overflow"] = await r.one(
            "over", {"group": "jobs", "batch": 2, "expires": expires}, 0.6, ack=False
        )
        out["min_ack_pending_unmet"] = await r.one(
            "over", {"group": "jobs", "min_ack_pending": 3, "expires": expires}, 0.6
        )
        out["min_ack_pending_met"] = await r.one(
            "over", {"group": "jobs", "min_ack_pending": 2, "batch": 2, "expires": expires}, 0.6
        )
        await r.ack_all()
        await publish(["e1"])
        await asyncio.sleep(0.2)
        out["empty_body_bypasses_checks"] = await r.one("over", b"", 0.3)

        # Everything the prioritized consumer has so far goes first.
        drained = await r.one("prio", {"group": "jobs", "batch": 10, "no_wait": True}, 0.5)
        out["prio_backlog"] = drained

        # prioritized: requests with priorities 5, 1 and 0 (batch 2 each) wait, then three
        # messages come: priority 0 takes two, priority 1 the third, priority 5 none.
        subs = {}
        for name, priority in (("p5", 5), ("p1", 1), ("p0", 0)):
            body = {"group": "jobs", "priority": priority, "batch": 2, "expires": 1500 * MS}
            subs[name] = await r.send("prio", body)
        await asyncio.sleep(0.3)
        await publish(["q0", "q1", "q2"])
        results = await asyncio.gather(*(r.gather(sub, 1.8) for sub in subs.values()))
        out["prioritized"] = dict(zip(subs, results, strict=True))
        await nc.flush()
        await asyncio.sleep(0.3)
        for consumer in POLICIES:
            info = await nc.request(f"$JS.API.CONSUMER.INFO.orders.{consumer}", b"", timeout=5)
            out[f"info_{consumer}"] = comparable_info(json.loads(info.data))
    finally:
        await nc.close()
    return out


def comparable_info(document: dict[str, Any]) -> dict[str, Any]:
    """The parts of CONSUMER.INFO that priority groups change, and the counts."""
    config = document["config"]
    return {
        "config": {k: v for k, v in config.items() if k.startswith("priority_")},
        "priority_groups": document.get("priority_groups"),
        "num_pending": document["num_pending"],
        "num_ack_pending": document["num_ack_pending"],
    }


def consumer_config(name: str, policy: str | None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "durable_name": name,
        "ack_policy": "explicit",
        "ack_wait": ACK_WAIT * p.NANOS,
        "max_deliver": MAX_RETRY + 1,
        "filter_subject": "orders",
    }
    if policy:
        config |= {"priority_groups": ["jobs"], "priority_policy": policy, **extra}
    return config


Scenario = Callable[[str, Publish], Awaitable[dict[str, Any]]]


async def on_jetstream(
    server: NatsServer, configs: list[dict[str, Any]], run: Scenario
) -> dict[str, Any]:
    """`run` against real JetStream: stream `orders` with these consumers, then removed."""
    async with side_by_side.on_jetstream(server, workers=False, headers=with_msg_id) as side:
        for config in configs:
            created = await side.nc.request(
                f"$JS.API.CONSUMER.CREATE.orders.{config['durable_name']}.orders",
                json.dumps({"stream_name": "orders", "config": config}).encode(),
                timeout=5,
            )
            assert "error" not in json.loads(created.data), created.data
        return await run(side.url, side.publish)


_reference: dict[str, Any] = {}


async def reference(server: NatsServer) -> dict[str, Any]:
    if not _reference:
        configs = [consumer_config(name, policy) for name, policy in POLICY_OF.items()]
        _reference.update(await on_jetstream(server, configs, scenario))
    return _reference


async def broker_consumers(client: httpx.AsyncClient) -> None:
    for name, policy in POLICIES.items():
        form = {
            "token": f"{name}-token",
            "type": "pull",
            "ackWait": str(ACK_WAIT),
            "priorityGroups": "jobs",
            "priorityPolicy": policy,
        }
        response = await client.put(f"/channel/orders/consumer/{name}", data=form)
        assert response.status_code == 200, response.text


@uncapped_only
@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_priority_groups_match_jetstream(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server)
    # What the protocol document recorded, so that a scenario observing nothing fails.
    assert expected["group_missing"] == [
        ("status", "400", "Bad Request - Priority Group missing", None)
    ]
    # (A request without "batch" counts its batch as 0 in the pending header of its 408.)
    assert expected["min_pending_unmet"] == [("status", "408", "Request Timeout", "0")]
    assert expected["min_pending_met"] == [("msg", "o1")]
    assert expected["prioritized"] == {
        "p5": [("status", "408", "Request Timeout", "2")],
        "p1": [("msg", "q2"), ("status", "408", "Request Timeout", "1")],
        "p0": [("msg", "q0"), ("msg", "q1")],
    }
    await broker_consumers(client)
    await make_bridge(mode)
    actual = await scenario(hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()


class Pins:
    """Pin ids are random: each is named by the order it first appeared in (pin1, pin2...)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def name(self, pin_id: str | None) -> str | None:
        if pin_id is None:
            return None
        return self.names.setdefault(pin_id, f"pin{len(self.names) + 1}")

    def id_of(self, name: str) -> str:
        return next(pin for pin, named in self.names.items() if named == name)


async def pinned_scenario(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    pins = Pins()
    out: dict[str, Any] = {}

    async def one(body: dict[str, Any] | bytes, window: float) -> list[tuple[Any, ...]]:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        await nc.publish(next_subject("pin"), raw, reply=inbox)
        return await gather(sub, window)

    async def gather(sub: Any, window: float) -> list[tuple[Any, ...]]:
        got: list[tuple[Any, ...]] = []
        async for msg in arriving(sub, window, late=LATE_ANSWER):
            headers = msg.headers or {}
            if msg.reply:
                got.append(("msg", msg.data.decode(), pins.name(headers.get("Nats-Pin-Id"))))
                await nc.publish(msg.reply, b"+ACK")
            else:
                got.append(seen(msg))
        await sub.unsubscribe()
        return got

    async def unpin(body: bytes) -> Any:
        reply = await nc.request("$JS.API.CONSUMER.UNPIN.orders.pin", body, timeout=5)
        return json.loads(reply.data)

    async def info() -> Any:
        reply = await nc.request("$JS.API.CONSUMER.INFO.orders.pin", b"", timeout=5)
        [group] = json.loads(reply.data)["priority_groups"]
        return {
            "group": group["group"],
            "pinned": pins.name(group.get("pinned_client_id")),
            "zero_ts": group["pinned_ts"] == p.GO_ZERO_TIME,
        }

    advised: list[tuple[Any, ...]] = []

    async def advisory(msg: Any) -> None:
        doc = json.loads(msg.data)
        kind = doc["type"].rsplit(".", 1)[-1]
        advised.append(
            (kind, doc["stream"], doc["consumer"], doc["group"], doc.get("reason"))
            + ((pins.name(doc["pinned_id"]),) if "pinned_id" in doc else ())
        )

    for event in ("PINNED", "UNPINNED"):
        await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.{event}.orders.pin", cb=advisory)
    try:
        out["info_unpinned"] = await info()
        await publish(["a1", "a2"])
        await asyncio.sleep(0.2)
        out["first_pull_is_pinned"] = await one({"group": "jobs", "expires": 500 * MS}, 0.7)
        out["info_pinned"] = await info()
        out["standby_waits"] = await one({"group": "jobs", "expires": 400 * MS}, 0.7)
        out["other_id"] = await one({"group": "jobs", "id": "someone", "expires": 400 * MS}, 0.3)
        pin1 = pins.id_of("pin1")
        out["pinned_again"] = await one({"group": "jobs", "id": pin1, "expires": 400 * MS}, 0.6)

        out["unpin_bad_json"] = await unpin(b"{x")
        out["unpin_no_group"] = await unpin(b"{}")
        out["unpin_other_group"] = await unpin(b'{"group": "other"}')
        out["unpin"] = await unpin(b'{"group": "jobs"}')
        # A request naming the old pin, then a standby, wait; a message comes: the server
        # meets the old pin first and ends it, then pins the standby.
        standby, stale = nc.new_inbox(), nc.new_inbox()
        subs = [await nc.subscribe(standby), await nc.subscribe(stale)]
        await nc.publish(
            next_subject("pin"),
            json.dumps({"group": "jobs", "id": pin1, "expires": 1500 * MS}).encode(),
            reply=stale,
        )
        await nc.flush()
        await asyncio.sleep(0.1)
        await nc.publish(
            next_subject("pin"), json.dumps({"group": "jobs", "expires": 1500 * MS}).encode(),
            reply=standby,
        )  # fmt: skip
        await nc.flush()
        await asyncio.sleep(0.3)
        await publish(["b1"])
        standby_got, stale_got = await asyncio.gather(*(gather(s, 1.6) for s in subs))
        out["after_unpin_standby"] = standby_got
        out["after_unpin_old_pin"] = stale_got
        # pin2 stops pulling: after the priority timeout (2 s) a standby is pinned.
        await publish(["c1"])
        out["timeout_standby"] = await one({"group": "jobs", "expires": 5000 * MS}, 5.2)
        await nc.flush()
        await asyncio.sleep(0.2)
        # (pin3 may lapse too before the end: its advisory is left out, on both.)
        out["advisories"] = advised[:5]
    finally:
        await nc.close()
    return out


_pinned_reference: dict[str, Any] = {}


async def pinned_reference(server: NatsServer) -> dict[str, Any]:
    if not _pinned_reference:
        config = consumer_config("pin", "pinned_client", priority_timeout=PIN_TIMEOUT * p.NANOS)
        _pinned_reference.update(await on_jetstream(server, [config], pinned_scenario))
    return _pinned_reference


PIN_TIMEOUT = 2


@uncapped_only
@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_pinned_client_matches_jetstream(
    mode: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await pinned_reference(jetstream_server)
    assert expected["first_pull_is_pinned"] == [("msg", "a1", "pin1")]
    assert expected["other_id"] == [("status", "423", "Nats-Pin-Id mismatch", None)]
    assert expected["after_unpin_old_pin"] == [("status", "423", "Nats-Wrong-Pin-Id", "0")]
    assert expected["timeout_standby"] == [("msg", "c1", "pin3")]
    assert expected["advisories"] == [
        ("consumer_group_pinned", "orders", "pin", "jobs", None, "pin1"),
        ("consumer_group_unpinned", "orders", "pin", "jobs", "admin"),
        ("consumer_group_pinned", "orders", "pin", "jobs", None, "pin2"),
        ("consumer_group_unpinned", "orders", "pin", "jobs", "timeout"),
        ("consumer_group_pinned", "orders", "pin", "jobs", None, "pin3"),
    ]
    form = {
        "token": "pin-token",
        "type": "pull",
        "ackWait": str(ACK_WAIT),
        "priorityGroups": "jobs",
        "priorityPolicy": "pinned_client",
        "priorityTimeout": str(PIN_TIMEOUT),
    }
    response = await client.put("/channel/orders/consumer/pin", data=form)
    assert response.status_code == 200, response.text
    await make_bridge(mode)
    actual = await pinned_scenario(hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, key


@uncapped_only
async def test_api_and_sweeper_processes_publish_their_advisories(
    config: Any, hub: NatsServer, client: httpx.AsyncClient
) -> None:
    """Without a bridge: an API process pins over HTTP, its sweeper lets the pin lapse and
    dead-letters a job whose last lease lapsed; each advisory goes out on the process's own
    NATS connection ([nats] configured)."""
    nats_config = dataclasses.replace(config.nats, url=hub.url, configured=True)
    process = Runtime(
        dataclasses.replace(config, nats=nats_config), nats_advisories=True, listen=False
    )
    await process.start(seed=False)
    nc = await nats.connect(hub.url)
    advised: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        advised.append(json.loads(msg.data))

    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>", cb=collect)
    await nc.flush()
    try:
        await eventually_attached(process)
        form = {
            "token": "pin-token",
            "type": "pull",
            "priorityGroups": "jobs",
            "priorityPolicy": "pinned_client",
            "priorityTimeout": "1",
        }
        assert (await client.put("/channel/orders/consumer/pin", data=form)).status_code == 200
        await publish_http(client, ["x1"])
        stored = process.tokens.digest("orders-token")  # services take tokens as stored
        creds = ConsumerCredentials("orders", stored, "pin", "pin-token")
        pulled = await process.pulls.pull(creds, PullRequest(no_wait=True, terms=Terms("jobs")))
        assert pulled.pin_id is not None and [j.message_id for j in pulled.jobs] == ["x1"]
        await asyncio.sleep(1.1)  # time passes on purpose: the 1 s priority timeout lapses
        assert len(await process.sweeps.expire_pins()) == 1
        # The job's lease lapses with no retry left (max-retry is 4: four lapses requeue it).
        job_id = pulled.jobs[0].id
        pin: str | None = None  # the first pin lapsed: the next pull is pinned anew
        for _ in range(MAX_RETRY + 1):
            await expire_leases(process, [job_id])
            await process.sweeps.sweep_all()
            terms = Terms("jobs", pin_id=pin)
            again = await process.pulls.pull(creds, PullRequest(no_wait=True, terms=terms))
            if not again.jobs:
                break
            pin = again.pin_id
        await nc.flush()
        await eventually(
            lambda: any(a["type"].endswith("max_deliver") for a in advised),
            what="the max_deliver advisory",
        )
    finally:
        await nc.close()
        await process.stop()
    kinds = [(a["type"].rsplit(".", 1)[-1], a.get("reason")) for a in advised]
    assert kinds[:2] == [("consumer_group_pinned", None), ("consumer_group_unpinned", "timeout")]
    assert ("max_deliver", None) in kinds
    dead = next(a for a in advised if a["type"].endswith("max_deliver"))
    assert (dead["stream"], dead["consumer"], dead["stream_seq"]) == ("orders", "pin", job_id)
    assert dead["deliveries"] == MAX_RETRY + 1


async def eventually_attached(process: Runtime) -> None:
    await eventually(lambda: process.advisories.attached, 5, what="the advisory link connected")


BAD_CONFIGS: dict[str, dict[str, Any]] = {
    "groups_without_policy": {"priority_groups": ["jobs"]},
    "policy_without_groups": {"priority_policy": "overflow"},
    "bad_group_name": {"priority_groups": ["no spaces"], "priority_policy": "overflow"},
    "empty_group_name": {"priority_groups": [""], "priority_policy": "overflow"},
    "timeout_without_policy": {"priority_timeout": 5 * p.NANOS},
}


async def create_errors(url: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    out: dict[str, Any] = {}
    try:
        for key, extra in BAD_CONFIGS.items():
            config = consumer_config("over", None) | extra
            reply = await nc.request(
                "$JS.API.CONSUMER.CREATE.orders.over.orders",
                json.dumps({"stream_name": "orders", "config": config}).encode(),
                timeout=5,
            )
            out[key] = json.loads(reply.data).get("error")
    finally:
        await nc.close()
    return out


@uncapped_only
async def test_create_checks_priority_settings_as_jetstream(
    jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory, client: Any
) -> None:
    expected = await on_jetstream(
        jetstream_server, [consumer_config("over", "overflow")], lambda url, _: create_errors(url)
    )
    assert expected["groups_without_policy"]["err_code"] == 10196
    assert expected["empty_group_name"]["err_code"] == 10161
    await broker_consumers(client)
    await make_bridge("client")
    assert await create_errors(hub.url) == expected
