"""Deleting a queue while its consumers work never deadlocks (issue 14).

A consumer's claim (and a stream read) locks its member row, then its group's cursor row. The
cascade of `DELETE FROM fluxpg.queues` used to lock cursors, then members: the opposite order, so
PostgreSQL aborted one side (40P01). The queues' BEFORE DELETE trigger now takes the member rows
first, as a consumer does. The tests below stage the bad interleaving with a third connection
holding the contested row, so each one either deadlocks or not on every run; no timing is asserted.
"""
from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from fluxpg import db
from tests.helpers import declare, publish_many

# One member's claim on a queue about to be deleted; the deleter is an operator's DELETE or the
# SQL API. Each blocks on a row lock the test holds; the test lets go once both wait.
DELETERS = {
    "operator DELETE": "DELETE FROM fluxpg.queues WHERE name = $1",
    "fluxpg.delete_queue": "SELECT fluxpg.delete_queue($1)",
}


async def _waiting_on_lock(watcher: asyncpg.Connection, pid: int) -> None:
    """Until backend `pid` waits for a lock (bounded: 20 s, then the test fails)."""
    for _ in range(2000):
        if await watcher.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


async def _stage(dsn: str, qname: str, hold_sql: str, first_sql: str, first_args: tuple,
                 second_sql: str, second_args: tuple):
    """A holder locks a row (hold_sql); `first` runs and waits for it, then `second` runs and
    waits; the holder commits. Returns both outcomes (a result or the exception). A deadlock
    shows within deadlock_timeout (1 s) of the holder's commit."""
    holder, first, second = [await db.connect(dsn) for _ in range(3)]
    try:
        tx = holder.transaction()
        await tx.start()
        assert await holder.fetch(hold_sql, qname), "nothing to hold"
        t1 = asyncio.create_task(first.fetch(first_sql, *first_args))
        await _waiting_on_lock(holder, first.get_server_pid())
        t2 = asyncio.create_task(second.fetch(second_sql, *second_args))
        await _waiting_on_lock(holder, second.get_server_pid())
        await tx.commit()
        return await asyncio.wait_for(asyncio.gather(t1, t2, return_exceptions=True), 60)
    finally:
        for c in (holder, first, second):
            with contextlib.suppress(Exception):
                await c.close()


# What a claim meets when its queue went away under it: unknown queue, or its group's rows gone
# between its reading the group and writing for it (foreign key), or a new queue of that name
# without the group yet (an ack after the re-declare).
GONE = {"FP001", "FP005", "23503"}

HOLD_CURSOR = ("SELECT 1 FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id "
               "JOIN fluxpg.queues q ON q.id = g.queue_id WHERE q.name = $1 FOR UPDATE OF c")


def _no_deadlock(outcomes) -> None:
    for o in outcomes:
        assert not isinstance(o, asyncpg.DeadlockDetectedError), f"deadlock: {o}"


@pytest.mark.parametrize("deleter", DELETERS)
async def test_delete_while_a_consumer_claims(dsn, conn, qname, deleter):
    """The deleter waits for the cursor row a claim needs; the claim (its member row locked)
    queues behind it. Before: the cascade took the cursor, then wanted the member row."""
    await declare(conn, qname)
    await publish_many(conn, qname, 5)
    await conn.fetch("SELECT * FROM fluxpg.claim($1, 'g', 'c1', 1)", qname)    # member c1 exists
    claim = "SELECT seq FROM fluxpg.claim($1, 'g', 'c1', 2)"
    deleted, claimed = await _stage(dsn, qname, HOLD_CURSOR, DELETERS[deleter], (qname,), claim, (qname,))
    _no_deadlock([deleted, claimed])
    assert not isinstance(deleted, Exception), deleted
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", qname) == 0
    # The claim found its queue gone (its member row went with the group) or got nothing.
    assert getattr(claimed, "sqlstate", None) in GONE or claimed == [], claimed


@pytest.mark.parametrize("deleter", DELETERS)
async def test_delete_while_a_stream_reader_reads(dsn, conn, qname, deleter):
    await declare(conn, qname, "stream")
    await publish_many(conn, qname, 5)
    await conn.fetch("SELECT * FROM fluxpg.read($1, 'g', 'r1', 1)", qname)
    read = "SELECT seq FROM fluxpg.read($1, 'g', 'r1', 2)"
    deleted, got = await _stage(dsn, qname, HOLD_CURSOR, DELETERS[deleter], (qname,), read, (qname,))
    _no_deadlock([deleted, got])
    assert not isinstance(deleted, Exception), deleted


async def test_delete_queue_while_a_claim_redelivers(dsn, conn, qname):
    """A claim taking a due redelivery reads the queue's log table before it waits for the
    cursor row; delete_queue drops that table. It no longer waits for it while holding the
    cursor rows: a busy table is left for fluxpg.drop_deleted_logs, which drops it afterwards."""
    await declare(conn, qname)
    await publish_many(conn, qname, 5)
    seqs = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c1', 1)", qname)]
    await conn.fetchval("SELECT fluxpg.release($1, 'g', $2)", qname, seqs)   # due again at once
    qid, gid = await conn.fetchrow("SELECT q.id, g.id FROM fluxpg.queues q JOIN fluxpg.groups g ON g.queue_id = q.id "
                                   "WHERE q.name = $1", qname)
    claim = "SELECT seq FROM fluxpg.claim($1, 'g', 'c1', 3)"
    deleted, claimed = await _stage(dsn, qname, HOLD_CURSOR, DELETERS["fluxpg.delete_queue"], (qname,),
                                    claim, (qname,))
    _no_deadlock([deleted, claimed])
    assert not isinstance(deleted, Exception), deleted
    await conn.fetchval("SELECT fluxpg.drop_deleted_logs()")
    assert await conn.fetchval("SELECT to_regclass($1)", f"fluxpg.log_{qid}") is None
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.pending WHERE group_id = $1", gid) == 0


async def test_delete_group_while_a_consumer_claims(dsn, conn, qname):
    """fluxpg.delete_group cascades groups → cursors → members like the queue's DELETE."""
    await declare(conn, qname)
    await publish_many(conn, qname, 5)
    await conn.fetch("SELECT * FROM fluxpg.claim($1, 'g', 'c1', 1)", qname)
    claim = "SELECT seq FROM fluxpg.claim($1, 'g', 'c1', 2)"
    deleted, claimed = await _stage(dsn, qname, HOLD_CURSOR, "SELECT fluxpg.delete_group($1, 'g')", (qname,),
                                    claim, (qname,))
    _no_deadlock([deleted, claimed])
    assert not isinstance(deleted, Exception), deleted


async def test_an_operator_delete_leaves_no_log_table_behind(conn, qname):
    """A cascade cannot drop a table: the retention pass (enforce_retention, or the broker's
    loop through drop_deleted_logs) drops the log table of a queue deleted by hand."""
    qid = await declare(conn, qname)
    await publish_many(conn, qname, 3)
    await conn.execute("DELETE FROM fluxpg.queues WHERE id = $1", qid)
    assert await conn.fetchval("SELECT to_regclass($1)", f"fluxpg.log_{qid}") is not None
    await conn.fetchval("SELECT fluxpg.enforce_retention()")
    assert await conn.fetchval("SELECT to_regclass($1)", f"fluxpg.log_{qid}") is None


async def test_deleting_queues_under_busy_consumers(dsn, qname):
    """Many rounds of: consumers claim and ack a queue, an operator deletes it and declares it
    again. Bounded (40 rounds); every deadlock fails the test instead of being retried."""
    setup = await db.connect(dsn)
    conns = [await db.connect(dsn) for _ in range(3)]
    stop = asyncio.Event()
    errors: list[BaseException] = []

    async def consumer(c: asyncpg.Connection, name: str) -> None:
        while not stop.is_set():
            try:
                rows = await c.fetch("SELECT seq FROM fluxpg.claim($1, 'g', $2, 5)", qname, name)
                if rows:
                    await c.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, [r["seq"] for r in rows])
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == "40P01":
                    errors.append(exc)
                elif exc.sqlstate not in GONE:
                    raise
            await asyncio.sleep(0)

    try:
        await declare(setup, qname)
        tasks = [asyncio.create_task(consumer(c, f"c{i}")) for i, c in enumerate(conns)]
        for _ in range(40):
            await publish_many(setup, qname, 50)
            await asyncio.sleep(0.01)
            try:
                await setup.execute("DELETE FROM fluxpg.queues WHERE name = $1", qname)
            except asyncpg.DeadlockDetectedError as exc:
                errors.append(exc)
            await declare(setup, qname)
        stop.set()
        await asyncio.gather(*tasks)
        assert not errors, f"{len(errors)} deadlocks: {errors[0]}"
    finally:
        stop.set()
        for c in conns + [setup]:
            await c.close()


async def test_reset_group_and_a_claim_carrying_acks_do_not_deadlock(dsn, conn, qname):
    """fluxpg.ack_claim deletes the acked pending rows, then locks the cursor row (its claim);
    fluxpg.reset_group takes the entries it drops before the cursor row, the same order. Staged:
    the ack half holds a pending row, reset_group waits for it, then the claim half runs. With
    the cursor first, reset_group would hold it while waiting, and the claim would deadlock."""
    await declare(conn, qname)
    await publish_many(conn, qname, 5)
    assert [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 5)", qname)] == \
        list(range(5))
    consumer = await db.connect(dsn)
    resetter = await db.connect(dsn)
    try:
        tx = consumer.transaction()
        await tx.start()
        assert await consumer.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, [3]) == 1   # the ack half
        reset = asyncio.ensure_future(resetter.fetchval("SELECT fluxpg.reset_group($1, 'g', 'offset=2')", qname))
        await _waiting_on_lock(conn, resetter.get_server_pid())
        rows = await asyncio.wait_for(consumer.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 5)", qname), 20)
        assert rows == []                                                   # the claim half: nothing new
        await tx.commit()
        assert await asyncio.wait_for(reset, 20) == 2
        # Offsets 2 and 4 were pending (3 acked): dropped, delivered again from the cursor.
        assert [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 5)", qname)] == \
            [2, 3, 4]
    finally:
        await consumer.close()
        await resetter.close()
