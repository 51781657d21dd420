"""Retention: one node at a time drops whole log segments that are due.

Leadership is a session advisory lock held by a dedicated connection: when the leader dies its
connection closes and another node's next attempt takes over. Dropping detaches each segment with
`DETACH PARTITION … CONCURRENTLY` (readers and writers of the queue are not blocked), then drops
it; nothing ever DELETEs from the log. Which segments are due is decided in SQL
(fluxpg.due_segments), the same rule fluxpg.enforce_retention() applies for SQL users.
"""
from __future__ import annotations

import asyncio
import logging

import asyncpg

from fluxpg import db
from fluxpg.aio import cancel_and_wait

log = logging.getLogger("fluxpg.retention")

RETENTION_LOCK = 0x666C7072  # 'flpr'
LIFECYCLE_QUERIES = "queue_lifecycle_queries.sql"


class RetentionLoop:
    def __init__(self, dsn: str, interval: float):
        self.dsn = dsn
        self.interval = interval
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task | None = None
        self.leader = False
        self.dropped = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fluxpg-retention")

    async def _ensure_leader(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            self._conn = await db.connect(self.dsn)
            self.leader = False
        if not self.leader:
            self.leader = await self._conn.fetchval(db.queries()["retention_leader"], RETENTION_LOCK)
            if self.leader:
                log.info("this node runs retention")
        return self.leader

    async def run_once(self) -> int:
        """Drop every due segment now (if this node is the leader); returns how many."""
        if not await self._ensure_leader():
            return 0
        conn = self._conn
        q = db.queries()
        # Log tables of deleted queues (an operator's DELETE leaves them; delete_queue when busy).
        gone = await conn.fetchval(db.queries(LIFECYCLE_QUERIES)["drop_deleted_logs"])
        if gone:
            log.info("dropped the log tables of %d deleted queues", gone)
        # A DETACH … CONCURRENTLY interrupted by a crash leaves the segment half-detached.
        for row in await conn.fetch(q["detach_pending_segments"]):
            await conn.execute(f"ALTER TABLE {row['parent']} DETACH PARTITION {row['segment']} FINALIZE")
        dropped = 0
        for seg in await conn.fetch(q["due_segments"]):
            parent = f"fluxpg.log_{seg['queue_id']}"
            await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {seg['segment']} CONCURRENTLY")
            await conn.execute(f"DROP TABLE IF EXISTS {seg['segment']}")
            await conn.execute(q["forget_segment"], seg["queue_id"], seg["partition"])
            log.info("dropped segment %s of queue %s [%d, %d): %s", seg["segment"], seg["queue"],
                     seg["from_seq"], seg["to_seq"], seg["reason"])
            dropped += 1
        swept = await conn.fetchval(q["sweep_transient"])
        if swept:
            log.info("%d messages of transient queues removed (done with or expired)", swept)
        expired = await conn.fetchval(q["expire_groups"])
        if expired:
            log.info("%d stream consumer groups expired (unused for their queue's retention period)", expired)
        self.dropped += dropped
        return dropped

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retention must survive a database restart
                log.warning("retention pass failed: %s", exc)
                if self._conn is not None and not self._conn.is_closed():
                    await self._conn.close()
                self._conn = None
                self.leader = False
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
