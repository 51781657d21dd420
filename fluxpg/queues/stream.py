"""Stream operations: read, checkpoint (ack/commit), seek, auto-commit.

The cursor logic lives in SQL (fluxpg.read, _scan, commit, seek); this module is its Python face.
"""
from __future__ import annotations

import asyncpg

from fluxpg import db
from fluxpg.queues.classic import to_delivery
from fluxpg.delivery import Delivery

# x-stream-offset / cursor values every front-end accepts, mapped to fluxpg.seek positions.
POSITION_ALIASES = {"earliest": "first", "beginning": "first", "latest": "last", "end": "last"}


def normalize_position(position: object) -> str | None:
    """A start position from any protocol (int, 'first', 'offset=N', 'timestamp=N', …) as the
    string fluxpg.seek takes; None means resume from the group's checkpoint."""
    if position is None or position == "":
        return None
    if isinstance(position, bool):
        raise ValueError(f"invalid stream offset {position!r}")
    if isinstance(position, int):
        if position < 0:
            raise ValueError(f"invalid stream offset {position}: offsets are not negative")
        return str(position)
    if isinstance(position, (bytes, bytearray)):
        position = bytes(position).decode("utf-8", "replace")
    text = str(position).strip().lower()
    return POSITION_ALIASES.get(text, text)


async def read(pool: asyncpg.Pool, queue: str, group: str, consumer: str, n: int) -> list[Delivery]:
    return [to_delivery(r, "stream") for r in await db.fetch(pool, "read", queue, group, consumer, n)]


async def checkpoint(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int], partition: int = 0) -> int:
    """Stream ack: the checkpoint moves past the highest offset (never backwards)."""
    return await db.fetchval(pool, "ack", queue, group, seqs, partition)


async def commit(pool: asyncpg.Pool, queue: str, group: str, seq: int, partition: int = 0) -> None:
    """Set the checkpoint to `seq`: every lower offset is processed (seq ≤ cursor)."""
    await db.fetchval(pool, "commit", queue, group, seq, partition)


async def seek(pool: asyncpg.Pool, queue: str, group: str, position: str) -> int:
    return await db.fetchval(pool, "seek", queue, group, position)


async def configure(pool: asyncpg.Pool, queue: str, group: str, auto_commit: bool) -> None:
    await db.fetchval(pool, "configure_group", queue, group, auto_commit)
