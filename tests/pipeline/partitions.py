"""Steps the partition archive's tests share (tests/pipeline/test_partition_archive.py,
test_message_partition_archive.py, test_message_partition_replica.py, test_archive_replica.py):
the broker's sweeper run on its own Database, a crash standing in at a step, SQL run on the
pipeline's database, and message_p0 seeded and closed past the retention."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.partitions import (
    MESSAGE_DATASET,
    MESSAGE_KIND,
    PartitionHook,
    archived_partitions,
)
from app.services.retention import RetentionService
from app.store.db import Database
from tests.pipeline import data
from tests.pipeline.helpers import MESSAGES_SQL, _python, query

T = TypeVar("T")


class Crash(RuntimeError):
    """Stands for the process dying right after a step."""


def broker(config: Config, step: Callable[[RetentionService], Awaitable[T]]) -> T:
    """One step of the broker's sweeper (its partition round's parts) on its own Database."""

    async def go() -> T:
        db = Database.from_config(config.database)
        try:
            service = RetentionService(
                db,
                config.database.partition_interval_seconds,
                config.pipeline.retention_days,
                hold_seconds=60,
            )
            return await step(service)
        finally:
            await db.dispose()

    return asyncio.run(go())


def crash_at(step: str) -> PartitionHook:
    def hook(done: str, name: str) -> None:
        if done == step:
            raise Crash(f"after {step} of {name}")

    return hook


def execute(config: Config, sql: str) -> None:
    with psycopg.connect(config.database.connection_url) as conn:
        conn.execute(sql)


STATE = "SELECT status, exported_rows FROM message_partition WHERE name = 'message_p0'"


def closed_past_retention(config: Config) -> data.Dataset:
    """Seeded messages (with their keys) in message_p0 and their jobs in job_p0, both
    partitions closed by the broker's rotation 8 days ago (past the 7 days' retention)."""
    dataset = data.seed(config.database.connection_url)
    execute(
        config,
        "INSERT INTO message_key (channel_id, message_id, message_pk)"
        " SELECT channel_id, message_id, pk FROM message",
    )
    broker(config, lambda s: s.maintain())
    for state in ("job_partition", "message_partition"):
        execute(
            config,
            f"UPDATE {state} SET opened_at = now() - interval '2 hours'"
            " WHERE name IN ('job_p0', 'message_p0')",
        )
    broker(config, lambda s: s.maintain())
    assert query(
        config,
        "SELECT name FROM job_partition WHERE closed_at IS NOT NULL UNION ALL"
        " SELECT name FROM message_partition WHERE closed_at IS NOT NULL ORDER BY name",
    ) == [{"name": "job_p0"}, {"name": "message_p0"}]
    for state in ("job_partition", "message_partition"):
        execute(
            config,
            f"UPDATE {state} SET closed_at = now() - interval '8 days'"
            " WHERE name IN ('job_p0', 'message_p0')",
        )
    assert query(config, "SELECT count(*) AS n FROM message_p0") == [
        {"n": len(dataset.old_terminal + dataset.old_open + dataset.recent)}
    ]
    return dataset


def jobs_leave_with_their_partition(config: Config, spark: SparkSession) -> None:
    """Every job delivered; the archive exports job_p0 and the broker drops it."""
    execute(config, "UPDATE job SET status = 'DELIVERED' WHERE status <> 'DELIVERED'")
    first = run("archive", config, spark=spark)
    assert first["status"] == "ok", first
    # The jobs still point into message_p0 while the archive runs: it waits.
    assert first["message_partitions"] == {
        "exported": [],
        "messages": 0,
        "waiting": ["message_p0"],
    }
    assert first["partitions"]["exported"] == ["job_p0"]
    assert broker(config, lambda s: s.finish_exported()).dropped == ["job_p0"]
    assert query(config, "SELECT count(*) AS n FROM job") == [{"n": 0}]


def messages(config: Config) -> list[dict[str, Any]]:
    pks = [r["pk"] for r in query(config, "SELECT pk FROM message")]
    return query(config, MESSAGES_SQL, pks)


def archived_whole(spark: SparkSession, config: Config) -> list[dict[str, Any]]:
    frame = archived_partitions(
        spark, config.pipeline.archive_root, ["message_p0"], kind=MESSAGE_KIND
    )
    if frame is None:
        return []
    return [_python(row.asDict()) for row in frame.orderBy("pk").collect()]


def files(config: Config) -> list[Path]:
    return list((Path(config.pipeline.archive_root) / MESSAGE_DATASET).rglob("*.parquet"))
