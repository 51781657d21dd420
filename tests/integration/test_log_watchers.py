"""NOTIFY fluxpg_log only where someone else waits (issue 17; sql/0015_log_watchers.sql).

A NOTIFY wakes every LISTENing backend of the database and is read by every node, so a node's
appends (tagged `,@<node>`: it wakes its own consumers itself) name only the queues that another
node has consumers of, or that a SQL listener watches with fluxpg.watch_log; without one they send
none. Untagged appends (the SQL API, applications) always NOTIFY."""
from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

import fluxpg
from fluxpg import db
from fluxpg.config import QueueConfig
from fluxpg.queues.sequencer import Sequencer
from tests.helpers import Inbox, declare


class Notes:
    """A LISTEN connection on fluxpg_log collecting payloads."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self.conn: asyncpg.Connection | None = None

    async def start(self, dsn: str) -> "Notes":
        self.conn = await db.connect(dsn)
        await self.conn.add_listener("fluxpg_log", lambda _c, _p, _ch, payload: self.payloads.append(payload))
        return self

    def naming(self, qid: int) -> list[str]:
        return [p for p in self.payloads if str(qid) in p.split("@")[0].split(",")]

    async def settle(self) -> None:
        await self.conn.execute("SELECT 1")   # notifications sent before this have arrived
        await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self.conn.close()


async def _append(conn, qid: int, qname: str, tag: str | None) -> None:
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[], NULL, NULL, $4)",
                     [qid], [f"$queue/{qname}/k"], [b"x"], tag)


async def _node(conn) -> int:
    return await conn.fetchval("INSERT INTO fluxpg.nodes (host, pid) VALUES ('test', 0) RETURNING id")


async def test_tagged_appends_notify_only_queues_watched_by_someone_else(dsn, conn, qname):
    await declare(conn, qname)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    me, other = await _node(conn), await _node(conn)
    notes = await Notes().start(dsn)
    try:
        await _append(conn, qid, qname, f",@{me}")                       # nobody watches
        await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", me, [qid])
        await _append(conn, qid, qname, f",@{me}")                       # only this node watches
        await notes.settle()
        assert notes.naming(qid) == []

        await _append(conn, qid, qname, None)                            # untagged: always
        await notes.settle()
        assert notes.naming(qid) == [str(qid)]

        assert await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, [qid]) == 1
        await _append(conn, qid, qname, f",@{me}")                       # another node watches
        await notes.settle()
        assert notes.naming(qid)[-1] == f"{qid},@{me}"
        # The other node's own appends: watched by `me`, so they name it too.
        await _append(conn, qid, qname, f",@{other}")
        await notes.settle()
        assert notes.naming(qid)[-1] == f"{qid},@{other}"

        # A node's watches are exactly what it last said; they go with the node.
        assert await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, []) == 0
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = $1", me)
        assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_watchers WHERE queue_id = $1", qid) == 0
        n = len(notes.naming(qid))
        await _append(conn, qid, qname, f",@{other}")
        await notes.settle()
        assert len(notes.naming(qid)) == n
    finally:
        await notes.close()
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = ANY ($1::int[])", [me, other])


async def test_a_sql_listener_lease(dsn, conn, qname):
    await declare(conn, qname)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    me = await _node(conn)
    notes = await Notes().start(dsn)
    try:
        ends = await conn.fetchval("SELECT fluxpg.watch_log($1, 'app', interval '1 hour')", qname)
        assert ends > await conn.fetchval("SELECT now() + interval '59 minutes'")
        await _append(conn, qid, qname, f",@{me}")
        await notes.settle()
        assert notes.naming(qid) == [f"{qid},@{me}"]

        assert await conn.fetchval("SELECT fluxpg.unwatch_log($1, 'app')", qname) is True
        assert await conn.fetchval("SELECT fluxpg.unwatch_log($1, 'app')", qname) is False
        await conn.fetchval("SELECT fluxpg.watch_log($1, 'app', interval '1 millisecond')", qname)
        await asyncio.sleep(0.01)
        await _append(conn, qid, qname, f",@{me}")                       # the lease has ended
        await notes.settle()
        assert len(notes.naming(qid)) == 1
        await conn.fetchval("SELECT fluxpg.node_heartbeat($1)", me)      # ended leases are removed
        assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_watchers WHERE queue_id = $1", qid) == 0

        for bad in ("SELECT fluxpg.watch_log($1, 'app', interval '0')",
                    "SELECT fluxpg.watch_log($1, 'node:7')"):
            with pytest.raises(asyncpg.PostgresError) as err:
                await conn.fetchval(bad, qname)
            assert err.value.sqlstate == "FP004"
    finally:
        await notes.close()
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = $1", me)


async def test_watching_waits_for_appends_holding_the_head(dsn, conn, qname):
    """An append that took the head before a node started watching commits before the watch
    returns (so the node's first claim sees it, though its NOTIFY did not name the queue)."""
    await declare(conn, qname)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    me, other = await _node(conn), await _node(conn)
    appender = await db.connect(dsn)
    try:
        tx = appender.transaction()
        await tx.start()
        await _append(appender, qid, qname, f",@{me}")
        watch = asyncio.ensure_future(conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, [qid]))
        started = time.monotonic()
        await asyncio.sleep(0.05)
        if time.monotonic() - started < 0.15:   # else its 200 ms lock_timeout may have run out meanwhile
            assert not watch.done()
        await tx.commit()
        assert await asyncio.wait_for(watch, 5) == 1
        # Held longer than 200 ms (an application's transaction): the watch does not wait for it.
        tx = appender.transaction()
        await tx.start()
        await _append(appender, qid, qname, None)
        await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, [])
        assert await asyncio.wait_for(conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, [qid]), 5) == 1
        await tx.rollback()
    finally:
        await appender.close()
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = ANY ($1::int[])", [me, other])


async def test_nodes_wake_their_own_consumers_and_notify_the_others(manager_factory, dsn, qname):
    a = await manager_factory([QueueConfig(name=qname)])
    b = await manager_factory([QueueConfig(name=qname)])
    qid = a.queues[qname].id
    notes = await Notes().start(dsn)
    try:
        # Nobody consumes: a's publishes send no NOTIFY.
        for i in range(3):
            await a.publish(f"$queue/{qname}/k", b"%d" % i)
        await notes.settle()
        assert notes.naming(qid) == []

        # b's consumer: b watches the queue from its subscribe on; a's publishes NOTIFY it, b's
        # own wake its consumer at commit without one.
        inbox = Inbox()
        sub = await b.subscribe(qname, "g", "c", on_delivery=inbox, credit=1000)
        await inbox.wait_for(3)
        assert b._watched == {qid}
        woken = b._wake_counts.get(qid, 0)
        await a.publish(f"$queue/{qname}/k", b"from a")
        await inbox.wait_for(4)
        await notes.settle()
        assert notes.naming(qid) == [f"{qid},@{a.node_id}"]
        assert b._wake_counts.get(qid, 0) > woken
        woken = b._wake_counts.get(qid, 0)
        await b.publish(f"$queue/{qname}/k", b"from b")
        await inbox.wait_for(5)
        await notes.settle()
        assert len(notes.naming(qid)) == 1                              # nobody else watches
        assert b._wake_counts.get(qid, 0) > woken                       # woken at its own commit
        assert [d.payload for d in inbox.items] == [b"0", b"1", b"2", b"from a", b"from b"]

        # The consumer goes: b's next heartbeat check stops watching the queue.
        await sub.close()
        await b._watch(force=True)
        assert b._watched == frozenset()
        await a.publish(f"$queue/{qname}/k", b"after")
        await notes.settle()
        assert len(notes.naming(qid)) == 1
    finally:
        await notes.close()


async def _append_claim(pool, qid: int, qname: str, tag: str | None) -> None:
    await pool.fetch("SELECT * FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, '{}', '{}', '{}', '{}', NULL, NULL, $4)",
                     [qid], [f"$queue/{qname}/k"], [b"x"], tag)


async def _sequence_claim(pool, qid: int, qname: str, tag: str | None) -> None:
    async with pool.acquire() as app, app.transaction():
        await fluxpg.publish(app, f"$queue/{qname}/k", b"x")
    rows = await pool.fetch("SELECT * FROM fluxpg.sequence_claim(100, '{}', '{}', '{}', '{}', $1)", tag)
    assert [(r["r_target"], r["r_queue_id"], r["r_seq"]) for r in rows] == [(0, qid, 1)]


@pytest.mark.parametrize("call", [_append_claim, _sequence_claim], ids=["append_claim", "sequence_claim"])
async def test_claiming_appends_are_tagged_by_their_caller_not_by_the_connection(dsn, conn, qname, call):
    """fluxpg.append_claim and fluxpg.sequence_claim tag their NOTIFY with the notify_tag they are
    given (the broker's LocalHandoff, which wakes the node's consumers itself), never with the
    connection's fluxpg.node_id: untagged on a node's connection, they NOTIFY though only that node
    watches the queue (nobody would wake its consumers otherwise); tagged, as fluxpg.append_batch."""
    await declare(conn, qname)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    me, other = await _node(conn), await _node(conn)
    await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", me, [qid])      # only this node watches
    pool = await db.create_pool(dsn, min_size=1, max_size=2, node_id=me)
    notes = await Notes().start(dsn)
    try:
        assert await pool.fetchval("SELECT current_setting('fluxpg.node_id')") == str(me)
        await call(pool, qid, qname, None)
        await notes.settle()
        assert notes.naming(qid) == [str(qid)]

        await call(pool, qid, qname, f",@{me}")                                # its own node: none
        await notes.settle()
        assert notes.naming(qid) == [str(qid)]

        await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", other, [qid])
        await call(pool, qid, qname, f",@{me}")                                # another node watches
        await notes.settle()
        assert notes.naming(qid) == [str(qid), f"{qid},@{me}"]
    finally:
        await notes.close()
        await pool.close()
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = ANY ($1::int[])", [me, other])


async def test_a_sequencer_without_a_handoff_notifies_on_a_nodes_pool(dsn, conn, qname):
    """The tag comes from the handoff that wakes the node's consumers: a Sequencer without one, on
    a pool whose connections carry fluxpg.node_id, sends an untagged NOTIFY (the queue's consumers
    on that node are woken by it); the broker's, with its LocalHandoff, tags its moves."""
    await declare(conn, qname)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    me = await _node(conn)
    await conn.fetchval("SELECT fluxpg._node_watches($1, $2)", me, [qid])      # only this node watches
    pool = await db.create_pool(dsn, min_size=1, max_size=2, node_id=me)
    notes = await Notes().start(dsn)
    try:
        async with conn.transaction():
            await fluxpg.publish(conn, f"$queue/{qname}/k", b"x")
        assert await Sequencer(pool).run_once() == 1
        await notes.settle()
        assert notes.naming(qid) == [str(qid)]
    finally:
        await notes.close()
        await pool.close()
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = $1", me)


async def test_the_brokers_sequencer_tags_its_moves(manager_factory, dsn, conn, qname):
    """The broker's sequencer passes its handoff's tag: with only its own node consuming, a
    transactional publish is delivered without a NOTIFY."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    qid = mgr.queues[qname].id
    assert mgr.sequencer._notify_tag == f",@{mgr.node_id}"
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=100)
    notes = await Notes().start(dsn)
    try:
        async with conn.transaction():
            await fluxpg.publish(conn, f"$queue/{qname}/k", b"tx")
        [d] = await inbox.wait_for(1)
        assert d.payload == b"tx"
        await notes.settle()
        assert notes.naming(qid) == []
    finally:
        await notes.close()
