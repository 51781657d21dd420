"""Message rates for the console: a sampler that reads every queue's counters (messages appended,
messages delivered summed over groups — cluster-wide, from the database) every few seconds and
keeps the last minutes of differences. Memory is bounded by HISTORY samples per queue."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

log = logging.getLogger("fluxpg.console")

INTERVAL = 5.0      # seconds between samples
HISTORY = 120       # samples kept: 10 minutes


class Rates:
    def __init__(self, admin: Any, interval: float = INTERVAL, history: int = HISTORY):
        self.admin = admin
        self.interval = interval
        # (time, total in/s, total out/s) per interval, oldest first
        self.points: deque[tuple[float, float, float]] = deque(maxlen=history)
        self.per_queue: dict[str, tuple[float, float]] = {}   # queue → (in/s, out/s) of the last interval
        self._last: tuple[float, dict[str, tuple[int, int]]] | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fluxpg-console-rates")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None

    async def sample(self) -> None:
        now = time.time()
        counters = await self.admin.queue_counters()
        if self._last is not None:
            then, before = self._last
            dt = max(now - then, 1e-3)
            per_queue = {}
            for queue, (appended, delivered) in counters.items():
                a0, d0 = before.get(queue, (appended, delivered))
                per_queue[queue] = (max(appended - a0, 0) / dt, max(delivered - d0, 0) / dt)
            self.per_queue = per_queue
            self.points.append((now, sum(r[0] for r in per_queue.values()), sum(r[1] for r in per_queue.values())))
        self._last = (now, counters)

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be away; try again later
                log.debug("console rates: sampling failed: %s", exc)
            await asyncio.sleep(self.interval)


def svg_chart(points: list[tuple[float, float, float]], width: int = 720, height: int = 180) -> dict[str, Any]:
    """Polylines (in, out) and axis labels for an inline SVG of the rates, drawn by the template."""
    pad_l, pad_b, pad_t = 48, 20, 10
    w, h = width - pad_l - 8, height - pad_b - pad_t
    if len(points) < 2:
        return {"width": width, "height": height, "empty": True}
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1e-6)
    top = max(max(p[1] for p in points), max(p[2] for p in points), 1.0)

    def line(i: int) -> str:
        return " ".join(f"{pad_l + (p[0] - t0) / span * w:.1f},{pad_t + h - p[i] / top * h:.1f}" for p in points)

    return {"width": width, "height": height, "empty": False, "in_line": line(1), "out_line": line(2),
            "top": top, "x0": pad_l, "x1": pad_l + w, "y0": pad_t + h, "y1": pad_t,
            "span": span, "last_in": points[-1][1], "last_out": points[-1][2]}
