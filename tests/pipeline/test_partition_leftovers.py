"""The partition archive's edges (issue 42), on a real PostgreSQL and Spark local mode:
--dry-run lists the partitions a run would export whole, with their rows and keys, and touches
nothing; files a refused mark could not remove (made undeletable for real: the immutable
attribute, which holds for root too) are reported, fail the next run while they stay, and are
removed by the first run that can, before a reader or the sweeper's mark of an emptied
partition could take them for archived rows; a scheduled message cancelled between the export
and the mark makes the mark refuse, and one cancelled after the mark is refused, so that the
files hold exactly what the broker drops."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.partitions import DATASET, MESSAGE_DATASET, partition_dir
from app.store.db import Database
from app.store.messages import MessageStore
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import COPY_JOB, MESSAGE_COLUMNS, query
from tests.pipeline.partitions import (
    STATE,
    archived_whole,
    broker,
    closed_past_retention,
    execute,
    files,
    jobs_leave_with_their_partition,
    messages,
)


@pytest.fixture
def config(rdbms: str, tmp_path: Path) -> Config:
    return pipeline_config(rdbms, tmp_path, partition_interval="1h")


def attr(flag: str, path: Path) -> bool:
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    done = subprocess.run([chattr, flag, str(path)], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture
def undeletable() -> Iterator[list[Path]]:
    """Files made immutable (no delete, not even by root) during a test; made plain again
    after it, whatever happened, so that its tmp_path can go."""
    made: list[Path] = []
    yield made
    for path in made:
        attr("-i", path)


def cancel(config: Config, pk: int) -> bool:
    """The broker's cancel of a scheduled message (app/store/messages.py), on its own Database."""
    row = query(config, "SELECT channel_id, message_id FROM message WHERE pk = %s", pk)[0]

    async def go() -> bool:
        db = Database.from_config(config.database)
        try:
            async with db.transaction() as tx:
                return await MessageStore(tx).cancel_scheduled(row["channel_id"], row["message_id"])
        finally:
            await db.dispose()

    return asyncio.run(go())


def scheduled(config: Config, pk: int) -> None:
    """A message of message_p0, jobless, whose time is still to come."""
    execute(config, f"UPDATE message SET scheduled_for = now() + interval '1 day' WHERE pk = {pk}")


def archived_pks(spark: SparkSession, config: Config) -> list[int]:
    return [r["pk"] for r in archived_whole(spark, config)]


def test_a_dry_run_lists_the_partitions_a_run_would_export_whole(
    spark: SparkSession, config: Config
) -> None:
    closed_past_retention(config)
    execute(config, "UPDATE job SET status = 'DELIVERED' WHERE status <> 'DELIVERED'")
    jobs = query(config, "SELECT count(*) AS n, min(id) AS first, max(id) AS last FROM job_p0")[0]
    root = config.pipeline.archive_root

    dry = run("archive", config, dry_run=True)
    assert dry["status"] == "ok", dry
    assert dry["partitions"] == {
        "would_export": [
            {
                "partition": "job_p0",
                "jobs": jobs["n"],
                "first_id": jobs["first"],
                "last_id": jobs["last"],
                "jdbc_partitions": 1,
                "path": partition_dir(root, "job_p0", DATASET),
            }
        ],
        "jobs": jobs["n"],
        "waiting": [],
    }
    # Its jobs point into message_p0, which waits; the batches wait for job_p0 to go.
    assert dry["message_partitions"] == {
        "would_export": [],
        "messages": 0,
        "waiting": ["message_p0"],
    }
    assert dry["archive"]["batches_wait_for"] == ["job_p0"]
    # Nothing written, nothing marked.
    assert not Path(root).exists()
    assert query(config, "SELECT status FROM job_partition WHERE name = 'job_p0'") == [
        {"status": "ATTACHED"}
    ]

    # The run takes what the dry run said.
    real = run("archive", config, spark=spark)
    assert real["status"] == "ok", real
    assert real["partitions"]["exported"] == ["job_p0"]
    assert real["partitions"]["jobs"] == jobs["n"]
    assert "archive" not in real  # the batches waited, as said
    assert broker(config, lambda s: s.finish_exported()).dropped == ["job_p0"]

    # Nothing points into message_p0 now: listed with its messages' count and keys.
    rows = messages(config)
    dry = run("archive", config, dry_run=True)
    assert dry["message_partitions"] == {
        "would_export": [
            {
                "partition": "message_p0",
                "messages": len(rows),
                "first_pk": rows[0]["pk"],
                "last_pk": rows[-1]["pk"],
                "jdbc_partitions": 1,
                "path": partition_dir(root, "message_p0", MESSAGE_DATASET),
            }
        ],
        "messages": len(rows),
        "waiting": [],
    }
    assert not files(config)
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]
    real = run("archive", config, spark=spark)
    assert real["message_partitions"]["exported"] == ["message_p0"]
    assert real["message_partitions"]["messages"] == len(rows)


def refused_with_a_file_left(
    spark: SparkSession, config: Config, undeletable: list[Path]
) -> dict[str, Any]:
    """message_p0 exported, one of its files made undeletable, and its mark refused (a job
    copied into it meanwhile): the run's summary."""
    copied = min(r["pk"] for r in messages(config))

    def pinned_and_copied(step: str, name: str) -> None:
        if step == "exported" and name == "message_p0":
            written = files(config)
            assert written
            if not attr("+i", written[0]):
                pytest.skip("no immutable attribute here (chattr, ext4 or similar needed)")
            undeletable.append(written[0])
            with psycopg.connect(config.database.connection_url) as conn:
                assert conn.execute(COPY_JOB, (copied,)).fetchone() is not None

    summary = run("archive", config, spark=spark, partition_hook=pinned_and_copied)
    assert summary["status"] == "ok", summary
    return summary


def test_files_a_refused_mark_could_not_remove_are_removed_by_the_next_run(
    spark: SparkSession, config: Config, undeletable: list[Path]
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)

    summary = refused_with_a_file_left(spark, config, undeletable)
    parts = summary["message_partitions"]
    assert parts["exported"] == [] and parts["waiting"] == ["message_p0"]
    assert parts["stale_files_left"] == ["message_p0"]
    assert undeletable[0] in files(config)
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]

    # While they cannot go, no run goes on past them.
    stuck = run("archive", config, spark=spark)
    assert stuck["status"] == "failed"
    assert "message_p0" in stuck["error"] and "could not be removed" in stuck["error"]

    # Once they can, the next run removes them first (the partition still waits for its job).
    attr("-i", undeletable[0])
    again = run("archive", config, spark=spark)
    assert again["status"] == "ok", again
    assert again["message_partitions"]["stale_files_removed"] == ["message_p0"]
    assert again["message_partitions"]["waiting"] == ["message_p0"]
    assert not files(config)
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]


def test_files_left_under_a_partition_the_sweeper_marked_emptied_are_removed(
    spark: SparkSession, config: Config, undeletable: list[Path]
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    summary = refused_with_a_file_left(spark, config, undeletable)
    assert summary["message_partitions"]["stale_files_left"] == ["message_p0"]
    attr("-i", undeletable[0])

    # Its messages leave by rows (standing for the batch archive once the job is done), and
    # the sweeper marks the empty partition EXPORTED with no rows and drops it: the refused
    # export's files now sit under a partition whose state says archived.
    execute(config, "DELETE FROM job")
    execute(config, "DELETE FROM message_key")
    execute(config, "DELETE FROM message")
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    assert query(config, STATE) == [{"status": "DROPPED", "exported_rows": 0}]
    assert archived_whole(spark, config)  # a reader would count them

    after = run("archive", config, spark=spark)
    assert after["status"] == "ok", after
    assert after["message_partitions"]["stale_files_removed"] == ["message_p0"]
    assert not files(config)
    assert archived_whole(spark, config) == []


def test_a_scheduled_message_cancelled_before_the_mark_makes_it_refuse(
    spark: SparkSession, config: Config
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    gone = min(r["pk"] for r in messages(config))
    scheduled(config, gone)
    cancelled: list[bool] = []

    def cancel_after_export(step: str, name: str) -> None:
        # Exported and read back with the message in it; cancelled before the mark.
        if step == "exported" and name == "message_p0":
            cancelled.append(cancel(config, gone))

    summary = run("archive", config, spark=spark, partition_hook=cancel_after_export)
    assert summary["status"] == "ok", summary
    assert cancelled == [True]
    assert summary["message_partitions"]["exported"] == []
    assert summary["message_partitions"]["waiting"] == ["message_p0"]
    assert query(config, STATE) == [{"status": "ATTACHED", "exported_rows": None}]
    assert not files(config)
    assert query(config, "SELECT count(*) AS n FROM message WHERE pk = %s", gone) == [{"n": 0}]

    # The next run exports what is there now, and that is what the broker drops.
    rows = messages(config)
    again = run("archive", config, spark=spark)
    assert again["message_partitions"]["exported"] == ["message_p0"]
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
    assert gone not in archived_pks(spark, config)


def test_a_scheduled_message_is_not_cancelled_once_its_partition_is_marked(
    spark: SparkSession, config: Config
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    kept = min(r["pk"] for r in messages(config))
    scheduled(config, kept)
    rows = messages(config)
    cancelled: list[bool] = []

    def cancel_after_mark(step: str, name: str) -> None:
        if step == "marked" and name == "message_p0":
            cancelled.append(cancel(config, kept))

    summary = run("archive", config, spark=spark, partition_hook=cancel_after_mark)
    assert summary["status"] == "ok", summary
    assert summary["message_partitions"]["exported"] == ["message_p0"]
    # Refused: the message is in the archive, as exported; it leaves with its partition.
    assert cancelled == [False]
    assert messages(config) == rows
    assert broker(config, lambda s: s.finish_messages()).dropped == ["message_p0"]
    got = archived_whole(spark, config)
    assert [{c: r[c] for c in MESSAGE_COLUMNS} for r in got] == rows
