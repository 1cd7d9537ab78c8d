"""The seed spec's pull API (webhook-broker-pull-consumer-spec.md), on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import httpx
import pytest

from app.runtime import Runtime
from tests.helpers.pull import (
    CHANNEL,
    CHANNEL_TOKEN,
    PullConsumer,
    job_row,
    job_status,
    publish,
    publish_many,
    set_state,
    setup_channel,
)

Q, IN, DL, DD = "QUEUED", "INFLIGHT", "DELIVERED", "DEAD"
# Lease when no ackWait is set: connection-timeout-in-seconds (30) + rational-delay-in-seconds (2).
DEFAULT_LEASE = 32


async def queued(client: httpx.AsyncClient, who: PullConsumer, query: str = "") -> Any:
    r = await client.get(f"{who.base}/queued-jobs{query}", headers=who.auth)
    assert r.status_code == 200, r.text
    return r.json()


async def queued_ids(client: httpx.AsyncClient, who: PullConsumer, query: str = "") -> list[str]:
    return [j["ID"] for j in (await queued(client, who, query))["Result"]]


async def new_job(client: httpx.AsyncClient, who: PullConsumer, state: str = Q) -> str:
    """Publish one message and walk its job to `state` through the seed API."""
    message_id = await publish(client, f"job for {state}")
    found = [
        j["ID"]
        for j in (await queued(client, who, "?limit=100"))["Result"]
        if j["Message"]["MessageID"] == message_id
    ]
    assert len(found) == 1
    job_id: str = found[0]
    path = {Q: [], IN: [IN], DL: [IN, DL], DD: [IN, DD]}[state]
    for step in path:
        r = await set_state(client, who, job_id, {"NextState": step})
        assert r.status_code == 202, r.text
    assert await job_status(client, who, job_id) == state
    return job_id


def seconds_between(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


# -- authentication order ----------------------------------------------------------------------


# (method, path under the consumer, body, refuses push consumers with 412)
ENDPOINTS = [
    ("GET", "/queued-jobs", None, True),
    ("POST", "/job/{job}", {"NextState": "INFLIGHT"}, True),
    ("POST", "/pull", {"no_wait": True}, True),
    ("POST", "/job/{job}/ack", {"type": "ack"}, True),
    ("POST", "/ack", {"acks": [{"id": 1, "type": "ack"}]}, True),
    # Job reads and dead letters exist for push consumers as well.
    ("GET", "/job/{job}", None, False),
    ("POST", "/job/{job}/requeue-dead-job", None, False),
    ("DELETE", "/job/{job}", None, False),
    ("GET", "/dlq", None, False),
    ("POST", "/dlq", None, False),
]


@pytest.mark.parametrize(("method", "suffix", "body", "pull_only"), ENDPOINTS)
async def test_credentials_are_checked_in_the_go_order(
    client: httpx.AsyncClient,
    k1: PullConsumer,
    method: str,
    suffix: str,
    body: dict[str, Any] | None,
    pull_only: bool,
) -> None:
    r = await client.put(
        f"/channel/{CHANNEL}/consumer/pusher",
        data={"token": "push-token", "callbackUrl": "http://example.test/hook"},
    )
    assert r.status_code == 200, r.text
    job_id = await new_job(client, k1)
    good = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": k1.token}

    async def call(channel: str, consumer: str, headers: dict[str, str]) -> int:
        url = f"/channel/{channel}/consumer/{consumer}" + suffix.format(job=job_id)
        r = await client.request(method, url, json=body, headers=headers)
        return r.status_code

    wrong_channel_token = {**good, "X-Broker-Channel-Token": "nope"}
    wrong_consumer_token = {**good, "X-Broker-Consumer-Token": "nope"}
    push_tokens = {**good, "X-Broker-Consumer-Token": "push-token"}
    assert await call("no-such-channel", "k1", good) == 404
    assert await call("no-such-channel", "k1", wrong_consumer_token) == 404
    assert await call(CHANNEL, "k1", wrong_channel_token) == 403
    assert await call(CHANNEL, "no-such-consumer", wrong_channel_token) == 403
    assert await call(CHANNEL, "no-such-consumer", good) == 401
    assert await call(CHANNEL, "k1", wrong_consumer_token) == 403
    assert await call(CHANNEL, "k1", {"X-Broker-Channel-Token": CHANNEL_TOKEN}) == 403
    assert await call(CHANNEL, "pusher", wrong_consumer_token) == 403
    if pull_only:
        assert await call(CHANNEL, "pusher", push_tokens) == 412
    # None of the refused calls touched the job.
    assert await job_status(client, k1, job_id) == Q


@pytest.mark.parametrize(
    ("suffix", "body"),
    [("/job/{job}", b"{not json"), ("/pull", b"[1]"), ("/job/{job}/ack", b"{"), ("/ack", b"")],
)
async def test_credentials_are_checked_before_the_body(
    client: httpx.AsyncClient, k1: PullConsumer, suffix: str, body: bytes
) -> None:
    """A bad body from a caller with bad credentials is answered like any call with them."""
    job_id = await new_job(client, k1)
    path = suffix.format(job=job_id)
    wrong = {**k1.auth, "X-Broker-Consumer-Token": "nope"}
    r = await client.post(f"/channel/nope/consumer/k1{path}", content=body, headers=k1.auth)
    assert r.status_code == 404
    r = await client.post(f"{k1.base}{path}", content=body, headers=wrong)
    assert r.status_code == 403
    r = await client.post(f"{k1.base}{path}", content=body, headers=k1.auth)
    assert r.status_code == 400
    assert r.json()["detail"]


# -- queued-jobs ---------------------------------------------------------------------------------


async def test_queued_jobs_shape(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    message_id = await publish(
        client,
        '{"hello": "world"}',
        priority=7,
        message_id="msg-1",
        headers={
            "Content-Type": "application/json",
            "X-Broker-Metadata-Headers": "X-Trace",
            "X-Trace": "abc",
        },
    )
    body = await queued(client, k1)
    assert body["Pages"] == {}
    [item] = body["Result"]
    assert set(item) == {"ID", "Priority", "IncrementalTimeout", "Message"}
    assert isinstance(item["ID"], str)
    assert item["Priority"] == 7
    assert item["IncrementalTimeout"] == 0
    assert item["Message"] == {
        "MessageID": message_id,
        "Payload": '{"hello": "world"}',
        "ContentType": "application/json",
        "Headers": {"X-Trace": "abc"},
    }


async def test_queued_jobs_priority_first_then_oldest_first(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    # A negative priority is taken as its absolute value, as the Go original does: -1 ranks as 1.
    order = [(0, "a"), (5, "b"), (0, "c"), (9, "d"), (5, "e"), (-1, "f"), (9, "g")]
    for priority, name in order:
        await publish(client, name, priority=priority, message_id=name)
    result = (await queued(client, k1))["Result"]
    assert [j["Message"]["MessageID"] for j in result] == ["d", "g", "b", "e", "f", "a", "c"]
    assert [j["Priority"] for j in result] == [9, 9, 5, 5, 1, 0, 0]


async def test_queued_jobs_lists_only_due_queued_jobs(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    ids = [await new_job(client, k1) for _ in range(5)]
    assert await queued_ids(client, k1) == ids
    assert (await set_state(client, k1, ids[0], {"NextState": IN})).status_code == 202
    assert (await set_state(client, k1, ids[1], {"NextState": IN})).status_code == 202
    assert (await set_state(client, k1, ids[1], {"NextState": DL})).status_code == 202
    # A nak with a delay puts the job back in QUEUED, but not yet due.
    assert (await set_state(client, k1, ids[2], {"NextState": IN})).status_code == 202
    r = await client.post(
        f"{k1.job(ids[2])}/ack", json={"type": "nak", "delay": 3600}, headers=k1.auth
    )
    assert r.status_code == 202, r.text
    assert await job_status(client, k1, ids[2]) == Q
    assert await queued_ids(client, k1) == ids[3:]


async def test_queued_jobs_are_per_consumer(client: httpx.AsyncClient) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    await publish(client, "x")
    a, b = await queued_ids(client, k1), await queued_ids(client, k2)
    assert len(a) == len(b) == 1
    assert a != b
    assert (await set_state(client, k1, a[0], {"NextState": IN})).status_code == 202
    assert await queued_ids(client, k1) == []
    assert await queued_ids(client, k2) == b


async def test_limit_default_clip_zero_and_pagination(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish_many(runtime, 130)
    body = await queued(client, k1)
    assert len(body["Result"]) == 25
    assert "next" in body["Pages"]
    assert len((await queued(client, k1, "?limit=150"))["Result"]) == 100
    assert len((await queued(client, k1, "?limit=100"))["Result"]) == 100
    zero = await queued(client, k1, "?limit=0")
    assert zero["Result"] == []
    # Walk every page through the links the server hands out.
    seen: list[str] = []
    link: str | None = f"{k1.base}/queued-jobs?limit=40"
    pages = 0
    while link:
        r = await client.get(link, headers=k1.auth)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["Result"]) <= 40
        seen += [j["ID"] for j in page["Result"]]
        link = page["Pages"].get("next")
        pages += 1
    assert pages == 4
    assert len(seen) == len(set(seen)) == 130
    assert seen == sorted(seen, key=int)


async def test_pagination_keeps_priority_order_across_pages(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    for n in range(9):
        await publish(client, f"m{n}", priority=n % 3, message_id=f"m{n}")
    seen: list[tuple[int, int]] = []
    link: str | None = f"{k1.base}/queued-jobs?limit=2"
    while link:
        page = (await client.get(link, headers=k1.auth)).json()
        seen += [(j["Priority"], int(j["ID"])) for j in page["Result"]]
        link = page["Pages"].get("next")
    assert len(seen) == 9
    assert seen == sorted(seen, key=lambda p: (-p[0], p[1]))


@pytest.mark.parametrize("limit", ["-1", "abc", "2.5", "1e3", "-0.5"])
async def test_bad_limit_is_400(client: httpx.AsyncClient, k1: PullConsumer, limit: str) -> None:
    r = await client.get(f"{k1.base}/queued-jobs?limit={limit}", headers=k1.auth)
    assert r.status_code == 400
    assert "limit" in r.json()["detail"]


async def test_malformed_cursor_is_400(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    r = await client.get(f"{k1.base}/queued-jobs?next=%%%", headers=k1.auth)
    assert r.status_code == 400


# -- the transition table ----------------------------------------------------------------------

VALID = [(Q, Q), (Q, IN), (IN, IN), (IN, DD), (DD, DD), (DD, IN), (IN, DL), (DL, DL)]
INVALID = [(Q, DL), (Q, DD), (IN, Q), (DD, Q), (DD, DL), (DL, Q), (DL, IN), (DL, DD)]


@pytest.mark.parametrize(("current", "target"), VALID)
async def test_valid_transition_is_202(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, current: str, target: str
) -> None:
    job_id = await new_job(client, k1, current)
    before = await job_row(runtime, job_id)
    r = await set_state(client, k1, job_id, {"NextState": target})
    assert r.status_code == 202, r.text
    assert r.content == b""
    after = await job_row(runtime, job_id)
    assert after.status == target
    if current == target:
        assert after == before  # nothing at all changed
    else:
        assert after.status_changed_at >= before.status_changed_at
    if (current, target) == (DD, IN):
        assert after.retry_count == before.retry_count + 1
        assert after.attempt == before.attempt + 1
    elif current != target:
        assert after.retry_count == before.retry_count


@pytest.mark.parametrize(("current", "target"), INVALID)
async def test_invalid_transition_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, current: str, target: str
) -> None:
    job_id = await new_job(client, k1, current)
    before = await job_row(runtime, job_id)
    r = await set_state(client, k1, job_id, {"NextState": target})
    assert r.status_code == 400, r.text
    assert r.json()["detail"]
    assert await job_row(runtime, job_id) == before


async def test_queued_to_inflight_sets_the_default_lease(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job_id = await new_job(client, k1)
    assert (await set_state(client, k1, job_id, {"NextState": IN})).status_code == 202
    row = await job_row(runtime, job_id)
    assert row.attempt == 1
    assert row.incremental_timeout == 0
    lease = seconds_between(row.lease_expires_at, row.claimed_at)
    assert lease == pytest.approx(DEFAULT_LEASE, abs=0.01)


async def test_consumer_ack_wait_replaces_the_default_lease(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", ackWait="7")
    job_id = await new_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": 3})
    assert r.status_code == 202
    row = await job_row(runtime, job_id)
    assert seconds_between(row.lease_expires_at, row.claimed_at) == pytest.approx(10, abs=0.01)


# -- IncrementalTimeout (the Go original's timeout tables) -------------------------------------


@pytest.mark.parametrize("extra", [10, 1000, 100000])
async def test_incremental_timeout_extends_the_lease(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, extra: int
) -> None:
    job_id = await new_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": extra})
    assert r.status_code == 202, r.text
    row = await job_row(runtime, job_id)
    assert row.status == IN
    assert row.incremental_timeout == extra
    lease = seconds_between(row.lease_expires_at, row.claimed_at)
    assert lease == pytest.approx(DEFAULT_LEASE + extra, abs=0.01)
    listed = await client.get(k1.job(job_id), headers=k1.auth)
    assert listed.json()["IncrementalTimeout"] == extra


async def test_incremental_timeout_sequence_of_the_go_original(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    """TestJobControllerPost_TimeoutValid: Q->IN 10, IN->IN 0, IN->DEAD 0, DEAD->IN 15."""
    job_id = await new_job(client, k1)
    steps = [(IN, 10, 10), (IN, 0, 10), (DD, 0, 10), (IN, 15, 15)]
    for target, timeout, expected in steps:
        r = await set_state(
            client, k1, job_id, {"NextState": target, "IncrementalTimeout": timeout}
        )
        assert r.status_code == 202, (target, timeout, r.text)
        row = await job_row(runtime, job_id)
        assert (row.status, row.incremental_timeout) == (target, expected)
    row = await job_row(runtime, job_id)
    assert row.retry_count == 1
    assert seconds_between(row.lease_expires_at, row.claimed_at) == pytest.approx(
        DEFAULT_LEASE + 15, abs=0.01
    )


@pytest.mark.parametrize(
    ("current", "target"),
    [(Q, Q), (Q, DL), (IN, DL), (IN, IN), (IN, DD), (DD, DD), (DD, DL), (DL, DL), (DL, IN)],
)
async def test_incremental_timeout_where_not_allowed_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, current: str, target: str
) -> None:
    job_id = await new_job(client, k1, current)
    before = await job_row(runtime, job_id)
    r = await set_state(client, k1, job_id, {"NextState": target, "IncrementalTimeout": 10})
    assert r.status_code == 400, r.text
    assert "IncrementalTimeout" in r.json()["detail"]
    assert await job_row(runtime, job_id) == before


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "JSON object"),
        (b"[]", "JSON object"),
        (b'"INFLIGHT"', "JSON object"),
        (b"{}", "NextState"),
        (b'{"NextState": "invalid-state"}', "NextState"),
        (b'{"NextState": "inflight"}', "NextState"),
        (b'{"NextState": 2}', "NextState"),
        (b'{"NextState": "INFLIGHT", "IncrementalTimeout": -1}', "IncrementalTimeout"),
        (b'{"NextState": "INFLIGHT", "IncrementalTimeout": 1.5}', "IncrementalTimeout"),
        (b'{"NextState": "INFLIGHT", "IncrementalTimeout": "10"}', "IncrementalTimeout"),
        (b'{"NextState": "INFLIGHT", "IncrementalTimeout": true}', "IncrementalTimeout"),
    ],
)
async def test_bad_payload_is_400_with_a_reason(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, body: bytes, reason: str
) -> None:
    job_id = await new_job(client, k1)
    r = await client.post(
        k1.job(job_id), content=body, headers={**k1.auth, "Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert reason in r.json()["detail"]
    assert (await job_row(runtime, job_id)).status == Q


async def test_whole_float_incremental_timeout_is_accepted(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job_id = await new_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": 4.0})
    assert r.status_code == 202
    assert (await job_row(runtime, job_id)).incremental_timeout == 4


async def test_jobs_of_another_consumer_are_404(client: httpx.AsyncClient) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    await publish(client, "x")
    [mine] = await queued_ids(client, k1)
    [theirs] = await queued_ids(client, k2)
    for target in (IN, DL, DD):
        assert (await set_state(client, k1, theirs, {"NextState": target})).status_code == 404
    assert (await client.get(k1.job(theirs), headers=k1.auth)).status_code == 404
    r = await client.post(f"{k1.job(theirs)}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 404
    assert (await client.delete(k1.job(theirs), headers=k1.auth)).status_code == 404
    assert (await set_state(client, k2, theirs, {"NextState": IN})).status_code == 202
    r = await client.post(f"{k1.job(theirs)}/ack", json={"type": "ack"}, headers=k1.auth)
    assert r.status_code == 404
    assert await job_status(client, k2, theirs) == IN
    assert await job_status(client, k1, mine) == Q


@pytest.mark.parametrize("job_id", ["999999", "0", "-3", "abc", "1.5"])
async def test_unknown_job_is_404(client: httpx.AsyncClient, k1: PullConsumer, job_id: str) -> None:
    await new_job(client, k1)
    assert (await set_state(client, k1, job_id, {"NextState": IN})).status_code == 404
    assert (await client.get(k1.job(job_id), headers=k1.auth)).status_code == 404


# -- job reads, dead letters --------------------------------------------------------------------


async def test_get_job(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    job_id = await new_job(client, k1, IN)
    r = await client.get(k1.job(job_id), headers=k1.auth)
    assert r.status_code == 200
    body = r.json()
    assert body["ID"] == job_id
    assert body["Status"] == IN
    assert body["Attempt"] == 1
    assert body["RetryCount"] == 0
    assert body["LeaseExpiresAt"]
    assert body["Message"]["Payload"] == "job for INFLIGHT"
    assert body["Links"]["self"] == k1.job(job_id)


async def test_requeue_dead_job(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job_id = await new_job(client, k1, DD)
    # DEAD -> INFLIGHT -> DEAD again: the retry count grows, then requeue resets it.
    assert (await set_state(client, k1, job_id, {"NextState": IN})).status_code == 202
    assert (await set_state(client, k1, job_id, {"NextState": DD})).status_code == 202
    assert (await job_row(runtime, job_id)).retry_count == 1
    r = await client.post(f"{k1.job(job_id)}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 202, r.text
    row = await job_row(runtime, job_id)
    assert (row.status, row.retry_count, row.dead_reason) == (Q, 0, None)
    assert await queued_ids(client, k1) == [job_id]
    r = await client.post(f"{k1.job(job_id)}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 400
    assert (await job_row(runtime, job_id)).status == Q


@pytest.mark.parametrize("state", [Q, IN, DL])
async def test_requeue_of_a_job_that_is_not_dead_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, state: str
) -> None:
    job_id = await new_job(client, k1, state)
    before = await job_row(runtime, job_id)
    r = await client.post(f"{k1.job(job_id)}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 400
    assert await job_row(runtime, job_id) == before


async def test_dlq_lists_pages_and_requeues_all(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    dead = [await new_job(client, k1, DD) for _ in range(5)]
    alive = await new_job(client, k1, IN)
    seen: list[str] = []
    link: str | None = f"{k1.base}/dlq?limit=2"
    while link:
        r = await client.get(link, headers=k1.auth)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["DeadJobs"]) <= 2
        for item in page["DeadJobs"]:
            assert item["Status"] == DD
            assert item["JobRequeueURL"].endswith("/requeue-dead-job")
        seen += [item["ID"] for item in page["DeadJobs"]]
        link = page["Pages"].get("next")
    assert seen == dead
    r = await client.post(f"{k1.base}/dlq", headers=k1.auth)
    assert r.status_code == 202
    assert r.json() == {"Requeued": 5}
    assert (await client.get(f"{k1.base}/dlq", headers=k1.auth)).json()["DeadJobs"] == []
    assert await queued_ids(client, k1) == dead
    assert await job_status(client, k1, alive) == IN
    assert (await client.post(f"{k1.base}/dlq", headers=k1.auth)).json() == {"Requeued": 0}


async def test_delete_dead_job(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    job_id = await new_job(client, k1, DD)
    other = await new_job(client, k1, DL)
    assert (await client.delete(k1.job(other), headers=k1.auth)).status_code == 400
    assert (await client.delete(k1.job(job_id), headers=k1.auth)).status_code == 204
    assert (await client.get(k1.job(job_id), headers=k1.auth)).status_code == 404
    assert (await client.delete(k1.job(job_id), headers=k1.auth)).status_code == 404
    assert await job_status(client, k1, other) == DL


# -- values out of range: 400 or 404, never a 500 ----------------------------------------------


def forged(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor", ["abc", "1", "x:1", "1:x", f"{2**31}:1", f"1:{2**63}", f"-{2**80}:1", ":"]
)
async def test_forged_queued_jobs_cursor_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, cursor: str
) -> None:
    await new_job(client, k1)
    r = await client.get(f"{k1.base}/queued-jobs?next={forged(cursor)}", headers=k1.auth)
    assert r.status_code == 400, r.text
    assert "cursor" in r.json()["detail"]


@pytest.mark.parametrize("cursor", ["abc", "", "1:2", str(2**63), str(-(2**70))])
async def test_forged_dlq_cursor_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, cursor: str
) -> None:
    await new_job(client, k1, DD)
    r = await client.get(f"{k1.base}/dlq?next={forged(cursor) or 'AA'}", headers=k1.auth)
    assert r.status_code == 400, r.text


async def test_huge_job_id_is_404(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    await new_job(client, k1)
    huge = str(2**63)
    assert (await set_state(client, k1, huge, {"NextState": IN})).status_code == 404
    assert (await client.get(k1.job(huge), headers=k1.auth)).status_code == 404
    assert (await client.delete(k1.job(huge), headers=k1.auth)).status_code == 404
    r = await client.post(f"{k1.job(huge)}/requeue-dead-job", headers=k1.auth)
    assert r.status_code == 404


@pytest.mark.parametrize("value", [2**31, 10**20, 1e300])
async def test_incremental_timeout_beyond_range_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, value: float
) -> None:
    job_id = await new_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": value})
    assert r.status_code == 400, r.text
    assert "IncrementalTimeout" in r.json()["detail"]
    assert (await job_row(runtime, job_id)).status == Q


async def test_largest_incremental_timeout_is_accepted(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job_id = await new_job(client, k1)
    r = await set_state(client, k1, job_id, {"NextState": IN, "IncrementalTimeout": 2**31 - 1})
    assert r.status_code == 202, r.text
    assert (await job_row(runtime, job_id)).incremental_timeout == 2**31 - 1


@pytest.mark.parametrize(
    "body",
    [b'{"NextState": "INFLIGHT", "IncrementalTimeout": 1' + b"0" * 5000 + b"}", b"[" * 100000],
)
async def test_pathological_json_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, body: bytes
) -> None:
    job_id = await new_job(client, k1)
    r = await client.post(k1.job(job_id), content=body, headers=k1.auth)
    assert r.status_code == 400
    assert "malformed JSON" in r.json()["detail"]
