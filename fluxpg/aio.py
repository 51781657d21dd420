"""Small asyncio helpers shared across the broker."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable


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
