"""Pipeline tests: real PostgreSQL (this package pins `backend`) and one local SparkSession."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.config import Config, load_config_text
from app.pipeline.spark import build_session

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    base = load_config_text("").pipeline
    session = build_session(
        base,
        "local[2]",
        extra={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()


def pipeline_config(
    rdbms: str, root: Path, *, partition_interval: str = "off", **overrides: str
) -> Config:
    """[pipeline] under `root`. Partitions off unless asked: these tests archive by rows (the
    partition archive's own: test_partition_archive.py)."""
    settings = {
        "archive-root": str(root / "archive"),
        "report-root": str(root / "report"),
        "retention-days": "7",
        "batch-size": "16",
        "jdbc-partitions": "2",
        **overrides,
    }
    section = "".join(f"{key}={value}\n" for key, value in settings.items())
    rdbms += f"partition-interval={partition_interval}\n"
    return load_config_text(rdbms + "[pipeline]\n" + section)


@pytest.fixture
def pipeline(rdbms: str, tmp_path: Path) -> Config:
    """A fresh migrated database plus [pipeline] paths under this test's tmp_path."""
    return pipeline_config(rdbms, tmp_path)
