"""Acks of pulled jobs: ack, nak, term, progress, attempt fencing and batched acks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from app.runtime import Runtime
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    expire_leases,
    job_row,
    make_due,
    publish,
    pull,
    pull_jobs,
    setup_channel,
    until_waiting,
)


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


async def ack(
    client: httpx.AsyncClient, who: PullConsumer, job_id: object, **body: Any
) -> httpx.Response:
    return await client.post(f"{who.job(job_id)}/ack", json=body, headers=who.auth)


async def ack_batch(
    client: httpx.AsyncClient, who: PullConsumer, acks: list[dict[str, Any]]
) -> httpx.Response:
    return await client.post(f"{who.base}/ack", json={"acks": acks}, headers=who.auth)


async def one_pulled(client: httpx.AsyncClient, who: PullConsumer, payload: str = "x") -> Any:
    await publish(client, payload)
    [job] = await pull_jobs(client, who)
    return job


def seconds(later: Any, earlier: Any) -> float:
    return float((later - earlier).total_seconds())


# -- ack -----------------------------------------------------------------------------------------


async def test_ack_delivers(client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime) -> None:
    job = await one_pulled(client, k1)
    r = await ack(client, k1, job["ID"], type="ack", attempt=1)
    assert r.status_code == 202
    assert r.content == b""
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.lease_expires_at) == ("DELIVERED", None)
    # Delivered is final: acking again, with or without the attempt, is a conflict.
    r = await ack(client, k1, job["ID"], type="ack", attempt=1)
    assert r.status_code == 409
    assert "DELIVERED" in r.json()["detail"]
    assert (await ack(client, k1, job["ID"])).status_code == 409
    for kind in ("nak", "term", "progress"):
        assert (await ack(client, k1, job["ID"], type=kind)).status_code == 409
    assert (await job_row(runtime, job["ID"])).status == "DELIVERED"


async def test_ack_type_defaults_to_ack(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    r = await client.post(f"{k1.job(job['ID'])}/ack", headers=k1.auth)
    assert r.status_code == 202
    assert (await job_row(runtime, job["ID"])).status == "DELIVERED"


async def test_ack_of_a_queued_job_is_409(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "x")
    [queued] = (await client.get(f"{k1.base}/queued-jobs", headers=k1.auth)).json()["Result"]
    assert (await ack(client, k1, queued["ID"])).status_code == 409
    assert (await job_row(runtime, queued["ID"])).status == "QUEUED"


async def test_stale_attempt_is_409_and_changes_nothing(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    # The lease runs out and the sweeper requeues: attempt 1 is over.
    await expire_leases(runtime, [job["ID"]])
    assert await runtime.sweeps.sweep_all() == 1
    r = await ack(client, k1, job["ID"], type="ack", attempt=1)
    assert r.status_code == 409
    assert "QUEUED" in r.json()["detail"]
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count) == ("QUEUED", 1)
    # Once the backoff has passed, another worker takes attempt 2; attempt 1 stays refused.
    await make_due(runtime, [job["ID"]])
    [again] = await pull_jobs(client, k1)
    assert again["Attempt"] == 2
    r = await ack(client, k1, job["ID"], type="ack", attempt=1)
    assert r.status_code == 409
    assert "stale" in r.json()["detail"]
    assert (await job_row(runtime, job["ID"])).status == "INFLIGHT"
    assert (await ack(client, k1, job["ID"], type="ack", attempt=2)).status_code == 202


async def test_old_attempt_cannot_finish_a_job_someone_else_holds(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    r = await ack(client, k1, job["ID"], type="nak", delay=0, attempt=1)
    assert r.status_code == 202
    [again] = await pull_jobs(client, k1)
    assert (again["ID"], again["Attempt"]) == (job["ID"], 2)
    for kind in ("ack", "nak", "term", "progress"):
        r = await ack(client, k1, job["ID"], type=kind, attempt=1)
        assert r.status_code == 409, kind
        assert "stale" in r.json()["detail"]
    before = await job_row(runtime, job["ID"])
    assert (before.status, before.attempt) == ("INFLIGHT", 2)
    assert (await ack(client, k1, job["ID"], type="ack", attempt=2)).status_code == 202
    assert (await job_row(runtime, job["ID"])).status == "DELIVERED"


async def test_ack_without_attempt_applies_to_the_current_one(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    assert (await ack(client, k1, job["ID"], type="nak", delay=0)).status_code == 202
    await pull_jobs(client, k1)
    assert (await ack(client, k1, job["ID"])).status_code == 202
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.attempt) == ("DELIVERED", 2)


# -- nak -----------------------------------------------------------------------------------------


async def test_nak_without_a_delay_redelivers_at_once_as_a_counted_retry(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    # JetStream's -NAK: due again at once (no backoff), and a retry is counted; the HTTP nak
    # and the bridge share the rule (app/domain/jobs.py, nak_delay).
    job = await one_pulled(client, k1)
    assert (await ack(client, k1, job["ID"], type="nak", attempt=1)).status_code == 202
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count, row.lease_expires_at) == ("QUEUED", 1, None)
    assert seconds(row.earliest_next_attempt_at, row.status_changed_at) == pytest.approx(
        0, abs=0.01
    )
    [again] = await pull_jobs(client, k1)
    assert (again["ID"], again["Attempt"]) == (job["ID"], 2)


async def test_nak_with_a_delay(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    assert (await ack(client, k1, job["ID"], type="nak", delay=1.2)).status_code == 202
    row = await job_row(runtime, job["ID"])
    assert seconds(row.earliest_next_attempt_at, row.status_changed_at) == pytest.approx(
        1.2, abs=0.01
    )
    assert await pull_jobs(client, k1) == []
    started = time.monotonic()
    [again] = await pull_jobs(client, k1, no_wait=False, expires=10)
    assert 0.6 < time.monotonic() - started < 6
    assert again["Attempt"] == 2


async def test_nak_with_zero_delay_is_due_at_once(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    job = await one_pulled(client, k1)
    assert (await ack(client, k1, job["ID"], type="nak", delay=0)).status_code == 202
    [again] = await pull_jobs(client, k1)
    assert (again["ID"], again["Attempt"]) == (job["ID"], 2)


@pytest.mark.parametrize(
    "extra_config", ["[broker]\nmax-retry=2\nretry-backoff-delays-in-seconds=1\n"], ids=["config"]
)
async def test_nak_after_the_last_retry_dead_letters(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    for attempt in (1, 2):
        r = await ack(client, k1, job["ID"], type="nak", delay=0, attempt=attempt)
        assert r.status_code == 202
        row = await job_row(runtime, job["ID"])
        assert (row.status, row.retry_count) == ("QUEUED", attempt)
        [again] = await pull_jobs(client, k1)
        assert again["Attempt"] == attempt + 1
    r = await ack(client, k1, job["ID"], type="nak", attempt=3)
    assert r.status_code == 202
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count) == ("DEAD", 2)
    assert "retries" in row.dead_reason
    assert await pull_jobs(client, k1) == []
    dlq = (await client.get(f"{k1.base}/dlq", headers=k1.auth)).json()["DeadJobs"]
    assert [d["ID"] for d in dlq] == [str(job["ID"])]


async def test_nak_wakes_a_waiting_pull(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    job = await one_pulled(client, k1)
    waiting = asyncio.create_task(pull(client, k1, expires=30))
    await until_waiting(runtime, await consumer_pk(runtime, "k1"))
    assert not waiting.done()
    assert (await ack(client, k1, job["ID"], type="nak", delay=0)).status_code == 202
    # Well before the 30 s expiry: the nak ended the wait, not the clock.
    r = await asyncio.wait_for(waiting, timeout=10)
    assert [(j["ID"], j["Attempt"]) for j in r.json()["Jobs"]] == [(job["ID"], 2)]


# -- term ----------------------------------------------------------------------------------------


async def test_term_dead_letters_with_the_reason(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    a = await one_pulled(client, k1, "a")
    b = await one_pulled(client, k1, "b")
    assert (await ack(client, k1, a["ID"], type="term", reason="bad payload")).status_code == 202
    assert (await ack(client, k1, b["ID"], type="term")).status_code == 202
    row_a, row_b = await job_row(runtime, a["ID"]), await job_row(runtime, b["ID"])
    assert (row_a.status, row_a.dead_reason) == ("DEAD", "bad payload")
    assert row_b.status == "DEAD"
    assert row_b.dead_reason
    assert row_a.retry_count == 0
    r = await client.get(k1.job(a["ID"]), headers=k1.auth)
    assert r.json()["DeadReason"] == "bad payload"


# -- progress ------------------------------------------------------------------------------------


async def test_progress_pushes_the_lease_forward(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", ackWait="4")
    job = await one_pulled(client, k1)
    first = await job_row(runtime, job["ID"])
    await asyncio.sleep(0.3)
    r = await ack(client, k1, job["ID"], type="progress", attempt=1)
    assert r.status_code == 200, r.text
    row = await job_row(runtime, job["ID"])
    assert r.json() == {"LeaseExpiresAt": row.lease_expires_at.isoformat()}
    assert row.lease_expires_at > first.lease_expires_at
    assert (row.status, row.attempt, row.retry_count) == ("INFLIGHT", 1, 0)
    assert row.status_changed_at == first.status_changed_at
    # About ackWait from now: at least 4 s after the first claim plus the pause.
    assert seconds(row.lease_expires_at, first.claimed_at) >= 4.25
    # An expired lease that nobody swept yet can still be saved by progress.
    await expire_leases(runtime, [job["ID"]])
    assert (await ack(client, k1, job["ID"], type="progress")).status_code == 200
    assert await runtime.sweeps.sweep_all() == 0
    assert (await job_row(runtime, job["ID"])).status == "INFLIGHT"


# -- validation and ownership ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"type": "maybe"}, "type"),
        ({"type": 1}, "type"),
        ({"type": "ack", "delay": 1}, "delay"),
        ({"type": "term", "delay": 1}, "delay"),
        ({"type": "nak", "delay": -1}, "delay"),
        ({"type": "nak", "delay": "1"}, "delay"),
        ({"type": "ack", "attempt": 0}, "attempt"),
        ({"type": "ack", "attempt": 1.5}, "attempt"),
        ({"type": "ack", "attempt": "1"}, "attempt"),
        ({"type": "term", "reason": 5}, "reason"),
        ({"type": "ack", "extra": 1}, "extra"),
    ],
)
async def test_bad_ack_is_400(
    client: httpx.AsyncClient,
    k1: PullConsumer,
    runtime: Runtime,
    body: dict[str, Any],
    reason: str,
) -> None:
    job = await one_pulled(client, k1)
    r = await ack(client, k1, job["ID"], **body)
    assert r.status_code == 400, r.text
    assert reason in r.json()["detail"]
    assert (await job_row(runtime, job["ID"])).status == "INFLIGHT"


async def test_ack_of_unknown_or_foreign_job_is_404(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    await publish(client, "x")
    [theirs] = await pull_jobs(client, k2)
    for job_id in ("999999", "abc", "0", str(theirs["ID"])):
        assert (await ack(client, k1, job_id)).status_code == 404, job_id
    assert (await job_row(runtime, theirs["ID"])).status == "INFLIGHT"


# -- batched acks --------------------------------------------------------------------------------


async def test_batch_ack_reports_each_item(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(6):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=6)
    ids = [j["ID"] for j in jobs]
    delivered_already = ids[5]
    assert (await ack(client, k1, delivered_already)).status_code == 202
    r = await ack_batch(
        client,
        k1,
        [
            {"id": ids[0], "type": "ack", "attempt": 1},
            {"id": ids[1], "type": "nak", "delay": 0},
            {"id": ids[2], "type": "term", "reason": "nope"},
            {"id": ids[3], "type": "progress"},
            {"id": 999999, "type": "ack"},  # an integer id is taken as well
            {"id": ids[4], "type": "ack", "attempt": 7},
            {"id": ids[0], "type": "term"},
            {"id": delivered_already},
        ],
    )
    assert r.status_code == 200, r.text
    results = r.json()["Results"]
    assert [(x["id"], x["status"]) for x in results] == [
        (ids[0], 202),
        (ids[1], 202),
        (ids[2], 202),
        (ids[3], 200),
        ("999999", 404),
        (ids[4], 409),
        (ids[0], 409),
        (delivered_already, 409),
    ]
    assert all(set(x) >= {"id", "status", "detail"} for x in results)
    assert "LeaseExpiresAt" in results[3]
    assert "stale" in results[5]["detail"]
    assert "twice" in results[6]["detail"]
    states = [(await job_row(runtime, i)).status for i in ids]
    assert states == ["DELIVERED", "QUEUED", "DEAD", "INFLIGHT", "INFLIGHT", "DELIVERED"]
    assert (await job_row(runtime, ids[2])).dead_reason == "nope"


async def test_plain_ack_batch_acks_what_it_can_and_explains_the_rest(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    """Only plain acks: the good ones land (one statement on PostgreSQL), the others say why."""
    for n in range(4):
        await publish(client, f"m{n}")
    ids = [j["ID"] for j in await pull_jobs(client, k1, batch=4)]
    assert (await ack(client, k1, ids[3])).status_code == 202
    r = await ack_batch(
        client,
        k1,
        [
            {"id": ids[0], "attempt": 1},
            {"id": 999999},
            {"id": ids[1], "attempt": 2},
            {"id": ids[2]},
            {"id": ids[3]},
        ],
    )
    assert [(x["id"], x["status"]) for x in r.json()["Results"]] == [
        (ids[0], 202),
        ("999999", 404),
        (ids[1], 409),
        (ids[2], 202),
        (ids[3], 409),
    ]
    states = [(await job_row(runtime, i)).status for i in ids]
    assert states == ["DELIVERED", "INFLIGHT", "DELIVERED", "DELIVERED"]
    # Wrong credentials ack nothing, whatever the body names.
    wrong = {**k1.auth, "X-Broker-Consumer-Token": "not-it"}
    r = await client.post(f"{k1.base}/ack", json={"acks": [{"id": ids[1]}]}, headers=wrong)
    assert r.status_code == 403
    r = await client.post(f"{k1.job(ids[1])}/ack", json={}, headers=wrong)
    assert r.status_code == 403
    assert (await job_row(runtime, ids[1])).status == "INFLIGHT"


async def test_batch_ack_groups_naks_with_different_delays(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(3):
        await publish(client, f"m{n}")
    ids = [j["ID"] for j in await pull_jobs(client, k1, batch=3)]
    r = await ack_batch(
        client,
        k1,
        [
            {"id": ids[0], "type": "nak", "delay": 100},
            {"id": ids[1], "type": "nak", "delay": 200},
            {"id": ids[2], "type": "nak"},
        ],
    )
    assert [x["status"] for x in r.json()["Results"]] == [202, 202, 202]
    waits = []
    for job_id in ids:
        row = await job_row(runtime, job_id)
        waits.append(round(seconds(row.earliest_next_attempt_at, row.status_changed_at), 2))
    assert waits == [100, 200, 0]  # a nak without a delay: at once, as JetStream's -NAK


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"acks": "all"},
        {"acks": [1, 2]},
        {"acks": [{"type": "ack"}]},
        {"acks": [{"id": "x"}]},
        {"acks": [{"id": 1, "type": "later"}]},
    ],
)
async def test_bad_batch_ack_is_400(
    client: httpx.AsyncClient, k1: PullConsumer, body: dict[str, Any]
) -> None:
    r = await client.post(f"{k1.base}/ack", json=body, headers=k1.auth)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize("extra_config", ["[pull]\nmax-batch=3\n"], ids=["config"])
async def test_batch_ack_size_is_capped(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    r = await ack_batch(client, k1, [{"id": n, "type": "ack"} for n in range(1, 5)])
    assert r.status_code == 400
    r = await ack_batch(client, k1, [])
    assert r.status_code == 200
    assert r.json() == {"Results": []}


# -- races -------------------------------------------------------------------------------------


async def test_racing_acks_on_one_job_exactly_one_wins(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(20):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=20)
    kinds = ["ack", "nak", "term"]
    calls = [
        ack(client, k1, job["ID"], type=kind, attempt=1, **({"delay": 60} if kind == "nak" else {}))
        for job in jobs
        for kind in kinds
    ]
    responses = await asyncio.gather(*calls)
    expected = {"ack": "DELIVERED", "nak": "QUEUED", "term": "DEAD"}
    for i, job in enumerate(jobs):
        mine = responses[i * 3 : i * 3 + 3]
        codes = [r.status_code for r in mine]
        assert sorted(codes) == [202, 409, 409], codes
        winner = kinds[codes.index(202)]
        assert (await job_row(runtime, job["ID"])).status == expected[winner]


# -- values out of range: 400 or 404, never a 500 ----------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"type": "nak", "delay": NaN}', "delay"),
        (b'{"type": "nak", "delay": Infinity}', "delay"),
        (b'{"type": "nak", "delay": 1e300}', "delay"),
        (b'{"type": "nak", "delay": 3000000000}', "delay"),
        (b'{"type": "ack", "attempt": 100000000000000000000}', "attempt"),
        (b'{"type": "ack", "attempt": 2147483648}', "attempt"),
    ],
)
async def test_out_of_range_ack_fields_are_400(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, raw: bytes, reason: str
) -> None:
    job = await one_pulled(client, k1)
    r = await client.post(f"{k1.job(job['ID'])}/ack", content=raw, headers=k1.auth)
    assert r.status_code == 400, r.text
    assert reason in r.json()["detail"]
    assert (await job_row(runtime, job["ID"])).status == "INFLIGHT"


async def test_out_of_range_job_ids_in_acks(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    await one_pulled(client, k1)
    assert (await ack(client, k1, str(2**63))).status_code == 404
    assert (await ack(client, k1, str(2**64 + 5))).status_code == 404
    r = await ack_batch(client, k1, [{"id": 2**63, "type": "ack"}])
    assert r.status_code == 400
    r = await ack_batch(client, k1, [{"id": 2**63 - 1, "type": "ack"}])
    assert [x["status"] for x in r.json()["Results"]] == [404]
