"""The self-contained HTML page of the delivery report: inline CSS, and charts drawn by the
vendored uPlot inlined with their data (app/pipeline/charts.py); nothing is fetched, so it opens
offline. Light or dark as the reader's system prefers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from html import escape
from typing import Any

from app.pipeline.charts import Chart, bar_chart, chart_html, chart_scripts, line_chart

MAX_SERIES = 10
MAX_BARS = 20
MAX_HOURLY_SPAN = timedelta(days=21)  # longer spans are drawn per day

# The series colours: Tableau 10 on white, lighter ones on the dark background (each at least
# 3:1 against its background, as WCAG asks of graphics).
_CSS = """
:root { color-scheme: light dark; --bg: #fafafa; --fg: #222; --muted: #595959; --card: #fff;
  --line: #ddd; --head: #f0f0f0; --grid: #e3e3e3;
  --c0: #1f77b4; --c1: #d9650b; --c2: #2ca02c; --c3: #d62728; --c4: #9467bd; --c5: #8c564b;
  --c6: #d15fb0; --c7: #6f6f6f; --c8: #8c8c14; --c9: #129aa8; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #121212; --fg: #ececec; --muted: #b8b8b8; --card: #1e1e1e; --line: #444;
    --head: #2a2a2a; --grid: #3a3a3a;
    --c0: #6cb4ee; --c1: #ffa657; --c2: #7ee787; --c3: #ff7b72; --c4: #d2a8ff; --c5: #e0a48a;
    --c6: #f59ad6; --c7: #b8b8b8; --c8: #e3e36b; --c9: #56d4dd; }
}
body { font-family: system-ui, sans-serif; margin: 24px; color: var(--fg); background: var(--bg); }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: var(--muted); font-size: 13px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 16px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 14px; }
.card b { display: block; font-size: 20px; }
table { border-collapse: collapse; background: var(--card); font-size: 12px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: right; }
th { background: var(--head); } td.id { text-align: left; } .scroll { overflow-x: auto; }
figure.chart { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
  margin: 0; padding: 10px; max-width: 1100px; }
figure.chart figcaption { font-weight: 600; font-size: 14px; margin-bottom: 6px; }
figure.empty { color: var(--muted); }
.u-legend { color: var(--fg); font-size: 12px; }
.u-legend th, .u-legend td { border: 0; background: none; padding: 2px 4px; text-align: left; }
"""

_COLUMNS = (
    ("jobs", "jobs"),
    ("delivered", "delivered"),
    ("dead", "dead"),
    ("queued", "queued"),
    ("inflight", "in flight"),
    ("dead_letter_rate", "dead-letter rate"),
    ("retries", "retries"),
    ("timeout_requeues", "timeout requeues"),
    ("queue_wait_p50_seconds", "wait p50 s"),
    ("queue_wait_p95_seconds", "wait p95 s"),
    ("queue_wait_p99_seconds", "wait p99 s"),
    ("processing_p50_seconds", "processing p50 s"),
    ("processing_p95_seconds", "processing p95 s"),
    ("processing_p99_seconds", "processing p99 s"),
)


def consumer_label(row: Mapping[str, Any]) -> str:
    return f"{row['channel_id']}/{row['consumer_id']}"


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "<td>–</td>"
    if key == "dead_letter_rate":
        return f"<td>{value * 100:.2f}%</td>"
    if isinstance(value, float):
        return f"<td>{value:,.3f}</td>"
    return f"<td>{value:,}</td>"


def _table(rows: Sequence[Mapping[str, Any]], id_columns: Sequence[str]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in id_columns)
    head += "".join(f"<th>{escape(title)}</th>" for _, title in _COLUMNS)
    body = []
    for row in rows:
        ids = "".join(f'<td class="id">{escape(str(row[c]))}</td>' for c in id_columns)
        body.append("<tr>" + ids + "".join(_cell(k, row[k]) for k, _ in _COLUMNS) + "</tr>")
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def _throughput(
    consumers: Sequence[Mapping[str, Any]], hourly: Sequence[Mapping[str, Any]]
) -> Chart:
    """Delivered jobs per hour (per day over long spans), zeros filled in, top consumers."""
    shown = [consumer_label(c) for c in sorted(consumers, key=lambda c: -c["jobs"])[:MAX_SERIES]]
    counts: dict[str, dict[datetime, float]] = defaultdict(lambda: defaultdict(float))
    for row in hourly:
        label = consumer_label(row)
        if label in shown:
            counts[label][datetime.fromisoformat(row["hour"])] += float(row["delivered"])
    hours = [h for per in counts.values() for h in per]
    if not hours:
        return line_chart({}, title="Delivered jobs per hour (UTC)", y_label="jobs / hour")
    first, last = min(hours), max(hours)
    unit, name = timedelta(hours=1), "hour"
    if last - first > MAX_HOURLY_SPAN:
        unit, name = timedelta(days=1), "day"
        first = first.replace(hour=0)
    buckets = [first + i * unit for i in range(int((last - first) / unit) + 1)]
    series = {}
    for label in shown:
        if label in counts:
            per: defaultdict[datetime, float] = defaultdict(float)
            for hour, value in counts[label].items():
                per[first + ((hour - first) // unit) * unit] += value
            series[label] = [(b, per[b]) for b in buckets]
    return line_chart(series, title=f"Delivered jobs per {name} (UTC)", y_label=f"jobs / {name}")


def render(report: Mapping[str, Any]) -> str:
    """The report as one HTML document that opens in any browser, offline."""
    consumers: list[Mapping[str, Any]] = list(report["consumers"])
    charted = consumers
    top = ""
    if len(consumers) > MAX_BARS:
        charted = sorted(consumers, key=lambda c: -c["jobs"])[:MAX_BARS]
        top = f" (the {MAX_BARS} busiest consumers)"
    labels = [consumer_label(c) for c in charted]
    totals = report["totals"]
    waits = bar_chart(
        labels,
        {p: [c[f"queue_wait_{p}_seconds"] for c in charted] for p in ("p50", "p95", "p99")},
        title=f"Queue wait (claim minus creation), seconds{top}",
        y_label="seconds",
    )
    processing = bar_chart(
        labels,
        {p: [c[f"processing_{p}_seconds"] for c in charted] for p in ("p50", "p95", "p99")},
        title=f"Processing time (completion minus claim), seconds{top}",
        y_label="seconds",
    )
    dead = bar_chart(
        labels,
        {"dead-letter rate": [c["dead_letter_rate"] for c in charted]},
        title=f"Dead-letter rate{top}",
        y_label="dead / finished",
        percent=True,
    )
    charts = [_throughput(consumers, report["hourly"]), waits, processing, dead]
    drawn = [chart_html(chart, i) for i, chart in enumerate(charts)]
    sources = report["sources"]
    cards = [
        ("jobs", f"{totals['jobs']:,}"),
        ("delivered", f"{totals['delivered']:,}"),
        ("dead", f"{totals['dead']:,}"),
        (
            "dead-letter rate",
            "–" if totals["dead_letter_rate"] is None else f"{totals['dead_letter_rate']:.2%}",
        ),
        ("archived jobs", f"{sources['archived_jobs']:,}"),
        ("live jobs", f"{sources['live_jobs']:,}"),
    ]
    card_html = "".join(f'<div class="card">{escape(k)}<b>{v}</b></div>' for k, v in cards)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>webhook-broker delivery report</title><style>{_CSS}</style></head>
<body>
<h1>webhook-broker delivery report</h1>
<div class="meta">generated {escape(str(report["generated_at"]))} from
{sources["archive_batches"]} archive batches and the live tables, read from the
{escape(str(report.get("read_from", "primary")))}</div>
<div class="cards">{card_html}</div>
<h2>Throughput</h2>{drawn[0]}
<h2>Queue wait percentiles</h2>{drawn[1]}
<h2>Processing time percentiles</h2>{drawn[2]}
<h2>Dead-letter rates</h2>{drawn[3]}
<h2>Per consumer</h2>{_table(consumers, ("channel_id", "consumer_id"))}
<h2>Per channel</h2>{_table(report["channels"], ("channel_id",))}
{chart_scripts(charts)}
</body></html>
"""
