"""Pipeline benchmark: generate N jobs in PostgreSQL, run `pipeline all`, print rows/s per step.

    .venv/bin/python -m bench.pipeline_bench                  # 1,000,000 jobs, throwaway PostgreSQL
    .venv/bin/python -m bench.pipeline_bench --jobs 100000    # smaller
    .venv/bin/python -m bench.pipeline_bench --database-url postgresql://u:p@host/db --master ...

Without --database-url it starts a throwaway PostgreSQL cluster (Debian's postgresql server, as the
tests do). The database gets a fresh `wb_bench` schema through the broker's migrations; messages
span the last 30 days, so with retention-days=7 about three quarters of them are archived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from app.config import Config, load_config_text
from app.store.migrate import upgrade

_GENERATE_MESSAGES = """
INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority,
                     headers, received_at)
SELECT 'bench', 'm-' || g, 'bench-producer', decode(repeat(md5(g::text), 4), 'hex'),
       'application/octet-stream', g %% 3, json_build_object('X-Seq', g),
       now() - interval '30 days' + g * (interval '30 days' / %(messages)s)
  FROM generate_series(1, %(messages)s) AS g
"""

# Deterministic pseudo-random statuses and timings from a hash of (message, consumer).
_GENERATE_JOBS = """
INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size, attempt, retry_count,
                 timeout_count, earliest_next_attempt_at, claimed_at, status_changed_at,
                 created_at, dead_reason)
SELECT m.pk, c.pk, s.status, m.priority, 64,
       CASE WHEN s.status = 'QUEUED' THEN 0 ELSE 1 + s.h % 3 END, s.h % 3, s.h % 2,
       m.received_at,
       CASE WHEN s.status = 'QUEUED' THEN NULL
            ELSE m.received_at + (s.h % 600) * interval '100 milliseconds' END,
       CASE WHEN s.status = 'QUEUED' THEN m.received_at
            ELSE m.received_at + (s.h % 600) * interval '100 milliseconds'
                 + (s.h % 97) * interval '30 milliseconds' END,
       m.received_at,
       CASE WHEN s.status = 'DEAD' THEN 'bench: gave up' END
  FROM message m
 CROSS JOIN consumer c
 CROSS JOIN LATERAL (
       SELECT abs(hashtext(m.pk::text || ':' || c.pk::text)) AS h) AS hh
 CROSS JOIN LATERAL (
       SELECT hh.h,
              CASE WHEN m.received_at > now() - interval '1 day' AND hh.h % 4 = 0 THEN 'QUEUED'
                   WHEN hh.h % 10 = 0 THEN 'DEAD'
                   ELSE 'DELIVERED' END AS status) AS s
"""


@contextmanager
def _database(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    from devtools.pg import Cluster

    cluster = Cluster()
    try:
        cluster.start()
        yield cluster.base_url
    finally:
        cluster.stop()


def _fresh(base_url: str) -> str:
    head, _, _ = base_url.rpartition("/")
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS wb_bench")
        conn.execute("CREATE DATABASE wb_bench")
    return f"{head}/wb_bench"


def generate(url: str, jobs: int, consumers: int) -> tuple[int, float]:
    """Channel, producer, `consumers` consumers and jobs/consumers messages; (rows, seconds)."""
    messages = max(1, jobs // consumers)
    started = time.monotonic()
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO channel (id, name, token, created_at, updated_at)"
            " VALUES ('bench', 'Bench', 'bench-channel-token', now(), now())"
        )
        conn.execute(
            "INSERT INTO producer (id, name, token, created_at, updated_at)"
            " VALUES ('bench-producer', 'P', 'bench-producer-token', now(), now())"
        )
        for k in range(consumers):
            conn.execute(
                "INSERT INTO consumer (channel_id, consumer_id, name, token, type, created_at,"
                " updated_at) VALUES ('bench', %s, %s, 'bench-consumer-token', 'pull', now(),"
                " now())",
                (f"consumer-{k}", f"Consumer {k}"),
            )
        conn.execute(_GENERATE_MESSAGES, {"messages": messages})
        made = conn.execute(_GENERATE_JOBS).rowcount
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE message")
        conn.execute("VACUUM ANALYZE job")
    return messages + made, time.monotonic() - started


def _config(url: str, work: Path, args: argparse.Namespace) -> Config:
    return load_config_text(
        f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n"
        f"[pipeline]\narchive-root={work / 'archive'}\nreport-root={work / 'report'}\n"
        f"retention-days=7\nbatch-size={args.batch_size}\n"
        f"jdbc-partitions={args.jdbc_partitions}\nshuffle-partitions={args.shuffle_partitions}\n"
    )


def _line(step: str, rows: int, seconds: float) -> str:
    rate = f"{rows / seconds:>12,.0f}" if seconds > 0 else f"{'-':>12}"
    return f"{step:<10} {rows:>12,} rows {seconds:>8.1f}s {rate} rows/s"


def report(generated: tuple[int, float], summary: dict[str, Any]) -> None:
    """One line per step: rows handled, seconds, rows per second."""
    print(_line("generate", *generated))
    for step, stats in summary.get("archive", {}).get("steps", {}).items():
        print(_line(step, stats["rows"], stats["seconds"]))
    if "report" in summary:
        print(_line("report", summary["report"]["rows"], summary["report"]["seconds"]))
    archived = summary.get("archive", {})
    print(
        f"{'all':<10} {archived.get('archived_messages', 0):>12,} messages and"
        f" {archived.get('archived_jobs', 0):,} jobs archived, {summary['seconds']:.1f}s in all"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs to generate")
    parser.add_argument("--consumers", type=int, default=4, help="consumers (jobs per message)")
    parser.add_argument("--database-url", help="a PostgreSQL server URL (default: throwaway)")
    parser.add_argument("--master", default="local[*]", help="Spark master URL")
    parser.add_argument("--batch-size", type=int, default=100_000, help="messages per batch")
    parser.add_argument("--jdbc-partitions", type=int, default=4)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the archive and report")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    work = Path(tempfile.mkdtemp(prefix="wb-pipeline-bench-"))
    from app.pipeline.job import run

    try:
        with _database(args.database_url) as base:
            url = _fresh(base)
            config = _config(url, work, args)
            upgrade(config.database)
            generated = generate(url, args.jobs, args.consumers)
            print(f"generated {generated[0]:,} rows in {generated[1]:.1f}s; running `all`")
            summary = run("all", config, master=args.master)
            if summary["status"] != "ok":
                print(json.dumps(summary, indent=2))
                return 1
            report(generated, summary)
            if args.keep:
                print(f"archive and report kept under {work}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
