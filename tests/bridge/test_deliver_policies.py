"""Deliver policies: the same script (nats-py, raw JetStream API requests and pull fetches)
against real nats-server 2.15 JetStream and the bridge, the same answers from both. Each
policy (all, new, last, by_start_sequence, by_start_time) on a channel that already holds
messages, a message published after the consumers exist, the start options reported in the
consumer's config and refused as updates. Stream sequences differ (the bridge's are message
ids), so the script reports them as positions among the messages it published."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import nats
from sqlalchemy import text

from app.bridge import protocol as p
from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, uncapped_only
from tests.helpers.consumer_management import create_body, request
from tests.helpers.natsproc import NatsServer
from tests.helpers.side_by_side import Publish, http_publisher, reference
from tests.helpers.waiting import eventually

ALL = {"filter_subject": "orders"}
SEEN = ("deliver_policy", "opt_start_seq", "opt_start_time", "mem_storage", "ack_policy")
# What each consumer is owed of m1..m6 (m6 published after they were made).
EXPECTED = {
    "all": ["m1", "m2", "m3", "m4", "m5", "m6"],
    "new": ["m6"],
    "last": ["m5", "m6"],
    "bystart": ["m3", "m4", "m5", "m6"],
    "bytime": ["m4", "m5", "m6"],
    "mem": ["m2", "m3", "m4", "m5", "m6"],
}


def go_time(moment: datetime) -> str:
    """A UTC time as Go's RFC 3339 marshalling writes it (what both servers echo)."""
    return p.rfc3339(moment)


async def policies_script(url: str, publish: Publish) -> dict[str, Any]:
    nc = await nats.connect(url)
    r: dict[str, Any] = {}
    try:
        js = nc.jetstream()
        await publish(["m1", "m2", "m3"])
        between = datetime.now(UTC)
        await publish(["m4", "m5"])
        # The stream sequences of m1..m5, read from an `all` consumer's deliveries.
        seqs: list[int] = []
        created = await request(
            nc,
            "CONSUMER.CREATE.orders.all",
            create_body({"durable_name": "all", "ack_policy": "explicit", **ALL}),
        )
        r["create_all"] = {k: created["config"].get(k) for k in SEEN}
        sub = await js.pull_subscribe_bind("all", "orders")
        got: list[Any] = []
        while len(got) < 5:
            got += await sub.fetch(5 - len(got), timeout=10)
        seqs = [m.metadata.sequence.stream for m in got]
        r["all_first"] = [m.data.decode() for m in got]
        for m in got:
            await m.ack()
        configs: dict[str, dict[str, Any]] = {
            "new": {"durable_name": "new", "deliver_policy": "new"},
            "last": {"durable_name": "last", "deliver_policy": "last"},
            "bystart": {
                "durable_name": "bystart",
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": seqs[2],
            },
            "bytime": {
                "durable_name": "bytime",
                "deliver_policy": "by_start_time",
                "opt_start_time": go_time(between),
            },
            # What an ordered consumer asks for: ephemeral, ack none, in memory, from a seq.
            "mem": {
                "name": "mem",
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": seqs[1],
                "ack_policy": "none",
                "mem_storage": True,
                "inactive_threshold": 30 * p.NANOS,
            },
        }
        for name, config in configs.items():
            body = create_body({"ack_policy": "explicit", **config, **ALL})
            answer = await request(nc, f"CONSUMER.CREATE.orders.{name}", body)
            seen = {k: answer["config"].get(k) for k in SEEN}
            if seen["opt_start_seq"]:
                seen["opt_start_seq"] = seqs.index(seen["opt_start_seq"])
            # The time as it was given (the runs' times differ).
            given = seen.pop("opt_start_time")
            r[f"create_{name}"] = (seen, given == go_time(between) if given else None)
        # The start options are fixed at creation, as nats-server keeps them.
        moved = {**configs["bystart"], "opt_start_seq": seqs[3], "ack_policy": "explicit", **ALL}
        r["update_start_seq"] = (
            await request(nc, "CONSUMER.CREATE.orders.bystart", create_body(moved))
        ).get("error")
        later = {
            **configs["bytime"],
            "opt_start_time": go_time(datetime.now(UTC)),
            "ack_policy": "explicit",
            **ALL,
        }
        r["update_start_time"] = (
            await request(nc, "CONSUMER.CREATE.orders.bytime", create_body(later))
        ).get("error")
        r["start_seq_missing"] = (
            await request(
                nc,
                "CONSUMER.CREATE.orders.nostart",
                create_body(
                    {
                        "durable_name": "nostart",
                        "ack_policy": "explicit",
                        "deliver_policy": "by_start_sequence",
                        **ALL,
                    }
                ),
            )
        ).get("error")
        await publish(["m6"])
        for name, wanted in EXPECTED.items():
            sub = await js.pull_subscribe_bind(name, "orders")
            got = []
            if name == "all":
                wanted = wanted[5:]  # m1..m5 fetched and acked above
            while len(got) < len(wanted):
                got += await sub.fetch(len(wanted) - len(got), timeout=10)
            delivered = [m.data.decode() for m in got]
            if name == "all":
                seqs.append(got[0].metadata.sequence.stream)
            positions = [seqs.index(m.metadata.sequence.stream) for m in got]
            for m in got:
                if name != "mem":
                    await m.ack()

            async def settled(name: str = name) -> Any:
                info = await request(nc, f"CONSUMER.INFO.orders.{name}")
                return info if info["num_ack_pending"] == 0 else None

            info = await eventually(settled, timeout=10)
            r[f"got_{name}"] = (
                delivered,
                positions,
                info["num_pending"],
                seqs.index(info["delivered"]["stream_seq"]),
                info["delivered"]["consumer_seq"],
            )
    finally:
        await nc.close()
    return r


@uncapped_only
async def test_deliver_policies_as_jetstream(
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    expected = await reference(jetstream_server, policies_script)
    # The reference itself, so that a broken script cannot pass by matching nothing.
    for name, wanted in EXPECTED.items():
        assert expected[f"got_{name}"][0] == (wanted[5:] if name == "all" else wanted), name
    assert expected["all_first"] == ["m1", "m2", "m3", "m4", "m5"]
    assert expected["update_start_seq"]["description"] == "start sequence can not be updated"
    assert expected["create_mem"][0]["mem_storage"] is True
    assert expected["create_bytime"][1] is True

    await make_bridge("hybrid")  # msg.metadata
    actual = await policies_script(hub.url, http_publisher(client))
    for key, value in expected.items():
        assert actual[key] == value, key
    assert actual.keys() == expected.keys()
    # Every consumer is live, and the delivery ledger balances for each.
    async with runtime.db.transaction() as tx:
        copying = await tx.conn.execute(
            text("SELECT count(*) FROM consumer WHERE backfill_next IS NOT NULL")
        )
        assert copying.scalar_one() == 0
    ledger = (await client.get("/metrics")).text
    unaccounted = [
        line
        for line in ledger.splitlines()
        if line.startswith("webhook_broker_ledger_unaccounted_jobs{")
    ]
    assert unaccounted and all(line.endswith(" 0") or line.endswith(" 0.0") for line in unaccounted)
