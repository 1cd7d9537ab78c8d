"""The HTML report's charts, drawn in the browser by uPlot: the same library the operator
console draws with (vendored once, app/ui/static/vendor, see VENDORED.md there).

Python builds each chart as plain data (a Chart); the page carries the data as JSON, uPlot and
a short drawing script inline. Inline rather than a script file beside the report: report.html
stays one file that opens anywhere offline (copied, mailed, attached to a ticket, archived)
with nothing to keep beside it, for about 55 kB. Colours come from the page's CSS variables,
read again when the reader's light/dark preference changes, so each chart reads in both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from html import escape
from importlib import resources
from typing import Any

# The console's copy: reading it by path keeps the pipeline from importing app.ui (FastAPI).
_VENDOR = resources.files("app") / "ui" / "static" / "vendor"
UPLOT_JS = "uPlot.iife.min.js"
UPLOT_CSS = "uPlot.min.css"
LABEL_CHARS = 24  # a category's label on the axis (the tables below carry the full names)


@dataclass(frozen=True)
class Chart:
    """One chart as uPlot draws it: `x` and one list of values per series (None: no point).

    kind "line": x in unix seconds. kind "bars": x are slots, one per (category, series) with a
    free slot between categories; `ticks` are the categories' middle slots, `labels` their
    names."""

    kind: str
    title: str
    y_label: str
    x: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    ticks: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    percent: bool = False

    @property
    def empty(self) -> bool:
        return not self.x or all(v is None for vs in self.series.values() for v in vs)

    def spec(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "yLabel": self.y_label,
            "x": self.x,
            "series": [{"label": k, "values": v} for k, v in self.series.items()],
            "ticks": self.ticks,
            "labels": self.labels,
            "percent": self.percent,
        }


def line_chart(
    series: Mapping[str, Sequence[tuple[datetime, float]]], *, title: str, y_label: str
) -> Chart:
    """One line per series over time (e.g. jobs finished per hour, per consumer), on the
    union of the series' times."""
    times = sorted({t for values in series.values() for t, _ in values})
    x = [t.timestamp() for t in times]
    aligned: dict[str, list[float | None]] = {}
    for name, values in series.items():
        at = {t: float(v) for t, v in values}
        aligned[name] = [at.get(t) for t in times]
    return Chart("line", title, y_label, x=x, series=aligned)


def bar_chart(
    categories: Sequence[str],
    groups: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    y_label: str,
    percent: bool = False,
) -> Chart:
    """For each category (consumer), one bar per group (p50, p95, p99); None draws no bar.
    uPlot has no grouped bars of its own: each bar gets a slot of its own on the x scale."""
    names = list(groups)
    width = len(names) + 1
    x: list[float] = []
    series: dict[str, list[float | None]] = {name: [] for name in names}
    for c in range(len(categories)):
        for g in range(len(names)):
            x.append(float(c * width + g))
            for h, name in enumerate(names):
                series[name].append(groups[name][c] if h == g else None)
    ticks = [c * width + (len(groups) - 1) / 2 for c in range(len(categories))]
    labels = [name[:LABEL_CHARS] for name in categories]
    return Chart("bars", title, y_label, x, series, ticks, labels, percent)


def chart_html(chart: Chart, index: int) -> str:
    """The chart's place on the page: a figure uPlot draws into (or a note when empty)."""
    title = escape(chart.title)
    if chart.empty:
        return f'<figure class="chart empty"><figcaption>{title}</figcaption>no data yet</figure>'
    return (
        f'<figure class="chart"><figcaption>{title}</figcaption>'
        f'<div class="plot" data-chart="{index}" role="img" aria-label="{title}"></div></figure>'
    )


def _inline_json(value: Any) -> str:
    # Inside <script>: a "</" in a consumer's name must not end the element.
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


def chart_scripts(charts: Sequence[Chart]) -> str:
    """uPlot, its stylesheet, the charts' data and the script that draws them, all inline."""
    uplot_js = (_VENDOR / UPLOT_JS).read_text(encoding="utf-8")
    uplot_css = (_VENDOR / UPLOT_CSS).read_text(encoding="utf-8")
    data = _inline_json([c.spec() for c in charts])
    return (
        f"<style>{uplot_css}</style>\n"
        f"<script>{uplot_js}</script>\n"
        f'<script type="application/json" id="chart-data">{data}</script>\n'
        f"<script>{_DRAW}</script>"
    )


_DRAW = """
(function () {
  "use strict";
  var specs = JSON.parse(document.getElementById("chart-data").textContent);
  var plots = [];
  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function number(v, percent) {
    if (v == null) return "-";
    if (percent) return (v * 100).toFixed(v < 0.1 ? 1 : 0) + "%";
    return Math.abs(v) >= 1000 ? Math.round(v).toLocaleString("en") : +v.toPrecision(3) + "";
  }
  function options(spec, el) {
    var fg = css("--fg"), grid = css("--grid"), bars = spec.kind === "bars";
    var axisFont = "12px system-ui, sans-serif";
    var x = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid },
              font: axisFont };
    if (bars) {
      x.splits = function () { return spec.ticks; };
      x.values = function () { return spec.labels; };
      x.grid = { show: false };
      if (spec.labels.length > 6) { x.rotate = -35; x.size = 90; }
    } else {
      x.space = 110;  // room for "MM-DD HH:MM", UTC as the title says
      x.values = function (u, splits) {
        return splits.map(function (ts) {
          return new Date(ts * 1e3).toISOString().slice(5, 16).replace("T", " ");
        });
      };
    }
    var series = [{ label: bars ? "slot" : "time (UTC)" }];
    spec.series.forEach(function (s, i) {
      var color = css("--c" + (i % 10));
      var one = { label: s.label, stroke: color, width: 2,
                  value: function (u, v) { return number(v, spec.percent); } };
      if (bars) {
        one.fill = color;
        one.paths = uPlot.paths.bars({ size: [0.9, 64] });
        one.points = { show: false };
      } else {
        one.points = { show: s.values.length <= 60, size: 5, fill: color };
        one.spanGaps = false;
      }
      series.push(one);
    });
    var last = spec.x.length ? spec.x[spec.x.length - 1] : 1;
    return {
      width: Math.min(el.clientWidth || 900, 1100), height: 320, padding: [12, 48, 0, 0],
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      scales: {
        x: bars ? { time: false, range: function () { return [-1, last + 1]; } } : { time: true },
        y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.08 : 1]; } }
      },
      axes: [x, { stroke: fg, label: spec.yLabel, labelFont: axisFont, font: axisFont,
                  grid: { stroke: grid, width: 1 }, ticks: { stroke: grid }, size: 64,
                  values: function (u, splits) {
                    return splits.map(function (v) { return number(v, spec.percent); });
                  } }],
      series: series,
      legend: { live: !bars },
      cursor: { points: { show: !bars } }
    };
  }
  function draw() {
    plots.forEach(function (p) { p.destroy(); });
    plots = [];
    document.querySelectorAll(".plot[data-chart]").forEach(function (el) {
      var spec = specs[+el.getAttribute("data-chart")];
      var data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
      plots.push(new uPlot(options(spec, el), data, el));
    });
  }
  draw();
  var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)");
  if (dark && dark.addEventListener) dark.addEventListener("change", draw);
  var pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(draw, 200);
  });
})();
"""
