"""Small asyncio helpers shared across the broker."""
from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory():
    """The event loop the broker runs on: uvloop's where it is installed (a dependency on Linux and
    macOS), else asyncio's. Measured on the serial paths (pika confirming each publish: a read, a
    query, a reply per message, ~9 loop iterations each): broker CPU per message 280 → 230-260 µs,
    throughput +0-12 % (benchmarks/README.md, session 9). FLUXPG_EVENT_LOOP=asyncio chooses asyncio's."""
    import os
    if os.environ.get("FLUXPG_EVENT_LOOP", "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the broker's event loop (loop_factory)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel tasks and wait until they are done, ignoring how they ended (shutdown paths)."""
    pending = [t for t in tasks if t is not None]
    for task in pending:
        task.cancel()
    for task in pending:
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down either way
            pass
