"""The SparkSession and the archive's file system (Hadoop's, so HDFS or S3 roots work too)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from pyspark.sql import SparkSession

from app.config import ConfigError, PipelineConfig


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands the Python driver its gateway."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    config: PipelineConfig, master: str | None = None, extra: dict[str, str] | None = None
) -> SparkSession:
    """One session for the run. --master wins, then [pipeline] master, then spark-submit's
    own, and local[*] when run as a plain program."""
    chosen = master or config.master
    builder = SparkSession.builder.appName("webhook-broker-pipeline")
    if chosen:
        builder = builder.master(chosen)
    elif not under_spark_submit():
        builder = builder.master("local[*]")
    if (chosen or "local").startswith("local") and not under_spark_submit():
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.ui.showConsoleProgress": "true",
        **(extra or {}),
    }
    if not under_spark_submit():
        # Under spark-submit, --jars sets spark.jars (with any other jars the user adds).
        settings.setdefault("spark.jars", config.jdbc_jar)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _require_jdbc_driver(spark, config.jdbc_jar)
    return spark


def _require_jdbc_driver(spark: SparkSession, jar: str) -> None:
    """spark.jars reaches the executors, but under spark-submit the driver's classpath was fixed
    when the JVM started: there the jar must come with `--jars`."""
    jvm: Any = spark.sparkContext._jvm
    try:
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName("org.postgresql.Driver", False, loader)
    except Exception:  # py4j's error for the JVM's ClassNotFoundException
        spark.stop()
        raise ConfigError(
            f"[pipeline] jdbc-jar: org.postgresql.Driver is not on the Spark driver's classpath;"
            f" install Debian's libpostgresql-jdbc-java, and under spark-submit pass --jars {jar}"
        ) from None


class ArchiveFs:
    """exists / delete / rename on the archive root through Hadoop's FileSystem API."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark.sparkContext._jvm
        self._path_class = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs = self._path_class(root).getFileSystem(conf)

    def _path(self, path: str) -> Any:
        return self._path_class(path)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def has_data(self, path: str) -> bool:
        """True when `path` holds at least one Parquet file (at any depth)."""
        if not self.exists(path):
            return False
        files = self._fs.listFiles(self._path(path), True)
        while files.hasNext():
            if str(files.next().getPath().getName()).endswith(".parquet"):
                return True
        return False

    def delete(self, path: str) -> bool:
        """Remove `path` and everything under it; False when some of it is still there
        (Hadoop's local file system reports a failed delete by its result, others by an
        IOException: either way the caller decides what a left file means)."""
        with contextlib.suppress(Exception):  # py4j's error for the JVM's IOException
            self._fs.delete(self._path(path), True)
        return not self.exists(path)

    def subdirectories(self, path: str) -> list[str]:
        """Names of the directories right under `path` (none when it does not exist)."""
        if not self.exists(path):
            return []
        return [
            str(status.getPath().getName())
            for status in self._fs.listStatus(self._path(path))
            if status.isDirectory()
        ]

    def rename(self, source: str, target: str) -> None:
        parent = self._path(target).getParent()
        if parent is not None:
            self._fs.mkdirs(parent)
        if not self._fs.rename(self._path(source), self._path(target)):
            raise OSError(f"could not rename {source} to {target}")
