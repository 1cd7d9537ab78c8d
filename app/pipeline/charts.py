"""Inline SVG charts for the HTML report: no JavaScript, no external files, no CDN."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)

_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 36, 56
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top`."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(top / step) + 1)]


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _frame(width: int, height: int, title: str, body: list[str]) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="{_LEFT}" y="20" font-family="system-ui, sans-serif" font-size="14" '
            'font-weight="600">'
            f"{escape(title)}</text>",
            *body,
            "</svg>",
        ]
    )


def _y_axis(ticks: list[float], width: int, height: int, label: str) -> list[str]:
    plot_h = height - _TOP - _BOTTOM
    out = []
    for tick in ticks:
        y = _TOP + plot_h - plot_h * tick / ticks[-1]
        out.append(
            f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#e5e5e5"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" {_FONT}>'
            f"{_number(tick)}</text>"
        )
    out.append(
        f'<text transform="translate(14 {_TOP + plot_h / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle" {_FONT}>{escape(label)}</text>'
    )
    return out


def _legend(names: Sequence[str], width: int, height: int) -> list[str]:
    out = []
    x = _LEFT
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="{height - 18}" width="10" height="10" fill="{color(i)}"/>'
            f'<text x="{x + 14}" y="{height - 9}" {_FONT}>{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
        if x > width - 80:
            break
    return out


def empty_chart(title: str, width: int = 900, height: int = 120) -> str:
    body = [f'<text x="{_LEFT}" y="60" {_FONT}>no data yet</text>']
    return _frame(width, height, title, body)


def line_chart(
    series: Mapping[str, Sequence[tuple[datetime, float]]],
    *,
    title: str,
    y_label: str,
    width: int = 900,
    height: int = 320,
) -> str:
    """One line per series over time (e.g. jobs finished per hour, per consumer)."""
    points = [p for values in series.values() for p in values]
    if not points:
        return empty_chart(title, width)
    start = min(t for t, _ in points).timestamp()
    end = max(t for t, _ in points).timestamp()
    span = max(end - start, 1.0)
    ticks = nice_ticks(max(v for _, v in points))
    plot_w = width - _LEFT - _RIGHT
    plot_h = height - _TOP - _BOTTOM

    def xy(t: datetime, v: float) -> tuple[float, float]:
        x = _LEFT + plot_w * (t.timestamp() - start) / span if end > start else _LEFT + plot_w / 2
        return x, _TOP + plot_h - plot_h * v / ticks[-1]

    body = _y_axis(ticks, width, height, y_label)
    for i in range(6 if end > start else 1):
        t = datetime.fromtimestamp(start + span * i / 5, tz=min(t for t, _ in points).tzinfo)
        x, _ = xy(t, 0)
        body.append(
            f'<text x="{x:.1f}" y="{height - _BOTTOM + 16}" text-anchor="middle" {_FONT}>'
            f"{t:%m-%d %H:%M}</text>"
        )
    for i, values in enumerate(series.values()):
        ordered = sorted(values)
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v in ordered))
        body.append(
            f'<polyline class="series" points="{coords}" fill="none" stroke="{color(i)}" '
            f'stroke-width="2"/>'
        )
        if len(ordered) <= 60:
            body.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color(i)}"/>'
                for x, y in (xy(t, v) for t, v in ordered)
            )
    body.extend(_legend(list(series), width, height))
    return _frame(width, height, title, body)


def grouped_bars(
    categories: Sequence[str],
    groups: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    y_label: str,
    width: int = 900,
    height: int = 320,
) -> str:
    """For each category (consumer), one bar per group (p50, p95, p99); None draws no bar."""
    values = [v for vs in groups.values() for v in vs if v is not None]
    if not categories or not values:
        return empty_chart(title, width)
    ticks = nice_ticks(max(values))
    plot_w = width - _LEFT - _RIGHT
    plot_h = height - _TOP - _BOTTOM
    slot = plot_w / len(categories)
    bar = slot * 0.8 / len(groups)
    body = _y_axis(ticks, width, height, y_label)
    for c, category in enumerate(categories):
        x0 = _LEFT + c * slot + slot * 0.1
        for g, group_values in enumerate(groups.values()):
            value = group_values[c]
            if value is None:
                continue
            h = plot_h * value / ticks[-1]
            body.append(
                f'<rect class="bar" x="{x0 + g * bar:.1f}" y="{_TOP + plot_h - h:.1f}" '
                f'width="{max(bar - 1, 1):.1f}" height="{h:.1f}" fill="{color(g)}">'
                f"<title>{escape(category)} {escape(list(groups)[g])}: {_number(value)}</title>"
                "</rect>"
            )
        body.append(
            f'<text x="{x0 + slot * 0.4:.1f}" y="{height - _BOTTOM + 16}" text-anchor="middle" '
            f"{_FONT}>{escape(category[:24])}</text>"
        )
    body.extend(_legend(list(groups), width, height))
    return _frame(width, height, title, body)


def rate_bars(
    labels: Sequence[str], rates: Sequence[float | None], *, title: str, width: int = 900
) -> str:
    """Horizontal bars for ratios in [0, 1], labelled as percentages."""
    if not labels:
        return empty_chart(title, width)
    row = 22
    height = _TOP + row * len(labels) + 16
    label_w = 220
    plot_w = width - label_w - 80
    body = []
    for i, (label, rate) in enumerate(zip(labels, rates, strict=True)):
        y = _TOP + i * row
        shown = "n/a" if rate is None else f"{rate * 100:.1f}%"
        w = plot_w * (rate or 0.0)
        body.append(
            f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" {_FONT}>'
            f"{escape(label[:36])}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{plot_w}" height="{row - 6}" fill="#f0f0f0"/>'
            f'<rect class="bar" x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" '
            f'fill="{color(3)}"/>'
            f'<text x="{label_w + plot_w + 6}" y="{y + 14}" {_FONT}>{shown}</text>'
        )
    return _frame(width, height, title, body)
