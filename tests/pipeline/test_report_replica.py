"""The pipeline's report reads from the replica ([rdbms] replica-url, issue 42), against a real
streaming replica: a second throwaway cluster made by pg_basebackup from a primary of this
module's own (pausing its replay touches no other test's database).

What is shown: while the replica is within [rdbms] replica-max-lag the report's database reads
go to it (a row committed on the primary after its replay paused is not counted) and the
report says `read_from: replica`; once the paused replica is past the limit the report reads
the primary (that row counted) and says so; a replica that fails the reads once chosen leaves
the report to the primary, as the API's reads do."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.domain.replica import ReadFrom
from app.pipeline.job import run
from tests.helpers.replica import (
    Pair,
    fresh_database,
    pause_replay,
    primary_with_replica,
    rdbms_section,
    resume_replay,
)
from tests.helpers.waiting import eventually_sync
from tests.pipeline import data
from tests.pipeline.conftest import pipeline_config

MAX_LAG = 2.0


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_with_replica("wb_report_replica_template") as pair:
        yield pair


@pytest.fixture
def database(pair: Pair) -> Iterator[str]:
    with fresh_database(pair, "wb_report_replica") as name:
        yield name


@pytest.fixture
def config(pair: Pair, database: str, tmp_path: Path) -> Config:
    rdbms = rdbms_section(pair.primary.url(database), pair.replica.url(database), MAX_LAG)
    return pipeline_config(rdbms, tmp_path)


def _jobs(url: str) -> int | None:
    """The job count at `url`; None while the database is not there yet (a replica that has
    not replayed its creation)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM job").fetchone()
    except psycopg.OperationalError:
        return None
    assert row is not None
    return int(row[0])


def _seeded(pair: Pair, database: str) -> int:
    """Broker data on the primary, replayed by the replica; the number of jobs."""
    data.seed(pair.primary.url(database), old=0, old_open=0, recent=12, seed=5)
    jobs = _jobs(pair.primary.url(database))
    assert jobs
    eventually_sync(lambda: _jobs(pair.replica.url(database)) == jobs, what="the replica's copy")
    return jobs


def _publish_one(pair: Pair, database: str) -> None:
    """One more message with one job, committed on the primary."""
    rng = random.Random(99)
    with psycopg.connect(pair.primary.url(database)) as conn:
        # The throwaway cluster commits asynchronously: a commit's WAL would be written up to
        # three wal_writer_delays later, and the lag is measured by written positions.
        conn.execute("SET LOCAL synchronous_commit = on")
        row = conn.execute("SELECT pk, channel_id FROM consumer ORDER BY pk LIMIT 1").fetchone()
        assert row is not None
        consumer_pk, channel = row
        now = datetime.now(UTC)
        pk = data._message(conn, rng, 10_000, str(channel), now)
        data._job(conn, rng, pk, int(consumer_pk), now, still_open=True)


def _written(config: Config) -> tuple[dict[str, object], str]:
    root = Path(config.pipeline.report_root)
    report = json.loads((root / "report.json").read_text(encoding="utf-8"))
    return report, (root / "report.html").read_text(encoding="utf-8")


def test_a_fresh_replica_serves_the_reports_reads_and_the_report_says_so(
    spark: SparkSession, pair: Pair, database: str, config: Config
) -> None:
    jobs = _seeded(pair, database)
    chosen: list[ReadFrom] = []

    def pause_then_publish(read_from: ReadFrom) -> None:
        # Chosen, not yet read: from here the replica stands still and the primary moves on,
        # so which database the report read shows in its count.
        chosen.append(read_from)
        pause_replay(pair)
        _publish_one(pair, database)

    try:
        summary = run("report", config, spark=spark, source_hook=pause_then_publish)
    finally:
        resume_replay(pair)

    assert summary["status"] == "ok", summary
    assert chosen == [ReadFrom.REPLICA]
    assert _jobs(pair.primary.url(database)) == jobs + 1
    assert summary["report"]["read_from"] == "replica"
    assert summary["report"]["live_jobs"] == jobs  # not the primary's newest job
    report, page = _written(config)
    assert report["read_from"] == "replica"
    assert "read from the\nreplica" in page


def test_a_replica_past_replica_max_lag_leaves_the_report_to_the_primary(
    spark: SparkSession, pair: Pair, database: str, config: Config
) -> None:
    jobs = _seeded(pair, database)
    chosen: list[ReadFrom] = []
    pause_replay(pair)
    try:
        _publish_one(pair, database)
        summary = run("report", config, spark=spark, source_hook=chosen.append)
    finally:
        resume_replay(pair)

    assert summary["status"] == "ok", summary
    assert chosen == [ReadFrom.PRIMARY]
    assert summary["report"]["read_from"] == "primary"
    assert summary["report"]["live_jobs"] == jobs + 1
    report, page = _written(config)
    assert report["read_from"] == "primary"
    assert "read from the\nprimary" in page


def test_a_replica_that_fails_the_reports_reads_leaves_them_to_the_primary(
    spark: SparkSession, pair: Pair, database: str, config: Config
) -> None:
    jobs = _seeded(pair, database)
    chosen: list[ReadFrom] = []

    def stop_the_replica(read_from: ReadFrom) -> None:
        chosen.append(read_from)
        pair.replica.down()  # chosen as fresh, gone before its first read

    try:
        summary = run("report", config, spark=spark, source_hook=stop_the_replica)
    finally:
        pair.replica.up()
        pair.replica.wait_streaming()

    assert summary["status"] == "ok", summary
    assert chosen == [ReadFrom.REPLICA]
    assert summary["report"]["read_from"] == "primary"
    assert summary["report"]["live_jobs"] == jobs
    report, _page = _written(config)
    assert report["read_from"] == "primary"
