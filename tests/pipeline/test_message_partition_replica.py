"""A message partition archived whole reads the streaming replica ([rdbms] replica-url), as a job
partition's export does: its statement runs on the replica (pg_stat_statements there has it,
the primary's has none), once the replica has replayed past the primary's position; the mark
stays on the primary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from devtools.pg import Cluster
from tests.helpers.replica import Pair, fresh_database, primary_with_replica, rdbms_section
from tests.helpers.waiting import eventually_sync
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import query
from tests.pipeline.partitions import (
    STATE,
    closed_past_retention,
    jobs_leave_with_their_partition,
    messages,
)

MARKER = "archived_message_partition"  # the export's JDBC source's alias


def _prepare(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE EXTENSION pg_stat_statements")


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_with_replica(
        "wb_message_partition_replica_template", statements=True, prepare=_prepare
    ) as pair:
        yield pair


@pytest.fixture
def config(pair: Pair, tmp_path: Path) -> Iterator[Config]:
    with fresh_database(pair, "wb_message_partition_replica") as name:
        rdbms = rdbms_section(pair.primary.url(name), pair.replica.url(name))
        yield pipeline_config(rdbms, tmp_path, partition_interval="1h")


def _calls(server: Cluster, config: Config) -> int:
    database = config.database.connection_url.rpartition("/")[2]
    with psycopg.connect(server.url(database), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
            " AND query LIKE %s",
            (database, f"%{MARKER}%"),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _replayed(pair: Pair, config: Config) -> None:
    with psycopg.connect(config.database.connection_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None

    def reached() -> bool:
        with psycopg.connect(pair.replica.base_url, autocommit=True) as conn:
            got = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
            ).fetchone()
        return bool(got and got[0])

    eventually_sync(reached, what="the replica replayed the set-up")


def test_a_message_partitions_export_reads_the_replica_and_marks_on_the_primary(
    spark: SparkSession, pair: Pair, config: Config
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    rows = messages(config)
    _replayed(pair, config)

    summary = run("archive", config, spark=spark)

    assert summary["status"] == "ok", summary
    assert summary["message_partitions"]["exported"] == ["message_p0"]
    assert summary["message_partitions"]["read_from"] == {"replica": 1}
    assert _calls(pair.replica, config) > 0
    assert _calls(pair.primary, config) == 0
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
