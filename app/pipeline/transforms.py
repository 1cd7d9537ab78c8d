"""Pure DataFrame -> DataFrame steps of the report; no I/O, each testable on a tiny DataFrame."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.domain.jobs import JobStatus
from app.pipeline.schemas import DELIVERY_STATS, HOURLY_THROUGHPUT, conform

PERCENTILES = (0.5, 0.95, 0.99)
_NAMES = ("p50", "p95", "p99")


def seconds_between(start: str, end: str) -> Column:
    """end - start in seconds, from exact microseconds (null if either is null)."""
    return (F.unix_micros(F.col(end)) - F.unix_micros(F.col(start))) / F.lit(1_000_000.0)


def _is(status: JobStatus) -> Column:
    return F.col("status") == F.lit(status.value)


def with_timings(jobs: DataFrame) -> DataFrame:
    """Queue wait = claim - creation; processing = completion - claim (finished jobs only).

    A job keeps only its latest claim time, so for a retried job the wait runs to its last claim.
    """
    finished = _is(JobStatus.DELIVERED) | _is(JobStatus.DEAD)
    return jobs.withColumn(
        "queue_wait_seconds", seconds_between("created_at", "claimed_at")
    ).withColumn(
        "processing_seconds",
        F.when(finished, seconds_between("claimed_at", "status_changed_at")),
    )


def delivery_stats(timed: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Counts, dead-letter rate, retries, timeout requeues and exact p50/p95/p99 per key."""
    grouped = timed.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("jobs"),
        *(F.count_if(_is(s)).alias(s.value.lower()) for s in JobStatus),
        F.sum("retry_count").alias("retries"),
        F.sum("timeout_count").alias("timeout_requeues"),
        F.percentile("queue_wait_seconds", list(PERCENTILES)).alias("_wait"),
        F.percentile("processing_seconds", list(PERCENTILES)).alias("_processing"),
    )
    finished = F.col("delivered") + F.col("dead")
    out = grouped.withColumn("dead_letter_rate", F.when(finished > 0, F.col("dead") / finished))
    for i, name in enumerate(_NAMES):
        out = out.withColumn(f"queue_wait_{name}_seconds", F.col("_wait")[i])
        out = out.withColumn(f"processing_{name}_seconds", F.col("_processing")[i])
    for key in ("channel_id", "consumer_id"):
        if key not in keys:
            out = out.withColumn(key, F.lit(None).cast("string"))
    return conform(out, DELIVERY_STATS).orderBy("channel_id", "consumer_id")


def hourly_throughput(timed: DataFrame) -> DataFrame:
    """Finished jobs per consumer and hour of completion (UTC)."""
    finished = timed.where(_is(JobStatus.DELIVERED) | _is(JobStatus.DEAD))
    hourly = finished.groupBy(
        "channel_id", "consumer_id", F.date_trunc("hour", F.col("status_changed_at")).alias("hour")
    ).agg(
        F.count_if(_is(JobStatus.DELIVERED)).alias("delivered"),
        F.count_if(_is(JobStatus.DEAD)).alias("dead"),
    )
    return conform(hourly, HOURLY_THROUGHPUT).orderBy("hour", "channel_id", "consumer_id")


def with_day(df: DataFrame, timestamp: str) -> DataFrame:
    """The archive's `dt` partition: the UTC day of `timestamp`."""
    return df.withColumn("dt", F.to_date(F.col(timestamp)))
