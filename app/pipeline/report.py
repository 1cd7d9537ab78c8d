"""report: delivery analytics over the archive plus the live tables, as JSON, Parquet and HTML.

Archived jobs count once: only batches that reached DELETED are read, and the kept messages of
a batch whose files still hold them are left out (they are still live); of the job partitions
archived whole, only those the broker detached or dropped.

The database reads (batch states, live jobs) all go to one database, the replica or the
primary (app/pipeline/replica.py chooses); the report says which in `read_from`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType, TimestampType

from app.config import PipelineConfig
from app.domain.replica import ReadFrom
from app.pipeline.archive import batch_dir, read_batch_files, staging_dir
from app.pipeline.db import JdbcTarget
from app.pipeline.htmlreport import render
from app.pipeline.partitions import archived_partitions
from app.pipeline.progress import Progress
from app.pipeline.schemas import ARCHIVED_JOB, PARTITIONS, REPORT_JOB, conform
from app.pipeline.spark import ArchiveFs
from app.pipeline.state import Batch, BatchStore
from app.pipeline.transforms import delivery_stats, hourly_throughput, with_timings

_LIVE_SQL = """(SELECT j.id, c.channel_id, c.consumer_id, j.status, j.retry_count,
        j.timeout_count, j.claimed_at, j.status_changed_at, j.created_at
   FROM job j JOIN consumer c ON c.pk = j.consumer_pk) AS live_job"""
_ROWS_PER_JDBC_PARTITION = 50_000


@dataclass(frozen=True, slots=True)
class ReportResult:
    data: dict[str, Any]
    seconds: float
    rows: int
    written: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.data["totals"]["jobs"],
            "archived_jobs": self.data["sources"]["archived_jobs"],
            "live_jobs": self.data["sources"]["live_jobs"],
            "consumers": len(self.data["consumers"]),
            "read_from": self.data["read_from"],
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "rows_per_second": self.rows / self.seconds if self.seconds > 0 else None,
            "written": list(self.written),
        }


def _collect(df: DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts; timestamps as ISO 8601 UTC text (the session time zone)."""
    columns = [
        F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss'+00:00'").alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else F.col(f.name)
        for f in df.schema.fields
    ]
    return [row.asDict() for row in df.select(columns).collect()]


class Reporter:
    def __init__(
        self,
        spark: SparkSession,
        config: PipelineConfig,
        jdbc: JdbcTarget,
        conn: psycopg.Connection[Any],
        store: BatchStore,
        progress: Progress,
        read_from: ReadFrom = ReadFrom.PRIMARY,
    ) -> None:
        """`jdbc`, `conn` and `store` all on the database `read_from` names."""
        self._spark = spark
        self._config = config
        self._jdbc = jdbc
        self._conn = conn
        self._store = store
        self._progress = progress
        self._read_from = read_from

    def run(self, *, write: bool = True) -> ReportResult:
        started = time.monotonic()
        batches = self._store.deleted()
        archived = self._archived_jobs(batches)
        # Job partitions the broker detached or dropped after their export: gone from job,
        # so read once, from their files (one still attached is read live).
        parts = archived_partitions(
            self._spark, self._config.archive_root, self._store.partitions_gone()
        )
        if parts is not None:
            archived = archived.unionByName(conform(parts, REPORT_JOB))
        archived = archived.withColumn("source", F.lit("archive"))
        live = self._live_jobs().withColumn("source", F.lit("live"))
        timed = with_timings(archived.unionByName(live)).cache()
        try:
            sources = {r["source"]: r["count"] for r in timed.groupBy("source").count().collect()}
            self._progress.line(
                f"report over {sources.get('archive', 0)} archived and"
                f" {sources.get('live', 0)} live jobs"
            )
            tables = {
                "consumers": delivery_stats(timed, ["channel_id", "consumer_id"]),
                "channels": delivery_stats(timed, ["channel_id"]),
                "totals": delivery_stats(timed, []),
                "hourly": hourly_throughput(timed),
            }
            collected = {name: _collect(df) for name, df in tables.items()}
            data: dict[str, Any] = {
                "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "read_from": self._read_from.value,
                "sources": {
                    "archive_batches": len(batches),
                    "archived_jobs": int(sources.get("archive", 0)),
                    "live_jobs": int(sources.get("live", 0)),
                },
                "totals": collected["totals"][0],
                "channels": collected["channels"],
                "consumers": collected["consumers"],
                "hourly": collected["hourly"],
            }
            written = self._write(data, tables) if write else ()
        finally:
            timed.unpersist()
        rows = data["sources"]["archived_jobs"] + data["sources"]["live_jobs"]
        return ReportResult(data, time.monotonic() - started, rows, written)

    def _archived_jobs(self, batches: list[Batch]) -> DataFrame:
        archive = self._config.archive_root
        root = f"{archive.rstrip('/')}/job"
        fs = ArchiveFs(self._spark, archive)
        parts = []
        if batches and fs.has_data(root):
            parts.append(
                self._spark.read.schema(StructType([*ARCHIVED_JOB.fields, *PARTITIONS.fields]))
                .option("basePath", root)
                .parquet(root)
                .where(F.col("batch_id").isin([b.id for b in batches]))
            )
        for batch in batches:
            # A finalize that crashed between removing the files and moving the staged copy in.
            staging = staging_dir(archive, "job", batch.id)
            if not fs.exists(batch_dir(archive, "job", batch.id)) and fs.exists(staging):
                staged = read_batch_files(self._spark, staging, "job")
                parts.append(staged.withColumn("batch_id", F.lit(batch.id).cast("long")))
        if not parts:
            return self._spark.createDataFrame([], REPORT_JOB)
        jobs = reduce(DataFrame.unionByName, parts)
        kept = self._store.kept_in_unfinalized()
        if kept:
            drop = self._spark.createDataFrame(kept, "_batch long, _pk long")
            jobs = jobs.join(
                F.broadcast(drop),
                (jobs["batch_id"] == drop["_batch"]) & (jobs["message_pk"] == drop["_pk"]),
                "left_anti",
            )
        return conform(jobs, REPORT_JOB)

    def _live_jobs(self) -> DataFrame:
        with self._conn.transaction():
            row = self._conn.execute("SELECT min(id), max(id), count(*) FROM job").fetchone()
        assert row is not None
        low, high, count = row
        if not count:
            return self._spark.createDataFrame([], REPORT_JOB)
        partitions = max(1, min(self._config.jdbc_partitions, count // _ROWS_PER_JDBC_PARTITION))
        live = (
            self._spark.read.format("jdbc")
            .options(**self._jdbc.options(self._config.jdbc_fetch_size))
            .option("dbtable", _LIVE_SQL)
            .option("partitionColumn", "id")
            .option("lowerBound", str(low))
            .option("upperBound", str(high + 1))
            .option("numPartitions", str(partitions))
            .load()
        )
        return conform(live, REPORT_JOB)

    def _write(self, data: dict[str, Any], tables: dict[str, DataFrame]) -> tuple[str, ...]:
        root = self._config.report_root.rstrip("/")
        for name, df in tables.items():
            df.coalesce(1).write.mode("overwrite").parquet(f"{root}/{name}")
        written = [f"{root}/{name}" for name in tables]
        # JSON and HTML are small: written by the driver (the report root is a local path
        # or a mount the driver sees).
        local = Path(root.removeprefix("file:"))
        local.mkdir(parents=True, exist_ok=True)
        for filename, produce in _DOCUMENTS.items():
            target = local / filename
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(produce(data), encoding="utf-8")
            tmp.replace(target)
            written.append(str(target))
        self._progress.line(f"report written to {root}")
        return tuple(written)


_DOCUMENTS: dict[str, Callable[[dict[str, Any]], str]] = {
    "report.json": lambda data: json.dumps(data, indent=2, sort_keys=True) + "\n",
    "report.html": render,
}
