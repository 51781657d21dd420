"""Administration through the queue manager: what the HTTP API, the console and the CLI read and
do besides publishing and consuming — statistics, browsing the log, pending entries, group resets,
redrive of dead letters.

Every operation is a named query of sql/queries.sql over the SQL API (sql/functions.sql, views);
the HTTP and console code call these methods and never touch the database themselves. Lists are
paged by keyset (`from_offset`, `limit`): a page costs one index range scan whatever the queue's
size.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fluxpg import db
from fluxpg.delivery import Delivery
from fluxpg.errors import InvalidArgument, UnknownQueue

MAX_PAGE = 500                  # rows of one page of messages or pending entries
PREVIEW_BYTES = 64 * 1024       # payload bytes a browsed message shows
NO_UPPER_BOUND = 2 ** 63 - 1


@dataclass
class BrowsedMessage:
    partition: int
    seq: int
    topic: str
    payload: bytes          # at most PREVIEW_BYTES
    size: int               # the whole payload's size
    headers: dict[str, Any]
    created_at: datetime
    expires_at: datetime | None
    redriven: bool          # a dead letter that was moved back to its queue (fluxpg.redrive)


class Admin:
    """Administrative operations of one queue manager (cheap to make: it holds nothing else)."""

    def __init__(self, manager: Any):
        self.manager = manager

    @property
    def _pool(self):
        return self.manager.pool

    # --- health and statistics --------------------------------------------------------------

    async def ping(self) -> None:
        await db.fetchval(self._pool, "ping")

    async def queue_stats(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await db.fetch(self._pool, "queue_stats")]

    async def stats_for_metrics(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return (await self.queue_stats(),
                [dict(r) for r in await db.fetch(self._pool, "all_group_status")])

    async def all_group_status(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await db.fetch(self._pool, "all_group_status")]

    async def queue_id(self, queue: str) -> int:
        qid = await db.fetchval(self._pool, "queue_id", queue)
        if qid is None:
            raise UnknownQueue(f"unknown queue {queue!r}")
        return qid

    async def group_status(self, queue: str) -> list[dict[str, Any]]:
        """The groups of a queue (UnknownQueue when there is no such queue)."""
        await self.queue_id(queue)
        return [dict(r) for r in await db.fetch(self._pool, "group_status", queue)]

    async def queue_rows(self) -> list[dict[str, Any]]:
        """Durable queues with their settings and consumer count."""
        return [dict(r) for r in await db.fetch(self._pool, "queue_rows")]

    async def queue_counters(self) -> dict[str, tuple[int, int]]:
        """queue → (messages appended, messages delivered summed over groups): rates are their
        differences over time."""
        return {r["queue"]: (r["appended"] or 0, r["delivered"] or 0)
                for r in await db.fetch(self._pool, "queue_counters")}

    async def nodes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await db.fetch(self._pool, "nodes")]

    async def all_connections(self) -> list[dict[str, Any]]:
        """Every node's client connections as last reported (fluxpg.connections)."""
        return [dict(r) for r in await db.fetch(self._pool, "all_connections")]

    async def request_close(self, node: int, conn_id: int) -> None:
        """Ask `node` to close its connection `conn_id` (NOTIFY fluxpg_close)."""
        await db.fetchval(self._pool, "request_close", node, conn_id)

    # --- browsing ---------------------------------------------------------------------------

    async def bounds(self, queue: str) -> list[tuple[int, int, int]]:
        """(partition, first retained offset, next offset) per partition."""
        rows = await db.fetch(self._pool, "queue_bounds", queue)
        if not rows:
            raise UnknownQueue(f"unknown queue {queue!r}")
        return [(r["partition"], r["first_seq"], r["next_seq"]) for r in rows]

    async def offset_at(self, queue: str, partition: int, at: datetime) -> int:
        return await db.fetchval(self._pool, "offset_at", queue, partition, at)

    async def browse(self, queue: str, *, partition: int = 0, from_offset: int = 0, limit: int = 50,
                     include_redriven: bool = False) -> list[BrowsedMessage]:
        """Messages of a queue partition from an offset on, in offset order."""
        if limit < 1 or limit > MAX_PAGE:
            raise InvalidArgument(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        if from_offset < 0:
            raise InvalidArgument(f"offset must not be negative, got {from_offset}")
        qid = await self.queue_id(queue)
        # First a window just above the page (opens one or two segments); offsets are contiguous,
        # so it holds the page unless redriven messages are hidden or the page reaches the head.
        upper = from_offset + max(limit * 20, 1000)
        rows = await db.fetch(self._pool, "browse", qid, partition, from_offset, limit, PREVIEW_BYTES,
                              include_redriven, upper)
        if len(rows) < limit:
            rows = await db.fetch(self._pool, "browse", qid, partition, from_offset, limit, PREVIEW_BYTES,
                                  include_redriven, NO_UPPER_BOUND)
        return [BrowsedMessage(r["partition"], r["seq"], r["topic"], bytes(r["payload"]), r["size"],
                               r["headers"] or {}, r["created_at"], r["expires_at"], r["redriven"]) for r in rows]

    async def pending(self, queue: str, group: str, *, partition: int = 0, from_offset: int = 0,
                      limit: int = 100) -> list[dict[str, Any]]:
        """Pending entries (XPENDING) of a group from an offset on."""
        if limit < 1 or limit > MAX_PAGE:
            raise InvalidArgument(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        return [dict(r) for r in await db.fetch(self._pool, "pending_page", queue, group, partition,
                                                from_offset, limit)]

    # --- actions ----------------------------------------------------------------------------

    async def redrive(self, dlq: str, *, offsets: list[int] | None = None, from_offset: int | None = None,
                      to_offset: int | None = None, dry_run: bool = False) -> int:
        """fluxpg.redrive: move dead letters back to their queue; how many moved."""
        return await db.fetchval(self._pool, "redrive", dlq, offsets, from_offset, to_offset, dry_run)

    async def reset_group(self, queue: str, group: str, position: str) -> int:
        return await db.fetchval(self._pool, "reset_group", queue, group, position)

    async def delete_group(self, queue: str, group: str) -> bool:
        return await db.fetchval(self._pool, "delete_group", queue, group)

    async def claim_stale(self, queue: str, group: str, consumer: str, min_idle: timedelta,
                          n: int = 100) -> list[Delivery]:
        return await self.manager.claim_stale(queue, group, consumer, min_idle, n)

    async def publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None) -> Any:
        return await self.manager.publish(topic, payload, headers)


def dlq_name(queue: str) -> str:
    """The dead-letter queue of `queue` (`$dlq/<queue>`), or `queue` itself when it is one."""
    return queue if queue.startswith("$dlq/") else f"$dlq/{queue}"
