"""The bench's retention scenario (bench/retention.py, issue 42) at a tiny size, never timed: both
variants' cycles run end to end on the real PostgreSQL, the broker's own processes, the pipeline
in Spark local mode and HTTP pull + batch ack, and what the report is built from has its rows,
cycles, sizes and targets. The numbers are the lead's to read on a quiet machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.env import Measured
from bench.retention import (
    DURING,
    LABELS,
    OUTSIDE,
    Plan,
    retention_sections,
    retention_targets,
    run_retention,
)

pytestmark = pytest.mark.timeout(900)  # two brokers, a JVM and eight archive runs, on 2 cores

BLOCK = 300
CYCLES = 3


def scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


def database(base_url: str, name: str) -> str:
    head, _, _ = base_url.rpartition("/")
    return f"{head}/{name}"


async def test_retention_cycles_both_variants_and_reports_them(
    pg_base_url: str, tmp_path: Path
) -> None:
    plan = Plan(
        jobs=BLOCK * CYCLES,
        cycle=BLOCK,
        pollers=2,
        batch=50,
        api_procs=1,
        spark_master="local[2]",
        keep_databases=True,
    )
    results = await run_retention(pg_base_url, tmp_path, plan, say=lambda _: None)

    rows: dict[tuple[str, str], Measured] = {
        (m.extra["variant"], m.extra["phase"]): m for m in results
    }
    assert set(rows) == {(v, p) for v in ("partitions", "deletes") for p in (OUTSIDE, DURING)}
    names = [m.extra["retention"]["database"] for m in results if "retention" in m.extra]
    try:
        for variant in ("partitions", "deletes"):
            outside, during = rows[variant, OUTSIDE], rows[variant, DURING]
            assert LABELS[variant] in outside.name and LABELS[variant] in during.name
            for m in (outside, during):
                assert m.group == "ours" and m.status == "ok"
                assert set(m.latency_ms) == {"pull", "ack"}
                assert m.as_dict()["jobs_per_s"] >= 0
            # Counted from the database inside the windows: never more than was published.
            assert 0 < outside.jobs + during.jobs <= BLOCK * CYCLES
            summary = during.extra["retention"]
            cycles = summary["cycles"]
            assert [c["cycle"] for c in cycles] == list(range(CYCLES))
            for c in cycles:
                assert c["jobs"] == BLOCK and c["undelivered"] == 0
                assert c["client"]["acked"] == BLOCK and not c["client"]["errors"]
                assert c["job_bytes"] > 0 and c["message_bytes"] > 0
                for phase in ("outside", "during"):
                    assert {"jobs", "seconds", "jobs_per_s", "pull_ms", "ack_ms"} <= set(c[phase])
            # The first cycle has nothing to archive; every later one archives the block before.
            assert cycles[0]["archive_s"] is None and cycles[0]["archive_steps"] == {}
            for c in cycles[1:]:
                assert c["archive_s"] > 0
                steps = c["archive_steps"]
                if variant == "partitions":
                    # One run: the block's job partition, and the message partition of the
                    # block before it (whose jobs left a cycle ago), each whole.
                    archived = steps["archive"]
                    assert len(archived["exported"]) == 1
                    assert len(archived["messages_exported"]) == (c["cycle"] >= 2)
                    assert archived["messages"] == (BLOCK if c["cycle"] >= 2 else 0)
                    assert steps["detach+drop"]["dropped"] == (
                        archived["exported"] + archived["messages_exported"]
                    )
                    assert "messages" not in steps  # no second run, no row deletes
                else:
                    assert steps["archive"]["archived_jobs"] == BLOCK
            if variant == "partitions":
                assert all(c["rotated_to"] for c in cycles)
            url = database(pg_base_url, summary["database"])
            # What is left is the last block, delivered and not yet archived (and, by
            # partitions, the messages of the block before it, which leave next cycle).
            assert scalar(url, "SELECT count(*) FROM job WHERE status = 'DELIVERED'") == BLOCK
            assert scalar(url, "SELECT count(*) FROM job") == BLOCK
            kept = 2 if variant == "partitions" else 1
            assert scalar(url, "SELECT count(*) FROM message") == kept * BLOCK
            assert scalar(url, "SELECT count(*) FROM message_key") == kept * BLOCK
            dropped = scalar(
                url,
                "SELECT count(*) FROM job_partition WHERE status = 'DROPPED'"
                " AND name LIKE 'job_p%'",
            )
            assert dropped == (CYCLES - 1 if variant == "partitions" else 0)
            whole = scalar(
                url,
                "SELECT count(*) FROM message_partition WHERE status = 'DROPPED'"
                " AND exported_rows > 0",
            )
            assert whole == (CYCLES - 2 if variant == "partitions" else 0)

        targets = retention_targets(results)
        assert len(targets) == 6
        for variant in ("partitions", "deletes"):
            mine = [t for t in targets if LABELS[variant] in t[0]]
            assert [t[0] for t in mine] == [
                f"retention, {LABELS[variant]}: pull + batch ack while archiving vs not",
                f"retention, {LABELS[variant]}: claim p50 / p99 while archiving vs not",
                f"retention, {LABELS[variant]}: job table size, last cycle vs second",
            ]
        assert all(t[3] in ("PASS", "FAIL", "n/a") for t in targets)
        # Three cycles: the size check has a first archived cycle and a later one to compare.
        assert all(t[3] != "n/a" for t in targets if "job table size" in t[0])
        (section,) = retention_sections(results)
        table = [line for line in section.splitlines() if line.startswith("| ")]
        assert len(table) == 2 + 2 * CYCLES  # header, rule, a row per cycle and variant
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
