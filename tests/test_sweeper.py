"""The requeue sweep: expired leases back to QUEUED due at once, or DEAD after max-retry; and
the sweeper's pause, which ends as the earliest lease does."""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import httpx
import pytest

from app.runtime import Runtime
from app.services.sweeping import SweepService
from app.store import upkeep
from app.sweeper.runner import MIN_PAUSE, VACUUM_SPACING, Sweeper, next_vacuum_at
from tests.helpers.pull import (
    PullConsumer,
    consumer_pk,
    expire_leases,
    job_row,
    job_rows,
    publish,
    publish_many,
    pull,
    pull_jobs,
    put_consumer,
    setup_channel,
    status_counts,
    until_waiting,
)
from tests.helpers.waiting import eventually


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


def seconds(later: object, earlier: object) -> float:
    delta = later - earlier  # type: ignore[operator]
    return float(delta.total_seconds())


async def expire_and_sweep(runtime: Runtime, job_id: int) -> None:
    await expire_leases(runtime, [job_id])
    assert await runtime.sweeps.sweep_all() == 1


@pytest.mark.parametrize(
    ("extra_config", "max_retry"),
    [("", 5), ("[broker]\nretry-backoff-delays-in-seconds=2,7\nmax-retry=4\n", 4)],
    ids=["defaults", "2,7"],
)
async def test_every_lapse_is_offered_again_at_once_then_the_job_dies(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, max_retry: int
) -> None:
    """The lease was the wait (as a JetStream ack wait, an SQS visibility timeout): a lapsed
    job counts a retry but is due at once, whatever the backoff a nak would wait."""
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    for retry in range(1, max_retry + 1):
        await expire_and_sweep(runtime, job["ID"])
        row = await job_row(runtime, job["ID"])
        assert (row.status, row.retry_count, row.timeout_count) == ("QUEUED", retry, retry)
        assert row.lease_expires_at is None
        assert row.earliest_next_attempt_at == row.status_changed_at
        [again] = await pull_jobs(client, k1)
        assert again["Attempt"] == retry + 1
    await expire_and_sweep(runtime, job["ID"])
    row = await job_row(runtime, job["ID"])
    assert (row.status, row.retry_count) == ("DEAD", max_retry)
    assert "lease expired" in row.dead_reason
    dlq = (await client.get(f"{k1.base}/dlq", headers=k1.auth)).json()["DeadJobs"]
    assert [d["ID"] for d in dlq] == [str(job["ID"])]


@pytest.mark.parametrize("extra_config", ["[broker]\nmax-retry=0\n"], ids=["config"])
async def test_no_retries_means_the_first_expiry_dead_letters(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    await expire_and_sweep(runtime, job["ID"])
    assert (await job_row(runtime, job["ID"])).status == "DEAD"


async def test_sweep_leaves_live_leases_and_other_states_alone(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(5):
        await publish(client, f"m{n}")
    jobs = await pull_jobs(client, k1, batch=4)
    ids = [j["ID"] for j in jobs]
    r = await client.post(f"{k1.job(ids[0])}/ack", json={}, headers=k1.auth)
    assert r.status_code == 202
    r = await client.post(f"{k1.job(ids[1])}/ack", json={"type": "term"}, headers=k1.auth)
    assert r.status_code == 202
    before = {str(row.id): row for row in await job_rows(runtime)}
    # ids[2] expired, ids[3] still leased (32 s), and one job still queued.
    await expire_leases(runtime, [ids[2]])
    assert await runtime.sweeps.sweep_all() == 1
    after = {str(row.id): row for row in await job_rows(runtime)}
    assert after[ids[2]].status == "QUEUED"
    for job_id, row in before.items():
        if job_id != ids[2]:
            assert after[job_id] == row
    assert await runtime.sweeps.sweep_all() == 0


@pytest.mark.parametrize("extra_config", ["[pull]\nsweep-batch-size=3\n"], ids=["config"])
async def test_sweep_moves_bounded_batches(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    for n in range(10):
        await publish(client, f"m{n}")
    ids = [j["ID"] for j in await pull_jobs(client, k1, batch=10)]
    await expire_leases(runtime, ids)
    assert await runtime.sweeps.sweep_once() == 3
    assert (await status_counts(runtime)) == {"QUEUED": 3, "INFLIGHT": 7}
    assert await runtime.sweeps.sweep_all() == 7
    assert (await status_counts(runtime)) == {"QUEUED": 10}


async def test_concurrent_sweepers_split_the_work(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, backend: str
) -> None:
    """Two sweepers with their own engines (two processes) never move the same job twice."""
    total = 400
    await publish_many(runtime, total)
    ids = []
    while batch := await pull_jobs(client, k1, batch=200):
        ids += [j["ID"] for j in batch]
    assert len(ids) == total
    await expire_leases(runtime, ids)
    other = Runtime(runtime.config)
    await other.start(seed=False)
    try:
        sweepers = [
            SweepService(runtime.db, runtime.config.broker.retry_policy, 7),
            SweepService(runtime.db, runtime.config.broker.retry_policy, 7),
            SweepService(other.db, runtime.config.broker.retry_policy, 11),
            SweepService(other.db, runtime.config.broker.retry_policy, 11),
        ]
        moved = await asyncio.gather(*(s.sweep_all() for s in sweepers))
    finally:
        await other.stop()
    print(f"\n{backend}: sweepers moved {moved}")
    assert sum(moved) == total
    rows = await job_rows(runtime)
    assert {(r.status, r.retry_count, r.timeout_count) for r in rows} == {("QUEUED", 1, 1)}


@pytest.mark.parametrize(
    "extra_config", ["[broker]\nretry-backoff-delays-in-seconds=30\n"], ids=["config"]
)
async def test_sweep_wakes_a_waiting_pull(client: httpx.AsyncClient, runtime: Runtime) -> None:
    """The waiter saw nothing queued, so only the sweep's wake-up tells it to look again."""
    [k1] = await setup_channel(client, "k1")
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    waiting = asyncio.create_task(pull(client, k1, expires=25))
    await until_waiting(runtime, await consumer_pk(runtime, "k1"))
    await asyncio.sleep(0.2)
    await expire_leases(runtime, [job["ID"]])
    assert await runtime.sweeps.sweep_all() == 1
    swept = time.monotonic()
    r = await asyncio.wait_for(waiting, timeout=15)
    elapsed = time.monotonic() - swept
    assert [(j["ID"], j["Attempt"]) for j in r.json()["Jobs"]] == [(job["ID"], 2)]
    assert elapsed < 10  # woken by the sweep, and no 30 s backoff to wait out


@pytest.mark.parametrize(
    "extra_config",
    ["[broker]\nrational-delay-in-seconds=1\nretry-backoff-delays-in-seconds=30\nmax-retry=1\n"],
    ids=["config"],
)
async def test_sweeper_loop_requeues_and_dead_letters_on_its_own(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    [k1] = await setup_channel(client, "k1", ackWait="1")
    await publish(client, "x")
    stop = asyncio.Event()
    sweeper = Sweeper(runtime.sweeps, runtime.config.broker.rational_delay_seconds)
    task = asyncio.create_task(sweeper.run(stop))
    try:
        # Lease 1 s from the claim, which falls between these two readings: the job comes back
        # as attempt 2 a second after the first at the least, without the 30 s backoff. (Timed
        # from the answer alone, a slow answer made the second look early: 0.77 s in CI.)
        claiming = time.monotonic()
        [first] = await pull_jobs(client, k1)
        started = time.monotonic()
        [second] = await pull_jobs(client, k1, no_wait=False, expires=15)
        assert second["Attempt"] == 2
        back = time.monotonic()
        assert back - claiming >= 0.9
        assert back - started < 10
        assert first["ID"] == second["ID"]
        # Attempt 2 expires too, and with max-retry=1 the sweeper dead-letters it.

        async def dead() -> bool:
            return bool((await job_row(runtime, first["ID"])).status == "DEAD")

        await eventually(dead, 15, 0.2, what="attempt 2 dead-lettered")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    row = await job_row(runtime, first["ID"])
    assert (row.retry_count, row.timeout_count) == (1, 2)


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize(
    "extra_config",
    ["[broker]\nrational-delay-in-seconds=1\nretry-backoff-delays-in-seconds=30\n"],
    ids=["config"],
)
async def test_sweeper_process_wakes_pulls_of_another_process(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """A separate sweeper process (its own Runtime) wakes the puller of this one by NOTIFY.

    SQLite has no cross-process wake-ups: there, the sweeper runs in the serving process.
    """
    [k1] = await setup_channel(client, "k1", ackWait="1")
    await publish(client, "x")
    [first] = await pull_jobs(client, k1)
    sweeper = Runtime(runtime.config, run_sweeper=True)
    await sweeper.start(seed=False)
    try:
        [again] = await pull_jobs(client, k1, no_wait=False, expires=15)
    finally:
        await sweeper.stop()
    assert (again["ID"], again["Attempt"]) == (first["ID"], 2)


@pytest.mark.parametrize(
    "extra_config", ["[broker]\nrational-delay-in-seconds=20\n"], ids=["interval-20"]
)
async def test_the_sweepers_pause_ends_with_the_earliest_lease(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    sweeper = Sweeper(runtime.sweeps, runtime.config.broker.rational_delay_seconds)
    [k1] = await setup_channel(client, "k1")
    assert await sweeper._pause() == 20  # nothing in flight, no ack wait of its own
    k2 = await put_consumer(client, "k2", ackWait="7")
    assert await sweeper._pause() == 7  # a claim may start a 7 s lease at any moment
    await publish(client, "x")
    await pull_jobs(client, k2)
    assert 6 < await sweeper._pause() <= 7.01  # that lease ends first
    await expire_leases(runtime, [j.id for j in await job_rows(runtime) if j.status == "INFLIGHT"])
    assert await sweeper._pause() == MIN_PAUSE  # already over: soon, but never a spin


async def test_vacuum_waits_for_enough_dead_jobs_then_runs(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime, backend: str
) -> None:
    if backend != "postgresql":
        assert not await runtime.sweeps.vacuum_if_needed(0)  # SQLite has nothing to vacuum
        return
    assert not await runtime.sweeps.vacuum_if_needed(10**9)
    for n in range(20):
        await publish(client, f"m{n}")
    await pull_jobs(client, k1, batch=20)  # each claim leaves a dead row version behind
    # Backends report their statistics within seconds, not at once.
    await eventually(
        lambda: runtime.sweeps.vacuum_if_needed(20),
        20,
        0.2,
        what="the dead jobs showing in pg_stat_user_tables",
    )
    rows = await runtime.db.run_alone(
        # The partition taking jobs (the partitioned table itself keeps no statistics).
        "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job_p0'",
        {},
    )
    assert rows[0][0] >= 1
    assert rows[0][1] < 20


def test_the_next_vacuum_waits_eight_roots_of_the_last_ones_length() -> None:
    assert next_vacuum_at(100.0, 100.0) == 100.0  # nothing to wait for
    assert next_vacuum_at(100.0, 100.12) == pytest.approx(100.0 + 8 * 0.12**0.5)  # 2.77 s
    assert next_vacuum_at(100.0, 103.0) == pytest.approx(100.0 + 8 * 3**0.5)  # 13.9 s
    assert next_vacuum_at(100.0, 200.0) == 200.0  # longer than its spacing: at once after


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_the_sweeper_spaces_its_vacuums(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked to look every 10 ms with nothing needed dead, and finding a dead row each time
    (the count made up here), the sweeper would vacuum without pause; each vacuum (real, timed
    here around the service call) starts at least 8 sqrt(V) after the one before, V being that
    one's length."""
    runs: list[tuple[float, float]] = []
    vacuum = runtime.sweeps.vacuum_if_needed

    async def one_dead(db: object) -> dict[str, int]:
        return {"job_p0": 1}

    monkeypatch.setattr(upkeep, "dead_jobs", one_dead)

    async def timed(min_dead_jobs: int) -> bool:
        started = time.monotonic()
        done = await vacuum(min_dead_jobs)
        runs.append((started, time.monotonic()))
        return done

    monkeypatch.setattr(runtime.sweeps, "vacuum_if_needed", timed)
    sweeper = Sweeper(
        runtime.sweeps,
        runtime.config.broker.rational_delay_seconds,
        vacuum_interval_seconds=0.01,
        vacuum_min_dead_jobs=0,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sweeper.run(stop))
    await eventually(lambda: len(runs) >= 3, 60, what="three sweeper runs")
    stop.set()
    await task
    for (started, ended), (next_started, _) in itertools.pairwise(runs[:3]):
        # The sweeper's own clock readings sit just outside these (a millisecond at most).
        assert next_started - started >= VACUUM_SPACING * math.sqrt(ended - started) - 0.001
