"""Transient queues: classic queues that live only until their node stops.

Used for AMQP 0-9-1 exclusive / auto-delete / non-durable / server-named queues, AMQP 1.0 dynamic
nodes, and `$queue/` names no configured queue matches when `queue_manager.auto_create` is
`transient`. They are NOT a second implementation: a transient queue is a row of fluxpg.queues
(durability 'transient', an owner node, optionally an owning connection and auto-delete) driven
by the same SQL functions as every classic queue (publish, claim, ack, nack, release, reject,
TTL, max-length, dead-lettering). Its messages land in the log's UNLOGGED default partition
(fluxpg.log_transient, migration 0005): creating one runs no DDL, and only a crash or a stop of
its node loses them — the transient promise. sql/functions.sql (declare_transient,
delete_transient, _transient_cleanup, _transient_forget, sweep_transient) holds the rules; this
module is their Python face.

A cost the default partition brings: attaching a NEW durable queue's partition to fluxpg.log
(declare_queue, e.g. an auto-created queue) makes PostgreSQL check that log_transient holds no
row for the new queue id, under an ACCESS EXCLUSIVE lock on log_transient: transient traffic
pauses for that scan (proportional to the transient backlog, small by design: acked rows are
deleted and transient_max_bytes bounds it). Durable queues' own traffic is not affected.
"""
from __future__ import annotations

from typing import Any

import asyncpg

from fluxpg import db


async def declare(pool: asyncpg.Pool, name: str, node_id: int, *, owner: str | None = None,
                  auto_delete: bool = False, settings: dict[str, Any] | None = None) -> int:
    """Create (or find) a transient queue; returns its id. Raises ResourceLocked when it is
    exclusive to another owner, WrongQueueKind when a durable queue has the name."""
    return await db.fetchval(pool, "declare_transient", name, node_id, owner, auto_delete, settings or {})


async def delete(pool: asyncpg.Pool, name: str) -> int | None:
    """Delete a transient queue with its messages; returns how many were waiting (None: no such
    queue)."""
    return await db.fetchval(pool, "delete_transient", name)


async def sweep(pool: asyncpg.Pool) -> int:
    """Delete messages every group is done with, or that expired undelivered."""
    return await db.fetchval(pool, "sweep_transient")
