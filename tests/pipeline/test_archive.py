"""archive on a real PostgreSQL and Spark local mode: round trip, crashes, the requeue race."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from tests.pipeline import data
from tests.pipeline.helpers import (
    JOB_COLUMNS,
    MESSAGE_COLUMNS,
    archived,
    batches,
    query,
    snapshot,
)


def _strip(rows: list[dict[str, object]], columns: list[str]) -> list[dict[str, object]]:
    return [{c: row[c] for c in columns} for row in rows]


def test_archive_round_trip(spark: SparkSession, pipeline: Config) -> None:
    dataset = data.seed(pipeline.database.connection_url)
    messages, jobs = snapshot(pipeline, dataset.old_terminal)
    assert len(messages) == 30 and len(jobs) > 30

    summary = run("archive", pipeline, spark=spark)

    assert summary["status"] == "ok", summary
    assert summary["archive"]["archived_messages"] == len(messages)
    assert summary["archive"]["archived_jobs"] == len(jobs)
    # Every archived row is in the Parquet files, value for value, exactly once.
    got_messages = archived(spark, pipeline, "message")
    got_jobs = archived(spark, pipeline, "job")
    assert _strip(got_messages, MESSAGE_COLUMNS) == messages
    assert _strip(got_jobs, JOB_COLUMNS) == jobs
    for row in got_messages:
        assert row["dt"] == row["received_at"].date()
    # ... and gone from PostgreSQL, while open and recent messages stay.
    left = {r["pk"] for r in query(pipeline, "SELECT pk FROM message")}
    assert left == set(dataset.old_open) | set(dataset.recent)
    assert query(
        pipeline, "SELECT count(*) AS n FROM job WHERE message_pk = ANY(%s)", dataset.old_terminal
    ) == [{"n": 0}]
    states = batches(pipeline)
    assert len(states) == 2  # batch-size 16, 30 messages
    assert all(b["status"] == "DELETED" and b["finalized"] for b in states)
    assert sum(b["deleted_message_count"] for b in states) == 30
    # The layout the issue asks for, and no token anywhere in the archive.
    root = Path(pipeline.pipeline.archive_root)
    for table in ("message", "job"):
        for batch in states:
            days = list((root / table / f"batch_id={batch['id']}").glob("dt=????-??-??"))
            assert days and all(any(d.glob("*.parquet")) for d in days)
    blob = b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())
    assert b"SECRET" not in blob and b"token" not in blob.lower()
    # A second run finds nothing to do.
    again = run("archive", pipeline, spark=spark)
    assert again["archive"]["batches"] == 0 and len(batches(pipeline)) == 2
