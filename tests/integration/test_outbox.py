"""Publishing inside the application's own transaction (fluxpg.publish → fluxpg.outbox in the
caller's transaction, a commit-order marker in fluxpg.outbox_commits at its commit → appended to
the log by the sequencer).

Real PostgreSQL and a real queue manager: a long application transaction blocks no other
publisher; messages are delivered only after commit, in commit order; a rollback leaves no trace
and no stall; the Python API works on asyncpg, psycopg and SQLAlchemy connections."""
from __future__ import annotations

import asyncio
import random
import time

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import fluxpg
from fluxpg import db
from fluxpg.config import QueueConfig
from fluxpg.queues import sequencer as sequencer_module
from fluxpg.testing import dsn_with_database

from tests.helpers import Inbox, declare


async def _drain(conn, queue, group, want, timeout=15.0):
    """Claim and ack until `want` messages arrived (or the timeout): their payloads, in order."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        rows = await conn.fetch("SELECT seq, payload FROM fluxpg.claim($1, $2, 'c', 500)", queue, group)
        if rows:
            await conn.execute("SELECT fluxpg.ack($1, $2, $3)", queue, group, [r["seq"] for r in rows])
            got.extend(bytes(r["payload"]) for r in rows)
        else:
            await asyncio.sleep(0.02)
    return got


async def test_long_transaction_blocks_no_publisher_and_is_delivered_after_commit(dsn, conn, qname, manager_factory):
    mgr = await manager_factory([QueueConfig(name=qname, topics=[f"$queue/{qname}/#"])])
    app = await db.connect(dsn)
    other = await db.connect(dsn)
    try:
        tx = app.transaction()
        await tx.start()
        assert await fluxpg.publish(app, f"$queue/{qname}/created", b"in-tx", {"order": 42}) == [qname]

        # While the application transaction is open: a broker publish and an SQL publish from
        # another connection complete at once (the bound is generous; a held head lock would
        # make them wait for the commit below, 2 s later).
        started = time.monotonic()
        await mgr.publish(f"$queue/{qname}/x", b"broker")
        await other.fetch("SELECT * FROM fluxpg.publish($1, 'sql')", f"$queue/{qname}/x")
        await other.fetch("SELECT * FROM fluxpg.append($1, 'direct')", f"$queue/{qname}/x")
        assert time.monotonic() - started < 1.5

        # The autocommitted fluxpg.publish reaches the log through the sequencer, a moment after
        # the direct appends around it.
        assert sorted(await _drain(conn, qname, "g", 3, timeout=5)) == [b"broker", b"direct", b"sql"]
        stats = await conn.fetchrow("SELECT staging_transactions, oldest_staging_age "
                                    "FROM fluxpg.queue_stats WHERE queue = $1", qname)
        assert stats["staging_transactions"] == 1
        assert stats["oldest_staging_age"].total_seconds() > 0
        await asyncio.sleep(2)
        assert await _drain(conn, qname, "g", 1, timeout=0.5) == []   # invisible until commit

        await tx.commit()
        assert await _drain(conn, qname, "g", 1) == [b"in-tx"]
        row = await conn.fetchrow("SELECT seq, headers FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                                  "WHERE q.name = $1 AND l.payload = 'in-tx'", qname)
        assert row["seq"] == 3 and row["headers"] == {"order": 42}
        stats = await conn.fetchrow("SELECT outbox, staging_transactions FROM fluxpg.queue_stats WHERE queue = $1", qname)
        assert (stats["outbox"], stats["staging_transactions"]) == (0, 0)
        assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 0
    finally:
        await app.close()
        await other.close()


async def test_rollback_leaves_no_trace_and_no_stall(dsn, conn, qname, manager_factory):
    await manager_factory([QueueConfig(name=qname, topics=[f"$queue/{qname}/#"])])
    app = await db.connect(dsn)
    try:
        for i in range(3):
            tx = app.transaction()
            await tx.start()
            await fluxpg.publish(app, f"$queue/{qname}/x", b"rolled-back-%d" % i)
            await tx.rollback()
        async with app.transaction():
            await fluxpg.publish(app, f"$queue/{qname}/x", b"kept")
        assert await _drain(conn, qname, "g", 1) == [b"kept"]
        assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox") == 0
        assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 0
        # No gap: the kept message got the first offset.
        assert await conn.fetchval("SELECT seq FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                                   "WHERE q.name = $1", qname) == 0
    finally:
        await app.close()


async def test_interleaved_commits_are_seen_in_commit_order_exactly_once(dsn, conn, qname, manager_factory):
    """8 connections run transactions of 1–3 messages with random pauses, a quarter rolled back.
    Every committed message arrives once; within each connection (whose transactions commit one
    after the other) offsets follow commit order; nothing rolled back appears."""
    await manager_factory([QueueConfig(name=qname, topics=[f"$queue/{qname}/#"])])
    rng = random.Random(7)
    committed: dict[int, list[bytes]] = {w: [] for w in range(8)}

    async def worker(w: int) -> None:
        c = await db.connect(dsn)
        try:
            for t in range(12):
                msgs = [f"w{w}-t{t}-m{m}".encode() for m in range(rng.randint(1, 3))]
                tx = c.transaction()
                await tx.start()
                for m in msgs:
                    await fluxpg.publish(c, f"$queue/{qname}/w{w}", m)
                    await asyncio.sleep(rng.random() * 0.01)
                if rng.random() < 0.25:
                    await tx.rollback()
                else:
                    await tx.commit()
                    committed[w].extend(msgs)
        finally:
            await c.close()

    await asyncio.gather(*(worker(w) for w in range(8)))
    want = sum(len(v) for v in committed.values())
    got = await _drain(conn, qname, "g", want)
    assert len(got) == want and set(got) == {m for v in committed.values() for m in v}
    for w, msgs in committed.items():
        assert [m for m in got if m.startswith(b"w%d-" % w)] == msgs
    rows = await conn.fetch("SELECT seq FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                            "WHERE q.name = $1 ORDER BY seq", qname)
    assert [r["seq"] for r in rows] == list(range(want))    # no gaps


async def test_full_queue_keeps_committed_messages_waiting_in_order(dsn, conn, qname, manager_factory):
    """The commit is the confirmation: a queue that is full when the sequencer gets to it keeps
    the committed messages in the outbox, in order, with the error, while other queues' messages
    move on; once consumers make room they follow, in order."""
    full, free = f"{qname}_full", f"{qname}_free"
    mgr = await manager_factory([QueueConfig(name=full, topics=[f"$queue/{full}/#"], limits={"max_depth": 2}),
                                 QueueConfig(name=free, topics=[f"$queue/{free}/#"])])
    for i in range(2):
        await mgr.publish(f"$queue/{full}/x", b"direct-%d" % i)
    app = await db.connect(dsn)
    try:
        async with app.transaction():
            for i in range(3):
                await fluxpg.publish(app, f"$queue/{full}/x", b"staged-%d" % i)
            await fluxpg.publish(app, f"$queue/{free}/x", b"free")
        assert await _drain(conn, free, "g", 1) == [b"free"]
        await asyncio.sleep(0.3)
        waiting = await conn.fetch("SELECT payload, last_error FROM fluxpg.outbox ORDER BY id")
        assert [bytes(r["payload"]) for r in waiting] == [b"staged-0", b"staged-1", b"staged-2"]
        assert "is full" in waiting[0]["last_error"]
        assert await conn.fetchval("SELECT outbox FROM fluxpg.queue_stats WHERE queue = $1", full) == 3
        got = await _drain(conn, full, "g", 5, timeout=20)
        assert got == [b"direct-0", b"direct-1", b"staged-0", b"staged-1", b"staged-2"]
    finally:
        await app.close()


async def test_a_sleeping_sequencer_is_woken_by_the_publishing_commit(dsn, conn, qname, manager_factory, monkeypatch):
    """An idle broker's sequencer sleeps (no poll for IDLE_POLL, raised here to a minute) and the
    publishing commit wakes it: the message is delivered at once, not after a poll."""
    monkeypatch.setattr(sequencer_module, "IDLE_POLL", 60.0)
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=10)

    async def asleep():
        while not mgr.sequencer.sleeping:
            await asyncio.sleep(0.01)
    for i in range(3):
        await asyncio.wait_for(asleep(), 10)
        async with conn.transaction():
            await fluxpg.publish(conn, f"$queue/{qname}/k", b"%d" % i)
        await inbox.wait_for(i + 1, timeout=10)     # far below IDLE_POLL
    assert [d.payload for d in inbox.items] == [b"0", b"1", b"2"]


async def test_every_node_sleeps_while_one_holds_the_lock_and_all_are_woken(dsn, conn, qname, manager_factory,
                                                                            monkeypatch):
    """Two nodes: one sequencer holds the sleep lock, the other sees it held and sleeps too; a
    publishing commit wakes both, and the consumer of either node gets its message at once."""
    monkeypatch.setattr(sequencer_module, "IDLE_POLL", 60.0)
    a = await manager_factory([QueueConfig(name=qname)])
    b = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    await b.subscribe(qname, "g", "c", on_delivery=inbox, credit=10)

    async def both_asleep():
        while not (a.sequencer.sleeping and b.sequencer.sleeping) or not await conn.fetchval(
                db.queries()["sequencer_asleep_elsewhere"]):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(both_asleep(), 10)
    rounds = a.sequencer.rounds + b.sequencer.rounds
    await asyncio.sleep(0.5)                       # both asleep: not one round (a poll: 10 a node)
    assert a.sequencer.rounds + b.sequencer.rounds == rounds
    for i in range(3):
        async with conn.transaction():
            await fluxpg.publish(conn, f"$queue/{qname}/k", b"%d" % i)
        await inbox.wait_for(i + 1, timeout=10)    # far below IDLE_POLL
        await asyncio.wait_for(both_asleep(), 10)
    assert [d.payload for d in inbox.items] == [b"0", b"1", b"2"]


async def test_a_sequencer_asleep_in_another_database_is_not_asleep_here(dsn, conn):
    """Advisory locks are per database but pg_locks lists the server's: the sleep lock held in
    another database (another fluxpg install on the same server, its sequencer asleep) is not
    this database's sleeping node, whose commits would NOTIFY. Seen as one, this node slept
    without the lock while its commits sent nothing, and every transactional publish waited
    IDLE_POLL."""
    other = await db.connect(dsn_with_database(dsn, "postgres"))
    try:
        assert await other.fetchval(db.queries()["sequencer_sleep_lock"])
        assert await other.fetchval(db.queries()["sequencer_asleep_elsewhere"])
        assert not await conn.fetchval(db.queries()["sequencer_asleep_elsewhere"])
        assert await conn.fetchval(db.queries()["sequencer_sleep_lock"])       # granted here
        assert await conn.fetchval(db.queries()["sequencer_sleep_unlock"])
    finally:
        await other.close()


async def test_publishing_commits_notify_only_while_the_sleep_lock_is_held(dsn, conn, qname):
    """No broker: the test holds the sequencer's sleep lock itself. Commits NOTIFY fluxpg_outbox
    only while it is held; and it is not granted while a publishing commit is under way (here its
    deferred trigger made immediate: the shared lock is held until the transaction ends)."""
    await declare(conn, qname)
    sleeper = await db.connect(dsn)
    app = await db.connect(dsn)
    heard = asyncio.Queue()
    await sleeper.add_listener("fluxpg_outbox", lambda *args: heard.put_nowait(args))
    lock, unlock = db.queries()["sequencer_sleep_lock"], db.queries()["sequencer_sleep_unlock"]
    try:
        async with app.transaction():
            await fluxpg.publish(app, f"$queue/{qname}/k", b"awake")
        await asyncio.sleep(0.3)
        assert heard.empty()                              # nobody sleeps: no NOTIFY

        assert await sleeper.fetchval(lock)
        async with app.transaction():
            await fluxpg.publish(app, f"$queue/{qname}/k", b"asleep")
        await asyncio.wait_for(heard.get(), 5)            # the commit woke the sleeper
        assert await sleeper.fetchval(unlock)

        async with app.transaction():
            await app.execute("SET CONSTRAINTS fluxpg.outbox_commit IMMEDIATE")
            await fluxpg.publish(app, f"$queue/{qname}/k", b"committing")
            assert not await sleeper.fetchval(lock)       # a commit under way: no sleeping now
        assert await sleeper.fetchval(lock)               # its marker is visible from here on
        assert await sleeper.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 3
        assert await sleeper.fetchval(unlock)
        assert await sleeper.fetchval("SELECT fluxpg.sequence_staged()") == 3   # leave no outbox behind
    finally:
        await sleeper.close()
        await app.close()


def test_psycopg_and_sqlalchemy_sessions(dsn, qname):
    """The sync kinds: a psycopg connection and a SQLAlchemy Session, with the application's own
    rows in the same transaction. No broker runs here: fluxpg.sequence_staged() appends them."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT fluxpg.declare_queue(%s, 'classic', NULL, '{}')", (qname,))
        admin.execute(f"CREATE TABLE {qname}_orders (id int PRIMARY KEY, total int)")
    with psycopg.connect(dsn) as pconn:   # a transaction until the block ends
        pconn.execute(f"INSERT INTO {qname}_orders VALUES (1, 10)")
        assert fluxpg.publish(pconn, f"$queue/{qname}/created", b"order-1", {"id": 1}) == [qname]
    engine = create_engine(db.sqlalchemy_url(dsn))
    with Session(engine) as session, session.begin():
        session.execute(text(f"INSERT INTO {qname}_orders VALUES (2, 20)"))
        assert fluxpg.publish_batch(session, [(f"$queue/{qname}/created", b"order-2", {"id": 2}),
                                              (f"$queue/{qname}/created", "order-3", None)]) == \
            [(1, qname), (2, qname)]
    with Session(engine) as session, session.begin():
        session.execute(text(f"INSERT INTO {qname}_orders VALUES (4, 40)"))
        fluxpg.publish(session, f"$queue/{qname}/created", b"order-4")
        session.rollback()
    engine.dispose()
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT fluxpg.sequence_staged()").fetchone()[0] == 3
        rows = admin.execute("SELECT seq, payload, headers FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                             "WHERE q.name = %s ORDER BY seq", (qname,)).fetchall()
        assert [(s, bytes(p), h) for s, p, h in rows] == [(0, b"order-1", {"id": 1}), (1, b"order-2", {"id": 2}),
                                                         (2, b"order-3", None)]
        assert admin.execute(f"SELECT id FROM {qname}_orders ORDER BY id").fetchall() == [(1,), (2,)]
        admin.execute(f"DROP TABLE {qname}_orders")


async def test_async_sqlalchemy_session_and_errors_in_the_callers_transaction(dsn, conn, qname, manager_factory):
    await manager_factory([QueueConfig(name=qname, topics=[f"$queue/{qname}/#"], limits={"max_message_size": 10})])
    engine = create_async_engine(db.sqlalchemy_url(dsn).replace("+psycopg", "+asyncpg"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            assert await fluxpg.publish(session, f"$queue/{qname}/a", b"small") == [qname]
        # Bad input fails in the caller's transaction, with fluxpg's SQLSTATE, never later.
        async with AsyncSession(engine) as session:
            with pytest.raises(Exception, match="exceeds limits.max_message_size"):
                async with session.begin():
                    await fluxpg.publish(session, f"$queue/{qname}/a", b"x" * 11)
        async with AsyncSession(engine) as session:
            with pytest.raises(Exception, match="no queue is bound"):
                async with session.begin():
                    await fluxpg.publish(session, "$queue/nobody_here_at_all/a", b"x")
    finally:
        await engine.dispose()
    assert await _drain(conn, qname, "g", 1) == [b"small"]
    with pytest.raises(TypeError, match="needs an asyncpg or psycopg connection"):
        fluxpg.publish(object(), "t", b"x")


async def test_publish_routes_as_route_does(conn, qname, manager_factory):
    """fluxpg.publish routes without fluxpg._routes' window (one query into arrays, the reserved
    rule applied afterwards, a one-queue fast path): the same queues as fluxpg.route, in id order,
    one row each in the outbox and one marker-bearing row per call; a size limit on any target
    queue refuses the call."""
    await manager_factory([
        QueueConfig(name=f"{qname}_a", topics=[f"$queue/{qname}_a/#", f"sensors/{qname}/#"]),
        QueueConfig(name=f"{qname}_b", topics=[f"sensors/{qname}/+/temp"]),
        QueueConfig(name=f"{qname}_c", topics=[f"sensors/{qname}/big/#"], limits={"max_message_size": 4}),
        QueueConfig(name=f"{qname}_r", topics=[f"other/{qname}/#", f"sensors/{qname}/#"], reserved=True),
    ])
    topics = [f"$queue/{qname}_a/x", f"sensors/{qname}/x/temp", f"sensors/{qname}/x/hum", f"other/{qname}/z",
              f"sensors/{qname}/big/temp"]
    for topic in topics:
        expected = await conn.fetchval(
            "SELECT array_agg(q.name ORDER BY q.id) FROM fluxpg.queues q WHERE q.id = ANY (fluxpg.route($1))", topic)
        tr = conn.transaction()
        await tr.start()
        try:
            got = [r["queue"] for r in await conn.fetch("SELECT queue FROM fluxpg.publish($1, 'ok')", topic)]
            rows = await conn.fetch("SELECT o.queue_id, o.marks FROM fluxpg.outbox o WHERE o.txid = pg_current_xact_id() "
                                    "ORDER BY o.id")
            assert got == expected, topic
            assert [r["marks"] for r in rows] == [True] + [False] * (len(expected) - 1), topic
            assert await conn.fetchval("SELECT fluxpg.route($1) = $2::int[]", topic, [r["queue_id"] for r in rows])
            await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
            assert await conn.fetchval(
                "SELECT count(*) FROM fluxpg.outbox_commits WHERE txid = pg_current_xact_id()") == 1
        finally:
            await tr.rollback()
    assert len(expected) == 3  # the last topic reaches _a (via sensors/#), _b and _c
    with pytest.raises(Exception, match="exceeds limits.max_message_size"):
        async with conn.transaction():
            await conn.fetch("SELECT * FROM fluxpg.publish($1, 'too big')", f"sensors/{qname}/big/temp")
    assert await conn.fetchval("SELECT fluxpg.route($1) = ARRAY(SELECT id FROM fluxpg.queues WHERE name = $2)",
                               f"other/{qname}/z", f"{qname}_r")


async def test_concurrent_sequencers_move_each_message_once_in_commit_order(dsn, conn, qname):
    """Three sequencers call fluxpg.sequence_staged at once, in rounds of a few markers, while four
    connections commit transactions of one or two fluxpg.publish calls (two markers; a round's
    limit often falls between them). Each sequencer deletes the markers it read by their row
    addresses: only the one holding the lock may, so every committed message is appended exactly
    once, each connection's in its commit order, with no gap and nothing left behind."""
    await conn.execute("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}')", qname)
    topic = f"$queue/{qname}/x"
    committed: dict[int, list[bytes]] = {w: [] for w in range(4)}
    publishing = True

    async def publisher(w: int) -> None:
        c = await db.connect(dsn)
        try:
            for t in range(120):
                msgs = [b"w%d-t%d-m%d" % (w, t, m) for m in range(1 + t % 2)]
                async with c.transaction():
                    for m in msgs:
                        await fluxpg.publish(c, topic, m)
                committed[w].extend(msgs)
        finally:
            await c.close()

    async def sequencer() -> int:
        c = await db.connect(dsn)
        moved = 0
        try:
            while publishing or await c.fetchval("SELECT EXISTS (SELECT FROM fluxpg.outbox_commits)"):
                moved += await c.fetchval("SELECT fluxpg.sequence_staged(3)")
        finally:
            await c.close()
        return moved

    sequencers = [asyncio.ensure_future(sequencer()) for _ in range(3)]
    await asyncio.gather(*(publisher(w) for w in range(4)))
    publishing = False
    moved = await asyncio.gather(*sequencers)
    want = sum(len(v) for v in committed.values())
    assert sum(moved) == want
    assert all(n > 0 for n in moved)       # all three took rounds
    rows = await conn.fetch("SELECT seq, payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                            "WHERE q.name = $1 ORDER BY seq", qname)
    assert [r["seq"] for r in rows] == list(range(want))
    got = [bytes(r["payload"]) for r in rows]
    assert sorted(got) == sorted(m for v in committed.values() for m in v)
    for w, msgs in committed.items():
        assert [m for m in got if m.startswith(b"w%d-" % w)] == msgs
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 0
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox o JOIN fluxpg.queues q ON q.id = o.queue_id "
                               "WHERE q.name = $1", qname) == 0


def test_commit_order_not_transaction_id_order(dsn, qname):
    """Offsets follow commit order even where transaction ids say otherwise: B starts (and takes
    its transaction id) first, A publishes and commits, then B commits, then C. All three are
    moved in one sequencer call: A, B, C — not B, A, C as ordering by transaction id would."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT fluxpg.declare_queue(%s, 'classic', NULL, '{}')", (qname,))
    topic = f"$queue/{qname}/x"
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        b.execute("SELECT pg_current_xact_id()")          # B's transaction id is the older one
        fluxpg.publish(b, topic, b"B")
        fluxpg.publish(a, topic, b"A1")
        fluxpg.publish(a, topic, b"A2")
        a.commit()
        b.commit()
        fluxpg.publish(a, topic, b"C")
        a.commit()
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT fluxpg.sequence_staged()").fetchone()[0] == 4
        rows = admin.execute("SELECT seq, payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                             "WHERE q.name = %s ORDER BY seq", (qname,)).fetchall()
        assert [(s, bytes(p)) for s, p in rows] == [(0, b"A1"), (1, b"A2"), (2, b"B"), (3, b"C")]
        assert admin.execute("SELECT count(*) FROM fluxpg.outbox_commits").fetchone()[0] == 0


@pytest.mark.slow
async def test_crash_after_commit_and_during_the_move_loses_nothing_and_duplicates_nothing(tmp_path):
    """A private durable PostgreSQL crashed (SIGQUIT: no checkpoint, WAL recovery on restart) right
    after the application's commits, and again right after the sequencer's asynchronously
    committed move of part of them: every committed message reaches the log once, in commit
    order, with dense offsets."""
    import os
    import signal

    from fluxpg.embedded import EmbeddedPostgres, _pid_alive

    pg = EmbeddedPostgres(tmp_path / "pgdata", durable=True, tcp=True)

    async def crash_and_restart() -> None:
        os.kill(pg.pid, signal.SIGQUIT)
        deadline = time.monotonic() + 20
        while _pid_alive(pg.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await pg.astop()
        await pg.astart()

    await pg.astart()
    try:
        await asyncio.to_thread(db.migrate, pg.dsn)
        c = await db.connect(pg.dsn)
        await c.execute("SELECT fluxpg.declare_queue('orders', 'classic', NULL, '{}')")
        for i in range(50):
            async with c.transaction():
                await fluxpg.publish(c, "$queue/orders/created", b"m%02d" % i)
        await c.close()
        await crash_and_restart()

        c = await db.connect(pg.dsn)
        assert await c.fetchval("SELECT count(*) FROM fluxpg.outbox") == 50
        await c.execute("SET synchronous_commit = off")
        assert await c.fetchval("SELECT fluxpg.sequence_staged(20)") == 20
        await c.close()
        await crash_and_restart()

        c = await db.connect(pg.dsn)
        moved = [bytes(r[0]) for r in await c.fetch("SELECT payload FROM fluxpg.log ORDER BY seq")]
        waiting = await c.fetchval("SELECT count(*) FROM fluxpg.outbox")
        assert moved in ([], [b"m%02d" % i for i in range(20)]) and len(moved) + waiting == 50
        while await c.fetchval("SELECT fluxpg.sequence_staged(7)"):
            pass
        rows = await c.fetch("SELECT seq, payload FROM fluxpg.log ORDER BY seq")
        assert [(r[0], bytes(r[1])) for r in rows] == [(i, b"m%02d" % i) for i in range(50)]
        assert await c.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 0
        await c.close()
    finally:
        await pg.astop()
