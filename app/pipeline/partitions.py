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
finishes whatever step it finds. The mark is refused when the partition changed since it was
counted (a job made for one of its messages; a row gone: a scheduled message cancelled, a
consumer's jobs deleted), so the files hold exactly what the broker drops; a refused mark
removes the files again. Files the state does not account for (a refused mark whose removal
failed, a crash before the mark) are removed at the start of the next run, before anything is
exported, and the run fails while they cannot be: no reader and no read-back counts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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

# The rows counted before the export must all still be there: a consumer's deletion that
# removed some of them meanwhile leaves the partition ATTACHED, to be exported again.
_MARK = """
UPDATE job_partition SET status = 'EXPORTED', exported_rows = %(rows)s, changed_at = now()
WHERE name = %(name)s AND status = 'ATTACHED'
  AND (SELECT count(*) FROM job WHERE id >= %(low)s AND id < %(high)s) = %(rows)s
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
# partition's re-homing) committed since the first check keeps the partition ATTACHED, and so
# does a message gone since the count (a scheduled message's cancel deletes it, with its key):
# the files would hold a message the broker no longer has. The row is locked first, by a
# statement of its own: a copy, and a cancel, hold it FOR SHARE while they work
# (app/store/backfill.py, app/store/messages.py), and the mark's check must see what they
# committed, which a snapshot taken before the lock was granted would not (an UPDATE only
# waiting for a row's lockers keeps its snapshot). A copy or a cancel after the mark finds the
# row EXPORTED and leaves the partition's messages alone.
_LOCK_MESSAGES = """
SELECT 1 FROM message_partition WHERE name = %(name)s FOR NO KEY UPDATE
"""
_MARK_MESSAGES = f"""
UPDATE message_partition SET status = 'EXPORTED', exported_rows = %(rows)s, changed_at = now()
WHERE name = %(name)s AND status = 'ATTACHED' AND closed_at IS NOT NULL
  AND {_MESSAGES_FREE}
  AND (SELECT count(*) FROM message WHERE pk >= %(low)s AND pk < %(high)s) = %(rows)s
"""

# Each partition directory in the archive root, with the state of its partition: files the
# state does not account for are stale (see _Archiver.clean).
_STATES = "SELECT name, status, exported_rows FROM {state} WHERE name = ANY(%(names)s)"

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
    stale_removed: list[str] = field(default_factory=list)  # files no state accounted for
    stale_left: list[str] = field(default_factory=list)  # a refused mark's, not removable now

    @property
    def jobs(self) -> int:
        return self.rows

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exported": self.exported, self.rows_name: self.rows}
        out["waiting"] = self.skipped
        if self.read_from:
            out["read_from"] = self.read_from
        if self.stale_removed:
            out["stale_files_removed"] = self.stale_removed
        if self.stale_left:
            out["stale_files_left"] = self.stale_left
        return out


class _Archiver:
    """Exports, reads back and marks the partitions `_ready` lets go (one kind of them)."""

    kind: _Kind = JOB_KIND
    _waits_for = "unfinished jobs left"
    _empty_left_to_broker = False

    def __init__(
        self,
        spark: SparkSession | None,  # None: plan() only (a dry run starts no Spark)
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

    @property
    def _session(self) -> SparkSession:
        if self._spark is None:
            raise RuntimeError("a partition archive without a SparkSession can only plan")
        return self._spark

    def run(self) -> PartitionSummary:
        before = self._reads.read_from.copy()  # the run's other archivers count there too
        self.clean()
        for name, low, high, rows in self._taken():
            if rows is None:
                self.summary.skipped.append(name)
                self._progress.line(f"partition {name}: {self._waits_for}, later")
                continue
            self._export(name, low, high, rows)
        self.summary.read_from = dict(self._reads.read_from - before)
        return self.summary

    def plan(self) -> dict[str, Any]:
        """What run() would export now, as it would take each partition (its rows, its first
        and last key, the JDBC reads it would split into), with nothing written or marked:
        for --dry-run. The order and the checks are run()'s."""
        kind = self.kind
        planned: list[dict[str, Any]] = []
        waiting: list[str] = []
        for name, _, _, rows in self._taken():
            if rows is None:
                waiting.append(name)
                continue
            first, last = self._bounds(name)
            self._progress.line(
                f"dry run: partition {name} would be exported whole, {rows} {kind.rows}"
                f" ({kind.key} {first}..{last})"
            )
            planned.append(
                {
                    "partition": name,
                    kind.rows: rows,
                    f"first_{kind.key}": first,
                    f"last_{kind.key}": last,
                    "jdbc_partitions": self._jdbc_partitions(rows),
                    "path": partition_dir(self._config.archive_root, name, kind.dataset),
                }
            )
        total = sum(int(p[kind.rows]) for p in planned)
        return {"would_export": planned, kind.rows: total, "waiting": waiting}

    def _taken(self) -> Iterator[tuple[str, int, int, int | None]]:
        """Each candidate as a run takes it, for run() and plan() alike: its rows to export,
        or None while it must wait; an empty one the broker drops by itself is left out."""
        for name, low, high in self._candidates():
            rows = self._ready(name, low, high)
            if rows == 0 and self._empty_left_to_broker:
                continue
            yield name, low, high, rows

    def clean(self) -> None:
        """Remove the partition directories whose files the state does not account for, before
        anything is exported: those of a partition still ATTACHED (a refused mark whose removal
        failed, a crash before the mark; its next export writes it again from scratch) and
        those of one the broker's sweeper marked EXPORTED with no rows (a message partition the
        batch archive emptied after an earlier export of it was refused). A partition this
        archive marked with rows holds its own files only: it is marked once, and only an
        ATTACHED one is exported. Files that cannot be removed fail the run: left, a reader (or
        the sweeper's later mark) would take them for archived rows."""
        kind = self.kind
        root = self._config.archive_root
        fs = ArchiveFs(self._session, root)
        prefix = "partition="
        names = [
            d[len(prefix) :]
            for d in fs.subdirectories(f"{root.rstrip('/')}/{kind.dataset}")
            if d.startswith(prefix) and d[len(prefix) :].startswith(f"{kind.table}_p")
        ]
        if not names:
            return
        with self._conn.transaction():
            rows = self._conn.execute(_STATES.format(state=kind.state), {"names": names}).fetchall()
        for name, status, exported in rows:
            target = partition_dir(root, str(name), kind.dataset)
            # Only the sweeper marks a partition with no rows (of the kinds it empties).
            emptied = self._empty_left_to_broker and exported == 0
            stale = status == "ATTACHED" or (emptied and fs.has_data(target))
            if not stale:
                continue
            if not fs.delete(target):
                raise OSError(
                    f"partition {name} ({status}): files the archive state does not account"
                    f" for at {target} could not be removed; remove them (or make them"
                    " removable) and run again"
                )
            self.summary.stale_removed.append(str(name))
            self._progress.line(f"partition {name}: removed files of an export never marked")

    def _jdbc_partitions(self, rows: int) -> int:
        return max(1, min(self._config.jdbc_partitions, rows // _ROWS_PER_JDBC_PARTITION))

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
            self._session.read.format("jdbc")
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
        return int(read_partition_files(self._session, target, kind.schema).count())

    def _export(self, name: str, low: int, high: int, expected: int) -> None:
        started = time.monotonic()
        kind = self.kind
        target = partition_dir(self._config.archive_root, name, kind.dataset)
        for _ in range(2):
            keys = self._bounds(name)
            partitions = self._jdbc_partitions(expected)
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
            self.summary.skipped.append(name)
            self._progress.line(f"partition {name}: changed since its export, later")
            if not ArchiveFs(self._session, self._config.archive_root).delete(target):
                # The next run's clean() removes them before it exports anything.
                self.summary.stale_left.append(name)
                self._progress.line(
                    f"partition {name}: could not remove its refused export's files at"
                    f" {target}; the next run removes them first"
                )
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
        params = {"rows": rows, "name": name, "low": low, "high": high}
        with self._conn.transaction():
            return bool(self._conn.execute(_MARK, params).rowcount)


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
