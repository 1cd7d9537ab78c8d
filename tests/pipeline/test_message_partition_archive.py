"""Message partitions archived whole, on a real PostgreSQL and Spark local mode: a closed message
partition past its retention that no job points into any more (its jobs left with their job
partition) is exported whole, read back and marked, then the broker's sweeper detaches it,
forgets its keys and drops it, with no message row deleted; one that a job still points into
waits while the batch archive takes its unreferenced messages by rows; a crash before or after
the mark is finished by the next run; a job made for one of its messages (the NATS bridge's
history copy) while it is exported keeps it, and the batch archive never takes a message of a
partition exported whole."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import COPY_JOB, MESSAGE_COLUMNS, archived, query
from tests.pipeline.partitions import (
    STATE,
    archived_whole,
    broker,
    closed_past_retention,
    crash_at,
    execute,
    files,
    jobs_leave_with_their_partition,
    messages,
)


@pytest.fixture
def config(rdbms: str, tmp_path: Path) -> Config:
    return pipeline_config(rdbms, tmp_path, partition_interval="1h")


def test_a_partition_no_job_points_into_is_archived_whole_then_dropped(
    spark: SparkSession, config: Config
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    rows = messages(config)
    assert rows

    crashed = run("archive", config, spark=spark, partition_hook=crash_at("exported"))
    assert crashed["status"] == "failed" and "Crash" in crashed["error"]
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]

    # Files written, then the crash after the mark: the partition is the broker's now.
    marked = run("archive", config, spark=spark, partition_hook=crash_at("marked"))
    assert marked["status"] == "failed" and "Crash" in marked["error"]
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]

    rerun = run("archive", config, spark=spark)
    assert rerun["status"] == "ok", rerun
    assert rerun["message_partitions"]["exported"] == []
    # No row of it is taken by the batch archive, though none has a job left.
    assert rerun["archive"]["archived_messages"] == 0
    assert query(config, "SELECT count(*) AS n FROM archive_batch") == [{"n": 0}]
    assert messages(config) == rows  # the row archive deleted nothing

    # Archived whole, value for value, each message once (the crashed export's files replaced).
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
    assert {r["partition"] for r in got} == {"message_p0"}
    assert archived(spark, config, "message") == []  # nothing by batches

    report = broker(config, lambda s: s.finish_messages())
    assert report.dropped == ["message_p0"]
    assert query(config, STATE) == [{"status": "DROPPED", "exported_rows": len(rows)}]
    assert query(config, "SELECT to_regclass('message_p0') AS t") == [{"t": None}]
    assert query(config, "SELECT count(*) AS n FROM message") == [{"n": 0}]
    assert query(config, "SELECT count(*) AS n FROM message_key") == [{"n": 0}]
    assert len(archived_whole(spark, config)) == len(rows)


def test_a_partition_a_job_still_points_into_waits_and_its_other_messages_go_by_rows(
    spark: SparkSession, config: Config
) -> None:
    dataset = closed_past_retention(config)
    # A dead job, moved forward by the broker into job_p1 (as a DLQ keeps it), still points
    # into message_p0; the other jobs are delivered and leave with job_p0.
    dead = dataset.old_terminal[0]
    execute(config, f"UPDATE job SET status = 'DEAD' WHERE message_pk = {dead}")
    execute(config, f"UPDATE job SET status = 'DELIVERED' WHERE message_pk <> {dead}")
    assert broker(config, lambda s: s.drain()).moved > 0
    assert query(config, "SELECT count(*) AS n FROM job_p0 WHERE status <> 'DELIVERED'") == [
        {"n": 0}
    ]
    first = run("archive", config, spark=spark)
    assert first["status"] == "ok", first
    assert first["partitions"]["exported"] == ["job_p0"]
    broker(config, lambda s: s.finish_exported())

    second = run("archive", config, spark=spark)
    assert second["status"] == "ok", second
    assert second["message_partitions"]["waiting"] == ["message_p0"]
    assert second["message_partitions"]["exported"] == []
    assert not files(config)
    # The batch archive took its old messages no job points at; the partition waits.
    old = set(dataset.old_terminal + dataset.old_open)
    assert second["archive"]["archived_messages"] == len(old) - 1
    left = {r["pk"] for r in query(config, "SELECT pk FROM message")}
    assert left == {dead} | set(dataset.recent)
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]
    assert not broker(config, lambda s: s.finish_messages()).dropped

    # Once the dead job is gone too, what is left of the partition leaves whole.
    execute(config, "DELETE FROM job")
    rows = messages(config)
    third = run("archive", config, spark=spark)
    assert third["status"] == "ok", third
    assert third["message_partitions"]["exported"] == ["message_p0"]
    assert third["archive"]["archived_messages"] == 0
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    # Every message archived once, by one path or the other.
    by_rows = {r["pk"] for r in archived(spark, config, "message")}
    whole = {r["pk"] for r in got}
    assert not by_rows & whole
    assert by_rows | whole == old | set(dataset.recent)


def test_a_job_copied_in_before_the_mark_keeps_the_partition(
    spark: SparkSession, config: Config
) -> None:
    dataset = closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    copied = dataset.old_terminal[0]
    made: list[int] = []

    def copy_after_export(step: str, name: str) -> None:
        # The NATS bridge's history copy commits a job for one of its messages after the
        # export's check and before its mark.
        if step == "exported" and name == "message_p0":
            with psycopg.connect(config.database.connection_url) as conn:
                row = conn.execute(COPY_JOB, (copied,)).fetchone()
                assert row is not None
                made.append(int(row[0]))

    summary = run("archive", config, spark=spark, partition_hook=copy_after_export)
    assert summary["status"] == "ok", summary
    assert made
    assert summary["message_partitions"]["exported"] == []
    assert summary["message_partitions"]["waiting"] == ["message_p0"]
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]
    assert not files(config)  # the refused export's files removed
    # The batch archive took the old messages no job points at; the copied one stays.
    old = set(dataset.old_terminal + dataset.old_open)
    assert summary["archive"]["archived_messages"] == len(old) - 1
    left = {r["pk"] for r in query(config, "SELECT pk FROM message")}
    assert left == {copied} | set(dataset.recent)
    assert not broker(config, lambda s: s.finish_messages()).dropped


def test_a_job_copied_in_after_the_mark_holds_the_drop_and_the_batches_keep_off(
    spark: SparkSession, config: Config
) -> None:
    dataset = closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    rows = messages(config)
    copied = dataset.old_terminal[0]

    def copy_after_mark(step: str, name: str) -> None:
        if step == "marked" and name == "message_p0":
            with psycopg.connect(config.database.connection_url) as conn:
                assert conn.execute(COPY_JOB, (copied,)).fetchone() is not None

    summary = run("archive", config, spark=spark, partition_hook=copy_after_mark)
    assert summary["status"] == "ok", summary
    assert summary["message_partitions"]["exported"] == ["message_p0"]
    # Exported whole: the batch archive takes none of its messages, though all but one have
    # no job left.
    assert summary["archive"]["archived_messages"] == 0
    assert query(config, "SELECT count(*) AS n FROM archive_batch") == [{"n": 0}]

    # The sweeper does not detach it while the job points into it; the message stays.
    assert not broker(config, lambda s: s.finish_messages()).detached
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
    again = run("archive", config, spark=spark)
    assert again["status"] == "ok", again
    assert again["archive"]["archived_messages"] == 0
    assert messages(config) == rows

    # Its job delivered and gone (with its own partition, in time): the partition goes.
    execute(config, "DELETE FROM job")
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
    assert archived(spark, config, "message") == []


def test_a_job_made_while_the_partition_detaches_brings_it_back(
    spark: SparkSession, config: Config
) -> None:
    dataset = closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    rows = messages(config)
    summary = run("archive", config, spark=spark)
    assert summary["message_partitions"]["exported"] == ["message_p0"]
    keys = query(config, "SELECT count(*) AS n FROM message_key")
    # The sweeper's step before the keys go: detached.
    broker(config, lambda s: s.message_store.detach("message_p0"))
    assert query(config, STATE)[0]["status"] == "DETACHED"
    # A history copy whose statement still saw the partition committed its job before the
    # detach finished (DETACH ... CONCURRENTLY waits for it): a job points into it now.
    copied = dataset.old_terminal[0]
    execute(
        config,
        "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
        " earliest_next_attempt_at, status_changed_at, created_at)"
        f" SELECT {copied}, min(pk), 'QUEUED', 0, 1, now(), now(), now() FROM consumer",
    )

    # The sweeper puts it back instead, exported, its message there for the job's claim and
    # its keys kept (a publish repeating one of its ids is still refused).
    report = broker(config, lambda s: s.finish_messages())
    assert report.dropped == []
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
    assert query(config, "SELECT count(*) AS n FROM message_key") == keys != [{"n": 0}]
    assert query(config, "SELECT pk FROM message WHERE pk = %s", copied) == [{"pk": copied}]
    assert messages(config) == rows

    # Once the job has gone, the sweeper finishes: detached and dropped.
    execute(config, "DELETE FROM job")
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    assert query(config, "SELECT to_regclass('message_p0') AS t") == [{"t": None}]
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
