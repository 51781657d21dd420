"""A new queue's log table joins fluxpg.log under ACCESS EXCLUSIVE on the parent alone
(fluxpg._lock_log_for_new_queue), waited for in short attempts; and dead-lettering never removes a
pending entry whose message it could not read.

Why: ATTACH PARTITION alone (SHARE UPDATE EXCLUSIVE) let a backend that built fluxpg.log's list of
partitions while the ATTACH committed keep a list without the new queue; on the embedded
PostgreSQL 16.2 one pool connection then read a new dead-letter queue as empty."""
from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from fluxpg import db


async def test_declare_waits_for_a_short_reader_of_the_log(dsn, conn, qname):
    reader = await db.connect(dsn)
    try:
        tx = reader.transaction()
        await tx.start()
        await reader.fetchval("SELECT count(*) FROM ONLY fluxpg.log")   # ACCESS SHARE on the parent
        declared = asyncio.ensure_future(conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic')", qname))
        await asyncio.sleep(0.3)
        assert not declared.done()            # waiting for the reader, in short attempts
        await tx.commit()
        qid = await asyncio.wait_for(declared, 10)
    finally:
        await reader.close()
    assert await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname) == qid
    assert await conn.fetchval("SELECT to_regclass(format('fluxpg.log_%s', $1::int)) IS NOT NULL", qid)


async def test_declare_gives_up_on_a_long_reader_with_a_clear_error(dsn, conn, qname):
    reader = await db.connect(dsn)
    try:
        async with reader.transaction():
            await reader.fetchval("SELECT count(*) FROM ONLY fluxpg.log")
            started = time.monotonic()
            with pytest.raises(asyncpg.LockNotAvailableError, match="fluxpg.log is busy"):
                await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic')", qname)
            assert time.monotonic() - started > 1.0     # 40 attempts of 50 ms, growing sleeps between: ~6 s
    finally:
        await reader.close()
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", qname) == 0
    # The caller's lock_timeout is its own again after the attempts.
    assert await conn.fetchval("SHOW lock_timeout") == "0"
    assert await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic')", qname) > 0


async def test_dead_lettering_a_message_it_cannot_read_leaves_it_pending(conn, qname):
    qid = await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic')", qname)
    await conn.fetch("SELECT * FROM fluxpg.append_batch(ARRAY[$1, $1]::int[], ARRAY[$2, $2], ARRAY['a', 'b']::bytea[])",
                     qid, f"$queue/{qname}/x")
    claimed = await conn.fetch("SELECT seq FROM fluxpg.claim($1, $1, 'c', 2)", qname)
    assert [r["seq"] for r in claimed] == [0, 1]
    # What a backend with a stale list of partitions would see: no row for offset 0.
    await conn.execute("DELETE FROM fluxpg.log WHERE queue_id = $1 AND seq = 0", qid)
    with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="left pending"):
        await conn.fetchval("SELECT fluxpg.reject($1, $1, ARRAY[0, 1]::bigint[], 'bad', 0)", qname)
    pending = await conn.fetch("SELECT p.seq FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id "
                               "WHERE g.queue_id = $1 ORDER BY p.seq", qid)
    assert [r["seq"] for r in pending] == [0, 1]        # nothing removed, nothing dead-lettered
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                               "WHERE q.name = '$dlq/' || $1", qname) == 0
    # The readable one alone goes through.
    assert await conn.fetchval("SELECT fluxpg.reject($1, $1, ARRAY[1]::bigint[], 'bad', 0)", qname) == 1
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                               "WHERE q.name = '$dlq/' || $1", qname) == 1
