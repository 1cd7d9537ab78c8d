"""No foreign key points at message (migration 0021): the archive's delete and a copy of a
message's history that makes a new job for it (the NATS bridge's back-fill) serialise on the
message's row lock instead, so the archive never deletes a message under a new job."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.state import Batch
from tests.helpers.waiting import eventually_sync
from tests.pipeline import data
from tests.pipeline.helpers import COPY_JOB, batches, query, url

# The archive's connection (any but the copy's) waiting for a lock in its delete transaction.
ARCHIVE_WAITING = """
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND pid <> %s AND datname = current_database()
"""


def test_a_copy_running_beside_the_archive_keeps_its_message(
    spark: SparkSession, pipeline: Config
) -> None:
    dataset = data.seed(pipeline.database.connection_url)
    with psycopg.connect(url(pipeline)) as conn:  # the seed writes messages only; a publish both
        conn.execute(
            "INSERT INTO message_key (channel_id, message_id, message_pk)"
            " SELECT channel_id, message_id, pk FROM message"
        )
    copied = dataset.old_terminal[0]
    others = dataset.old_terminal[1:]
    copier: psycopg.Connection[Any] = psycopg.connect(url(pipeline))
    job_ids: list[int] = []
    committed = threading.Event()
    errors: list[BaseException] = []

    def commit_once_the_archive_waits() -> None:
        try:
            with psycopg.connect(url(pipeline), autocommit=True) as watcher:

                def waiting() -> bool:
                    row = watcher.execute(ARCHIVE_WAITING, (copier.info.backend_pid,)).fetchone()
                    return bool(row and row[0])

                eventually_sync(waiting, 60, what="the archive's delete waiting for the copy")
            copier.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            committed.set()

    def hook(step: str, batch: Batch) -> None:
        # Exported, not deleted yet: the copy takes its lock and writes its job, uncommitted,
        # and commits only once the archive's delete has come to wait for it.
        if step == "exported" and not job_ids:
            row = copier.execute(COPY_JOB, (copied,)).fetchone()
            assert row is not None, "the message to copy is there"
            job_ids.append(int(row[0]))
            threading.Thread(target=commit_once_the_archive_waits, daemon=True).start()

    try:
        summary = run("archive", pipeline, spark=spark, hook=hook)
        assert committed.wait(60)
    finally:
        copier.close()
    assert not errors, errors
    assert summary["status"] == "ok", summary
    assert job_ids, "the hook ran"

    # The copied message stays (kept, with its key and its new job); the others went.
    left = {r["pk"] for r in query(pipeline, "SELECT pk FROM message")}
    assert copied in left
    assert not left & set(others)
    assert query(pipeline, "SELECT message_pk FROM job WHERE id = %s", job_ids[0]) == [
        {"message_pk": copied}
    ]
    assert query(
        pipeline,
        "SELECT count(*) AS n FROM message_key k JOIN message m ON m.pk = k.message_pk"
        " WHERE m.pk = %s",
        copied,
    ) == [{"n": 1}]
    assert batches(pipeline)[0]["kept_message_count"] == 1
    # No job points at a message that is gone, and no key outlives its message.
    assert query(
        pipeline,
        "SELECT count(*) AS n FROM job j WHERE NOT EXISTS"
        " (SELECT 1 FROM message m WHERE m.pk = j.message_pk)",
    ) == [{"n": 0}]
    assert query(
        pipeline,
        "SELECT count(*) AS n FROM message_key k WHERE NOT EXISTS"
        " (SELECT 1 FROM message m WHERE m.pk = k.message_pk)",
    ) == [{"n": 0}]
