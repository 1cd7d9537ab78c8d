"""Reading the archive back and the database directly, for the assertions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from app.config import Config
from app.pipeline.schemas import ARCHIVED_JOB, ARCHIVED_MESSAGE, PARTITIONS

MESSAGE_COLUMNS = [f.name for f in ARCHIVED_MESSAGE.fields]
JOB_COLUMNS = [f.name for f in ARCHIVED_JOB.fields]

MESSAGES_SQL = (
    "SELECT pk, channel_id, message_id, producer_id, payload, content_type, priority,"
    " headers::text AS headers, received_at FROM message WHERE pk = ANY(%s) ORDER BY pk"
)
JOBS_SQL = (
    "SELECT j.id, j.message_pk, j.consumer_pk, c.channel_id, c.consumer_id, j.status,"
    " j.priority, j.payload_size, j.attempt, j.retry_count, j.timeout_count,"
    " j.incremental_timeout, j.lease_expires_at, j.earliest_next_attempt_at, j.claimed_at,"
    " j.status_changed_at, j.created_at, j.dead_reason, j.last_error"
    " FROM job j JOIN consumer c ON c.pk = j.consumer_pk WHERE j.message_pk = ANY(%s)"
    " ORDER BY j.id"
)


def url(config: Config) -> str:
    return config.database.connection_url


def query(config: Config, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url(config)) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def snapshot(config: Config, pks: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows the archive must hold for these messages, read with plain SQL."""
    return query(config, MESSAGES_SQL, pks), query(config, JOBS_SQL, pks)


def archived(spark: SparkSession, config: Config, table: str) -> list[dict[str, Any]]:
    """Every row under <archive-root>/<table>, with batch_id and dt, as Python values."""
    root = Path(config.pipeline.archive_root) / table
    if not root.exists() or not any(root.rglob("*.parquet")):
        return []
    base = ARCHIVED_MESSAGE if table == "message" else ARCHIVED_JOB
    schema = StructType([*base.fields, *PARTITIONS.fields])
    key = "pk" if table == "message" else "id"
    df = spark.read.schema(schema).option("basePath", str(root)).parquet(str(root))
    return [_python(row.asDict()) for row in df.orderBy(key).collect()]


def _python(row: dict[str, Any]) -> dict[str, Any]:
    """Spark hands back naive local datetimes and bytearrays; PostgreSQL aware UTC and bytes."""
    out = {}
    for key, value in row.items():
        if isinstance(value, datetime) and value.tzinfo is None:
            value = value.astimezone(UTC)
        elif isinstance(value, bytearray):
            value = bytes(value)
        out[key] = value
    return out


def batches(config: Config) -> list[dict[str, Any]]:
    return query(config, "SELECT * FROM archive_batch ORDER BY id")


def chart_data(page: str) -> list[dict[str, Any]]:
    """The charts' data a report page carries."""
    start = page.index('<script type="application/json" id="chart-data">')
    body = page[start:].split(">", 1)[1].split("</script>", 1)[0]
    data: list[dict[str, Any]] = json.loads(body)
    return data


# A job for one message, made as the NATS bridge's history copy makes one (app/store/backfill.py:
# the message locked FOR KEY SHARE), but without its look at the message partition's state: a
# job pointing at the message however it came there.
COPY_JOB = """
INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                 earliest_next_attempt_at, status_changed_at, created_at)
SELECT m.pk, (SELECT min(pk) FROM consumer), 'QUEUED', m.priority, length(m.payload),
       now(), now(), now()
FROM message m WHERE m.pk = %s
FOR KEY SHARE OF m
RETURNING id
"""
