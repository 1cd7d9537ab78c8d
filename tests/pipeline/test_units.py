"""Pure parts: config parsing, JDBC coordinates, the charts' data, the HTML page (drawn by
Debian's Chromium through Playwright, in light and dark, offline)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from playwright.sync_api import Browser, Route

from app.config import ConfigError, load_config_text
from app.pipeline.charts import bar_chart, chart_html, line_chart
from app.pipeline.db import jdbc_target
from app.pipeline.htmlreport import render
from tests.helpers.browser import chromium
from tests.pipeline.helpers import chart_data


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


def test_charts_hold_one_value_per_point_and_one_slot_per_bar() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    later = t0 + timedelta(hours=1)
    line = line_chart({"a/x": [(t0, 1), (later, 3)], "b/<y>": [(t0, 2)]}, title="t", y_label="j")
    assert line.x == [t0.timestamp(), later.timestamp()]
    assert line.series == {"a/x": [1.0, 3.0], "b/<y>": [2.0, None]}  # no point, not a zero
    bars = bar_chart(["a", "b"], {"p50": [1.0, None], "p99": [2.0, 3.0]}, title="w", y_label="s")
    # Each bar its own slot, a free slot between categories, the label under their middle.
    assert bars.x == [0, 1, 3, 4]
    assert bars.series == {"p50": [1.0, None, None, None], "p99": [None, 2.0, None, 3.0]}
    assert (bars.ticks, bars.labels) == ([0.5, 3.5], ["a", "b"])
    assert line_chart({}, title="e", y_label="").empty
    assert bar_chart(["a"], {"rate": [None]}, title="d", y_label="", percent=True).empty
    assert "no data yet" in chart_html(line_chart({}, title="e", y_label=""), 0)
    assert 'data-chart="3"' in chart_html(bars, 3)


def test_page_is_self_contained() -> None:
    report = _report()
    stats = _stats()
    page = render(report)
    assert page.startswith("<!DOCTYPE html>") and page.count('class="plot"') == 4
    # uPlot and the data inline: nothing is fetched (no src, no stylesheet link).
    assert "<script src" not in page and "<link" not in page and "src=" not in page
    assert "/*! https://github.com/leeoniya/uPlot (v1.6." in page  # its licence header kept
    charts = chart_data(page)
    assert [c["kind"] for c in charts] == ["line", "bars", "bars", "bars"]
    assert [len(c["series"]) for c in charts] == [1, 3, 3, 1]  # wait, processing: p50 p95 p99
    many = [{**stats, "consumer_id": f"k{i}", "jobs": i} for i in range(25)]
    crowded = render({**report, "consumers": many})
    assert all(len(c["labels"]) == 20 for c in chart_data(crowded)[1:])  # the 20 busiest
    assert "c/k24" in chart_data(crowded)[1]["labels"]
    assert "c/k0" not in chart_data(crowded)[1]["labels"]
    evil = render({**report, "consumers": [{**stats, "consumer_id": "</script><b>x"}]})
    assert "</script><b>x" not in evil  # escaped in the table, "<\\/" in the chart data
    assert chart_data(evil)[1]["labels"] == ["c/</script><b>x"]


def test_page_draws_its_charts_offline_in_light_and_dark(tmp_path: Path) -> None:
    """In Chromium (Debian's, through Playwright) with every request but the file refused:
    four canvases drawn, the page's background and the axes' ink following the colour
    scheme, the first series in its scheme's colour."""
    page_file = tmp_path / "report.html"
    page_file.write_text(render(_report()), encoding="utf-8")
    with chromium() as browser:
        schemes: tuple[Scheme, ...] = ("light", "dark")
        seen: dict[str, dict[str, Any]] = {s: _drawn(browser, page_file, s) for s in schemes}
    assert _luma(seen["light"]["background"]) > 200 and _luma(seen["dark"]["background"]) < 50
    for scheme, other in (("light", "dark"), ("dark", "light")):
        counts = dict(zip(_INK, seen[scheme]["counts"], strict=True))
        # The axes' text and the first series in this scheme's colours, none in the other's.
        assert counts[f"text {scheme}"] > 50 and counts[f"first {scheme}"] > 500, seen
        assert counts[f"text {other}"] == 0 and counts[f"first {other}"] == 0, seen


def _drawn(browser: Browser, page_file: Path, scheme: Scheme) -> dict[str, Any]:
    """The page opened in `scheme` with every request but the file's refused: its background
    and the canvases' pixels of each _INK colour, once its four charts are drawn."""
    context = browser.new_context(color_scheme=scheme, viewport={"width": 1000, "height": 900})
    try:
        page = context.new_page()
        fetched: list[str] = []
        errors: list[str] = []

        def only_the_file(route: Route) -> None:
            if route.request.url.startswith("file:"):
                route.continue_()
            else:
                fetched.append(route.request.url)
                route.abort()

        page.route("**/*", only_the_file)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(page_file.as_uri())
        page.wait_for_function("document.querySelectorAll('canvas').length === 4")
        drawn: dict[str, Any] = page.evaluate(_PIXELS, list(_INK.values()))
        assert errors == [] and fetched == []
        return drawn
    finally:
        context.close()


def _stats() -> dict[str, Any]:
    return {
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


def _report() -> dict[str, Any]:
    stats = _stats()
    return {
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


Scheme = Literal["light", "dark"]

# The page's --fg and --c0 in each scheme (app/pipeline/htmlreport.py).
_INK = {
    "text light": (0x22, 0x22, 0x22),
    "text dark": (0xEC, 0xEC, 0xEC),
    "first light": (0x1F, 0x77, 0xB4),
    "first dark": (0x6C, 0xB4, 0xEE),
}


def _luma(rgb: list[int]) -> float:
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]


# Opaque canvas pixels (uPlot draws axes, text and series on transparent canvases, so these
# carry their exact colours) near each of the given colours, counted over every canvas.
_PIXELS = """
(targets) => {
  const bg = getComputedStyle(document.body).backgroundColor.match(/\\d+/g).map(Number);
  const counts = targets.map(() => 0);
  for (const canvas of document.querySelectorAll("canvas")) {
    const d = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] < 250) continue;
      targets.forEach((t, n) => {
        if (Math.abs(d[i] - t[0]) + Math.abs(d[i + 1] - t[1]) + Math.abs(d[i + 2] - t[2]) < 12)
          counts[n]++;
      });
    }
  }
  return { background: bg.slice(0, 3), counts: counts };
}
"""


def test_pipeline_imports_no_api_store_services_or_bridge() -> None:
    code = (
        "import sys, app.pipeline.job\nprint(' '.join(m for m in sys.modules if m[:4] == 'app.'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "app.pipeline.job" in loaded
    for forbidden in ("app.api", "app.store", "app.services", "app.bridge"):
        assert not [m for m in loaded if m == forbidden or m.startswith(forbidden + ".")]
