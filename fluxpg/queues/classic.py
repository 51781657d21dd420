"""Classic (work queue) operations: claim, ack, nack, reject, redelivery, dead-lettering.

The state machine lives in SQL (sql/functions.sql: fluxpg.claim, _take_pending, _scan, ack,
nack, reject, _dead_letter); this module is the Python face of it, translating rows to
Delivery objects and database errors to FluxError.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from fluxpg import db
from fluxpg.delivery import Delivery


def to_delivery(rec: Any, kind: str) -> Delivery:
    return Delivery(
        queue=rec["queue"], group=rec["grp"], partition=rec["partition"], seq=rec["seq"],
        topic=rec["topic"], payload=bytes(rec["payload"]), headers=rec["headers"] or {},
        created_at=rec["created_at"], delivery_count=rec["delivery_count"], kind=kind,
    )


async def claim(pool: asyncpg.Pool, queue: str, group: str, consumer: str, n: int,
                selector: str | None = None) -> list[Delivery]:
    """Redeliveries first, then new messages from the group cursor (DESIGN §2); with a selector
    (jsonpath, fluxpg.selectors) only the messages it selects."""
    return [to_delivery(r, "classic") for r in await db.fetch(pool, "claim", queue, group, consumer, n, selector)]


async def ack_claim(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int], consumer: str,
                    n: int) -> list[Delivery]:
    """Ack `seqs` (partition 0) and claim up to n, in one transaction (fluxpg.ack_claim)."""
    # Columns by position (queue, grp, partition, seq, topic, payload, headers, created_at,
    # delivery_count: the named query's order), as to_delivery reads them by name.
    return [Delivery(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6] or {}, r[7], r[8])
            for r in await db.fetch(pool, "ack_claim", queue, group, seqs, consumer, n)]


async def reclaim(pool: asyncpg.Pool, queue: str, group: str, consumer: str, n: int = 100,
                  after: int | None = None) -> list[Delivery]:
    """The consumer's own pending entries, delivered again (after a crash or reconnect), in offset
    order; `after` pages: only entries with a higher offset (XREADGROUP with an id)."""
    return [to_delivery(r, "classic") for r in await db.fetch(pool, "reclaim", queue, group, consumer, n, after)]


async def claim_stale(pool: asyncpg.Pool, queue: str, group: str, consumer: str,
                      min_idle: timedelta, n: int = 10) -> list[Delivery]:
    """XAUTOCLAIM: take over entries idle for at least min_idle."""
    return [to_delivery(r, "classic")
            for r in await db.fetch(pool, "claim_stale", queue, group, consumer, min_idle, n)]


async def ack(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int], partition: int = 0) -> int:
    return await db.fetchval(pool, "ack", queue, group, seqs, partition)


async def nack(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int], partition: int = 0) -> int:
    return await db.fetchval(pool, "nack", queue, group, seqs, partition)


async def reject(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int],
                 reason: str | None = None, partition: int = 0) -> int:
    return await db.fetchval(pool, "reject", queue, group, seqs, reason, partition)


async def release(pool: asyncpg.Pool, queue: str, group: str, seqs: list[int], partition: int = 0) -> int:
    """Requeue now: the entries become deliverable at once, in offset order, delivery count kept."""
    return await db.fetchval(pool, "release", queue, group, seqs, partition)
