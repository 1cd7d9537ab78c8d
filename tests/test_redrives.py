"""Redrives against a real broker process (`serve` runs the redrive runner beside the
sweeper): dead jobs moved back to the queue at the asked rate, never faster, cancellable
halfway; DELIVERED jobs replayed; time ranges; bad requests refused with a reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, func, insert, select

from app.config import load_config_text
from app.store.migrate import sync_url
from app.store.schema import consumer, job, message
from tests.helpers.metrics import pulls_waiting
from tests.helpers.processes import BrokerProcess, Setup, channel_with_consumer
from tests.helpers.waiting import eventually

AUTH = {"X-Broker-Channel-Token": "orders-token", "X-Broker-Consumer-Token": "billing-token"}


@pytest.fixture
def process(rdbms: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker.cfg"
    config.write_text(rdbms)
    broker = BrokerProcess(config)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def url(rdbms: str) -> str:
    return sync_url(load_config_text(rdbms).database)


def add_jobs(url: str, made: Setup, count: int, status: str, changed_at: datetime) -> None:
    """`count` messages of the test's channel with one job each in `status`, straight into the
    database (publishing and failing 10,000 jobs through the API would take the test's time)."""
    engine = create_engine(url, connect_args={"timeout": 30} if url.startswith("sqlite") else {})
    try:
        with engine.begin() as conn:
            pk = conn.execute(
                select(consumer.c.pk).where(
                    consumer.c.channel_id == made.channel, consumer.c.consumer_id == "billing"
                )
            ).scalar_one()
            first = conn.execute(select(func.coalesce(func.max(message.c.pk), 0))).scalar_one()
            tag = f"{status}-{changed_at.timestamp():.0f}"
            conn.execute(
                insert(message),
                [
                    {
                        "channel_id": made.channel,
                        "message_id": f"{tag}-{n}",
                        "producer_id": "shop",
                        "payload": b"x",
                        "content_type": "text/plain",
                        "priority": 0,
                        "headers": {},
                        "received_at": changed_at,
                    }
                    for n in range(count)
                ],
            )
            pks = conn.execute(
                select(message.c.pk).where(
                    message.c.pk > first, message.c.message_id.like(f"{tag}-%")
                )
            ).scalars()
            conn.execute(
                insert(job),
                [
                    {
                        "message_pk": m,
                        "consumer_pk": pk,
                        "status": status,
                        "payload_size": 1,
                        "attempt": 1,
                        "retry_count": 5,
                        "earliest_next_attempt_at": changed_at,
                        "status_changed_at": changed_at,
                        "created_at": changed_at,
                        "dead_reason": "retries exhausted" if status == "DEAD" else None,
                    }
                    for m in pks
                ],
            )
    finally:
        engine.dispose()


async def counts(made: Setup) -> dict[str, int]:
    body = (await made.broker.http.get("/job-status")).json()
    return {e["status"]: e["count"] for e in body.get(made.channel, {}).get("billing", [])}


async def start(made: Setup, **body: Any) -> httpx.Response:
    return await made.broker.http.post(
        f"/channel/{made.channel}/consumer/billing/redrives", json=body, headers=AUTH
    )


async def watch(made: Setup, location: str) -> dict[str, Any]:
    r = await made.broker.http.get(location, headers=AUTH)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_ten_thousand_dead_jobs_at_a_thousand_a_second_cancelled_halfway(
    process: BrokerProcess, url: str
) -> None:
    async with channel_with_consumer(process, {}) as made:
        add_jobs(url, made, 10_000, "DEAD", datetime.now(UTC))
        r = await start(made, perSecond=1000)
        began = time.monotonic()
        assert r.status_code == 202, r.text
        location = r.headers["Location"]
        assert r.json()["Links"]["self"] == location
        assert (r.json()["Status"], r.json()["Total"], r.json()["From"]) == (
            "RUNNING",
            10_000,
            "DEAD",
        )
        moved = 0
        while moved < 5000:
            await asyncio.sleep(0.25)
            seen = await watch(made, location)
            elapsed = time.monotonic() - began
            moved = seen["Moved"]
            # never faster than asked (a chunk, 100 jobs, may go ahead of the clock)
            assert moved <= 1000 * elapsed + 100, (moved, elapsed)
            assert elapsed < 60, f"the redrive stalled at {moved}"
        r = await made.broker.http.delete(location, headers=AUTH)
        assert r.status_code == 200, r.text
        cancelled = r.json()
        assert cancelled["Status"] == "CANCELLED" and cancelled["FinishedAt"] is not None
        # it moved about half, at about the rate: 5,000 in about five seconds
        assert 5000 <= cancelled["Moved"] < 10_000
        await asyncio.sleep(0.5)  # time passes on purpose: a chunk in flight would show here
        assert (await watch(made, location))["Moved"] == cancelled["Moved"]
        assert await counts(made) == {
            "QUEUED": cancelled["Moved"],
            "DEAD": 10_000 - cancelled["Moved"],
        }
        again = await made.broker.http.delete(location, headers=AUTH)
        assert again.status_code == 409 and "CANCELLED" in again.json()["detail"]
        listed = await made.broker.http.get(
            f"/channel/{made.channel}/consumer/billing/redrives", headers=AUTH
        )
        assert [item["ID"] for item in listed.json()["Result"]] == [cancelled["ID"]]
        # the jobs it moved are ordinary queued jobs again, with a fresh retry budget
        jobs = await made.consumer.fetch(10, expires=5)
        assert len(jobs) == 10


async def test_a_redrive_runs_to_completion_and_wakes_a_waiting_pull(
    process: BrokerProcess, url: str
) -> None:
    async with channel_with_consumer(process, {}) as made:
        add_jobs(url, made, 300, "DEAD", datetime.now(UTC))
        waiting = asyncio.create_task(made.consumer.fetch(300, expires=20))

        async def pull_waiting() -> bool:
            return await pulls_waiting(made.broker.http) == 1

        await eventually(pull_waiting, what="the pull waiting in the broker")
        r = await start(made, perSecond=1000)
        assert r.status_code == 202, r.text
        jobs = await waiting
        assert jobs, "the waiting pull was not woken by the redrive"
        location = r.headers["Location"]

        async def finished() -> dict[str, Any]:
            seen = await watch(made, location)
            assert seen["Status"] != "RUNNING", seen
            return seen

        seen = await eventually(finished, 20, 0.1, what="the redrive finished")
        assert (seen["Status"], seen["Moved"], seen["Total"]) == ("COMPLETED", 300, 300)
        assert seen["FinishedAt"] is not None
        assert "DEAD" not in await counts(made)


async def test_a_time_range_and_a_replay_of_delivered_jobs(
    process: BrokerProcess, url: str
) -> None:
    async with channel_with_consumer(process, {}) as made:
        now = datetime.now(UTC)
        add_jobs(url, made, 30, "DELIVERED", now - timedelta(hours=3))
        add_jobs(url, made, 20, "DELIVERED", now - timedelta(hours=1))
        add_jobs(url, made, 10, "DEAD", now - timedelta(hours=1))
        since = (now - timedelta(hours=2)).isoformat()
        r = await start(
            made, since=since, until=now.isoformat(), perSecond=500, **{"from": "DELIVERED"}
        )
        assert r.status_code == 202, r.text
        assert r.json()["Total"] == 20
        location = r.headers["Location"]

        async def completed() -> dict[str, Any]:
            seen = await watch(made, location)
            assert seen["Status"] == "COMPLETED", seen
            return seen

        seen = await eventually(completed, 20, 0.1, what="the redrive completed")
        assert seen["Moved"] == 20
        assert await counts(made) == {"QUEUED": 20, "DELIVERED": 30, "DEAD": 10}


async def test_bad_redrive_requests_are_refused_with_a_reason(process: BrokerProcess) -> None:
    async with channel_with_consumer(process, {}) as made:
        base = f"/channel/{made.channel}/consumer/billing/redrives"
        http = made.broker.http
        for body, why in (
            ({"from": "QUEUED"}, "from must be DEAD or DELIVERED"),
            ({"perSecond": 0}, "perSecond must be an integer from 1"),
            ({"perSecond": 1.5}, "perSecond must be an integer from 1"),
            ({"since": "yesterday"}, "since must be an RFC 3339 time"),
            ({"until": "2026-01-01T00:00:00"}, "until must be an RFC 3339 time with an offset"),
            (
                {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                "since must be before until",
            ),
            ({"rate": 5}, "unknown field(s) rate"),
        ):
            r = await http.post(base, json=body, headers=AUTH)
            assert r.status_code == 400, (body, r.text)
            assert why in r.json()["detail"], (body, r.text)
        r = await http.post(base, content=b"[1]", headers=AUTH)
        assert r.status_code == 400
        wrong = {**AUTH, "X-Broker-Consumer-Token": "nope"}
        assert (await http.post(base, json={"from": "QUEUED"}, headers=wrong)).status_code == 403
        assert (await http.get(f"{base}/12345", headers=AUTH)).status_code == 404
        assert (await http.delete(f"{base}/12345", headers=AUTH)).status_code == 404
        assert (await http.get(f"{base}/abc", headers=AUTH)).status_code == 400
        empty = await http.post(base, headers=AUTH)  # no body: every dead job, 500 a second
        assert empty.status_code == 202 and empty.json()["PerSecond"] == 500
