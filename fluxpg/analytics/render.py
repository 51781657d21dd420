"""Rich tables and matplotlib charts for the analytics commands (no Spark here)."""
from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _cell(value: Any, width: int = 80) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return "b64:" + base64.b64encode(bytes(value)).decode()[:width]
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        value = json.dumps(value, default=str)
    if hasattr(value, "asDict"):  # a Spark Row (struct column)
        value = json.dumps(value.asDict(recursive=True), default=str)
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
          limit: int | None = None, numeric: Sequence[str] = ()) -> None:
    """Print rows as a Rich table; with ``limit`` only the last ``limit`` rows, saying how many."""
    shown = rows if limit is None or len(rows) <= limit else rows[-limit:]
    caption = None if len(shown) == len(rows) else f"last {len(shown)} of {len(rows)} rows"
    t = Table(title=title, caption=caption, title_justify="left", show_lines=False)
    for c in columns:
        t.add_column(c, justify="right" if c in numeric else "left", overflow="fold")
    for r in shown:
        t.add_row(*(_cell(v) for v in r))
    if not rows:
        t.caption = "no rows"
    console.print(t)


def chart(path: Path, throughput: Sequence[tuple[str, datetime, int, int]],
          groups: Sequence[tuple[str, str, int]], bucket: str) -> None:
    """PNG with two panels: messages per time bucket per queue, and lag per consumer group."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), gridspec_kw={"height_ratios": [3, 2]})
    series: dict[str, list[tuple[datetime, int]]] = {}
    for queue, t, messages, _bytes in throughput:
        series.setdefault(queue, []).append((t, messages))
    for queue, points in sorted(series.items()):
        points.sort()
        xs, ys = zip(*points)
        top.plot(xs, ys, marker="o" if len(points) < 50 else None, linewidth=1.4, label=queue)
    top.set_title(f"Throughput (messages per {bucket})")
    top.set_ylabel("messages")
    top.grid(alpha=0.3)
    if series:
        top.legend(fontsize="small", ncol=2)
        import matplotlib.dates as mdates

        locator = mdates.AutoDateLocator()
        top.xaxis.set_major_locator(locator)
        top.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    else:
        top.text(0.5, 0.5, "no messages", ha="center", va="center", transform=top.transAxes)

    labels = [f"{q} / {g}" for q, g, _ in groups]
    lags = [lag for _, _, lag in groups]
    if groups:
        bottom.barh(range(len(groups)), lags, color="tab:orange", height=min(0.8, 0.25 * len(groups) + 0.2))
        bottom.set_yticks(range(len(groups)), labels, fontsize="small")
        bottom.invert_yaxis()
    else:
        bottom.text(0.5, 0.5, "no consumer groups", ha="center", va="center", transform=bottom.transAxes)
    bottom.set_title("Lag per consumer group (messages behind the head)")
    bottom.set_xlabel("messages")
    bottom.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
