"""Charts as inline SVG, drawn on the server: they need no JavaScript and no library. Credit over time
(``credit_chart``: a subject page's daily credit) and lines over a numeric axis (``line_chart``: an
experiment's validation loss per trainer over training tokens) share the frame, the round ticks and
the stylesheet's classes.

Only numbers and dates go into the markup (never a user's text: a line's name is in the page's legend,
outside the SVG), and it is built from fixed templates, so the result is safe to mark up as-is. The SVG
scales with its card; on narrow screens the stylesheet enlarges its text and hides every other x label
(``minor``). What it shows is also in words (a summary) and in a table the page puts beside it, for
screen readers and keyboards; lines differ in dash pattern as well as colour (``s0`` ... ``s5``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape

from ..credit.ledger import DAY_S
from .queries import CreditPoint

WIDTH = 760
HEIGHT = 260
LEFT, RIGHT, TOP, BOTTOM = 76, 24, 20, 44
SERIES_STYLES = 6  # line classes s0..s5 in the stylesheet; more lines reuse them


def nice_step(span: float, ticks: int = 4) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) that cuts ``span`` into about ``ticks`` parts."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if raw <= m * power:
            return m * power
    return 10.0 * power


def short_number(v: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= limit:
            return f"{v / limit:g}{suffix}"
    return f"{v:g}"


def day_label(day: int, fmt: str = "%b %d") -> str:
    return datetime.fromtimestamp(day * DAY_S, UTC).strftime(fmt)


def credit_chart(points: Sequence[CreditPoint], title: str = "Daily credit") -> Markup:
    """A line over a filled area, y axis with round ticks, x axis with about six dates."""
    if not points:
        return Markup("")
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    peak = max(p.credit for p in points)
    step = nice_step(peak)
    top_value = step * max(1, math.ceil(peak / step))
    n = len(points)

    def x(i: int) -> float:
        return LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: float) -> float:
        return TOP + plot_h * (1.0 - v / top_value)

    parts = _frame(title, "chart-title") + _y_grid(0.0, top_value, step, y)
    base = TOP + plot_h
    label_every = max(1, math.ceil(n / 6))
    for j, i in enumerate(range(n - 1, -1, -label_every)):  # anchored on today, the most useful date
        xx = x(i)
        parts.append(
            f'<line class="tick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{TOP + plot_h}" y2="{TOP + plot_h + 5}"/>'
        )
        minor = " minor" if j % 2 else ""
        if i == n - 1 and n > 1:
            minor += " last"  # anchored at its end: centred, today's date would run off the right edge
        parts.append(
            f'<text class="xlabel{minor}" x="{xx:.1f}" y="{HEIGHT - 10}">{day_label(points[i].day)}</text>'
        )
    line = " ".join(f"{x(i):.1f},{y(p.credit):.1f}" for i, p in enumerate(points))
    parts.append(f'<polygon class="area" points="{x(0):.1f},{base} {line} {x(n - 1):.1f},{base}"/>')
    parts.append(f'<polyline class="line" points="{line}"/>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}"/>')
    # One transparent column per day carries a tooltip: hovering shows the day's value, no script needed.
    col = plot_w / max(1, n - 1) if n > 1 else plot_w
    for i, p in enumerate(points):
        left = max(LEFT, x(i) - col / 2)
        right = min(WIDTH - RIGHT, x(i) + col / 2)
        parts.append(
            f'<rect class="hover" x="{left:.1f}" y="{TOP}" width="{right - left:.1f}" height="{plot_h}">'
            f"<title>{day_label(p.day, '%Y-%m-%d')}: {p.credit:,.1f}</title></rect>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _frame(title: str, title_id: str) -> list[str]:
    return [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{escape(title_id)}" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{escape(title_id)}">{escape(title)}</title>',
    ]


def _y_grid(lo: float, top: float, step: float, y: Callable[[float], float]) -> list[str]:
    """Horizontal grid lines with their labels, every ``step`` from ``lo`` to ``top``."""
    parts = []
    for k in range(round((top - lo) / step) + 1):
        v = round(lo + k * step, 10)  # 0.1 + 0.2 is not 0.3: the label says 0.3
        yy = y(v)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        parts.append(f'<text class="ylabel" x="{LEFT - 8}" y="{yy + 4:.1f}">{short_number(v)}</text>')
    return parts


@dataclass(frozen=True)
class LinePoint:
    x: float
    y: float
    note: str  # the point's tooltip, made of numbers by the caller (escaped all the same)


def line_chart(series: Sequence[Sequence[LinePoint]], title: str, title_id: str = "chart-title") -> Markup:
    """One line per series (points in ``x`` order), each with a marker per point that carries its
    tooltip: x from 0 (training starts there) to a round value past the last point, y over the
    points' range rounded out to whole ticks (a loss curve's shape, not its distance from zero)."""
    points = [p for s in series for p in s]
    if not points:
        return Markup("")
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    x_step = nice_step(max(p.x for p in points), 5)
    x_top = x_step * max(1, math.ceil(max(p.x for p in points) / x_step))
    lo, hi = min(p.y for p in points), max(p.y for p in points)
    y_step = nice_step(hi - lo if hi > lo else max(abs(hi) * 0.1, 0.1))
    y_lo = y_step * math.floor(lo / y_step)
    y_top = max(y_step * math.ceil(hi / y_step), y_lo + y_step)

    def x(v: float) -> float:
        return LEFT + plot_w * v / x_top

    def y(v: float) -> float:
        return TOP + plot_h * (1.0 - (v - y_lo) / (y_top - y_lo))

    parts = _frame(title, title_id) + _y_grid(y_lo, y_top, y_step, y)
    base = TOP + plot_h
    ticks = round(x_top / x_step)
    for k in range(ticks + 1):
        xx = x(k * x_step)
        parts.append(f'<line class="tick" x1="{xx:.1f}" x2="{xx:.1f}" y1="{base}" y2="{base + 5}"/>')
        cls = " minor" if k % 2 else ""
        cls += " last" if k == ticks else ""
        parts.append(
            f'<text class="xlabel{cls}" x="{xx:.1f}" y="{HEIGHT - 10}">{short_number(k * x_step)}</text>'
        )
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base}" y2="{base}"/>')
    for i, line in enumerate(series):
        style = f"s{i % SERIES_STYLES}"
        coords = " ".join(f"{x(p.x):.1f},{y(p.y):.1f}" for p in line)
        parts.append(f'<polyline class="line {style}" points="{coords}"/>')
        for p in line:
            parts.append(
                f'<circle class="dot {style}" cx="{x(p.x):.1f}" cy="{y(p.y):.1f}" r="4">'
                f"<title>{escape(p.note)}</title></circle>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def chart_summary(points: Sequence[CreditPoint]) -> str:
    """The chart in one sentence: span, total, best day, last day."""
    if not points:
        return "No credit yet."
    total = sum(p.credit for p in points)
    best = max(points, key=lambda p: p.credit)
    active = sum(1 for p in points if p.credit > 0)
    first, last = points[0], points[-1]
    return (
        f"From {day_label(first.day, '%Y-%m-%d')} to {day_label(last.day, '%Y-%m-%d')}: "
        f"{total:,.1f} credit over {active} active days of {len(points)}; "
        f"best day {day_label(best.day, '%Y-%m-%d')} with {best.credit:,.1f}; "
        f"last day {last.credit:,.1f}."
    )


def chart_context(points: Sequence[CreditPoint], title: str) -> dict[str, Any]:
    """What a subject page (contributor, team, host) shows of its daily credit: the chart, its text
    summary and the window's total, under the names the templates use."""
    return {
        "chart": credit_chart(points, title=title),
        "summary": chart_summary(points),
        "window_credit": sum(p.credit for p in points),
    }
