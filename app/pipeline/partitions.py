"""archive, partition by partition: a closed partition past its retention exported whole to
Parquet and read back, then marked EXPORTED, which is the broker's cue to detach and drop it
(app/services/retention.py). No row is deleted here.

- job partitions holding only delivered jobs (the sweeper moved the unfinished ones forward):
  <archive-root>/job_partition/partition=job_pN/dt=YYYY-MM-DD/*.parquet, the archived job
  columns, as the batch archive's job files;
- message partitions no job points into any more (their jobs left with their job partitions):
  <archive-root>/message_partition/partition=message_pN/dt=YYYY-MM-DD/*.parquet, the archived
  message columns, as the batch archive's message files. One that jobs still point into (dead
  jobs in a DLQ, scheduled ones, moved forward) waits; its other messages leave by the batch
  archive's row deletes meanwhile, and it goes once nothing points into it any more.

A partition's files count as archived once its state says EXPORTED (or later): a run that
stops before the mark exports the partition again next time (the write replaces the
partition's directory); one that stops after it leaves the rest to the broker's sweeper, which
finishes whatever step it finds. A mark the database refuses (a job made for one of the
partition's messages meanwhile) removes the files again.
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
from app.pipeline.schemas import ARCHIVED_JOB, ARCHIVED_MESSAGE, PARTITIONS, conform
from app.pipeline.spark import ArchiveFs
from app.pipeline.transforms import with_day

# Called after a partition's files are written and read back ("exported", before the mark)
# and after the mark ("marked"). Tests raise from it to stand for a crash there.
PartitionHook = Callable[[str, str], None]

DATASET = "job_partition"
MESSAGE_DATASET = "message_partition"
_ROWS_PER_JDBC_PARTITION = 20_000
_MIN_KEY = "-9223372036854775807 - 1"  # a lower bound for the migrated first partition (none)

# Closed partitions past the retention ({state}: job_partition or message_partition); whether
# each can go now is asked apart.
_CANDIDATES = """
SELECT name, coalesce(lower_id, {min_key}), upper_id FROM {state}
WHERE status = 'ATTACHED' AND closed_at IS NOT NULL
  AND closed_at <= now() - make_interval(days => %(days)s)
ORDER BY upper_id
"""

_MARK = """
UPDATE job_partition SET status = 'EXPORTED', exported_rows = %(rows)s, changed_at = now()
WHERE name = %(name)s AND status = 'ATTACHED'
"""

# Nothing may point into a message partition that leaves whole: no job (app/store/partitions.py
# REFERENCED: a job partition exported or detached but not dropped counts, since its drop may
# re-home rows pointing anywhere), and no batch of the row archive not yet finished (it would
# delete, or has exported, some of its messages: those leave by the batch).
_MESSAGES_FREE = """
NOT EXISTS (SELECT 1 FROM job WHERE message_pk >= %(low)s AND message_pk < %(high)s)
AND NOT EXISTS (SELECT 1 FROM job_partition WHERE status IN ('EXPORTED', 'DETACHED'))
AND NOT EXISTS (
    SELECT 1 FROM archive_batch a JOIN archive_batch_message b ON b.batch_id = a.id
     WHERE (a.status <> 'DELETED' OR NOT a.finalized)
       AND b.message_pk >= %(low)s AND b.message_pk < %(high)s)
"""

_MESSAGES_FREE_NOW = f"SELECT {_MESSAGES_FREE}"

# The check again, in the statement that marks: a job the NATS bridge's history copy (or a job
# partition's re-homing) committed since the first check keeps the partition ATTACHED. The row
# is locked first, by a statement of its own: a copy holds it FOR SHARE while it makes jobs
# (app/store/backfill.py), and the mark's check must see those jobs, which a snapshot taken
# before the lock was granted would not (an UPDATE only waiting for a row's lockers keeps its
# snapshot). A copy after the mark finds the row EXPORTED and makes no job into it.
_LOCK_MESSAGES = """
SELECT 1 FROM message_partition WHERE name = %(name)s FOR NO KEY UPDATE
"""
_MARK_MESSAGES = f"""
UPDATE message_partition SET status = 'EXPORTED', exported_rows = %(rows)s, changed_at = now()
WHERE name = %(name)s AND status = 'ATTACHED' AND closed_at IS NOT NULL
  AND {_MESSAGES_FREE}
"""

_JOB_SQL = """(SELECT j.id, j.message_pk, j.consumer_pk, c.channel_id, c.consumer_id, j.status,
        j.priority, j.payload_size, j.attempt, j.retry_count, j.timeout_count,
        j.incremental_timeout, j.lease_expires_at, j.earliest_next_attempt_at, j.claimed_at,
        j.status_changed_at, j.created_at, j.dead_reason, j.last_error
   FROM {name} j JOIN consumer c ON c.pk = j.consumer_pk) AS archived_partition"""

_MESSAGE_SQL = """(SELECT m.pk, m.channel_id, m.message_id, m.producer_id, m.payload,
        m.content_type, m.priority, m.headers::text AS headers, m.received_at
   FROM {name} m) AS archived_message_partition"""


class PartitionExportMismatch(RuntimeError):
    """The Parquet files read back do not hold the partition's rows."""


@dataclass(frozen=True, slots=True)
class _Kind:
    """What differs between archiving a job partition and a message partition."""

    table: str
    dataset: str
    source: str  # the JDBC source, {name} the partition
    key: str  # its partition column
    schema: StructType
    day: str  # the column that gives `dt`
    rows: str  # what a row is, for the progress lines

    @property
    def state(self) -> str:
        return f"{self.table}_partition"


JOB_KIND = _Kind("job", DATASET, _JOB_SQL, "id", ARCHIVED_JOB, "created_at", "jobs")
MESSAGE_KIND = _Kind(
    "message", MESSAGE_DATASET, _MESSAGE_SQL, "pk", ARCHIVED_MESSAGE, "received_at", "messages"
)


def partition_dir(root: str, name: str, dataset: str = DATASET) -> str:
    return f"{root.rstrip('/')}/{dataset}/partition={name}"


def _checked(name: str, kind: _Kind = JOB_KIND) -> str:
    # Names come from job_partition and message_partition, which only the broker writes;
    # checked before they go into SQL all the same.
    prefix = f"{kind.table}_p"
    if not (name.startswith(prefix) and name[len(prefix) :].isdigit()):
        raise ValueError(f"not a {kind.table} partition: {name!r}")
    return name


def read_partition_files(
    spark: SparkSession, path: str, schema: StructType = ARCHIVED_JOB
) -> DataFrame:
    return spark.read.schema(StructType([*schema.fields, PARTITIONS["dt"]])).parquet(path)


def archived_partitions(
    spark: SparkSession, root: str, names: list[str], kind: _Kind = JOB_KIND
) -> DataFrame | None:
    """The archived rows of these (exported, detached or dropped) partitions, with
    `partition`: jobs, or messages with `kind=MESSAGE_KIND`."""
    if not names:
        return None
    base = f"{root.rstrip('/')}/{kind.dataset}"
    if not ArchiveFs(spark, root).has_data(base):
        return None
    schema = StructType(
        [*kind.schema.fields, StructField("partition", StringType()), PARTITIONS["dt"]]
    )
    frame = spark.read.schema(schema).option("basePath", base).parquet(base)
    return frame.where(frame["partition"].isin(names))


@dataclass
class PartitionSummary:
    rows_name: str = "jobs"
    exported: list[str] = field(default_factory=list)
    rows: int = 0
    skipped: list[str] = field(default_factory=list)  # something left in them, or pointing in
    read_from: dict[str, int] = field(default_factory=dict)  # exports by database read

    @property
    def jobs(self) -> int:
        return self.rows

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exported": self.exported, self.rows_name: self.rows}
        out["waiting"] = self.skipped
        if self.read_from:
            out["read_from"] = self.read_from
        return out


class _Archiver:
    """Exports, reads back and marks the partitions `_ready` lets go (one kind of them)."""

    kind: _Kind = JOB_KIND
    _waits_for = "unfinished jobs left"
    _empty_left_to_broker = False

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
        self.summary = PartitionSummary(self.kind.rows)

    def run(self) -> PartitionSummary:
        before = self._reads.read_from.copy()  # the run's other archivers count there too
        for name, low, high in self._candidates():
            rows = self._ready(name, low, high)
            if rows is None:
                self.summary.skipped.append(name)
                self._progress.line(f"partition {name}: {self._waits_for}, later")
                continue
            if rows == 0 and self._empty_left_to_broker:
                continue
            self._export(name, low, high, rows)
        self.summary.read_from = dict(self._reads.read_from - before)
        return self.summary

    def _candidates(self) -> list[tuple[str, int, int]]:
        sql = _CANDIDATES.format(state=self.kind.state, min_key=_MIN_KEY)
        with self._conn.transaction():
            rows = self._conn.execute(sql, {"days": self._config.retention_days}).fetchall()
        return [(_checked(r[0], self.kind), int(r[1]), int(r[2])) for r in rows]

    def _ready(self, name: str, low: int, high: int) -> int | None:
        """The partition's row count, or None while it cannot go yet."""
        raise NotImplementedError

    def _mark(self, name: str, low: int, high: int, rows: int) -> bool:
        raise NotImplementedError

    def _bounds(self, name: str) -> tuple[int, int]:
        key = self.kind.key
        with self._conn.transaction():
            row = self._conn.execute(f"SELECT min({key}), max({key}) FROM {name}").fetchone()
        assert row is not None
        return (int(row[0]), int(row[1])) if row[0] is not None else (0, 0)

    def _export_once(
        self, name: str, keys: tuple[int, int], partitions: int, target: str, jdbc: JdbcTarget
    ) -> int:
        """The partition's rows read from `jdbc`, written and read back: rows in the files."""
        kind = self.kind
        source = (
            self._spark.read.format("jdbc")
            .options(**jdbc.options(self._config.jdbc_fetch_size))
            .option("dbtable", kind.source.format(name=name))
            .option("partitionColumn", kind.key)
            .option("lowerBound", str(keys[0]))
            .option("upperBound", str(keys[1] + 1))
            .option("numPartitions", str(partitions))
            .load()
        )
        # Overwrite: a repeated export replaces exactly this partition's directory.
        with_day(conform(source, kind.schema), kind.day).write.mode("overwrite").partitionBy(
            "dt"
        ).parquet(target)
        return int(read_partition_files(self._spark, target, kind.schema).count())

    def _export(self, name: str, low: int, high: int, expected: int) -> None:
        started = time.monotonic()
        kind = self.kind
        target = partition_dir(self._config.archive_root, name, kind.dataset)
        for _ in range(2):
            keys = self._bounds(name)
            partitions = max(
                1, min(self._config.jdbc_partitions, expected // _ROWS_PER_JDBC_PARTITION)
            )
            # Counted just now, with nothing left that the broker writes again (jobs all
            # delivered; messages no job points at), so a replica past this moment holds the
            # partition as the primary does. A consumer's deletion may remove jobs, which the
            # count after catches.
            export = partial(self._export_once, name, keys, partitions, target)
            got = self._reads.run(self._conn, f"partition {name}", export)
            if got == expected:
                break
            recount = self._ready(name, low, high)
            if recount is None:
                raise PartitionExportMismatch(f"partition {name}: {self._waits_for} meanwhile")
            expected = recount
        else:
            raise PartitionExportMismatch(
                f"partition {name}: Parquet holds {got} {kind.rows}, the database {expected}"
            )
        self._hook("exported", name)
        if not self._mark(name, low, high, expected):
            # Its files never counted (not EXPORTED); removed so that none mislead a reader.
            ArchiveFs(self._spark, self._config.archive_root).delete(target)
            self.summary.skipped.append(name)
            self._progress.line(f"partition {name}: {self._waits_for} meanwhile, later")
            return
        self._hook("marked", name)
        self.summary.exported.append(name)
        self.summary.rows += expected
        self._progress.line(
            f"partition {name}: exported and verified {expected} {kind.rows}"
            f" in {time.monotonic() - started:.1f}s; the broker drops it"
        )


class PartitionArchiver(_Archiver):
    """Job partitions holding only delivered jobs (the sweeper moves the others forward)."""

    kind = JOB_KIND

    def _ready(self, name: str, low: int, high: int) -> int | None:
        with self._conn.transaction():
            row = self._conn.execute(
                f"SELECT count(*), count(*) FILTER (WHERE status <> 'DELIVERED') FROM {name}"
            ).fetchone()
        assert row is not None
        return None if row[1] else int(row[0])

    def _mark(self, name: str, low: int, high: int, rows: int) -> bool:
        with self._conn.transaction():
            return bool(self._conn.execute(_MARK, {"rows": rows, "name": name}).rowcount)


class MessagePartitionArchiver(_Archiver):
    """Message partitions nothing points into any more. Runs before PartitionArchiver in a
    run: a job partition it marks counts as pointing into every message partition until the
    broker drops it."""

    kind = MESSAGE_KIND
    _waits_for = "jobs (or an unfinished batch) still point into it"
    # The sweeper marks an empty one itself (MARK_EMPTIED): no files to write for it.
    _empty_left_to_broker = True

    def _ready(self, name: str, low: int, high: int) -> int | None:
        params = {"low": low, "high": high}
        with self._conn.transaction():
            free = self._conn.execute(_MESSAGES_FREE_NOW, params).fetchone()
            assert free is not None
            if not free[0]:
                return None
            row = self._conn.execute(f"SELECT count(*) FROM {name}").fetchone()
        assert row is not None
        return int(row[0])

    def _mark(self, name: str, low: int, high: int, rows: int) -> bool:
        params = {"rows": rows, "name": name, "low": low, "high": high}
        with self._conn.transaction():
            self._conn.execute(_LOCK_MESSAGES, params)
            return bool(self._conn.execute(_MARK_MESSAGES, params).rowcount)
