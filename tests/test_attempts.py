"""Each job's attempt history: written by the statements that end an attempt (ack, nak, term,
lease expiry), trimmed to [ui] attempts-kept, on PostgreSQL and SQLite. The push outcomes'
entries are in tests/test_push.py's live run; the console shows them (tests/ui)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.runtime import Runtime
from app.store import attempts
from tests.helpers.pull import (
    PullConsumer,
    expire_leases,
    job_row,
    make_due,
    publish,
    pull_jobs,
    setup_channel,
)


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


@pytest.fixture
def three_kept(runtime: Runtime) -> Iterator[None]:
    """[ui] attempts-kept = 3, set after the runtime has set the configured value."""
    before = attempts.kept()
    attempts.keep(3)
    yield
    attempts.keep(before)


async def settle(client: httpx.AsyncClient, who: PullConsumer, job: Any, **body: Any) -> None:
    r = await client.post(f"{who.job(job['ID'])}/ack", json=body, headers=who.auth)
    assert r.status_code in (200, 202), r.text


async def history(runtime: Runtime, job_id: int | str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await job_row(runtime, job_id)).attempts or []
    return found


async def test_an_ack_ends_the_attempt_in_its_history(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    assert await history(runtime, job["ID"]) == []
    await settle(client, k1, job, type="ack", attempt=1)
    [entry] = await history(runtime, job["ID"])
    assert entry["outcome"] == "ack"
    assert entry["at"] > 1.7e9 and 0 <= entry["ms"] < 60_000
    # A batch ack writes one entry a job.
    await publish(client, "y", message_id="m2")
    await publish(client, "z", message_id="m3")
    jobs = await pull_jobs(client, k1, batch=2)
    acks = [{"id": j["ID"], "attempt": j["Attempt"]} for j in jobs]
    r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
    assert r.status_code == 200, r.text
    for j in jobs:
        assert [e["outcome"] for e in await history(runtime, j["ID"])] == ["ack"]


async def test_naks_terms_and_expiries_are_recorded(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    await settle(client, k1, job, type="nak", attempt=1)
    await make_due(runtime, [job["ID"]])
    [job] = await pull_jobs(client, k1)
    await expire_leases(runtime, [job["ID"]])
    assert await runtime.sweeps.sweep_all() == 1
    await make_due(runtime, [job["ID"]])
    [job] = await pull_jobs(client, k1)
    await settle(client, k1, job, type="term", reason="bad payload", attempt=3)
    entries = await history(runtime, job["ID"])
    assert [e["outcome"] for e in entries] == ["nak", "expired", "term"]
    assert entries[2]["error"] == "bad payload"
    assert entries[0]["at"] <= entries[1]["at"] <= entries[2]["at"]


@pytest.mark.usefixtures("three_kept")
async def test_the_history_keeps_the_last_attempts(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "x")
    for attempt in range(1, 6):
        [job] = await pull_jobs(client, k1)
        assert job["Attempt"] == attempt
        kind = "ack" if attempt == 5 else "nak"
        await settle(client, k1, job, type=kind, attempt=attempt)
        await make_due(runtime, [job["ID"]])
    entries = await history(runtime, job["ID"])
    assert [e["outcome"] for e in entries] == ["nak", "nak", "ack"]
    assert entries == sorted(entries, key=lambda e: e["at"])
