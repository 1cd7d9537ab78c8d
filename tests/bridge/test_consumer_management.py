"""Consumer management over NATS: the same script of raw JetStream API requests (nats-py's
connection) against real nats-server 2.15 JetStream and against the bridge, the same answers
from both: create, info, names, list (paging), update (allowed and refused), delete of a
durable; STREAM.LIST; a `-NAK` without delay redelivered at once; a backoff timing ack-wait
redeliveries. Then what only the broker has: the consumer seen and deleted over HTTP, its jobs
going with it, and `[nats] allow-consumer-management=false`."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import nats
from sqlalchemy import text

from app.bridge import protocol as p
from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, publish_http, uncapped_only
from tests.helpers.consumer_management import config_seen, create_body, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually

NANOS = p.NANOS

MANAGED: dict[str, Any] = {
    "durable_name": "mgr",
    "description": "made over NATS",
    "ack_policy": "explicit",
    "ack_wait": 5 * NANOS,
    "max_deliver": 3,
    "max_ack_pending": 10,
    "filter_subject": "orders",
    "metadata": {"team": "billing"},
}


def error_seen(document: dict[str, Any]) -> Any:
    return document.get("error")


async def management_script(url: str) -> dict[str, Any]:
    """Requests as a JetStream client sends them; what is compared of each answer."""
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        created = await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(MANAGED))
        r["create"] = (created["type"], created["name"], config_seen(created))
        r["create_again"] = config_seen(
            await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(MANAGED, "create"))
        )
        r["info"] = config_seen(await request(nc, "CONSUMER.INFO.orders.mgr"))
        legacy = {**MANAGED, "durable_name": "legacy"}
        r["durable_create"] = config_seen(
            await request(nc, "CONSUMER.DURABLE.CREATE.orders.legacy", create_body(legacy))
        )
        names = await request(nc, "CONSUMER.NAMES.orders")
        r["names"] = {k: names[k] for k in ("type", "total", "offset", "limit", "consumers")}
        second = await request(nc, "CONSUMER.NAMES.orders", {"offset": 1})
        r["names_offset"] = (second["offset"], second["consumers"])
        listed = await request(nc, "CONSUMER.LIST.orders")
        r["list"] = (
            listed["type"],
            listed["total"],
            listed["limit"],
            [(c["name"], c["stream_name"]) for c in listed["consumers"]],
        )
        r["list_config"] = [config_seen(c) for c in listed["consumers"] if c["name"] == "mgr"]
        r["names_nowhere"] = error_seen(await request(nc, "CONSUMER.NAMES.nowhere"))

        changed = {**MANAGED, "ack_wait": 7 * NANOS, "description": "changed", "max_deliver": 5}
        r["update"] = config_seen(
            await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(changed, "update"))
        )
        r["update_deliver_policy"] = error_seen(
            await request(
                nc,
                "CONSUMER.CREATE.orders.mgr.orders",
                create_body({**changed, "deliver_policy": "new"}),
            )
        )
        r["update_max_waiting"] = error_seen(
            await request(
                nc, "CONSUMER.CREATE.orders.mgr.orders", create_body({**changed, "max_waiting": 7})
            )
        )
        r["create_existing"] = error_seen(
            await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(MANAGED, "create"))
        )
        missing = {**MANAGED, "durable_name": "missing"}
        r["update_missing"] = error_seen(
            await request(
                nc, "CONSUMER.CREATE.orders.missing.orders", create_body(missing, "update")
            )
        )
        r["backoff_over_max_deliver"] = error_seen(
            await request(
                nc,
                "CONSUMER.CREATE.orders.mgr.orders",
                create_body({**changed, "backoff": [NANOS] * 6}),
            )
        )
        r["name_mismatch"] = error_seen(
            await request(nc, "CONSUMER.CREATE.orders.other.orders", create_body(MANAGED))
        )
        r["stream_mismatch"] = error_seen(
            await request(
                nc, "CONSUMER.CREATE.orders.mgr.orders", {"stream_name": "x", "config": MANAGED}
            )
        )
        r["durable_not_set"] = error_seen(
            await request(nc, "CONSUMER.DURABLE.CREATE.orders.legacy", create_body({}))
        )
        r["bad_json"] = (error_seen(await request(nc, "CONSUMER.CREATE.orders.mgr", b"{x")) or {})[
            "err_code"
        ]
        r["no_stream"] = error_seen(
            await request(
                nc,
                "CONSUMER.CREATE.nowhere.mgr",
                {"stream_name": "nowhere", "config": {"durable_name": "mgr"}},
            )
        )

        streams = await request(nc, "STREAM.LIST", {"subject": "orders"})
        r["stream_list"] = (
            streams["type"],
            streams["total"],
            [s["config"]["name"] for s in streams["streams"]],
            [s["state"]["consumer_count"] for s in streams["streams"]],
        )

        deleted = await request(nc, "CONSUMER.DELETE.orders.mgr")
        r["delete"] = deleted
        r["info_after_delete"] = error_seen(await request(nc, "CONSUMER.INFO.orders.mgr"))
        r["delete_again"] = error_seen(await request(nc, "CONSUMER.DELETE.orders.mgr"))
        r["delete_not_empty"] = error_seen(await request(nc, "CONSUMER.DELETE.orders.legacy", b"x"))
        await request(nc, "CONSUMER.DELETE.orders.legacy")
        r["names_after"] = (await request(nc, "CONSUMER.NAMES.orders"))["consumers"]
    finally:
        await nc.close()
    return r


async def nak_script(url: str, publish: Publish) -> dict[str, Any]:
    """A `-NAK` without a delay comes back at once, well inside the 30 s ack wait; a backoff
    consumer's unacknowledged delivery n comes back after backoff[n-1]."""
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        js = nc.jetstream()
        await request(
            nc,
            "CONSUMER.CREATE.orders.nakker",
            create_body({"durable_name": "nakker", "ack_policy": "explicit"}),
        )
        await request(
            nc,
            "CONSUMER.CREATE.orders.slow",
            create_body(
                {
                    "durable_name": "slow",
                    "ack_policy": "explicit",
                    "backoff": [1 * NANOS, 3 * NANOS],
                    "max_deliver": 4,
                    "filter_subject": "orders",
                }
            ),
        )
        r["slow_config"] = config_seen(await request(nc, "CONSUMER.INFO.orders.slow"))
        await publish(["n1"])
        sub = await js.pull_subscribe_bind("nakker", "orders")
        [first] = await sub.fetch(1, timeout=5)
        start = time.monotonic()
        await first.nak()
        [again] = await sub.fetch(1, timeout=5)
        r["nak_seconds"] = time.monotonic() - start
        r["nak_again"] = (again.data, again.metadata.num_delivered)
        await again.ack_sync()

        slow = await js.pull_subscribe_bind("slow", "orders")
        [one] = await slow.fetch(1, timeout=5)
        start = time.monotonic()
        [two] = await slow.fetch(1, timeout=5)  # after backoff[0]: 1 s
        r["second_after"] = time.monotonic() - start
        start = time.monotonic()
        [three] = await slow.fetch(1, timeout=8)  # after backoff[1]: 3 s
        r["third_after"] = time.monotonic() - start
        r["deliveries"] = [m.metadata.num_delivered for m in (one, two, three)]
        await three.ack_sync()
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_management_answers_as_jetstream(
    jetstream_server: NatsServer, hub: NatsServer, make_bridge: BridgeFactory
) -> None:
    expected = await reference(jetstream_server, management_script, publishes=False)
    # The reference itself, so that a broken script cannot pass by matching nothing.
    assert expected["create"][1] == "mgr"
    assert expected["info"]["description"] == "made over NATS"
    assert expected["names"]["consumers"] == ["legacy", "mgr", "workers"]
    assert expected["update"]["ack_wait"] == 7 * NANOS
    assert expected["update_deliver_policy"]["err_code"] == 10012
    assert expected["create_existing"]["err_code"] == 10148
    assert expected["update_missing"]["err_code"] == 10149
    assert expected["delete"] == {"type": p.DELETE_TYPE, "success": True}
    assert expected["info_after_delete"]["err_code"] == 10014

    await make_bridge("client")
    actual = await management_script(hub.url)
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()


@uncapped_only
async def test_nak_at_once_and_backoff_as_jetstream(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    expected = await reference(jetstream_server, nak_script)
    assert expected["nak_again"] == (b"n1", 2)
    assert expected["deliveries"] == [1, 2, 3]

    await make_bridge("hybrid")
    actual = await nak_script(hub.url, http_publisher(client))
    assert actual["slow_config"] == expected["slow_config"]
    assert actual["nak_again"] == expected["nak_again"]
    assert actual["deliveries"] == expected["deliveries"]
    # At once: far inside the consumer's 30 s ack wait, on both.
    assert expected["nak_seconds"] < 1.0 and actual["nak_seconds"] < 1.0, actual
    # The backoff times each redelivery: 1 s, then 3 s (the sweep adds its few ms).
    for key, low in (("second_after", 0.8), ("third_after", 2.7)):
        assert low < expected[key] < low + 1.5, (key, expected[key])
        assert low < actual[key] < low + 1.5, (key, actual[key])


@uncapped_only
async def test_a_consumer_made_over_nats_is_a_broker_consumer(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await make_bridge("hybrid")  # msg.metadata below
    nc = await nats.connect(hub.url)
    try:
        created = await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(MANAGED))
        assert "error" not in created, created
        seen = await client.get("/channel/orders/consumer/mgr")
        assert seen.status_code == 200, seen.text
        assert seen.json()["Type"] == "pull"
        await publish_http(client, ["a"])

        async def jobs_of_mgr() -> int:
            async with runtime.db.transaction() as tx:
                rows = await tx.conn.execute(
                    text(
                        "SELECT count(*) FROM job JOIN consumer ON consumer.pk = job.consumer_pk "
                        "WHERE consumer.consumer_id = 'mgr'"
                    )
                )
                return int(rows.scalar_one())

        assert await jobs_of_mgr() == 1
        # max_deliver 3: a nak'd job is dead after its third delivery, not the broker's five.
        sub = await nc.jetstream().pull_subscribe_bind("mgr", "orders")
        for attempt in (1, 2, 3):
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.metadata.num_delivered == attempt
            await msg.nak()

        async def dead() -> bool:
            async with runtime.db.transaction() as tx:
                rows = await tx.conn.execute(text("SELECT count(*) FROM job WHERE status='DEAD'"))
                return int(rows.scalar_one()) == 1

        await eventually(dead, timeout=10)

        deleted = await request(nc, "CONSUMER.DELETE.orders.mgr")
        assert deleted == {"type": p.DELETE_TYPE, "success": True}
        assert (await client.get("/channel/orders/consumer/mgr")).status_code == 404
        assert await jobs_of_mgr() == 0
        # The seeded consumer, made over HTTP, is deleted over NATS as well.
        assert (await request(nc, "CONSUMER.DELETE.orders.workers"))["success"] is True
        assert (await client.get("/channel/orders/consumer/workers")).status_code == 404
    finally:
        await nc.close()


REFUSED: dict[str, dict[str, Any]] = {
    "push_rate_limit": {
        "durable_name": "p",
        "ack_policy": "explicit",
        "deliver_subject": "x.y",
        "rate_limit_bps": 1000,
    },
    "ack_all": {"durable_name": "n", "ack_policy": "all"},
    "sub_second_ack_wait": {"durable_name": "s", "ack_policy": "explicit", "ack_wait": NANOS // 2},
    "other_subject": {"durable_name": "o", "ack_policy": "explicit", "filter_subject": "x"},
    "headers_only": {"durable_name": "h", "ack_policy": "explicit", "headers_only": True},
}
REFUSED_WORDS = {
    "push_rate_limit": "rate_limit_bps",
    "ack_all": "ack_policy all",
    "sub_second_ack_wait": "ack_wait",
    "other_subject": "filter_subject x",
    "headers_only": "headers_only",
}


@uncapped_only
async def test_what_the_broker_cannot_honour_is_refused_by_name(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient
) -> None:
    await make_bridge("client")
    nc = await nats.connect(hub.url)
    try:
        for key, config in REFUSED.items():
            name = config.get("durable_name")
            subject = f"CONSUMER.CREATE.orders.{name}" if name else "CONSUMER.CREATE.orders"
            answer = await request(nc, subject, create_body(config))
            error = answer["error"]
            assert error["code"] == 400, (key, error)
            assert REFUSED_WORDS[key] in error["description"], (key, error)
    finally:
        await nc.close()


@uncapped_only
async def test_management_can_be_turned_off(
    hub: NatsServer, make_bridge: BridgeFactory, client: httpx.AsyncClient
) -> None:
    await make_bridge("client", allow_consumer_management=False)
    nc = await nats.connect(hub.url)
    try:
        answer = await request(nc, "CONSUMER.CREATE.orders.mgr.orders", create_body(MANAGED))
        assert "allow-consumer-management" in answer["error"]["description"], answer
        answer = await request(nc, "CONSUMER.DELETE.orders.workers")
        assert "allow-consumer-management" in answer["error"]["description"], answer
        assert (await client.get("/channel/orders/consumer/mgr")).status_code == 404
        assert (await client.get("/channel/orders/consumer/workers")).status_code == 200
        # Listing still answers.
        assert (await request(nc, "CONSUMER.NAMES.orders"))["consumers"] == ["workers"]
    finally:
        await nc.close()


# -- a request without durable_name naming a durable; bodies nested too deep; metadata bytes --

DEEP = b"[" * 100_000
# Each API request with a body nested far past any JSON reader's depth limit.
DEEP_SUBJECTS = (
    "CONSUMER.INFO.orders.workers",
    "CONSUMER.CREATE.orders.workers",
    "CONSUMER.CREATE.orders",
    "CONSUMER.DURABLE.CREATE.orders.workers",
    "CONSUMER.PAUSE.orders.workers",
    "CONSUMER.DELETE.orders.nobody",
    "CONSUMER.UNPIN.orders.workers",
    "CONSUMER.NAMES.orders",
    "CONSUMER.LIST.orders",
    "STREAM.INFO.orders",
    "STREAM.NAMES",
    "STREAM.LIST",
)
# Their descriptions are compared too (the paged requests' syntax errors carry Go's offsets,
# which the bridge does not count).
DEEP_TEXTS_COMPARED = (
    "CONSUMER.INFO.orders.workers",
    "CONSUMER.CREATE.orders.workers",
    "CONSUMER.CREATE.orders",
    "CONSUMER.DURABLE.CREATE.orders.workers",
    "CONSUMER.PAUSE.orders.workers",
    "CONSUMER.DELETE.orders.nobody",
    "CONSUMER.UNPIN.orders.workers",
    "STREAM.INFO.orders",
)


def lifetime_seen(document: dict[str, Any]) -> Any:
    """A consumer's name, durability and inactive threshold, or the error."""
    if "error" in document:
        return document["error"]
    config = document["config"]
    return {k: config.get(k) for k in ("name", "durable_name", "inactive_threshold")}


async def takeover_script(url: str) -> dict[str, Any]:
    """CREATE requests without durable_name that name existing consumers: the durable
    `workers` (made over HTTP on the bridge) by config.name on the bare subject, a durable made
    here by its subject; an ephemeral re-created and made durable."""
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        bare = {"name": "workers", "ack_policy": "explicit"}
        r["bare_name"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders", create_body(bare))
        )
        r["bare_name_info"] = lifetime_seen(await request(nc, "CONSUMER.INFO.orders.workers"))
        durable = {"durable_name": "keep", "ack_policy": "explicit"}
        r["durable"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.keep", create_body(durable))
        )
        unnamed = {"ack_policy": "explicit", "description": "no durable name"}
        r["create_unnamed"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.keep", create_body(unnamed, "create"))
        )
        r["update_unnamed"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.keep", create_body(unnamed))
        )
        r["update_unnamed_info"] = lifetime_seen(await request(nc, "CONSUMER.INFO.orders.keep"))
        ephemeral = {"ack_policy": "explicit"}
        r["ephemeral"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.eph", create_body(ephemeral))
        )
        r["ephemeral_again_create"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.eph", create_body(ephemeral, "create"))
        )
        r["ephemeral_made_durable"] = lifetime_seen(
            await request(
                nc,
                "CONSUMER.CREATE.orders.eph",
                create_body({"durable_name": "eph", "ack_policy": "explicit"}),
            )
        )
        wide = {"durable_name": "meta", "ack_policy": "explicit", "metadata": {"k": "é" * 70_000}}
        r["metadata_bytes"] = lifetime_seen(
            await request(nc, "CONSUMER.CREATE.orders.meta", create_body(wide))
        )
        # Half a surrogate pair, which Go decodes as U+FFFD (json.dumps escapes it as \\udXXX).
        halves = {
            "durable_name": "halves",
            "ack_policy": "explicit",
            "description": "\ud800",
            "metadata": {"k": "\udfff"},
            "filter_subject": "orders",
        }
        made = await request(nc, "CONSUMER.CREATE.orders.halves", create_body(halves))
        r["lone_surrogates"] = made.get("error") or config_seen(made)
        for subject in DEEP_SUBJECTS:
            error = (await request(nc, subject, DEEP)).get("error") or {}
            seen = (error.get("code"), error.get("err_code"))
            r[f"deep {subject}"] = (*seen, error.get("description"))[
                : 3 if subject in DEEP_TEXTS_COMPARED else 2
            ]
        for name in ("keep", "eph", "halves"):
            await request(nc, f"CONSUMER.DELETE.orders.{name}")
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_no_durable_name_never_makes_a_durable_expire(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    runtime: Runtime,
) -> None:
    """nats-server lets such a request update the durable (its config then shows no durable
    name) but never stamps the ephemeral's 5 s threshold on it: the bridge answers the same and
    its sweeper, which deletes consumers by that threshold, leaves the consumer alone. Bodies
    nested 100,000 deep are refused as nats-server refuses them (400, never a 500), and
    metadata is measured in UTF-8 bytes, half a surrogate pair read as U+FFFD."""
    expected = await reference(jetstream_server, takeover_script, publishes=False)
    # The reference itself: the durable is updated, named but not durable, and never expires.
    assert expected["bare_name"] == {
        "name": "workers",
        "durable_name": None,
        "inactive_threshold": None,
    }
    assert expected["update_unnamed_info"]["inactive_threshold"] is None
    assert expected["create_unnamed"]["err_code"] == 10148
    assert expected["ephemeral_again_create"]["err_code"] == 10148
    assert expected["ephemeral_made_durable"]["inactive_threshold"] == 5 * NANOS
    assert expected["metadata_bytes"]["err_code"] == 10135
    assert expected["lone_surrogates"]["description"] == "\ufffd"
    assert expected["deep CONSUMER.INFO.orders.workers"] == (
        400,
        10038,
        "expected an empty request payload",
    )
    assert expected["deep CONSUMER.CREATE.orders"] == (
        400,
        10025,
        "invalid JSON: exceeded max depth at offset 10001",
    )

    await make_bridge("client")
    actual = await takeover_script(hub.url)
    differing = {k: (actual.get(k), v) for k, v in expected.items() if actual.get(k) != v}
    assert not differing, json.dumps(differing)
    assert actual.keys() == expected.keys()
    # What the sweeper deletes by: the consumer made over HTTP has no inactive threshold.
    async with runtime.db.transaction() as tx:
        rows = await tx.conn.execute(
            text("SELECT inactive_threshold FROM consumer WHERE consumer_id = 'workers'")
        )
        assert rows.scalar_one() is None


def test_a_nak_delay_nested_too_deep_is_a_plain_nak() -> None:
    """processNak: a delay json.Unmarshal cannot read is a NAK without delay, not an error."""
    command = p.parse_ack(b'-NAK {"delay":' + DEEP)
    assert command == p.AckCommand(p.AckKind.NAK, delay=None)
