"""`GET /metrics` after a scripted workload: the job series equal the rows, requests are counted
by route template, waiting pulls show, and a scrape within the refresh interval reads nothing."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from sqlalchemy import text

from app import metrics as metrics_module
from app.runtime import Runtime
from app.store.migrate import head_revisions
from tests.helpers.metrics import scrape
from tests.helpers.pull import (
    CHANNEL,
    consumer_pk,
    expire_leases,
    publish,
    pull,
    pull_jobs,
    put_consumer,
    setup_channel,
    status_counts,
    until_waiting,
)


def jobs_of(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], consumer: str
) -> dict[str, float]:
    return {
        dict(labels)["status"]: value
        for (name, labels), value in samples.items()
        if name == "webhook_broker_jobs" and dict(labels)["consumer"] == consumer
    }


async def test_metrics_after_a_workload(
    client: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    k1, k2 = await setup_channel(client, "k1", "k2")
    for n in range(6):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=3)
    acks = [{"id": jobs[0]["ID"], "type": "ack"}, {"id": jobs[1]["ID"], "type": "term"}]
    r = await client.post(f"{k1.base}/ack", json={"acks": acks}, headers=k1.auth)
    assert r.status_code == 200, r.text
    runtime.metrics.snapshot.read_at = 0.0  # the counters are read again at the next scrape

    samples = await scrape(client)
    assert jobs_of(samples, "k1") == {"QUEUED": 3, "INFLIGHT": 1, "DELIVERED": 1, "DEAD": 1}
    assert jobs_of(samples, "k2") == {"QUEUED": 6}
    rows = await status_counts(runtime)
    assert sum(v for (n, _), v in samples.items() if n == "webhook_broker_jobs") == sum(
        rows.values()
    )
    oldest = samples[
        (
            "webhook_broker_oldest_queued_job_age_seconds",
            (("channel", CHANNEL), ("consumer", "k2")),
        )
    ]
    assert 0 <= oldest < 60
    pull_route = "/channel/{channel_id}/consumer/{consumer_id}/pull"
    assert (
        samples[
            (
                "webhook_broker_http_requests_total",
                (("method", "POST"), ("route", pull_route), ("status", "200")),
            )
        ]
        == 1
    )
    assert (
        "webhook_broker_http_request_duration_seconds_count",
        (("method", "POST"), ("route", pull_route)),
    ) in samples
    assert ("process_cpu_seconds_total", ()) in samples
    transitions = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "webhook_broker_transitions_total"
    }
    assert transitions == {"publish": 12, "claim": 3, "ack": 1, "term": 1}
    claims = ("webhook_broker_statement_duration_seconds_count", (("statement", "claim"),))
    assert samples[claims] >= 1
    for who in ("k1", "k2"):  # the ledger balanced (every way out of it: tests/test_ledger.py)
        labels = (("channel", CHANNEL), ("consumer", who))
        assert samples[("webhook_broker_ledger_published_jobs", labels)] == 6
        assert samples[("webhook_broker_ledger_unaccounted_jobs", labels)] == 0

    # A long poll waiting shows; the job counts are not read again within the interval.
    k3 = await put_consumer(client, "k3")  # made after the publishes: nothing queued
    waiting = asyncio.create_task(pull(client, k3, batch=10, expires=30))
    await until_waiting(runtime, await consumer_pk(runtime, "k3"))
    reads = 0
    original = runtime.job_status.by_consumer

    async def counted() -> object:
        nonlocal reads
        reads += 1
        return await original()

    monkeypatch.setattr(runtime.job_status, "by_consumer", counted)
    samples = await scrape(client)
    assert samples[("webhook_broker_pulls_waiting", ())] >= 1
    assert reads == 0 and metrics_module.JOBS_FOR >= 1
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def test_ready_and_status_say_whether_the_schema_is_current(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    status = (await client.get("/_status")).json()
    assert status["database"]["schema"] == "current"
    ready = await client.get("/_ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "reasons": []}

    head = max(head_revisions(runtime.config.database))  # the newest's number is the highest
    async with runtime.db.transaction() as tx:
        await tx.conn.execute(
            text(f"UPDATE alembic_version SET version_num = 'older' WHERE version_num = '{head}'")
        )
    ready = await client.get("/_ready")
    assert ready.status_code == 503
    assert ready.json()["reasons"][0].startswith("schema not current")
    assert (await client.get("/_status")).status_code == 200  # alive, just not ready
    async with runtime.db.transaction() as tx:
        await tx.conn.execute(
            text(f"UPDATE alembic_version SET version_num = '{head}' WHERE version_num = 'older'")
        )
    assert (await client.get("/_ready")).status_code == 200


async def test_ready_fails_while_draining(client: httpx.AsyncClient, runtime: Runtime) -> None:
    assert (await client.get("/_ready")).status_code == 200
    runtime.begin_draining()
    ready = await client.get("/_ready")
    assert ready.status_code == 503 and ready.json()["reasons"] == ["draining"]


async def test_lease_expiries_and_redrives_are_counted(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client, "k1")
    for n in range(3):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=2)
    await expire_leases(runtime, [j["ID"] for j in jobs])
    assert await runtime.sweeps.sweep_once() == 2
    samples = await scrape(client)
    assert samples[("webhook_broker_transitions_total", (("kind", "lease_expiry_requeue"),))] == 2
    assert ("webhook_broker_transitions_total", (("kind", "dead_letter"),)) not in samples


async def test_pull_waits_are_timed_by_transport_and_ending(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    pk = await consumer_pk(runtime, "k1")
    r = await pull(client, k1, batch=5, expires=0.3)  # nothing comes: it expires
    assert r.status_code == 200 and r.json()["Jobs"] == []
    waiting = asyncio.create_task(pull(client, k1, batch=5, expires=30))
    await until_waiting(runtime, pk)
    await publish(client, "wake")
    assert len((await waiting).json()["Jobs"]) == 1  # a long poll ends with its first job

    samples = await scrape(client)

    def wait(outcome: str, suffix: str) -> float:
        labels = (("outcome", outcome), ("transport", "http"))
        return samples[(f"webhook_broker_pull_wait_seconds_{suffix}", labels)]

    assert wait("expired", "count") == 1
    assert 0.25 <= wait("expired", "sum") < 5
    assert wait("delivered", "count") == 1
    assert samples[("webhook_broker_pull_jobs_total", (("transport", "http"),))] == 1


@pytest.mark.parametrize(
    "extra_config", ["[broker]\nmax-retry=1\nretry-backoff-delays-in-seconds=1\n"], ids=["config"]
)
async def test_naks_and_a_dead_letter_are_counted_and_the_ledger_stays_balanced(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    (k1,) = await setup_channel(client)
    await publish(client, "m0")
    for attempt in (1, 2):  # the second nak finds the retries used up: a dead letter
        [job] = await pull_jobs(client, k1)
        r = await client.post(
            k1.job(job["ID"]) + "/ack",
            json={"type": "nak", "delay": 0, "attempt": attempt},
            headers=k1.auth,
        )
        assert r.status_code == 202, r.text
    runtime.metrics.snapshot.read_at = 0.0
    samples = await scrape(client)
    transitions = {
        dict(labels)["kind"]: value
        for (name, labels), value in samples.items()
        if name == "webhook_broker_transitions_total"
    }
    assert transitions == {"publish": 1, "claim": 2, "nak": 2, "dead_letter": 1}
    assert jobs_of(samples, "k1") == {"DEAD": 1}
    labels = (("channel", CHANNEL), ("consumer", "k1"))
    assert samples[("webhook_broker_ledger_published_jobs", labels)] == 1
    assert samples[("webhook_broker_ledger_unaccounted_jobs", labels)] == 0
