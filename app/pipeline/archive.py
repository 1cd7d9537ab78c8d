"""archive: batches of finished messages to Parquet, verified, then pruned from PostgreSQL.

Each batch goes PLANNED -> EXPORTED -> DELETED (state.py keeps the state in PostgreSQL), and a
run first finishes whatever a crashed run left behind. The export overwrites only its batch's
directory, so repeating any step after a crash neither loses nor duplicates a row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from app.config import PipelineConfig
from app.pipeline.db import JdbcTarget
from app.pipeline.progress import Progress
from app.pipeline.replica import ExportReads
from app.pipeline.schemas import ARCHIVED_JOB, ARCHIVED_MESSAGE, PARTITIONS, conform
from app.pipeline.spark import ArchiveFs
from app.pipeline.state import EXPORTED, PLANNED, Batch, BatchStore
from app.pipeline.transforms import with_day

# Called after each step ("planned", "exported", "deleted", "finalized"; inside finalize also
# "<table>-staged", between removing a batch's files and moving the staged copy in) with the
# batch as it was when the step ended. Tests raise from it to simulate a crash at that point.
StepHook = Callable[[str, Batch], None]

_MESSAGE_SQL = """(SELECT m.pk, m.channel_id, m.message_id, m.producer_id, m.payload,
        m.content_type, m.priority, m.headers::text AS headers, m.received_at
   FROM message m JOIN archive_batch_message b ON b.message_pk = m.pk
  WHERE b.batch_id = {batch_id}) AS archived_message"""

_JOB_SQL = """(SELECT j.id, j.message_pk, j.consumer_pk, c.channel_id, c.consumer_id, j.status,
        j.priority, j.payload_size, j.attempt, j.retry_count, j.timeout_count,
        j.incremental_timeout, j.lease_expires_at, j.earliest_next_attempt_at, j.claimed_at,
        j.status_changed_at, j.created_at, j.dead_reason, j.last_error
   FROM job j
   JOIN archive_batch_message b ON b.message_pk = j.message_pk
   JOIN consumer c ON c.pk = j.consumer_pk
  WHERE b.batch_id = {batch_id}) AS archived_job"""

# (table, JDBC source, partition/key column, contract, column that gives the dt partition)
_TABLES: tuple[tuple[str, str, str, StructType, str], ...] = (
    ("message", _MESSAGE_SQL, "pk", ARCHIVED_MESSAGE, "received_at"),
    ("job", _JOB_SQL, "message_pk", ARCHIVED_JOB, "created_at"),
)
_ROWS_PER_JDBC_PARTITION = 20_000
_DELETE_TRIES = 3


class ExportMismatch(RuntimeError):
    """The Parquet files read back do not hold what the database holds for the batch."""


@dataclass
class StepStats:
    rows: int = 0
    seconds: float = 0.0

    def add(self, rows: int, started: float) -> None:
        self.rows += rows
        self.seconds += time.monotonic() - started

    def as_dict(self) -> dict[str, Any]:
        rate = self.rows / self.seconds if self.seconds > 0 else None
        return {"rows": self.rows, "seconds": round(self.seconds, 3), "rows_per_second": rate}


@dataclass
class ArchiveSummary:
    batches: int = 0
    resumed: int = 0
    messages: int = 0
    jobs: int = 0
    kept: int = 0
    read_from: dict[str, int] = field(default_factory=dict)  # exports by database read
    steps: dict[str, StepStats] = field(
        default_factory=lambda: {s: StepStats() for s in ("plan", "export", "delete", "finalize")}
    )

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "resumed_batches": self.resumed,
            "archived_messages": self.messages,
            "archived_jobs": self.jobs,
            "kept_messages": self.kept,
            "steps": {name: stats.as_dict() for name, stats in self.steps.items()},
            **({"read_from": self.read_from} if self.read_from else {}),
        }


def batch_dir(root: str, table: str, batch_id: int) -> str:
    return f"{root.rstrip('/')}/{table}/batch_id={batch_id}"


def staging_dir(root: str, table: str, batch_id: int) -> str:
    """Where finalize stages a batch's rewritten files (hidden from partition discovery)."""
    return batch_dir(f"{root.rstrip('/')}/_rewrite", table, batch_id)


def read_batch_files(spark: SparkSession, path: str, table: str) -> DataFrame:
    """One batch directory of one table, with its `dt` partition column."""
    schema = ARCHIVED_MESSAGE if table == "message" else ARCHIVED_JOB
    return spark.read.schema(StructType([*schema.fields, PARTITIONS["dt"]])).parquet(path)


class Archiver:
    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        reads: ExportReads,
        conn: psycopg.Connection[Any],
        store: BatchStore,
        progress: Progress,
        hook: StepHook | None = None,
    ) -> None:
        self._spark = spark
        self._config = config
        self._reads = reads
        self._conn = conn  # the primary's: the position the replica must reach is read on it
        self._store = store
        self._progress = progress
        self._hook = hook or (lambda step, batch: None)
        self._root = config.archive_root
        self._fs = ArchiveFs(spark, self._root)
        self.summary = ArchiveSummary()

    def run(self) -> ArchiveSummary:
        before = self._reads.read_from.copy()  # the run's other archiver counts there too
        for left in self._store.unfinished():
            self._progress.line(f"batch {left.id}: resuming from {left.status}")
            self.summary.resumed += 1
            self._advance(left)
        after = 0
        planned = 0
        while self._config.max_batches == 0 or planned < self._config.max_batches:
            started = time.monotonic()
            batch = self._store.plan(self._config.retention_days, self._config.batch_size, after)
            if batch is None:
                break
            self.summary.steps["plan"].add(batch.message_count + batch.job_count, started)
            self._progress.line(
                f"batch {batch.id}: planned {batch.message_count} messages,"
                f" {batch.job_count} jobs (received before {batch.cutoff:%Y-%m-%d %H:%M})"
            )
            self._hook("planned", batch)
            self._advance(batch)
            after = batch.last_message_pk
            planned += 1
        self.summary.read_from = dict(self._reads.read_from - before)
        return self.summary

    def _advance(self, batch: Batch) -> None:
        if batch.status == PLANNED:
            self._export(batch)
            batch = self._store.get(batch.id)
            self._hook("exported", batch)
        if batch.status == EXPORTED:
            self._delete(batch)
            batch = self._store.get(batch.id)
            self._hook("deleted", batch)
        if not batch.finalized:
            self._finalize(batch)
            batch = self._store.get(batch.id)
            self._hook("finalized", batch)
        self.summary.batches += 1

    # -- export --------------------------------------------------------------------------------

    def _export(self, batch: Batch) -> None:
        started = time.monotonic()

        def export(jdbc: JdbcTarget) -> tuple[int, ...]:
            return tuple(self._export_table(jdbc, batch, *table) for table in _TABLES)

        for _ in range(2):
            # Counted on the primary, then read where ExportReads says: a replica only once it
            # holds what the primary held at the count. A batch's rows are not immutable (a
            # dead job requeued), but the delete re-checks each message's fingerprint on the
            # primary, later than any read, and keeps a message whose jobs changed since the
            # plan (finalize drops it from the files): what it deletes was read as planned,
            # on either database.
            expected = self._store.recount(batch.id)
            counts = self._reads.run(self._conn, f"batch {batch.id}", export)
            if counts == expected:
                break
            # A row changed between the count and the read (a job deleted meanwhile): again.
        else:
            raise ExportMismatch(
                f"batch {batch.id}: Parquet holds {counts[0]} messages and {counts[1]} jobs,"
                f" the database {expected[0]} and {expected[1]}"
            )
        self._store.mark_exported(batch.id, *expected)
        self.summary.steps["export"].add(sum(expected), started)
        self._progress.line(
            f"batch {batch.id}: exported and verified {expected[0]} messages, {expected[1]} jobs"
            f" in {time.monotonic() - started:.1f}s"
        )

    def _export_table(
        self,
        jdbc: JdbcTarget,
        batch: Batch,
        table: str,
        sql: str,
        key: str,
        schema: StructType,
        day: str,
    ) -> int:
        partitions = max(
            1, min(self._config.jdbc_partitions, batch.message_count // _ROWS_PER_JDBC_PARTITION)
        )
        source = (
            self._spark.read.format("jdbc")
            .options(**jdbc.options(self._config.jdbc_fetch_size))
            .option("dbtable", sql.format(batch_id=int(batch.id)))
            .option("partitionColumn", key)
            .option("lowerBound", str(batch.first_message_pk))
            .option("upperBound", str(batch.last_message_pk + 1))
            .option("numPartitions", str(partitions))
            .load()
        )
        target = batch_dir(self._root, table, batch.id)
        # Overwrite replaces exactly this batch's directory: a repeated export starts clean.
        with_day(conform(source, schema), day).write.mode("overwrite").partitionBy("dt").parquet(
            target
        )
        return self._verify(batch, table)

    def _verify(self, batch: Batch, table: str) -> int:
        """Rows in the batch's files as read back (Parquet footers: no data scan)."""
        return int(
            read_batch_files(self._spark, batch_dir(self._root, table, batch.id), table).count()
        )

    # -- delete --------------------------------------------------------------------------------

    def _delete(self, batch: Batch) -> None:
        started = time.monotonic()
        for attempt in range(1, _DELETE_TRIES + 1):
            try:
                outcome = self._store.delete(batch.id)
                break
            except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable) as exc:
                if attempt == _DELETE_TRIES:
                    raise
                self._progress.line(f"batch {batch.id}: delete retried after {exc.sqlstate}")
        self.summary.messages += outcome.messages
        self.summary.jobs += outcome.jobs
        self.summary.kept += outcome.kept
        self.summary.steps["delete"].add(outcome.messages + outcome.jobs, started)
        kept = f", kept {outcome.kept} whose jobs moved" if outcome.kept else ""
        self._progress.line(
            f"batch {batch.id}: deleted {outcome.messages} messages, {outcome.jobs} jobs{kept}"
        )

    # -- finalize ------------------------------------------------------------------------------

    def _finalize(self, batch: Batch) -> None:
        """Drop kept messages (still in the database) from the batch's files."""
        started = time.monotonic()
        kept = self._store.kept(batch.id)
        rows = 0
        for table, _, key, _, _ in _TABLES:
            rows += self._rewrite_without(batch, table, key, kept)
        self._store.mark_finalized(batch.id)
        self.summary.steps["finalize"].add(rows, started)
        self._progress.line(f"batch {batch.id}: removed {len(kept)} kept messages from its files")

    def _rewrite_without(self, batch: Batch, table: str, key: str, kept: list[int]) -> int:
        target = batch_dir(self._root, table, batch.id)
        staging = staging_dir(self._root, table, batch.id)
        expected = batch.deleted_message_count if table == "message" else batch.deleted_job_count
        # The target is removed only once the staging copy is complete and checked, so when
        # the target is missing the staging copy is whole and only the rename is left to do.
        if self._fs.exists(target):
            self._fs.delete(staging)
            if batch.deleted_message_count == 0:
                self._fs.delete(target)
                return 0
            drop = self._spark.createDataFrame([(pk,) for pk in kept], "_kept_pk long")
            source = read_batch_files(self._spark, target, table)
            remaining = source.join(F.broadcast(drop), source[key] == drop["_kept_pk"], "left_anti")
            remaining.write.mode("overwrite").partitionBy("dt").parquet(staging)
            rows = int(read_batch_files(self._spark, staging, table).count())
            if rows != expected:
                raise ExportMismatch(
                    f"batch {batch.id}: {rows} {table} rows left after removing kept messages,"
                    f" {expected} were deleted from the database"
                )
            if not self._fs.delete(target):
                # A rename onto what is left would nest the staged copy inside it.
                raise OSError(f"batch {batch.id}: could not remove {target} to replace it")
            self._hook(f"{table}-staged", batch)
        if self._fs.exists(staging):
            self._fs.rename(staging, target)
        return expected
