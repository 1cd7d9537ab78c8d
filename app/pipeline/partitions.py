"""archive, partition by partition: a closed job partition past its retention, holding only
delivered jobs, exported whole to Parquet and read back; then marked EXPORTED, which is the
broker's cue to detach and drop it (app/services/retention.py). No row is deleted here.

Layout: <archive-root>/job_partition/partition=job_pN/dt=YYYY-MM-DD/*.parquet (the archived job
columns, as the batch archive's job files). A run that stops before the mark exports the
partition again next time (the write replaces the partition's directory); one that stops after
it leaves the rest to the broker's sweeper, which finishes whatever step it finds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from app.config import PipelineConfig
from app.pipeline.db import JdbcTarget
from app.pipeline.progress import Progress
from app.pipeline.replica import ExportReads
from app.pipeline.schemas import ARCHIVED_JOB, PARTITIONS, conform
from app.pipeline.spark import ArchiveFs
from app.pipeline.transforms import with_day

# Called after a partition's files are written and read back ("exported", before the mark)
# and after the mark ("marked"). Tests raise from it to stand for a crash there.
PartitionHook = Callable[[str, str], None]

DATASET = "job_partition"
_ROWS_PER_JDBC_PARTITION = 20_000

# Closed partitions past the retention; whether each holds only delivered jobs is asked apart.
_CANDIDATES = """
SELECT name FROM job_partition
WHERE status = 'ATTACHED' AND closed_at IS NOT NULL
  AND closed_at <= now() - make_interval(days => %(days)s)
ORDER BY upper_id
"""

_MARK = """
UPDATE job_partition SET status = 'EXPORTED', exported_rows = %(rows)s, changed_at = now()
WHERE name = %(name)s AND status = 'ATTACHED'
"""

_JOB_SQL = """(SELECT j.id, j.message_pk, j.consumer_pk, c.channel_id, c.consumer_id, j.status,
        j.priority, j.payload_size, j.attempt, j.retry_count, j.timeout_count,
        j.incremental_timeout, j.lease_expires_at, j.earliest_next_attempt_at, j.claimed_at,
        j.status_changed_at, j.created_at, j.dead_reason, j.last_error
   FROM {name} j JOIN consumer c ON c.pk = j.consumer_pk) AS archived_partition"""


class PartitionExportMismatch(RuntimeError):
    """The Parquet files read back do not hold the partition's rows."""


def partition_dir(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{DATASET}/partition={name}"


def _checked(name: str) -> str:
    # Names come from job_partition, which only the broker writes; checked before they go into
    # SQL all the same.
    if not (name.startswith("job_p") and name[5:].isdigit()):
        raise ValueError(f"not a job partition: {name!r}")
    return name


def read_partition_files(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.schema(StructType([*ARCHIVED_JOB.fields, PARTITIONS["dt"]])).parquet(path)


def archived_partitions(spark: SparkSession, root: str, names: list[str]) -> DataFrame | None:
    """The archived jobs of these (detached or dropped) partitions, with `partition`."""
    if not names:
        return None
    base = f"{root.rstrip('/')}/{DATASET}"
    if not ArchiveFs(spark, root).has_data(base):
        return None
    schema = StructType(
        [*ARCHIVED_JOB.fields, StructField("partition", StringType()), PARTITIONS["dt"]]
    )
    frame = spark.read.schema(schema).option("basePath", base).parquet(base)
    return frame.where(frame["partition"].isin(names))


@dataclass
class PartitionSummary:
    exported: list[str] = field(default_factory=list)
    jobs: int = 0
    skipped: list[str] = field(default_factory=list)  # unfinished jobs left in them
    read_from: dict[str, int] = field(default_factory=dict)  # exports by database read

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exported": self.exported, "jobs": self.jobs}
        out["waiting"] = self.skipped
        if self.read_from:
            out["read_from"] = self.read_from
        return out


class PartitionArchiver:
    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        reads: ExportReads,
        conn: psycopg.Connection[Any],
        progress: Progress,
        hook: PartitionHook | None = None,
    ) -> None:
        self._spark = spark
        self._config = config
        self._reads = reads
        self._conn = conn
        self._progress = progress
        self._hook = hook or (lambda step, name: None)
        self.summary = PartitionSummary()

    def run(self) -> PartitionSummary:
        before = self._reads.read_from.copy()  # the run's other archiver counts there too
        for name in self._candidates():
            rows = self._finished_rows(name)
            if rows is None:
                # The broker's sweeper moves them forward first; the next run takes it.
                self.summary.skipped.append(name)
                self._progress.line(f"partition {name}: unfinished jobs left, later")
                continue
            self._export(name, rows)
        self.summary.read_from = dict(self._reads.read_from - before)
        return self.summary

    def _candidates(self) -> list[str]:
        with self._conn.transaction():
            rows = self._conn.execute(_CANDIDATES, {"days": self._config.retention_days})
            return [_checked(r[0]) for r in rows.fetchall()]

    def _finished_rows(self, name: str) -> int | None:
        """The partition's row count, or None while any of its jobs is not delivered."""
        with self._conn.transaction():
            row = self._conn.execute(
                f"SELECT count(*), count(*) FILTER (WHERE status <> 'DELIVERED') FROM {name}"
            ).fetchone()
        assert row is not None
        return None if row[1] else int(row[0])

    def _bounds(self, name: str) -> tuple[int, int]:
        with self._conn.transaction():
            row = self._conn.execute(f"SELECT min(id), max(id) FROM {name}").fetchone()
        assert row is not None
        return (int(row[0]), int(row[1])) if row[0] is not None else (0, 0)

    def _export_once(
        self, name: str, ids: tuple[int, int], partitions: int, target: str, jdbc: JdbcTarget
    ) -> int:
        """The partition's jobs read from `jdbc`, written and read back: rows in the files."""
        source = (
            self._spark.read.format("jdbc")
            .options(**jdbc.options(self._config.jdbc_fetch_size))
            .option("dbtable", _JOB_SQL.format(name=name))
            .option("partitionColumn", "id")
            .option("lowerBound", str(ids[0]))
            .option("upperBound", str(ids[1] + 1))
            .option("numPartitions", str(partitions))
            .load()
        )
        # Overwrite: a repeated export replaces exactly this partition's directory.
        with_day(conform(source, ARCHIVED_JOB), "created_at").write.mode("overwrite").partitionBy(
            "dt"
        ).parquet(target)
        return int(read_partition_files(self._spark, target).count())

    def _export(self, name: str, expected: int) -> None:
        started = time.monotonic()
        target = partition_dir(self._config.archive_root, name)
        for _ in range(2):
            low, high = self._bounds(name)
            partitions = max(
                1, min(self._config.jdbc_partitions, expected // _ROWS_PER_JDBC_PARTITION)
            )
            # Every job delivered and counted just now: the broker writes none of them again
            # (a consumer's deletion may remove some, which the count after catches), so a
            # replica past this moment holds the partition as the primary does.
            export = partial(self._export_once, name, (low, high), partitions, target)
            got = self._reads.run(self._conn, f"partition {name}", export)
            if got == expected:
                break
            # A consumer deleted meanwhile took its jobs along: count again, export again.
            recount = self._finished_rows(name)
            if recount is None:
                raise PartitionExportMismatch(f"partition {name}: a job woke during its export")
            expected = recount
        else:
            raise PartitionExportMismatch(
                f"partition {name}: Parquet holds {got} jobs, the database {expected}"
            )
        self._hook("exported", name)
        with self._conn.transaction():
            self._conn.execute(_MARK, {"rows": expected, "name": name})
        self._hook("marked", name)
        self.summary.exported.append(name)
        self.summary.jobs += expected
        self._progress.line(
            f"partition {name}: exported and verified {expected} jobs"
            f" in {time.monotonic() - started:.1f}s; the broker drops it"
        )
