"""archive on a real PostgreSQL and Spark local mode: round trip, crashes, the requeue race."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.archive import StepHook
from app.pipeline.job import run
from app.pipeline.state import Batch
from tests.pipeline import data
from tests.pipeline.broker import claim_and_deliver, requeue_dead, requeue_dead_slowly
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
    # The delivery ledger counts each consumer's archived jobs as removed on purpose.
    removed = query(
        pipeline, "SELECT consumer_pk, sum(n) AS n FROM job_removed GROUP BY consumer_pk"
    )
    by_consumer: dict[object, int] = {}
    for row in jobs:
        by_consumer[row["consumer_pk"]] = by_consumer.get(row["consumer_pk"], 0) + 1
    assert {r["consumer_pk"]: r["n"] for r in removed} == by_consumer
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


class Crash(RuntimeError):
    """Stands for the process dying right after a step committed."""


def _crash_at(step: str, batch_id: int = 1) -> StepHook:
    def hook(done: str, batch: Batch) -> None:
        if done == step and batch.id == batch_id:
            raise Crash(f"after {step} of batch {batch.id}")

    return hook


def _ids(rows: list[dict[str, Any]], key: str) -> list[int]:
    return sorted(row[key] for row in rows)


@pytest.mark.parametrize("step", ["planned", "exported"])
def test_crash_then_rerun_loses_and_duplicates_nothing(
    spark: SparkSession, pipeline: Config, step: str
) -> None:
    dataset = data.seed(pipeline.database.connection_url)
    messages, jobs = snapshot(pipeline, dataset.old_terminal)
    root = Path(pipeline.pipeline.archive_root)
    if step == "planned":
        # A half-written export from an earlier attempt: the re-export must replace it.
        stray = root / "message" / "batch_id=1" / "dt=2001-01-01"
        stray.mkdir(parents=True)
        (stray / "part-00000-stray.parquet").write_bytes(b"not parquet")

    crashed = run("archive", pipeline, spark=spark, hook=_crash_at(step))

    assert crashed["status"] == "failed" and "Crash" in crashed["error"]
    assert [(b["id"], b["status"]) for b in batches(pipeline)] == [
        (1, "PLANNED" if step == "planned" else "EXPORTED")
    ]
    # Nothing was deleted yet.
    assert (
        len(query(pipeline, "SELECT pk FROM message WHERE pk = ANY(%s)", dataset.old_terminal))
        == 30
    )
    if step == "exported":
        assert len(archived(spark, pipeline, "message")) == 16

    rerun = run("archive", pipeline, spark=spark)

    assert rerun["status"] == "ok", rerun
    assert rerun["archive"]["resumed_batches"] == 1
    got_messages = archived(spark, pipeline, "message")
    got_jobs = archived(spark, pipeline, "job")
    assert _ids(got_messages, "pk") == sorted(dataset.old_terminal)  # each exactly once
    assert _ids(got_jobs, "id") == _ids(jobs, "id")
    assert _strip(got_messages, MESSAGE_COLUMNS) == messages
    assert _strip(got_jobs, JOB_COLUMNS) == jobs
    assert query(
        pipeline, "SELECT count(*) AS n FROM message WHERE pk = ANY(%s)", dataset.old_terminal
    ) == [{"n": 0}]
    assert all(b["status"] == "DELETED" and b["finalized"] for b in batches(pipeline))


def _dead_job(pipeline: Config) -> dict[str, Any]:
    rows = query(
        pipeline,
        "SELECT id, message_pk, consumer_pk FROM job WHERE status = 'DEAD' ORDER BY id LIMIT 1",
    )
    assert rows, "the seed made no dead job"
    return rows[0]


def test_requeue_between_plan_and_delete_keeps_the_message(
    spark: SparkSession, pipeline: Config
) -> None:
    dataset = data.seed(pipeline.database.connection_url, old=12, old_open=0, recent=0)
    victim = _dead_job(pipeline)
    others = [pk for pk in dataset.old_terminal if pk != victim["message_pk"]]
    messages, jobs = snapshot(pipeline, others)

    def requeue_then_crash(step: str, batch: Batch) -> None:
        if step == "exported":  # the files already hold the victim's DEAD job
            assert requeue_dead(pipeline, victim["consumer_pk"], victim["id"]) == 1
        if step == "deleted":
            raise Crash("before the kept message left the files")

    crashed = run("archive", pipeline, spark=spark, hook=requeue_then_crash)

    assert crashed["status"] == "failed"
    [state] = batches(pipeline)
    assert (state["status"], state["kept_message_count"], state["finalized"]) == (
        "DELETED",
        1,
        False,
    )
    # The requeued job and its message (with its other jobs) are still in the database.
    left = query(
        pipeline,
        "SELECT id, status FROM job WHERE message_pk = %s ORDER BY id",
        victim["message_pk"],
    )
    assert {"id": victim["id"], "status": "QUEUED"} in left
    assert query(pipeline, "SELECT pk FROM message") == [{"pk": victim["message_pk"]}]

    rerun = run("archive", pipeline, spark=spark)  # finishes the batch: drops the kept message

    assert rerun["status"] == "ok", rerun
    assert _strip(archived(spark, pipeline, "message"), MESSAGE_COLUMNS) == messages
    assert _strip(archived(spark, pipeline, "job"), JOB_COLUMNS) == jobs
    assert batches(pipeline)[0]["finalized"]

    # Delivered at last, the message is archived by a later run, once, with its new values.
    claim_and_deliver(pipeline, victim["consumer_pk"], victim["id"])
    later_messages, later_jobs = snapshot(pipeline, [victim["message_pk"]])
    final = run("archive", pipeline, spark=spark)
    assert final["archive"]["archived_messages"] == 1
    got = archived(spark, pipeline, "message")
    assert _ids(got, "pk") == sorted(dataset.old_terminal)
    assert [r for r in _strip(got, MESSAGE_COLUMNS) if r["pk"] == victim["message_pk"]] == (
        later_messages
    )
    got_jobs = _strip(archived(spark, pipeline, "job"), JOB_COLUMNS)
    assert [j for j in got_jobs if j["message_pk"] == victim["message_pk"]] == later_jobs
    assert any(j["status"] == "DELIVERED" and j["id"] == victim["id"] for j in later_jobs)


def test_requeue_committing_during_the_delete_keeps_the_message(
    spark: SparkSession, pipeline: Config
) -> None:
    """The delete locks the batch's jobs before it re-checks them: a requeue that holds a job's
    row lock when the delete starts is waited for, and seen."""
    data.seed(pipeline.database.connection_url, old=8, old_open=0, recent=0)
    victim = _dead_job(pipeline)
    threads = []

    def requeue_in_flight(step: str, batch: Batch) -> None:
        if step == "exported":
            threads.append(requeue_dead_slowly(pipeline, victim["consumer_pk"], victim["id"], 1.5))

    summary = run("archive", pipeline, spark=spark, hook=requeue_in_flight)

    threads[0].join(30)
    assert summary["status"] == "ok", summary
    assert summary["archive"]["kept_messages"] == 1
    assert query(pipeline, "SELECT status FROM job WHERE id = %s", victim["id"]) == [
        {"status": "QUEUED"}
    ]
    assert victim["message_pk"] not in _ids(archived(spark, pipeline, "message"), "pk")


def test_crash_inside_finalize_then_report_then_rerun(
    spark: SparkSession, pipeline: Config
) -> None:
    """Crash after a batch's job files were removed and before the staged copy moved in."""
    dataset = data.seed(pipeline.database.connection_url, old=12, old_open=0, recent=0)
    victim = _dead_job(pipeline)
    total = query(pipeline, "SELECT count(*) AS n FROM job")[0]["n"]
    others = [pk for pk in dataset.old_terminal if pk != victim["message_pk"]]
    messages, jobs = snapshot(pipeline, others)

    def hook(step: str, batch: Batch) -> None:
        if step == "exported":
            requeue_dead(pipeline, victim["consumer_pk"], victim["id"])
        if step == "job-staged":
            raise Crash("between removing the job files and moving the staged copy in")

    assert run("archive", pipeline, spark=spark, hook=hook)["status"] == "failed"
    root = Path(pipeline.pipeline.archive_root)
    assert not (root / "job" / "batch_id=1").exists()
    assert (root / "_rewrite" / "job" / "batch_id=1").exists()

    # The report still counts every job exactly once: the staged files stand in.
    report = run("report", pipeline, spark=spark)
    assert report["status"] == "ok", report
    assert (
        report["report"]["archived_jobs"] == len(jobs) == batches(pipeline)[0]["deleted_job_count"]
    )
    assert report["report"]["archived_jobs"] + report["report"]["live_jobs"] == total

    rerun = run("archive", pipeline, spark=spark)
    assert rerun["status"] == "ok" and rerun["archive"]["resumed_batches"] == 1
    assert _strip(archived(spark, pipeline, "message"), MESSAGE_COLUMNS) == messages
    assert _strip(archived(spark, pipeline, "job"), JOB_COLUMNS) == jobs
    assert not (root / "_rewrite" / "job" / "batch_id=1").exists()
    assert batches(pipeline)[0]["finalized"]
