"""StructType contracts: what the archive holds and what the report writes.

Archive layout: <archive-root>/<table>/batch_id=N/dt=YYYY-MM-DD/*.parquet, for table in message
and job. `batch_id` and `dt` are partition directories, not columns inside the files. No
column holds a token: the exports name their columns one by one and never read channel,
producer or consumer tokens.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


def _fields(*pairs: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind, True) for name, kind in pairs])


ARCHIVED_MESSAGE = _fields(
    ("pk", LongType()),
    ("channel_id", StringType()),
    ("message_id", StringType()),
    ("producer_id", StringType()),
    ("payload", BinaryType()),
    ("content_type", StringType()),
    ("priority", IntegerType()),
    ("headers", StringType()),  # the JSON text as stored
    ("received_at", TimestampType()),
)

ARCHIVED_JOB = _fields(
    ("id", LongType()),
    ("message_pk", LongType()),
    ("consumer_pk", LongType()),
    ("channel_id", StringType()),
    ("consumer_id", StringType()),
    ("status", StringType()),
    ("priority", IntegerType()),
    ("payload_size", IntegerType()),
    ("attempt", IntegerType()),
    ("retry_count", IntegerType()),
    ("timeout_count", IntegerType()),
    ("incremental_timeout", IntegerType()),
    ("lease_expires_at", TimestampType()),
    ("earliest_next_attempt_at", TimestampType()),
    ("claimed_at", TimestampType()),
    ("status_changed_at", TimestampType()),
    ("created_at", TimestampType()),
    ("dead_reason", StringType()),
    ("last_error", StringType()),
)

# Partition columns Spark adds when the archive root of a table is read.
PARTITIONS = _fields(("batch_id", LongType()), ("dt", DateType()))

# The job columns the report needs, from the archive and the live table alike.
REPORT_JOB = _fields(
    ("channel_id", StringType()),
    ("consumer_id", StringType()),
    ("status", StringType()),
    ("retry_count", IntegerType()),
    ("timeout_count", IntegerType()),
    ("claimed_at", TimestampType()),
    ("status_changed_at", TimestampType()),
    ("created_at", TimestampType()),
)

_PERCENTILES = ("p50", "p95", "p99")

DELIVERY_STATS = _fields(
    ("channel_id", StringType()),
    ("consumer_id", StringType()),
    ("jobs", LongType()),
    ("queued", LongType()),
    ("inflight", LongType()),
    ("delivered", LongType()),
    ("dead", LongType()),
    ("dead_letter_rate", DoubleType()),
    ("retries", LongType()),
    ("timeout_requeues", LongType()),
    *((f"queue_wait_{p}_seconds", DoubleType()) for p in _PERCENTILES),
    *((f"processing_{p}_seconds", DoubleType()) for p in _PERCENTILES),
)

HOURLY_THROUGHPUT = _fields(
    ("channel_id", StringType()),
    ("consumer_id", StringType()),
    ("hour", TimestampType()),
    ("delivered", LongType()),
    ("dead", LongType()),
)


def conform(df: DataFrame, schema: StructType) -> DataFrame:
    """Exactly the contract's columns, in its order and types; a missing column is an error."""
    missing = [f.name for f in schema.fields if f.name not in df.columns]
    if missing:
        raise ValueError(f"missing columns {missing}")
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])
