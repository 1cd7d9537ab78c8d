"""Priority groups over HTTP: a consumer's settings (PUT, GET, seed), the pull request's
priority fields with nats-server's refusals, and overflow and prioritized pulls, on both
backends. (The same scenarios as raw NATS requests, against real JetStream:
tests/bridge/test_priority_groups.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.config import ConfigError, load_config_text
from app.runtime import Runtime
from tests.helpers.pull import (
    CHANNEL,
    PullConsumer,
    consumer_pk,
    publish,
    pull,
    pull_jobs,
    put_consumer,
    setup_channel,
    until_waiting,
)
from tests.helpers.waiting import eventually


async def put_raw(client: httpx.AsyncClient, consumer_id: str, **fields: str) -> httpx.Response:
    form = {"token": f"{consumer_id}-token", "type": "pull", **fields}
    return await client.put(f"/channel/{CHANNEL}/consumer/{consumer_id}", data=form)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"priorityGroups": "jobs"}, "consumer can not have priority groups when policy is none"),
        ({"priorityPolicy": "overflow"}, "requires at least one PriorityGroup"),
        ({"priorityGroups": "a,b", "priorityPolicy": "overflow"}, "only one priority group"),
        ({"priorityGroups": "no spaces", "priorityPolicy": "overflow"}, "Valid priority group"),
        ({"priorityGroups": "jobs", "priorityPolicy": "failover"}, "priorityPolicy must be"),
        (
            {"priorityGroups": "jobs", "priorityPolicy": "overflow", "priorityTimeout": "5"},
            "pinned_client policy only",
        ),
        (
            {
                "type": "push",
                "callbackUrl": "http://127.0.0.1:9/h",
                "priorityGroups": "jobs",
                "priorityPolicy": "overflow",
            },
            "can not be used with push consumers",
        ),  # fmt: skip
    ],
)
async def test_settings_refused_with_a_reason(
    client: httpx.AsyncClient, fields: dict[str, str], reason: str
) -> None:
    await setup_channel(client)
    r = await put_raw(client, "k2", **fields)
    assert r.status_code == 400
    assert reason in r.json()["detail"]


async def test_settings_are_stored_shown_and_only_the_timeout_changes(
    client: httpx.AsyncClient,
) -> None:
    await setup_channel(client)
    r = await put_raw(
        client, "pin", priorityGroups="jobs", priorityPolicy="pinned_client", priorityTimeout="30"
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["PriorityGroups"], body["PriorityPolicy"], body["PriorityTimeout"]) == (
        ["jobs"],
        "pinned_client",
        30,
    )
    since = {"If-Unmodified-Since": r.headers["Last-Modified"]}
    path = f"/channel/{CHANNEL}/consumer/pin"
    form = {"token": "pin-token", "type": "pull"}
    r = await client.put(path, data={**form, "priorityPolicy": "overflow"}, headers=since)
    assert r.status_code == 400 and "can not be changed" in r.json()["detail"]
    r = await client.put(path, data={**form, "priorityTimeout": "60"}, headers=since)
    assert r.status_code == 200, r.text
    got = (await client.get(path)).json()
    assert (got["PriorityGroups"], got["PriorityPolicy"], got["PriorityTimeout"]) == (
        ["jobs"],
        "pinned_client",
        60,
    )
    plain = (await client.get(f"/channel/{CHANNEL}/consumer/k1")).json()
    assert (plain["PriorityGroups"], plain["PriorityPolicy"], plain["PriorityTimeout"]) == (
        [],
        "none",
        None,
    )


async def policy_consumer(client: httpx.AsyncClient, name: str, policy: str) -> PullConsumer:
    await setup_channel(client)
    return await put_consumer(client, name, priorityGroups="jobs", priorityPolicy=policy)


@pytest.mark.parametrize(
    ("policy", "body", "reason"),
    [
        ("overflow", {}, "Bad Request - Priority Group missing"),
        ("overflow", {"group": "nope"}, "Bad Request - Invalid Priority Group"),
        ("overflow", {"group": "jobs", "id": "x"}, "Not a Pinned Client Priority consumer"),
        ("prioritized", {"group": "jobs", "priority": 10}, "Priority must be between 0 and 9"),
        ("prioritized", {"group": "jobs", "min_pending": 1}, "Not a Overflow Priority consumer"),
    ],
)
async def test_pull_terms_refused_as_nats_server_refuses_them(
    client: httpx.AsyncClient, policy: str, body: dict[str, Any], reason: str
) -> None:
    k = await policy_consumer(client, "pol", policy)
    await publish(client, "x")  # the refusal comes before any claim: the job stays queued
    r = await pull(client, k, no_wait=True, **body)
    assert r.status_code == 400
    assert reason in r.json()["detail"]
    assert [j["Attempt"] for j in await pull_jobs(client, k, group="jobs")] == [1]


async def test_a_plain_consumer_ignores_a_group_but_refuses_overflow_terms(
    client: httpx.AsyncClient,
) -> None:
    [k1] = await setup_channel(client)
    await publish(client, "x")
    r = await pull(client, k1, no_wait=True, min_pending=1)
    assert r.status_code == 400 and "Not a Overflow" in r.json()["detail"]
    assert len(await pull_jobs(client, k1, group="jobs", priority=3)) == 1


async def test_overflow_pulls_take_jobs_only_while_the_backlog_meets_their_terms(
    client: httpx.AsyncClient,
) -> None:
    k = await policy_consumer(client, "over", "overflow")
    for name in ("o1", "o2"):
        await publish(client, name)
    jobs = await pull_jobs(client, k, group="jobs", min_pending=5)
    assert jobs == []  # two pending
    [o1] = await pull_jobs(client, k, group="jobs", min_pending=2, batch=2)
    assert o1["Message"]["Payload"] == "o1"  # the second job would leave one pending
    assert await pull_jobs(client, k, group="jobs", min_pending=2) == []
    for name in ("o3", "o4"):
        await publish(client, name)
    plain = await pull_jobs(client, k, group="jobs", batch=2)  # no terms: like any pull
    assert [j["Message"]["Payload"] for j in plain] == ["o2", "o3"]
    # Three in flight now (o1, o2, o3), one pending.
    assert await pull_jobs(client, k, group="jobs", min_ack_pending=4) == []
    [o4] = await pull_jobs(client, k, group="jobs", min_ack_pending=3)
    assert o4["Message"]["Payload"] == "o4"


async def test_a_waiting_overflow_pull_is_served_once_the_backlog_grows(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k = await policy_consumer(client, "over", "overflow")
    waiting = asyncio.create_task(pull(client, k, group="jobs", min_pending=3, expires=20))
    await until_waiting(runtime, await consumer_pk(runtime, "over"))
    await publish(client, "b1")
    await publish(client, "b2")
    await asyncio.sleep(0.3)
    assert not waiting.done()  # two pending: not yet
    await publish(client, "b3")
    r = await asyncio.wait_for(waiting, timeout=10)
    assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == ["b1"]


async def test_prioritized_pulls_lowest_priority_first(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k = await policy_consumer(client, "prio", "prioritized")
    pk = await consumer_pk(runtime, "prio")
    polls = {}
    for n, priority in enumerate((5, 1, 0), start=1):
        polls[priority] = asyncio.create_task(
            pull(client, k, group="jobs", priority=priority, batch=2, expires=20)
        )
        await until_waiting(runtime, pk, n)
    for round_no, served in enumerate((0, 1, 5)):
        await publish(client, f"q{round_no}")
        r = await asyncio.wait_for(polls[served], timeout=10)
        # (An HTTP long poll ends with its first hand-out.)
        assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == [f"q{round_no}"]
        assert not any(t.done() for p, t in polls.items() if p != served and p > served)


async def test_pinned_client_over_http(client: httpx.AsyncClient, runtime: Runtime) -> None:
    await setup_channel(client)
    k = await put_consumer(
        client, "pin", priorityGroups="jobs", priorityPolicy="pinned_client", priorityTimeout="60"
    )
    for name in ("a1", "a2", "a3"):
        await publish(client, name)
    r = await pull(client, k, group="jobs", no_wait=True)
    pin = r.json()["PinId"]
    assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == ["a1"] and len(pin) == 22
    # Another client's pin id is refused at once; a standby waits and gets nothing.
    r = await pull(client, k, group="jobs", id="someone", no_wait=True)
    assert r.status_code == 423 and "Nats-Pin-Id mismatch" in r.json()["detail"]
    r = await pull(client, k, group="jobs", expires=0.5)
    assert r.status_code == 200 and r.json()["Jobs"] == []
    r = await pull(client, k, group="jobs", id=pin, no_wait=True)
    assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == ["a2"]
    assert r.json()["PinId"] == pin
    # Unpinned: the old pin is refused, a standby gets the next job under a new pin.
    unpin = f"{k.base}/unpin"
    r = await client.post(unpin, json={"group": "other"}, headers=k.auth)
    assert r.status_code == 400 and "does not exist" in r.json()["detail"]
    r = await client.post(unpin, json={"group": "jobs"}, headers=k.auth)
    assert r.json() == {"Group": "jobs", "Unpinned": True}
    r = await pull(client, k, group="jobs", id=pin, no_wait=True)
    assert r.status_code == 423 and "Nats-Wrong-Pin-Id" in r.json()["detail"]
    r = await pull(client, k, group="jobs", no_wait=True)
    assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == ["a3"]
    assert r.json()["PinId"] not in (None, pin)
    r = await client.post(unpin, json={"group": "jobs"}, headers=k.auth)
    assert r.json()["Unpinned"] is True
    r = await client.post(unpin, json={"group": "jobs"}, headers=k.auth)
    assert r.json()["Unpinned"] is False


async def test_a_pin_lapses_after_the_timeout_and_a_waiting_standby_takes_over(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await setup_channel(client)
    k = await put_consumer(
        client, "pin", priorityGroups="jobs", priorityPolicy="pinned_client", priorityTimeout="1"
    )
    await publish(client, "a1")
    first = (await pull(client, k, group="jobs", no_wait=True)).json()["PinId"]
    await publish(client, "a2")
    standby = asyncio.create_task(pull(client, k, group="jobs", expires=20))
    pk = await consumer_pk(runtime, "pin")
    await until_waiting(runtime, pk)

    async def lapsed() -> list[tuple[int, str]]:
        assert not standby.done()  # the pin holds until the sweeper finds it lapsed
        return await runtime.sweeps.expire_pins()

    assert await eventually(lapsed, 10, 0.1, what="the pin lapsed (1 s)") == [(pk, "jobs")]
    r = await asyncio.wait_for(standby, timeout=10)
    assert [j["Message"]["Payload"] for j in r.json()["Jobs"]] == ["a2"]
    assert r.json()["PinId"] not in (None, first)


SEEDED = """
[initial-channels]
c1=c1
[initial-channel-tokens]
c1=channel-token
[initial-consumers]
seeded=
[seeded]
token=seeded-token
channel=c1
type=pull
priority-groups=jobs
priority-policy=pinned_client
priority-timeout=45
"""


@pytest.mark.parametrize("extra_config", [SEEDED], ids=["seed"])
async def test_seeded_priority_settings(client: httpx.AsyncClient) -> None:
    body = (await client.get(f"/channel/{CHANNEL}/consumer/seeded")).json()
    assert (body["PriorityGroups"], body["PriorityPolicy"], body["PriorityTimeout"]) == (
        ["jobs"],
        "pinned_client",
        45,
    )


@pytest.mark.parametrize(
    "seed", ["priority-groups=jobs\n", "priority-policy=overflow\n", "priority-groups=a b\n"]
)
def test_seeded_priority_settings_that_nats_server_refuses_fail_the_config(seed: str) -> None:
    text = "[initial-consumers]\nbad=\n[bad]\ntoken=t\nchannel=c1\ntype=pull\n"
    if "groups" in seed and "policy" not in seed and " " in seed:
        seed += "priority-policy=overflow\n"
    with pytest.raises(ConfigError, match=r"\[bad\] priority-\*"):
        load_config_text(text + seed)
