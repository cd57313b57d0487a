"""The Usage page's chart: spend per day, as an SVG drawn on the server (no script, no library).

Pure functions: :func:`daily_spend` turns ledger rows into one amount per UTC day, and
:func:`spend_svg` draws them. The SVG is an image with a text alternative (``role="img"``, a
``<title>`` and a ``<desc>`` naming the total and the busiest day, a ``<title>`` on each bar);
the page shows a table of the same numbers beside it. Every text in it is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from html import escape

from kyronix.server.config import credits_text

__all__ = ["credits_text", "daily_spend", "spend_svg"]

DAY_MS = 24 * 3600 * 1000
WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 12, 28


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def daily_spend(
    entries: Iterable[tuple[int, str, int]], *, today_ms: int, days: int = 14
) -> list[tuple[str, int]]:
    """``(day, millicredits spent)`` for each of the ``days`` UTC days ending today, oldest
    first. ``entries`` are ledger rows ``(created_at ms, kind, amount)``: a ``settle`` (a
    negative amount) is spent, a ``refund`` gives back; holds and their releases are not spending
    (they cancel out), nor are grants."""
    last = datetime.fromtimestamp(today_ms / 1000, UTC).date()
    order = [(last - timedelta(days=n)).isoformat() for n in range(days - 1, -1, -1)]
    spent = dict.fromkeys(order, 0)
    for at, kind, amount in entries:
        day = _day(at)
        if day in spent and kind in ("settle", "refund"):
            spent[day] -= amount
    return [(day, spent[day]) for day in order]


def spend_svg(series: Sequence[tuple[str, int]], *, title: str = "Spend per day") -> str:
    """A bar chart of ``series`` (``(label, millicredits)``) as an SVG element."""
    n = max(len(series), 1)
    top = max([v for _, v in series] + [0])
    total = sum(v for _, v in series)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / n
    bar = max(slot * 0.7, 1.0)
    if series:
        busiest = max(series, key=lambda item: item[1])
        desc = (
            f"{credits_text(total)} credits spent over {len(series)} days, from "
            f"{series[0][0]} to {series[-1][0]}; the most on {busiest[0]}: "
            f"{credits_text(busiest[1])} credits."
        )
    else:
        desc = "No days to show."
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-labelledby="chart-title chart-desc" '
        f'aria-label="{escape(title)}: {escape(desc)}">',
        f'<title id="chart-title">{escape(title)}</title>',
        f'<desc id="chart-desc">{escape(desc)}</desc>',
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - RIGHT}" '
        f'y2="{TOP + plot_h}" stroke="currentColor" stroke-width="1"/>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end">0</text>',
        f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end">{escape(credits_text(top))}</text>',
    ]
    every = max(1, -(-n // 7))  # at most about seven labels under the bars
    for i, (label, value) in enumerate(series):
        h = 0.0 if top <= 0 else plot_h * max(value, 0) / top
        x = LEFT + i * slot + (slot - bar) / 2
        y = TOP + plot_h - h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}">'
            f"<title>{escape(label)}: {escape(credits_text(value))} credits</title></rect>"
        )
        if i % every == 0 or i == n - 1:
            short = label[5:] if len(label) == 10 and label[4] == "-" else label
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                f"{escape(short)}</text>"
            )
    parts.append("</svg>")
    return "".join(parts)
