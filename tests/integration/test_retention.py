"""Retention drops whole segments (checked in the catalog) and never DELETEs from the log."""
from __future__ import annotations

import asyncio

from fluxpg.queues.retention import RetentionLoop
from tests.helpers import claim, declare, publish_many, read


async def segment_tables(conn, qname) -> list[str]:
    """Child tables of the queue's log table, straight from pg_inherits."""
    return [r["relname"] for r in await conn.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = (SELECT ('fluxpg.log_' || id)::regclass FROM fluxpg.queues WHERE name = $1) "
        "ORDER BY c.relname", qname)]


async def ranges(conn, qname) -> list[tuple[int, int]]:
    return [(r["from_seq"], r["to_seq"]) for r in await conn.fetch(
        "SELECT from_seq, to_seq FROM fluxpg.segments WHERE queue = $1", qname)]


async def retain(conn, qname) -> int:
    """Run the SQL retention (for the whole database: other tests' queues too) until it drops
    nothing more (a call stops after holding locks ~25 ms) and return how many segments of this
    queue went."""
    before = await ranges(conn, qname)
    for _ in range(1000):
        if await conn.fetchval("SELECT fluxpg.enforce_retention()") == 0:
            break
    return len(before) - len(await ranges(conn, qname))


async def log_deletes(conn, qname) -> dict[str, int]:
    """Segments of the queue with deleted rows (from the statistics collector)."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    rows = await conn.fetch(
        "SELECT relname, n_tup_del FROM pg_stat_user_tables WHERE schemaname = 'fluxpg' AND n_tup_del > 0 "
        "AND relname ~ ('^log_' || (SELECT id FROM fluxpg.queues WHERE name = $1) || '_p')", qname)
    return {r["relname"]: r["n_tup_del"] for r in rows}


async def test_classic_segments_below_the_slowest_group_are_dropped(conn, qname):
    qid = await declare(conn, qname, settings={"segment_size": 10})
    await publish_many(conn, qname, 35)
    assert await retain(conn, qname) == 0       # no group yet: keep all
    seqs = await claim(conn, qname, "fast", "c", 25)
    await conn.fetchval("SELECT fluxpg.ack($1, 'fast', $2)", qname, seqs)
    slow = await claim(conn, qname, "slow", "c", 12)
    await conn.fetchval("SELECT fluxpg.ack($1, 'slow', $2)", qname, [s for s in slow if s != 5])
    assert await retain(conn, qname) == 0       # slow still has 5 pending
    await conn.fetchval("SELECT fluxpg.ack($1, 'slow', ARRAY[5]::bigint[])", qname)
    before = await segment_tables(conn, qname)
    assert f"log_{qid}_p0_0" in before
    assert await retain(conn, qname) == 1       # [0,10) below slow's 12
    after = await segment_tables(conn, qname)
    assert set(before) - set(after) == {f"log_{qid}_p0_0"}
    assert await conn.fetchval("SELECT to_regclass($1)", f"fluxpg.log_{qid}_p0_0") is None
    head = await conn.fetchrow("SELECT first_seq, next_seq FROM fluxpg.heads WHERE queue_id = $1", qid)
    assert (head["first_seq"], head["next_seq"]) == (10, 35)
    assert await claim(conn, qname, "slow", "c", 100) == list(range(12, 35))
    assert await log_deletes(conn, qname) == {}


async def test_stream_retention_by_length_bytes_and_age(conn, qname):
    qid = await declare(conn, qname, "stream", {"segment_size": 10, "retention": {"max_length_messages": 15}})
    await publish_many(conn, qname, 40)
    # Keep at least the newest 15 (25..39): segments ending at or below 25 go.
    assert await retain(conn, qname) == 2
    assert (await ranges(conn, qname))[:2] == [(20, 30), (30, 40)]
    # A group behind the retained range moves up to the first retained message.
    assert await read(conn, qname, "late", "c", 3) == [20, 21, 22]

    await declare(conn, qname, "stream", {"segment_size": 10, "retention": {"max_age": "100ms"}})
    await asyncio.sleep(0.2)
    await publish_many(conn, qname, 1)      # the open segment [40, 50) stays
    assert await retain(conn, qname) == 2
    assert await conn.fetchval("SELECT first_seq FROM fluxpg.heads WHERE queue_id = $1", qid) == 40

    await declare(conn, qname, "stream", {"segment_size": 10, "retention": {"max_age": "0", "max_length_bytes": 1}})
    await publish_many(conn, qname, 20, payload=b"x" * 100)
    assert await retain(conn, qname) >= 1
    assert await log_deletes(conn, qname) == {}


async def test_retention_loop_detaches_concurrently_as_single_leader(dsn, conn, qname):
    await declare(conn, qname, "stream", {"segment_size": 5, "retention": {"max_length_messages": 5}})
    await publish_many(conn, qname, 23)
    leader, follower = RetentionLoop(dsn, 3600), RetentionLoop(dsn, 3600)
    try:
        before = await ranges(conn, qname)
        await leader.run_once()
        assert len(before) - len(await ranges(conn, qname)) == 3    # [0,5) [5,10) [10,15); 18..22 kept
        assert await follower.run_once() == 0 and not follower.leader
        assert [(r["from_seq"]) for r in await conn.fetch(
            "SELECT from_seq FROM fluxpg.segments WHERE queue = $1", qname)][0] == 15
    finally:
        await leader.close()
        await follower.close()
    # The leader's connection is gone: the other node takes over.
    again = RetentionLoop(dsn, 3600)
    try:
        await again.run_once()
        assert again.leader
    finally:
        await again.close()


async def test_expired_classic_segments_are_dropped(conn, qname):
    await declare(conn, qname, settings={"segment_size": 5, "limits": {"message_ttl": "100ms"}})
    await publish_many(conn, qname, 12)
    await asyncio.sleep(0.2)
    # Nobody consumed them, but every message of the two full segments expired.
    assert await retain(conn, qname) == 2
    assert await claim(conn, qname, "g", "c", 10) == []


async def test_sql_retention_under_concurrent_publishers_never_fails_a_publish(dsn, conn, qname):
    """fluxpg.enforce_retention() while four connections keep appending: plain DETACH used to take
    the queue's log table and then wait for a head row a publisher held (who waited for the log
    table): the publisher was aborted by the deadlock detector in 3 runs of 5. Now retention locks
    in the publishers' order and backs off; every publish succeeds and segments still go."""
    from fluxpg import db

    await declare(conn, qname, "stream", settings={"segment_size": 50, "retention": {"max_length_messages": 100}})
    stop = asyncio.Event()
    errors: list[BaseException] = []
    published = [0]

    async def publisher() -> None:
        c = await db.connect(dsn)
        try:
            while not stop.is_set():
                try:
                    await c.fetch("SELECT * FROM fluxpg.append($1, 'x')", f"$queue/{qname}/k")
                    published[0] += 1
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    errors.append(exc)
        finally:
            await c.close()

    tasks = [asyncio.create_task(publisher()) for _ in range(4)]
    dropped = 0
    try:
        for _ in range(40):   # bounded; stops as soon as segments went under publishing load
            await asyncio.sleep(0.05)
            dropped += await conn.fetchval("SELECT fluxpg.enforce_retention()")
            if dropped >= 2 and published[0] > 300:
                break
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert errors == []
    assert published[0] > 300 and dropped > 0
    head = await conn.fetchrow("SELECT first_seq, next_seq FROM fluxpg.heads h JOIN fluxpg.queues q "
                               "ON q.id = h.queue_id WHERE q.name = $1", qname)
    assert head["next_seq"] == published[0]
    assert await log_deletes(conn, qname) == {}


async def test_enforce_retention_drops_a_large_backlog_over_calls(conn, qname):
    """A call leaves what it has no time for (it holds the queue's head rows, and publishers wait
    for them, until it commits): calling until it returns 0 drops every due segment, oldest
    first, and the retained range stays contiguous."""
    qid = await declare(conn, qname, "stream", {"segment_size": 5, "retention": {"max_length_messages": 5}})
    await publish_many(conn, qname, 203)
    due = await conn.fetchval("SELECT count(*) FROM fluxpg.due_segments() WHERE queue_id = $1", qid)
    assert due == 39                    # [0,5) … [190,195); [195,200) holds offsets the newest 5 need
    segments = len(await ranges(conn, qname))
    calls = 0
    while await conn.fetchval("SELECT fluxpg.enforce_retention()") > 0:   # (other tests' queues too)
        calls += 1
        first = await conn.fetchval("SELECT first_seq FROM fluxpg.heads WHERE queue_id = $1", qid)
        assert (await ranges(conn, qname))[0][0] == first    # oldest first: no hole below the head
        assert calls < 1000
    assert segments - len(await ranges(conn, qname)) == due
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.due_segments() WHERE queue_id = $1", qid) == 0
    assert await read(conn, qname, "late", "c", 10) == list(range(195, 203))
    assert await log_deletes(conn, qname) == {}

