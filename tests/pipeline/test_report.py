"""report: every number checked against plain SQL computed before the archive took its share,
and the HTML page rendered by headless Chromium from the file, its uPlot charts drawn."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from app.config import Config
from app.pipeline.job import run
from app.pipeline.state import Batch
from tests.conftest import fresh_database
from tests.pipeline import data
from tests.pipeline.conftest import pipeline_config
from tests.pipeline.helpers import batches, chart_data, query
from tests.pipeline.png import decode

_STATS = """
SELECT {keys}
       count(*) AS jobs,
       count(*) FILTER (WHERE j.status = 'QUEUED') AS queued,
       count(*) FILTER (WHERE j.status = 'INFLIGHT') AS inflight,
       count(*) FILTER (WHERE j.status = 'DELIVERED') AS delivered,
       count(*) FILTER (WHERE j.status = 'DEAD') AS dead,
       sum(j.retry_count) AS retries,
       sum(j.timeout_count) AS timeout_requeues,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM j.claimed_at - j.created_at)) AS wait,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM j.status_changed_at - j.claimed_at))
           FILTER (WHERE j.status IN ('DELIVERED', 'DEAD')) AS processing
  FROM job j JOIN consumer c ON c.pk = j.consumer_pk
 {group}
"""

_HOURLY = """
SELECT c.channel_id, c.consumer_id,
       date_trunc('hour', j.status_changed_at AT TIME ZONE 'UTC') AS hour,
       count(*) FILTER (WHERE j.status = 'DELIVERED') AS delivered,
       count(*) FILTER (WHERE j.status = 'DEAD') AS dead
  FROM job j JOIN consumer c ON c.pk = j.consumer_pk
 WHERE j.status IN ('DELIVERED', 'DEAD')
 GROUP BY 1, 2, 3 ORDER BY 3, 1, 2
"""


def _expected(config: Config, keys: list[str]) -> list[dict[str, Any]]:
    select = "".join(f"c.{k}, " for k in keys)
    group = f"GROUP BY {', '.join(f'c.{k}' for k in keys)} ORDER BY 1, 2" if keys else ""
    if len(keys) == 1:
        group = group.replace("ORDER BY 1, 2", "ORDER BY 1")
    rows = query(config, _STATS.format(keys=select, group=group))
    out = []
    for row in rows:
        wait = row.pop("wait") or [None] * 3
        processing = row.pop("processing") or [None] * 3
        finished = row["delivered"] + row["dead"]
        row["dead_letter_rate"] = row["dead"] / finished if finished else None
        for i, p in enumerate(("p50", "p95", "p99")):
            row[f"queue_wait_{p}_seconds"] = None if wait[i] is None else float(wait[i])
            row[f"processing_{p}_seconds"] = None if processing[i] is None else float(processing[i])
        row.setdefault("channel_id", None)
        row.setdefault("consumer_id", None)
        row["retries"] = int(row["retries"])
        row["timeout_requeues"] = int(row["timeout_requeues"])
        out.append(row)
    return out


def _same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), set(g) ^ set(w)
        for key, value in w.items():
            if isinstance(value, float):
                assert g[key] is not None and math.isclose(g[key], value, abs_tol=1e-6), (
                    key,
                    g[key],
                    value,
                )
            else:
                assert g[key] == value, (key, g, w)


class Crash(RuntimeError):
    pass


@pytest.fixture(scope="module")
def reported(
    spark: SparkSession,
    pg_template: str,
    pg_base_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, dict[str, Any]]]:
    """Expected values by SQL, then a crashed archive (one batch done, one only exported)."""
    rdbms = fresh_database("postgresql", pg_base_url, None)
    config = pipeline_config(rdbms, tmp_path_factory.mktemp("report"), **{"batch-size": "40"})
    data.seed(config.database.connection_url, old=90, old_open=8, recent=20, seed=11)
    expected = {
        "consumers": _expected(config, ["channel_id", "consumer_id"]),
        "channels": _expected(config, ["channel_id"]),
        "totals": _expected(config, []),
        "hourly": [
            {**row, "hour": row["hour"].isoformat() + "+00:00"} for row in query(config, _HOURLY)
        ],
        "jobs": query(config, "SELECT count(*) AS n FROM job")[0]["n"],
    }

    def crash(step: str, batch: Batch) -> None:
        if step == "exported" and batch.id == 2:
            raise Crash("after the export of batch 2")

    assert run("archive", config, spark=spark, hook=crash)["status"] == "failed"
    yield config, expected


def test_report_counts_archive_and_live_once_and_matches_sql(
    spark: SparkSession, reported: tuple[Config, dict[str, Any]]
) -> None:
    config, expected = reported
    # Batch 2's rows are in its Parquet files AND still in the database: counted once.
    assert [b["status"] for b in batches(config)] == ["DELETED", "EXPORTED"]

    summary = run("report", config, spark=spark)

    assert summary["status"] == "ok", summary
    report = json.loads((Path(config.pipeline.report_root) / "report.json").read_text())
    assert report["sources"]["archived_jobs"] == batches(config)[0]["deleted_job_count"] > 0
    assert report["sources"]["archived_jobs"] + report["sources"]["live_jobs"] == expected["jobs"]
    _same(report["consumers"], expected["consumers"])
    _same(report["channels"], expected["channels"])
    _same([report["totals"]], expected["totals"])
    assert report["hourly"] == expected["hourly"]
    # The Parquet tables hold the same rows as the JSON.
    consumers = spark.read.parquet(str(Path(config.pipeline.report_root) / "consumers"))
    _same(
        sorted(
            (r.asDict() for r in consumers.collect()),
            key=lambda r: (r["channel_id"], r["consumer_id"]),
        ),
        expected["consumers"],
    )
    hourly = spark.read.parquet(str(Path(config.pipeline.report_root) / "hourly"))
    assert hourly.count() == len(expected["hourly"])

    # After the archive finishes, the same numbers come from a different split.
    finished = run("all", config, spark=spark)
    assert finished["status"] == "ok", finished
    assert finished["archive"]["resumed_batches"] == 1
    report = json.loads((Path(config.pipeline.report_root) / "report.json").read_text())
    assert report["sources"]["live_jobs"] == query(config, "SELECT count(*) AS n FROM job")[0]["n"]
    assert report["sources"]["archive_batches"] == 3
    _same(report["consumers"], expected["consumers"])
    _same([report["totals"]], expected["totals"])
    assert report["hourly"] == expected["hourly"]


def test_report_html_renders_in_headless_chromium(
    spark: SparkSession, reported: tuple[Config, dict[str, Any]], tmp_path: Path
) -> None:
    config, _ = reported
    page = Path(config.pipeline.report_root) / "report.html"
    if not page.exists():
        assert run("report", config, spark=spark)["status"] == "ok"
    html = page.read_text()
    # uPlot and the charts' data inline: nothing to fetch, from the network or beside the file.
    assert "src=" not in html and "<link" not in html and html.count('class="plot"') == 4
    assert len(chart_data(html)[0]["series"]) >= 3  # one throughput line per consumer
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (scripts/test installs it)"
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1000,1300",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    image = decode(shot.read_bytes())
    assert (image.width, image.height) == (1000, 1300)
    step = 4
    pixels = [
        image.pixel(x, y) for y in range(0, image.height, step) for x in range(0, image.width, step)
    ]
    inked = [p for p in pixels if max(p) < 235]
    assert len(inked) > 0.02 * len(pixels), "the page rendered (nearly) blank"
    # The charts are drawn (uPlot ran, offline): their colours are on the page, not just text.
    blue = [
        p
        for p in pixels
        if abs(p[0] - 0x1F) < 30 and abs(p[1] - 0x77) < 30 and abs(p[2] - 0xB4) < 30
    ]
    assert len(blue) > 50
    shutil.copy(shot, Path(config.pipeline.report_root) / "report.png")


def test_report_on_an_empty_broker(spark: SparkSession, pipeline: Config) -> None:
    summary = run("all", pipeline, spark=spark)
    assert summary["status"] == "ok", summary
    assert summary["archive"]["batches"] == 0 and summary["report"]["jobs"] == 0
    report = json.loads((Path(pipeline.pipeline.report_root) / "report.json").read_text())
    assert report["consumers"] == [] and report["hourly"] == []
    assert report["totals"]["jobs"] == 0 and report["totals"]["dead_letter_rate"] is None
    html = (Path(pipeline.pipeline.report_root) / "report.html").read_text()
    assert html.count("no data yet") == 4
