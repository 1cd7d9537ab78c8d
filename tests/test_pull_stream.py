"""The streaming pull over real HTTP (uvicorn on loopback: the ASGI test transport would buffer
the body), the consumer info endpoint, and the nak that hands a job back uncounted."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.config import Config
from app.runtime import Runtime
from tests.helpers.live import served
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    job_row,
    publish,
    publish_many,
    pull,
    pull_jobs,
    setup_channel,
    until_waiting,
)
from tests.helpers.waiting import eventually


@pytest.fixture
async def live(config: Config, runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app served by uvicorn on a free loopback port."""
    async with (
        served(config, runtime) as base,
        httpx.AsyncClient(base_url=base, timeout=20) as http,
    ):
        yield http


async def read_stream(
    client: httpx.AsyncClient, who: PullConsumer, **body: Any
) -> tuple[httpx.Response, list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    async with client.stream(
        "POST", f"{who.base}/pull", json={"stream": True, **body}, headers=who.auth
    ) as r:
        async for line in r.aiter_lines():
            if line:
                lines.append(json.loads(line))
    return r, lines


def jobs_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line["Job"] for line in lines if "Job" in line]


async def test_a_stream_carries_jobs_as_they_come_heartbeats_and_one_status_line(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    await publish(live, "first")
    pk = await consumer_pk(runtime, "k1")

    async def later() -> None:
        await until_waiting(runtime, pk)
        await asyncio.sleep(0.5)  # long enough for the stream to have beaten at least once
        await publish(live, "second")

    publisher = asyncio.create_task(later())
    r, lines = await read_stream(live, k1, batch=10, expires=1.5, idle_heartbeat=0.2)
    await publisher
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    assert "content-length" not in r.headers
    jobs = jobs_of(lines)
    assert [j["Message"]["Payload"] for j in jobs] == ["first", "second"]
    assert all(isinstance(j["ID"], str) and j["Attempt"] == 1 for j in jobs)
    assert {"Heartbeat": True} in lines
    # the second job came after a heartbeat: it was written as it was claimed
    assert lines.index({"Heartbeat": True}) < lines.index(
        next(line for line in lines if "Job" in line and line["Job"] == jobs[1])
    )
    assert lines[-1] == {
        "Status": 408,
        "Reason": "expired",
        "PendingMessages": 8,
        "PendingBytes": 0,
    }
    assert sum("Status" in line for line in lines) == 1
    for job in jobs:
        assert (await job_row(runtime, job["ID"])).status == "INFLIGHT"


async def test_a_stream_ends_when_its_batch_is_filled(live: httpx.AsyncClient) -> None:
    (k1,) = await setup_channel(live)
    for n in range(5):
        await publish(live, f"m{n}")
    _, lines = await read_stream(live, k1, batch=3, expires=30)
    assert [j["Message"]["Payload"] for j in jobs_of(lines)] == ["m0", "m1", "m2"]
    assert [line["Pending"] for line in lines[:3]] == [4, 3, 2]
    assert lines[-1]["Status"] == 200 and lines[-1]["PendingMessages"] == 0


async def test_a_stream_gets_each_job_as_it_falls_due(live: httpx.AsyncClient) -> None:
    """A round that takes the jobs due so far reads when the next one falls due: a stream
    still short of its batch gets it then, not at its expiry."""
    (k1,) = await setup_channel(live)
    await publish(live, "first")
    await publish(live, "second")
    jobs = await pull_jobs(live, k1, batch=2)
    for job, delay in zip(jobs, (1.0, 1.8), strict=True):
        r = await live.post(
            f"{k1.job(job['ID'])}/ack", json={"type": "nak", "delay": delay}, headers=k1.auth
        )
        assert r.status_code == 202
    started = time.monotonic()
    _, lines = await read_stream(live, k1, batch=2, expires=15)
    elapsed = time.monotonic() - started
    assert [j["ID"] for j in jobs_of(lines)] == [j["ID"] for j in jobs]
    assert lines[-1]["Status"] == 200
    assert elapsed < 8


async def test_a_stream_may_ask_for_more_than_a_plain_pull(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    await publish_many(runtime, 300)
    r = await pull(live, k1, batch=300, no_wait=True)
    assert r.status_code == 400 and "between 1 and 256" in r.text
    _, lines = await read_stream(live, k1, batch=300, no_wait=True)
    assert len({j["ID"] for j in jobs_of(lines)}) == 300, lines[-1]
    assert lines[-1]["Status"] == 200


async def test_no_wait_stream_and_max_bytes_end_with_their_status(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    _, lines = await read_stream(live, k1, batch=5, no_wait=True)
    assert lines == [
        {"Status": 404, "Reason": "no messages", "PendingMessages": 5, "PendingBytes": 0}
    ]
    await publish(live, "a" * 10)
    await publish(live, "b" * 100)
    _, lines = await read_stream(live, k1, batch=5, max_bytes=50, expires=5)
    assert [j["Message"]["Payload"] for j in jobs_of(lines)] == ["a" * 10]
    assert lines[-1] == {
        "Status": 409,
        "Reason": "max_bytes reached",
        "PendingMessages": 4,
        "PendingBytes": 40,
    }
    # the job too large for what was left was not handed to anyone: it is queued, unchanged
    rows = [await job_row(runtime, i) for i in (1, 2)]
    assert [(row.status, row.attempt, row.retry_count) for row in rows] == [
        ("INFLIGHT", 1, 0),
        ("QUEUED", 0, 0),
    ]


async def test_a_deleted_consumer_ends_its_streams(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    pk = await consumer_pk(runtime, "k1")

    async def delete() -> None:
        await until_waiting(runtime, pk)
        got = await live.get(k1.base)
        r = await live.delete(
            k1.base, headers={"If-Unmodified-Since": got.headers["Last-Modified"]}
        )
        assert r.status_code == 204, r.text

    deleter = asyncio.create_task(delete())
    _, lines = await read_stream(live, k1, batch=5, expires=20)
    await deleter
    assert lines[-1]["Status"] == 410 and lines[-1]["Reason"] == "consumer deleted"


async def test_shutting_down_ends_streams_with_503(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    pk = await consumer_pk(runtime, "k1")

    async def drain() -> None:
        await until_waiting(runtime, pk)
        runtime.pulls.drain()

    drainer = asyncio.create_task(drain())
    _, lines = await read_stream(live, k1, batch=5, expires=20)
    await drainer
    assert lines == [
        {"Status": 503, "Reason": "server shutting down", "PendingMessages": 5, "PendingBytes": 0}
    ]


async def test_jobs_of_a_stream_whose_client_vanished_go_back_with_no_retry_counted(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    for n in range(3):
        await publish(live, f"m{n}")
    pk = await consumer_pk(runtime, "k1")
    received: list[dict[str, Any]] = []
    async with live.stream(
        "POST", f"{k1.base}/pull", json={"stream": True, "batch": 10}, headers=k1.auth
    ) as r:
        async for line in r.aiter_lines():
            received.append(json.loads(line)["Job"])
            if len(received) == 3:
                break  # the stream is still open (7 more wanted): leaving closes it

    async def gone_back() -> bool:
        statuses = [(await job_row(runtime, j["ID"])).status for j in received]
        return not runtime.scheduler.waiting(pk) and statuses == ["QUEUED"] * 3

    await eventually(gone_back, interval=0.02, what="the stream's jobs gone back")
    for job in received:
        row = await job_row(runtime, job["ID"])
        assert (row.attempt, row.retry_count, row.lease_expires_at) == (1, 0, None)
    # They are due at once, claimed again under a new attempt: the old one's ack is stale.
    again = await pull_jobs(live, k1, batch=10)
    assert sorted((j["ID"], j["Attempt"]) for j in again) == sorted((j["ID"], 2) for j in received)
    stale = await live.post(
        k1.job(received[0]["ID"]) + "/ack", json={"type": "ack", "attempt": 1}, headers=k1.auth
    )
    assert stale.status_code == 409


async def test_jobs_of_a_finished_stream_stay_with_its_client(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    await publish(live, "m")
    _, lines = await read_stream(live, k1, batch=1)
    await asyncio.sleep(0.2)  # the server's side of the closed connection is gone too
    assert (await job_row(runtime, jobs_of(lines)[0]["ID"])).status == "INFLIGHT"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"stream": "yes"}, "stream must be true or false"),
        ({"idle_heartbeat": 1}, "idle_heartbeat is only allowed with stream true"),
        ({"stream": True, "expires": 1, "idle_heartbeat": 0.6}, "idle_heartbeat must be between"),
        ({"stream": True, "idle_heartbeat": 0.01}, "idle_heartbeat must be between"),
        ({"stream": True, "idle_heartbeat": "1"}, "idle_heartbeat"),
        ({"stream": True, "batch": 4097}, "a streaming pull's batch must be between 1 and 4096"),
        ({"stream": True, "batch": 0}, "batch"),
    ],
)
async def test_bad_stream_requests_are_400_with_a_reason(
    live: httpx.AsyncClient, body: dict[str, Any], reason: str
) -> None:
    (k1,) = await setup_channel(live)
    r = await pull(live, k1, **body)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert reason in r.json()["detail"]


async def test_stream_credentials_are_checked_before_streaming(live: httpx.AsyncClient) -> None:
    (k1,) = await setup_channel(live)
    wrong = PullConsumer("k1", "wrong")
    assert (await pull(live, wrong, stream=True)).status_code == 403
    assert (await pull(live, PullConsumer("nobody", "x"), stream=True)).status_code == 401


async def test_consumer_info_gives_the_counts_consumer_info_gives(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    for n in range(4):
        await publish(live, f"m{n}")
    await pull_jobs(live, k1, batch=1)
    pk = await consumer_pk(runtime, "k1")
    waiting = asyncio.create_task(read_stream(live, k1, batch=100, expires=2, group=None))
    await until_waiting(runtime, pk)
    r = await live.get(f"{k1.base}/info", headers=k1.auth)
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["AckPending"] + info["Pending"] == 4
    assert info["Waiting"] == 1
    assert info["Channel"] == "c1" and info["Consumer"] == "k1"
    await waiting
    r = await live.get(f"{k1.base}/info", headers=k1.auth)
    assert (r.json()["Pending"], r.json()["AckPending"], r.json()["Waiting"]) == (0, 4, 0)
    assert (
        await live.get(f"{k1.base}/info", headers=PullConsumer("k1", "x").auth)
    ).status_code == 403
    assert (await live.get("/channel/c1/consumer/nobody/info", headers=k1.auth)).status_code == 401
    assert (await live.get("/channel/zz/consumer/k1/info", headers=k1.auth)).status_code == 404


async def test_a_nak_that_is_not_counted_hands_the_job_back_as_it_was(
    live: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(live)
    await publish(live, "m")
    (job,) = await pull_jobs(live, k1)
    r = await live.post(
        k1.job(job["ID"]) + "/ack",
        json={"type": "nak", "attempt": 1, "counted": False},
        headers=k1.auth,
    )
    assert r.status_code == 202, r.text
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count, row.attempt) == ("QUEUED", 0, 1)
    (again,) = await pull_jobs(live, k1)  # due at once
    assert (again["ID"], again["Attempt"]) == (job["ID"], 2)
    r = await live.post(
        f"{k1.base}/ack",
        json={"acks": [{"id": again["ID"], "type": "ack", "counted": False}]},
        headers=k1.auth,
    )
    assert r.status_code == 400 and "counted is only allowed with type nak" in r.text
    r = await live.post(
        f"{k1.base}/ack",
        json={"acks": [{"id": again["ID"], "type": "nak", "counted": False, "delay": 30}]},
        headers=k1.auth,
    )
    assert [(x["id"], x["status"]) for x in r.json()["Results"]] == [(again["ID"], 202)]
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count) == ("QUEUED", 0)
    assert await pull_jobs(live, k1) == []  # the delay holds it back


@pytest.mark.parametrize("given", ["abc", "-1", "1" * 20, "", 1.5, True, "١٢"])
async def test_job_ids_in_bodies_are_digit_strings_or_integers(
    live: httpx.AsyncClient, given: object
) -> None:
    (k1,) = await setup_channel(live)
    r = await live.post(
        f"{k1.base}/ack", json={"acks": [{"id": given, "type": "ack"}]}, headers=k1.auth
    )
    assert r.status_code == 400, r.text
    assert "id must be" in r.json()["detail"]
