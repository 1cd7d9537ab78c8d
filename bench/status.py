"""`python -m bench.status`: `/job-status` and `/dlq-status` latency with millions of jobs.

The Go original's job-status query (one GROUP BY over every job joined to its consumer) took
60-108 s in production at 23M dead jobs. Ours read the trigger-kept counters (migration
0006_job_counts). This loads `--jobs` jobs (default 10,000,000) over `--consumers` consumers in
a mix of states on a throwaway PostgreSQL, then times, in the same run and on the same data:

- ours: `GET /job-status` and `GET /dlq-status` through the ASGI app (routing, query, JSON);
- the baseline: the Go original's job-status query and a dead-count GROUP BY, run as SQL.

Prints one table and writes bench/results/status-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from devtools.pg import Cluster

RESULTS = Path(__file__).resolve().parent / "results"

# Of each consumer's jobs, by message number mod 100: the rest are DELIVERED.
MIX = (("DEAD", 20), ("QUEUED", 8), ("INFLIGHT", 2))

GO_JOB_STATUS = (
    "SELECT c.channel_id, c.consumer_id, j.status, count(j.id), min(j.status_changed_at),"
    " max(j.status_changed_at) FROM job j JOIN consumer c ON j.consumer_pk = c.pk"
    " GROUP BY c.channel_id, c.consumer_id, j.status"
)
GO_DLQ_STATUS = (
    "SELECT c.channel_id, c.consumer_id, count(*) FROM job j JOIN consumer c"
    " ON j.consumer_pk = c.pk WHERE j.status = 'DEAD' GROUP BY c.channel_id, c.consumer_id"
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.status", description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000_000, help="jobs in all (default 10M)")
    p.add_argument("--consumers", type=int, default=10, help="consumers (default 10)")
    p.add_argument("--samples", type=int, default=30, help="requests per endpoint (default 30)")
    p.add_argument("--baseline-samples", type=int, default=3, help="runs of each Go query (3)")
    return p.parse_args()


def status_case() -> str:
    """The state of job of message number g (SQL), by MIX."""
    arms, low = [], 0
    for status, share in MIX:
        arms.append(f"WHEN mod(g, 100) < {low + share} THEN '{status}'")
        low += share
    return f"CASE {' '.join(arms)} ELSE 'DELIVERED' END"


def load(url: str, jobs: int, consumers: int) -> float:
    """Messages (one per `consumers` jobs) and their jobs, in one statement per consumer."""
    started = time.monotonic()
    messages = jobs // consumers
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,"
            " priority, headers, received_at)"
            " SELECT 'bench', 'm' || g, 'bp', convert_to('{}', 'UTF8'), 'application/json', 0,"
            " '{}'::json, now() - (%s - g) * interval '1 millisecond'"
            " FROM generate_series(1, %s) AS g",
            (messages, messages),
        )
        pks = [row[0] for row in conn.execute("SELECT pk FROM consumer ORDER BY pk")]
        for pk in pks:
            conn.execute(
                "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
                " lease_expires_at, earliest_next_attempt_at, status_changed_at, created_at)"
                f" SELECT m.pk, %s, s.status, 0, 2,"
                " CASE WHEN s.status = 'INFLIGHT' THEN now() + interval '1 hour' END,"
                " m.received_at, m.received_at, m.received_at"
                " FROM message m CROSS JOIN LATERAL"
                f" (SELECT {status_case()} AS status FROM (SELECT m.pk AS g) AS n) AS s",
                (pk,),
            )
        conn.execute("VACUUM ANALYZE job")
        conn.execute("VACUUM ANALYZE message")
    return time.monotonic() - started


def percentile_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000.0


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": percentile_ms(samples, 0.5),
        "p99_ms": percentile_ms(samples, 0.99),
        "mean_ms": statistics.fmean(samples) * 1000.0,
    }


async def time_endpoints(config_text: str, samples: int) -> dict[str, Any]:
    from app.api.app import create_app
    from app.config import load_config_text
    from app.runtime import Runtime

    config = load_config_text(config_text)
    runtime = Runtime(config)
    await runtime.start()
    out: dict[str, Any] = {}
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            for path in ("/job-status", "/dlq-status"):
                times, body = [], None
                for _ in range(samples + 1):  # the first warms the connection pool
                    started = time.perf_counter()
                    r = await client.get(path)
                    times.append(time.perf_counter() - started)
                    r.raise_for_status()
                    body = r.json()
                out[path] = {**summary(times[1:]), "body": body}
    finally:
        await runtime.stop()
    return out


def time_sql(url: str, sql: str, samples: int) -> dict[str, Any]:
    times = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            rows = conn.execute(sql).fetchall()
            times.append(time.perf_counter() - started)
    return {**summary(times), "rows": len(rows)}


def main() -> None:
    args = parse_args()
    from app.config import load_config_text
    from app.store.migrate import upgrade

    cluster = Cluster(statements=False)
    cluster.start()
    try:
        with psycopg.connect(cluster.base_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE status_bench")
        url = cluster.url("status_bench")
        config_text = (
            f"[rdbms]\ndialect=postgres\nconnection-url={url}\n"
            "[log]\nlog-level=warning\n"
            "[initial-channels]\nbench=bench\n[initial-channel-tokens]\nbench=bench-token\n"
            "[initial-producers]\nbp=bp\n[initial-producer-tokens]\nbp=bp-token\n"
        )
        upgrade(load_config_text(config_text).database)
        # Stakeholders through the broker's own seeding: one start of the runtime.
        asyncio.run(seed(config_text, args.consumers))
        print(f"loading {args.jobs:,} jobs over {args.consumers} consumers ...", flush=True)
        loaded = load(url, args.jobs, args.consumers)
        print(f"loaded and vacuumed in {loaded:.0f} s", flush=True)
        ours = asyncio.run(time_endpoints(config_text, args.samples))
        go_jobs = time_sql(url, GO_JOB_STATUS, args.baseline_samples)
        go_dlq = time_sql(url, GO_DLQ_STATUS, args.baseline_samples)
    finally:
        cluster.stop()
    body = ours["/job-status"]["body"]
    counted = sum(e["count"] for per in body.values() for es in per.values() for e in es)
    rows = [
        ("GET /job-status (ours)", ours["/job-status"], go_jobs),
        ("GET /dlq-status (ours)", ours["/dlq-status"], go_dlq),
    ]
    print(f"\n{args.jobs:,} jobs ({counted:,} counted by /job-status), {args.consumers} consumers")
    print("| what | p50 ms | p99 ms | baseline: the Go query, p50 ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, mine, base in rows:
        ratio = base["p50_ms"] / mine["p50_ms"]
        print(
            f"| {name} | {mine['p50_ms']:.2f} | {mine['p99_ms']:.2f} | {base['p50_ms']:,.0f} |"
            f" {ratio:,.0f}x faster |"
        )
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H-%M-%S")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"status-{stamp}.json"
    for result in ours.values():
        result.pop("body", None)
    out.write_text(
        json.dumps(
            {
                "jobs": args.jobs,
                "counted": counted,
                "consumers": args.consumers,
                "loaded_seconds": loaded,
                "ours": ours,
                "go_job_status_sql": go_jobs,
                "go_dlq_status_sql": go_dlq,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written {out}")


async def seed(config_text: str, consumers: int) -> None:
    from app.config import load_config_text
    from app.runtime import Runtime

    runtime = Runtime(load_config_text(config_text))
    await runtime.start()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=_app(runtime)), base_url="http://bench"
        ) as client:
            for n in range(consumers):
                r = await client.put(
                    f"/channel/bench/consumer/k{n}", data={"token": f"t{n}", "type": "pull"}
                )
                r.raise_for_status()
    finally:
        await runtime.stop()


def _app(runtime: Any) -> Any:
    from app.api.app import create_app

    return create_app(runtime.config, runtime)


if __name__ == "__main__":
    main()
