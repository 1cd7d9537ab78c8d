"""archive by partition on a real PostgreSQL and Spark local mode: a closed job partition whose
unfinished jobs the broker moved forward is exported whole, read back, marked, then detached and
dropped by the broker; a crash between the export and the mark is finished by the next run; the
messages whose jobs all left go by the batch archive."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.partitions import DATASET, archived_partitions
from app.store.db import Database
from app.store.ledger import LedgerStore
from tests.pipeline import data
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import JOB_COLUMNS, _python, query
from tests.pipeline.partitions import broker, crash_at, execute

T = TypeVar("T")

PARTITION_JOBS_SQL = (
    "SELECT j.id, j.message_pk, j.consumer_pk, c.channel_id, c.consumer_id, j.status,"
    " j.priority, j.payload_size, j.attempt, j.retry_count, j.timeout_count,"
    " j.incremental_timeout, j.lease_expires_at, j.earliest_next_attempt_at, j.claimed_at,"
    " j.status_changed_at, j.created_at, j.dead_reason, j.last_error"
    " FROM job_p0 j JOIN consumer c ON c.pk = j.consumer_pk ORDER BY j.id"
)


@pytest.fixture
def config(rdbms: str, tmp_path: Path) -> Config:
    return pipeline_config(rdbms, tmp_path, partition_interval="1h")


def unaccounted(config: Config) -> dict[str, int]:
    async def go() -> dict[str, int]:
        db = Database.from_config(config.database)
        try:
            async with db.transaction() as tx:
                return {e.consumer_id: e.unaccounted for e in await LedgerStore(tx).entries()}
        finally:
            await db.dispose()

    return asyncio.run(go())


def archived_partition(spark: SparkSession, config: Config) -> list[dict[str, Any]]:
    assert any((Path(config.pipeline.archive_root) / DATASET).rglob("*.parquet"))
    frame = archived_partitions(spark, config.pipeline.archive_root, ["job_p0"])
    assert frame is not None
    return [_python(row.asDict()) for row in frame.orderBy("id").collect()]


def test_a_closed_partition_is_archived_whole_then_dropped(
    spark: SparkSession, config: Config
) -> None:
    url = config.database.connection_url
    dataset = data.seed(url)
    # Seeded rows were never published (no publish counted): the ledger is off by them from
    # the start, and must stay exactly as off through every step below.
    ledger = unaccounted(config)
    # The broker: a partition ahead, the interval over (job_p0 closed 8 days ago: past the
    # 7-day retention).
    broker(config, lambda s: s.maintain())
    execute(
        config,
        "UPDATE job_partition SET opened_at = now() - interval '2 hours' WHERE name = 'job_p0'",
    )
    broker(config, lambda s: s.maintain())
    execute(
        config,
        "UPDATE job_partition SET closed_at = now() - interval '8 days' WHERE name = 'job_p0'",
    )
    open_jobs = query(config, "SELECT id, status FROM job_p0 WHERE status <> 'DELIVERED'")
    assert open_jobs  # dead, queued and in-flight jobs among them

    waiting = run("archive", config, spark=spark)
    assert waiting["status"] == "ok", waiting
    assert waiting["partitions"] == {"exported": [], "jobs": 0, "waiting": ["job_p0"]}

    # In-flight jobs end (acked); the broker's rounds move the others forward.
    execute(config, "UPDATE job SET status = 'DELIVERED' WHERE status = 'INFLIGHT'")
    moved = broker(config, lambda s: s.drain()).moved
    moved += broker(config, lambda s: s.drain()).moved
    assert moved == sum(1 for j in open_jobs if j["status"] != "INFLIGHT")
    rows = query(config, PARTITION_JOBS_SQL)
    assert rows and all(r["status"] == "DELIVERED" for r in rows)

    crashed = run("archive", config, spark=spark, partition_hook=crash_at("exported"))
    assert crashed["status"] == "failed" and "Crash" in crashed["error"]
    assert query(config, "SELECT status FROM job_partition WHERE name = 'job_p0'") == [
        {"status": "ATTACHED"}
    ]

    rerun = run("archive", config, spark=spark)
    assert rerun["status"] == "ok", rerun
    assert rerun["partitions"]["exported"] == ["job_p0"]
    assert rerun["partitions"]["jobs"] == len(rows)
    assert "archive" not in rerun  # no message batch until the broker dropped the partition
    state = "SELECT status, exported_rows FROM job_partition WHERE name = 'job_p0'"
    assert query(config, state) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
    # Archived whole, value for value, once (the crashed export's files replaced).
    got = archived_partition(spark, config)
    assert [{c: r[c] for c in JOB_COLUMNS} for r in got] == rows

    report = broker(config, lambda s: s.finish_exported())
    assert report.dropped == ["job_p0"]
    assert query(config, "SELECT to_regclass('job_p0') AS t") == [{"t": None}]
    assert unaccounted(config) == ledger
    counted = query(config, "SELECT coalesce(sum(n), 0) AS n FROM job_count")
    assert counted == query(config, "SELECT count(*) AS n FROM job")
    # The moved jobs are still there, in job_p1.
    assert query(config, "SELECT count(*) AS n FROM job_p1") == [{"n": moved}]

    # The report reads the dropped partition's jobs from its files, the rest live: each once.
    reported = run("report", config, spark=spark)
    assert reported["status"] == "ok", reported
    assert reported["report"]["archived_jobs"] == len(rows)
    assert reported["report"]["live_jobs"] == moved

    # Messages whose jobs all left go by the batch archive; those with a moved job stay.
    after = run("archive", config, spark=spark)
    assert after["status"] == "ok", after
    left = {r["pk"] for r in query(config, "SELECT pk FROM message")}
    with_jobs = {r["message_pk"] for r in query(config, "SELECT DISTINCT message_pk FROM job")}
    assert with_jobs and left == with_jobs | set(dataset.recent)  # recent: inside retention
    assert after["archive"]["archived_jobs"] == 0
    old = set(dataset.old_terminal + dataset.old_open)
    assert after["archive"]["archived_messages"] == len(old - with_jobs)
