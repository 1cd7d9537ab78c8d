"""A message partition archived whole reads the streaming replica ([rdbms] replica-url), as a job
partition's export does: its statement runs on the replica (pg_stat_statements there has it,
the primary's has none), once the replica has replayed past the primary's position; the mark
stays on the primary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from tests.helpers.replica import (
    Pair,
    fresh_database,
    primary_with_replica,
    rdbms_section,
    replayed,
    statement_calls,
    with_statements,
)
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import query
from tests.pipeline.partitions import (
    STATE,
    closed_past_retention,
    jobs_leave_with_their_partition,
    messages,
)

MARKER = "archived_message_partition"  # the export's JDBC source's alias


def _database(config: Config) -> str:
    return config.database.connection_url.rpartition("/")[2]


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_with_replica(
        "wb_message_partition_replica_template", statements=True, prepare=with_statements
    ) as pair:
        yield pair


@pytest.fixture
def config(pair: Pair, tmp_path: Path) -> Iterator[Config]:
    with fresh_database(pair, "wb_message_partition_replica") as name:
        rdbms = rdbms_section(pair.primary.url(name), pair.replica.url(name))
        yield pipeline_config(rdbms, tmp_path, partition_interval="1h")


def test_a_message_partitions_export_reads_the_replica_and_marks_on_the_primary(
    spark: SparkSession, pair: Pair, config: Config
) -> None:
    closed_past_retention(config)
    jobs_leave_with_their_partition(config, spark)
    rows = messages(config)
    replayed(pair, _database(config))

    summary = run("archive", config, spark=spark)

    assert summary["status"] == "ok", summary
    assert summary["message_partitions"]["exported"] == ["message_p0"]
    assert summary["message_partitions"]["read_from"] == {"replica": 1}
    assert statement_calls(pair.replica, _database(config), MARKER) > 0
    assert statement_calls(pair.primary, _database(config), MARKER) == 0
    assert query(config, STATE) == [{"status": "EXPORTED", "exported_rows": len(rows)}]
