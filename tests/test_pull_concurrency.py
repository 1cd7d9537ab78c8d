"""Many pullers at once: every job claimed exactly once, and a bounded chaos run that ends clean."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.runtime import Runtime
from app.sweeper.runner import Sweeper
from tests.helpers.pull import (
    PullConsumer,
    job_rows,
    publish_many,
    pull,
    setup_channel,
    status_counts,
)
from tests.helpers.waiting import eventually

PULLERS = 50
JOBS = 2000


async def test_fifty_pullers_drain_two_thousand_jobs_exactly_once(
    client: httpx.AsyncClient, runtime: Runtime, backend: str
) -> None:
    [k1] = await setup_channel(client, "k1")
    started = time.monotonic()
    await publish_many(runtime, JOBS, concurrency=16)
    published = time.monotonic()
    claimed: list[str] = []
    oversized: list[tuple[int, int]] = []
    statuses: Counter[int] = Counter()

    async def puller(n: int) -> None:
        rng = random.Random(n)
        while True:
            batch = rng.randint(1, 20)
            # Half the pullers long-poll briefly, half never wait.
            body: dict[str, Any] = {"batch": batch, "no_wait": n % 2 == 0, "expires": 0.2}
            r = await pull(client, k1, **body)
            statuses[r.status_code] += 1
            if r.status_code != 200:
                return
            jobs = r.json()["Jobs"]
            if len(jobs) > batch:
                oversized.append((batch, len(jobs)))
            claimed.extend(j["ID"] for j in jobs)
            assert all(j["Attempt"] == 1 for j in jobs)
            if not jobs and r.json()["Pending"] == 0:
                return

    await asyncio.wait_for(asyncio.gather(*(puller(n) for n in range(PULLERS))), timeout=120)
    done = time.monotonic()
    print(
        f"\n{backend}: published {JOBS} in {published - started:.1f}s, "
        f"{PULLERS} pullers drained them in {done - published:.1f}s ({dict(statuses)})"
    )
    assert set(statuses) == {200}
    assert oversized == []
    duplicates = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert duplicates == []
    assert len(claimed) == JOBS
    rows = await job_rows(runtime)
    assert {str(row.id) for row in rows} == set(claimed)
    assert {(row.status, row.attempt) for row in rows} == {("INFLIGHT", 1)}


# -- chaos -----------------------------------------------------------------------------------------

CHAOS_CONFIG = (
    "[broker]\nretry-backoff-delays-in-seconds=1\nmax-retry=2\nrational-delay-in-seconds=1\n"
)
CONSUMERS = 3
MESSAGES = 1667  # x 3 consumers = 5001 jobs
WORKERS = 16


@dataclass
class Ledger:
    """What the workers saw, to check against the database at the end."""

    claims: list[tuple[str, int]] = field(default_factory=list)
    latest: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))
    term_reasons: dict[str, str] = field(default_factory=dict)
    stale_accepted: list[tuple[str, str, int]] = field(default_factory=list)
    stale_refused: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    zombies: list[tuple[PullConsumer, str, int, float]] = field(default_factory=list)

    def claimed(self, jobs: list[dict[str, Any]]) -> None:
        for job in jobs:
            self.claims.append((job["ID"], job["Attempt"]))
            self.latest[job["ID"]] = max(self.latest.get(job["ID"], 0), job["Attempt"])

    def is_stale(self, job_id: str, attempt: int) -> bool:
        return self.latest[job_id] > attempt

    def outcome(self, kind: str, job_id: str, attempt: int, stale: bool, status: int) -> None:
        if status == 202:
            self.accepted[kind].append((job_id, attempt))
            if stale:
                self.stale_accepted.append((kind, job_id, attempt))
        elif stale and status == 409:
            self.stale_refused += 1


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize("extra_config", [CHAOS_CONFIG], ids=["config"])
async def test_chaos_every_job_ends_delivered_or_dead(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    consumers = await setup_channel(client, *(f"k{n}" for n in range(CONSUMERS)), ackWait="1")
    for who in consumers:
        assert (await client.get(who.base)).json()["AckWait"] == 1
    t0 = time.monotonic()
    await publish_many(runtime, MESSAGES, concurrency=16)
    total = MESSAGES * CONSUMERS
    t_published = time.monotonic()

    ledger = Ledger()
    finished = asyncio.Event()

    async def send_acks(who: PullConsumer, items: list[dict[str, Any]], rng: random.Random) -> None:
        stale = {item["id"]: ledger.is_stale(item["id"], item["attempt"]) for item in items}
        # Now and then a few items go one by one through the single-job endpoint.
        singles = items[: rng.randint(1, 3)] if rng.random() < 0.2 or len(items) == 1 else []
        batched = items[len(singles) :]
        if batched:
            r = await client.post(f"{who.base}/ack", json={"acks": batched}, headers=who.auth)
            ledger.statuses[r.status_code] += 1
            assert r.status_code == 200, r.text
            for item, result in zip(batched, r.json()["Results"], strict=True):
                assert result["id"] == item["id"]
                ledger.outcome(
                    item["type"], item["id"], item["attempt"], stale[item["id"]], result["status"]
                )
        for item in singles:
            body = {k: v for k, v in item.items() if k != "id"}
            r = await client.post(f"{who.job(item['id'])}/ack", json=body, headers=who.auth)
            ledger.statuses[r.status_code] += 1
            assert r.status_code in (202, 409), r.text
            ledger.outcome(
                item["type"], item["id"], item["attempt"], stale[item["id"]], r.status_code
            )

    async def slow_ack(who: PullConsumer, job: dict[str, Any], rng: random.Random) -> None:
        await asyncio.sleep(rng.uniform(1.2, 2.5))  # past the 1 s lease
        item = {"id": job["ID"], "type": "ack", "attempt": job["Attempt"]}
        await send_acks(who, [item], rng)

    async def wake_zombies(rng: random.Random) -> None:
        old = time.monotonic() - 2.5
        if not ledger.zombies or ledger.zombies[0][3] > old:
            return
        who = ledger.zombies[0][0]
        mine = [z for z in ledger.zombies if z[0] is who and z[3] <= old][:20]
        for zombie in mine:
            ledger.zombies.remove(zombie)
        await send_acks(who, [{"id": j, "type": "ack", "attempt": a} for _, j, a, _ in mine], rng)

    async def worker(n: int) -> None:
        rng = random.Random(1000 + n)
        slow: list[asyncio.Task[None]] = []
        while not finished.is_set():
            who = consumers[rng.randrange(CONSUMERS)]
            r = await pull(client, who, batch=rng.randint(5, 50), expires=0.5)
            ledger.statuses[r.status_code] += 1
            assert r.status_code == 200, r.text
            jobs = r.json()["Jobs"]
            ledger.claimed(jobs)
            items: list[dict[str, Any]] = []
            for job in jobs:
                roll = rng.random()
                base = {"id": job["ID"], "attempt": job["Attempt"]}
                if roll < 0.45:
                    items.append({**base, "type": "ack"})
                elif roll < 0.60:
                    delay = rng.choice([None, 0, 0.5])
                    items.append(
                        {**base, "type": "nak", **({} if delay is None else {"delay": delay})}
                    )
                elif roll < 0.68:
                    reason = f"term by worker {n}"
                    ledger.term_reasons[job["ID"]] = reason
                    items.append({**base, "type": "term", "reason": reason})
                elif roll < 0.72:
                    slow.append(asyncio.create_task(slow_ack(who, job, rng)))
                else:  # vanish: never ack, and maybe come back much later as a zombie
                    ledger.zombies.append((who, job["ID"], job["Attempt"], time.monotonic()))
            if items:
                await send_acks(who, items, rng)
            # Now and then workers that vanished wake up and ack their long-lost jobs.
            await wake_zombies(rng)
        await asyncio.gather(*slow)

    async def monitor() -> None:
        async def settled() -> bool:
            counts = await status_counts(runtime)
            assert counts.get("QUEUED", 0) + counts.get("INFLIGHT", 0) == 0, counts
            return True

        await eventually(settled, 90, 0.5, what="no job queued or in flight")
        finished.set()

    stop = asyncio.Event()
    first_sweeper = asyncio.create_task(
        Sweeper(runtime.sweeps, runtime.config.broker.rational_delay_seconds).run(stop)
    )
    # The second sweeper is another process: its own engine, signals and NOTIFY listener.
    second = Runtime(runtime.config, run_sweeper=True)
    await second.start(seed=False)
    try:
        await asyncio.gather(monitor(), *(worker(n) for n in range(WORKERS)))
    finally:
        stop.set()
        await first_sweeper
        await second.stop()
    t_done = time.monotonic()

    rows = await job_rows(runtime)
    by_id = {str(row.id): row for row in rows}
    counts = Counter(row.status for row in rows)
    accepted_acks = ledger.accepted["ack"]
    print(
        f"\nchaos: {total} jobs published in {t_published - t0:.1f}s, settled in "
        f"{t_done - t_published:.1f}s; {dict(counts)}; {len(ledger.claims)} claims; "
        f"accepted { ({k: len(v) for k, v in ledger.accepted.items()}) }; "
        f"stale acks refused {ledger.stale_refused}; statuses {dict(ledger.statuses)}"
    )
    assert len(rows) == total
    assert set(counts) <= {"DELIVERED", "DEAD"}
    assert not set(ledger.statuses) - {200, 202, 409}
    # Fencing: no ack for an attempt older than one already handed out was accepted.
    assert ledger.stale_accepted == []
    assert ledger.stale_refused > 0  # the run did exercise stale acks
    # Every accepted ack delivered exactly one job, under the attempt the job ended on.
    assert len(accepted_acks) == counts["DELIVERED"]
    assert {job_id for job_id, _ in accepted_acks} == {
        str(row.id) for row in rows if row.status == "DELIVERED"
    }
    for job_id, attempt in accepted_acks:
        assert by_id[job_id].attempt == attempt
    # Each claim was handed out once, attempts count up from 1 without gaps.
    assert len(set(ledger.claims)) == len(ledger.claims)
    attempts: defaultdict[str, list[int]] = defaultdict(list)
    for job_id, attempt in ledger.claims:
        attempts[job_id].append(attempt)
    assert set(attempts) == set(by_id)
    for job_id, seen in attempts.items():
        assert sorted(seen) == list(range(1, len(seen) + 1))
        assert by_id[job_id].attempt == len(seen)
        assert len(seen) <= 3  # max-retry=2: the third failure dead-letters
        assert by_id[job_id].retry_count <= 2
    # Each attempt ended at most once, whatever ended it.
    ended = [pair for kind in ("ack", "nak", "term") for pair in ledger.accepted[kind]]
    assert len(set(ended)) == len(ended)
    for job_id, _ in ledger.accepted["term"]:
        assert by_id[job_id].status == "DEAD"
        assert by_id[job_id].dead_reason == ledger.term_reasons[job_id]
