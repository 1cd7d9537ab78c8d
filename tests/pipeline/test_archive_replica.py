"""The archive's exports read from the replica ([rdbms] replica-url, issue 42), against a real
streaming replica made by pg_basebackup from a primary of this module's own.

What is shown: a closed partition's export and a row batch's export run on the replica (its
pg_stat_statements has their statements, the primary's has none), once the replica has replayed
past the primary's position taken after the rows were settled: a replica behind is waited for
(and the export then holds the rows as the primary has them), one that stays behind past
[pipeline] replica-wait or is down leaves the export to the primary, the run saying so. The
marks and deletes stay on the primary (the primary's rows are gone, the partition marked)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.partitions import archived_partitions
from app.priority import autogroup_nice, autogroups_on
from devtools.replica import standby_of
from tests.helpers.replica import (
    Pair,
    fresh_database,
    pause_replay,
    primary_with_replica,
    rdbms_section,
    replayed,
    resume_replay,
    statement_calls,
    with_statements,
)
from tests.pipeline import data
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import query
from tests.pipeline.partitions import broker


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_with_replica(
        "wb_archive_replica_template", statements=True, prepare=with_statements
    ) as pair:
        yield pair


@pytest.fixture
def database(pair: Pair) -> Iterator[str]:
    with fresh_database(pair, "wb_archive_replica") as name:
        yield name


def _config(
    pair: Pair, database: str, tmp_path: Path, *, partitions: bool, wait: str = "60s"
) -> Config:
    rdbms = rdbms_section(pair.primary.url(database), pair.replica.url(database))
    return pipeline_config(
        rdbms, tmp_path, partition_interval="1h" if partitions else "off", **{"replica-wait": wait}
    )


def _execute(url: str, sql: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(sql)


def _closed_partition(config: Config) -> None:
    """Seeded jobs in job_p0, closed 8 days ago (past the 7 days' retention); some not yet
    delivered."""
    url = config.database.connection_url
    data.seed(url, old=12, old_open=2, recent=0, seed=11)
    broker(config, lambda s: s.maintain())
    _execute(url, "UPDATE job_partition SET opened_at = now() - interval '2 hours'")
    broker(config, lambda s: s.maintain())
    _execute(
        url, "UPDATE job_partition SET closed_at = now() - interval '8 days' WHERE name = 'job_p0'"
    )


def _finish_jobs(config: Config) -> int:
    """Every job of job_p0 delivered (the write that settles the partition); how many."""
    with psycopg.connect(config.database.connection_url) as conn:
        conn.execute("UPDATE job_p0 SET status = 'DELIVERED' WHERE status <> 'DELIVERED'")
        row = conn.execute("SELECT count(*) FROM job_p0").fetchone()
    assert row is not None
    return int(row[0])


def _archived_statuses(spark: SparkSession, config: Config) -> list[str]:
    frame = archived_partitions(spark, config.pipeline.archive_root, ["job_p0"])
    assert frame is not None
    return [str(row["status"]) for row in frame.collect()]


def test_a_closed_partitions_export_reads_the_replica_and_marks_on_the_primary(
    spark: SparkSession, pair: Pair, database: str, tmp_path: Path
) -> None:
    config = _config(pair, database, tmp_path, partitions=True)
    _closed_partition(config)
    jobs = _finish_jobs(config)
    replayed(pair, database)

    summary = run("archive", config, spark=spark)

    assert summary["status"] == "ok", summary
    assert summary["partitions"]["exported"] == ["job_p0"]
    assert summary["partitions"]["read_from"] == {"replica": 1}
    assert statement_calls(pair.replica, database, "archived_partition") > 0
    assert statement_calls(pair.primary, database, "archived_partition") == 0
    assert _archived_statuses(spark, config) == ["DELIVERED"] * jobs
    state = "SELECT status, exported_rows FROM job_partition WHERE name = 'job_p0'"
    assert query(config, state) == [{"status": "EXPORTED", "exported_rows": jobs}]


def test_the_row_batches_export_reads_the_replica_and_deletes_on_the_primary(
    spark: SparkSession, pair: Pair, database: str, tmp_path: Path
) -> None:
    config = _config(pair, database, tmp_path, partitions=False)
    dataset = data.seed(config.database.connection_url, old=20, old_open=0, recent=0, seed=3)

    summary = run("archive", config, spark=spark)

    assert summary["status"] == "ok", summary
    archive = summary["archive"]
    assert archive["archived_messages"] == len(dataset.old_terminal)
    assert archive["read_from"] == {"replica": archive["batches"]}
    assert statement_calls(pair.replica, database, "archived_message") > 0
    assert statement_calls(pair.replica, database, "archived_job") > 0
    assert statement_calls(pair.primary, database, "archived_message") == 0
    assert query(config, "SELECT count(*) AS n FROM message") == [{"n": 0}]


def test_a_replica_behind_is_waited_for_then_read(
    spark: SparkSession, pair: Pair, database: str, tmp_path: Path
) -> None:
    config = _config(pair, database, tmp_path, partitions=True)
    _closed_partition(config)
    replayed(pair, database)
    waited: list[str] = []

    def resume(what: str) -> None:
        # Waiting, so the replica was seen behind: let it catch up.
        waited.append(what)
        resume_replay(pair)

    pause_replay(pair)
    try:
        # The replica keeps the partition's undelivered jobs: an export read from it now
        # would differ from the primary's rows.
        jobs = _finish_jobs(config)
        err = io.StringIO()
        summary = run("archive", config, spark=spark, wait_hook=resume, err=err)
    finally:
        resume_replay(pair)

    assert summary["status"] == "ok", summary
    assert waited == ["partition job_p0"]
    assert "partition job_p0: waiting for the replica to replay to" in err.getvalue()
    assert summary["partitions"]["read_from"] == {"replica": 1}
    assert _archived_statuses(spark, config) == ["DELIVERED"] * jobs


def test_a_replica_still_behind_after_replica_wait_leaves_the_export_to_the_primary(
    spark: SparkSession, pair: Pair, database: str, tmp_path: Path
) -> None:
    config = _config(pair, database, tmp_path, partitions=True, wait="1s")
    _closed_partition(config)
    replayed(pair, database)
    pause_replay(pair)
    try:
        jobs = _finish_jobs(config)
        err = io.StringIO()
        summary = run("archive", config, spark=spark, err=err)
    finally:
        resume_replay(pair)

    assert summary["status"] == "ok", summary
    assert summary["partitions"]["read_from"] == {"primary": 1}
    assert "partition job_p0: reading the primary: the replica replayed to" in err.getvalue()
    assert "after replica-wait 1 s" in err.getvalue()
    assert statement_calls(pair.replica, database, "archived_partition") == 0
    assert _archived_statuses(spark, config) == ["DELIVERED"] * jobs


def test_a_replica_down_leaves_the_export_to_the_primary(
    spark: SparkSession, pair: Pair, database: str, tmp_path: Path
) -> None:
    config = _config(pair, database, tmp_path, partitions=True)
    _closed_partition(config)
    jobs = _finish_jobs(config)
    pair.replica.down()
    try:
        err = io.StringIO()
        summary = run("archive", config, spark=spark, err=err)
    finally:
        pair.replica.up()
        pair.replica.wait_streaming()

    assert summary["status"] == "ok", summary
    assert summary["partitions"]["read_from"] == {"primary": 1}
    assert "partition job_p0: reading the primary: the replica is unreachable" in err.getvalue()
    assert _archived_statuses(spark, config) == ["DELIVERED"] * jobs


def test_a_replica_made_from_a_url_streams_at_the_niceness_asked(pair: Pair) -> None:
    """The bench's replica: made from the primary's address alone, under nice."""
    replica = standby_of(pair.primary.base_url, niceness=5)
    try:
        # The postmaster, and so every process it forks (the startup process replaying WAL).
        assert os.getpriority(os.PRIO_PROCESS, replica.postmaster_pid()) == 5
        # pg_ctl gave it a session of its own: under autogroups that session yields too.
        if autogroups_on():
            assert autogroup_nice(replica.postmaster_pid()) == 5
        with psycopg.connect(replica.url(pair.template), autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery(), current_setting('port')").fetchone()
        assert row == (True, str(replica.port))
    finally:
        replica.stop()
