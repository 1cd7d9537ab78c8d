"""Pure parts: config parsing, JDBC coordinates, SVG charts, the HTML page."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest

from app.config import ConfigError, load_config_text
from app.pipeline.charts import grouped_bars, line_chart, nice_ticks, rate_bars
from app.pipeline.db import jdbc_target
from app.pipeline.htmlreport import render


def test_pipeline_config_defaults_and_validation() -> None:
    p = load_config_text("").pipeline
    assert (p.retention_days, p.terminal_statuses, p.jdbc_jar) == (
        7,
        ("DELIVERED", "DEAD"),
        "/usr/share/java/postgresql.jar",
    )
    p = load_config_text("[pipeline]\nterminal-statuses = dead\nbatch-size=5\n").pipeline
    assert (p.terminal_statuses, p.batch_size) == (("DEAD",), 5)
    for bad in ("terminal-statuses=QUEUED", "batch-size=0", "retention-days=-1", "nope=1"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config_text(f"[pipeline]\n{bad}\n")


def test_jdbc_target_moves_credentials_out_of_the_url() -> None:
    t = jdbc_target("postgresql://us%40er:p%3Ass@db.example:5433/broker?sslmode=require")
    assert t.url == "jdbc:postgresql://db.example:5433/broker?sslmode=require"
    assert (t.user, t.password) == ("us@er", "p:ss")
    assert "password" not in jdbc_target("postgresql://127.0.0.1/x").options(10)


def test_nice_ticks_cover_the_top() -> None:
    assert nice_ticks(9.3) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(0) == [0.0, 1.0]


def test_charts_are_well_formed_svg_with_one_mark_per_value() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    line = line_chart(
        {"a/x": [(t0, 1), (t0 + timedelta(hours=1), 3)], "b/<y>": [(t0, 2)]},
        title="t",
        y_label="jobs",
    )
    root = ET.fromstring(line)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2
    assert "b/&lt;y&gt;" in line
    bars = ET.fromstring(
        grouped_bars(["a", "b"], {"p50": [1.0, None], "p99": [2.0, 3.0]}, title="w", y_label="s")
    )
    assert len([r for r in bars.iter(f"{ns}rect") if r.get("class") == "bar"]) == 3
    rates = ET.fromstring(rate_bars(["a", "b"], [0.5, None], title="d"))
    widths = [float(r.get("width", 0)) for r in rates.iter(f"{ns}rect") if r.get("class") == "bar"]
    assert widths[0] > 0 and widths[1] == 0
    assert "no data yet" in line_chart({}, title="e", y_label="")


def test_page_is_self_contained() -> None:
    stats = {
        "channel_id": "c",
        "consumer_id": "k",
        "jobs": 2,
        "queued": 0,
        "inflight": 0,
        "delivered": 1,
        "dead": 1,
        "dead_letter_rate": 0.5,
        "retries": 3,
        "timeout_requeues": 1,
        **{
            f"{m}_{p}_seconds": 1.5
            for m in ("queue_wait", "processing")
            for p in ("p50", "p95", "p99")
        },
    }
    report: dict[str, object] = {
        "generated_at": "2026-01-01T00:00:00+00:00",
        "sources": {"archive_batches": 1, "archived_jobs": 1, "live_jobs": 1},
        "totals": stats,
        "channels": [stats],
        "consumers": [stats],
        "hourly": [
            {
                "channel_id": "c",
                "consumer_id": "k",
                "hour": "2026-01-01T00:00:00+00:00",
                "delivered": 1,
                "dead": 1,
            }
        ],
    }
    page = render(report)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 4
    assert "<script" not in page and "src=" not in page and "href=" not in page
    assert page.count('class="bar"') == 3 + 3 + 1  # wait, processing, dead-letter rate
    many = [{**stats, "consumer_id": f"k{i}", "jobs": i} for i in range(25)]
    crowded = render({**report, "consumers": many})
    assert crowded.count('class="bar"') == 20 * 7  # the 20 busiest consumers are charted
    assert "k24" in crowded and ">c/k0<" not in crowded.split("<table>")[0]


def test_pipeline_imports_no_api_store_services_or_bridge() -> None:
    code = (
        "import sys, app.pipeline.job\nprint(' '.join(m for m in sys.modules if m[:4] == 'app.'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "app.pipeline.job" in loaded
    for forbidden in ("app.api", "app.store", "app.services", "app.bridge"):
        assert not [m for m in loaded if m == forbidden or m.startswith(forbidden + ".")]
