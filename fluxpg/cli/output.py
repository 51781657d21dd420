"""Formatting for people (sizes, intervals, times, payloads, Rich tables) and JSON for scripts.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from rich.table import Table

from fluxpg.cli.app import stdout


def human_bytes(n: Any) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def human_interval(td: timedelta | None) -> str:
    if td is None:
        return "-"
    seconds = td.total_seconds()
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d{hours:02d}h"


def human_time(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    return ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def print_json(rows: Any) -> None:
    from fluxpg.protocols.http import jsonable

    sys.stdout.write(json.dumps(jsonable(rows), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_table(title: str, columns: list[tuple[str, str, Callable[[Any], str]]], rows: list[dict]) -> None:
    """columns: (key, header, formatter); numbers right-aligned."""
    table = Table(title=title, title_justify="left", show_lines=False)
    for key, header, _fmt in columns:
        numeric = key in {"partitions", "head", "depth", "bytes", "segments", "groups", "partition", "cursor",
                          "committed", "lag", "pending", "consumers", "seq", "delivery_count", "idle",
                          "oldest_pending_age"}
        table.add_column(header, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for key, _h, fmt in columns))
    if not rows:
        stdout.print(f"{title}: none", markup=False, highlight=False)
        return
    stdout.print(table)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def payload_text(payload: bytes) -> str:
    """UTF-8 text (control characters escaped, so one message stays one line), else hex:…"""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + payload.hex()
    if text.isprintable():
        return text
    escapes = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
    return "".join(escapes.get(c, c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256
                               else f"\\u{ord(c):04x}") for c in text)
