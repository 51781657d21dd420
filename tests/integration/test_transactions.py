"""Local transactions (fluxpg/queues/transactions.py): publishes and settlements collected, then
applied in one PostgreSQL transaction at commit, or not at all."""
from __future__ import annotations

import pytest

from fluxpg.config import QueueConfig
from fluxpg.errors import LimitExceeded, PayloadTooLarge, QueueFull
from fluxpg.queues import classic


async def _log(conn, queue: str) -> list[bytes]:
    rows = await conn.fetch("SELECT l.payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                            "WHERE q.name = $1 ORDER BY l.seq", queue)
    return [bytes(r["payload"]) for r in rows]


async def _pending(conn, queue: str) -> list[int]:
    rows = await conn.fetch("SELECT p.seq FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id "
                            "JOIN fluxpg.queues q ON q.id = g.queue_id WHERE q.name = $1 ORDER BY p.seq", queue)
    return [r["seq"] for r in rows]


async def test_commit_applies_publishes_and_acks_together(manager_factory, qname, conn):
    mgr = await manager_factory([QueueConfig(name=qname)])
    for i in range(3):
        await mgr.publish(f"$queue/{qname}/k", b"old%d" % i)
    got = await classic.claim(mgr.pool, qname, qname, "c1", 3)
    assert [d.seq for d in got] == [0, 1, 2]
    tx = mgr.transaction()
    tx.publish(f"$queue/{qname}/k", b"new0")
    tx.ack(qname, qname, [0, 1])
    tx.publish(f"$queue/{qname}/k", b"new1", {"content-type": "text/plain"})
    tx.reject(qname, qname, [2], "bad")
    # Nothing is applied before commit.
    assert await _log(conn, qname) == [b"old0", b"old1", b"old2"]
    assert await _pending(conn, qname) == [0, 1, 2]
    results = await tx.commit()
    assert results == [[(qname, 3)], [(qname, 4)]]
    assert await _log(conn, qname) == [b"old0", b"old1", b"old2", b"new0", b"new1"]
    assert await _pending(conn, qname) == []
    assert await _log(conn, f"$dlq/{qname}") == [b"old2"]    # reject went through the same SQL
    assert tx.empty and await tx.commit() == []              # reusable, and empty after commit


async def test_rollback_applies_nothing(manager_factory, qname, conn):
    mgr = await manager_factory([QueueConfig(name=qname)])
    await mgr.publish(f"$queue/{qname}/k", b"m0")
    await classic.claim(mgr.pool, qname, qname, "c1", 1)
    tx = mgr.transaction()
    tx.publish(f"$queue/{qname}/k", b"never")
    tx.ack(qname, qname, [0])
    tx.rollback()
    assert tx.empty and await tx.commit() == []
    assert await _log(conn, qname) == [b"m0"]
    assert await _pending(conn, qname) == [0]


async def test_failed_commit_applies_nothing(manager_factory, qname, conn):
    mgr = await manager_factory([QueueConfig(name=qname, limits={"max_depth": 2})])
    await mgr.publish(f"$queue/{qname}/k", b"m0")
    await classic.claim(mgr.pool, qname, qname, "c1", 1)
    tx = mgr.transaction()
    tx.ack(qname, qname, [0])
    for i in range(3):            # one more than max_depth allows
        tx.publish(f"$queue/{qname}/k", b"x%d" % i)
    with pytest.raises(QueueFull):
        await tx.commit()
    assert await _log(conn, qname) == [b"m0"]
    assert await _pending(conn, qname) == [0]     # the ack was rolled back with the publishes


async def test_bad_input_is_refused_when_added_and_memory_is_bounded(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname, limits={"max_message_size": 10})])
    tx = mgr.transaction(max_bytes=100)
    with pytest.raises(PayloadTooLarge):
        tx.publish(f"$queue/{qname}/k", b"x" * 11)
    for _ in range(10):
        tx.publish(f"$queue/{qname}/k", b"x" * 10)
    with pytest.raises(LimitExceeded):
        tx.publish(f"$queue/{qname}/k", b"x")
    assert tx.size == 100
    assert len(await tx.commit()) == 10
