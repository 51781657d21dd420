"""Auto-creation is create-if-absent (fluxpg.declare_queue(..., if_absent => true)): a queue that
exists when the declaring transaction runs — declared meanwhile by another node, the CLI, SQL or
AMQP — is returned as it is, never reset to the defaults; only an absent queue is created.
Explicit declarations still create or update.

Why: the broker auto-creates `<name>` of a `$queue/<name>/…` nothing matches after looking the
name up; a declaration with custom settings made elsewhere between that look-up and the create
used to be overwritten with the defaults (declare_queue is an upsert)."""
from __future__ import annotations

import asyncio

from fluxpg import db
from fluxpg.config import QueueConfig
from tests.helpers import Inbox

CUSTOM = {"retry": {"max_retries": 3}}


async def queue_row(conn, name):
    return await conn.fetchrow("SELECT id, kind, topics, settings FROM fluxpg.queues WHERE name = $1", name)


async def auto_created_settings(conn, name, mgr):
    """What an auto-create of `name` by `mgr` stores: its defaults, completed as SQL completes them."""
    return await conn.fetchval("SELECT fluxpg._settings($1, 'classic', $2)", name,
                               QueueConfig(name=name).to_settings(mgr.qm))


async def test_if_absent_leaves_an_existing_queue_as_it_is(conn, qname):
    qid = await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', $2, $3)", qname,
                              [f"$queue/{qname}/#", "orders/#"], CUSTOM)
    before = await queue_row(conn, qname)
    assert await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}', if_absent => true)",
                               qname) == qid
    # Even when asked for another kind: whatever exists is the queue.
    assert await conn.fetchval("SELECT fluxpg.declare_queue($1, 'stream', NULL, '{}', if_absent => true)",
                               qname) == qid
    assert await queue_row(conn, qname) == before
    assert before["settings"]["retry"]["max_retries"] == 3


async def test_if_absent_waits_for_a_declaration_in_progress_and_keeps_it(dsn, conn, qname):
    """The declaration elsewhere commits while the auto-create waits for the name's lock: the
    auto-create finds it then and leaves it (the old upsert reset it to the defaults)."""
    other = await db.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        qid = await other.fetchval("SELECT fluxpg.declare_queue($1, 'classic', $2, $3)", qname,
                                   [f"$queue/{qname}/#", "orders/#"], CUSTOM)
        auto = asyncio.ensure_future(
            conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}', if_absent => true)", qname))
        await asyncio.sleep(0.3)
        assert not auto.done()                 # waiting for the declaration's transaction
        await tx.commit()
        assert await asyncio.wait_for(auto, 10) == qid
    finally:
        await other.close()
    row = await queue_row(conn, qname)
    assert row["topics"] == [f"$queue/{qname}/#", "orders/#"]
    assert row["settings"]["retry"]["max_retries"] == 3


async def test_auto_create_keeps_a_queue_declared_after_the_nodes_look_up(manager_factory, conn, qname):
    """The broker's path: the node looks `qname` up (absent), another client declares it with
    custom settings, then the node's auto-create runs: the queue keeps them and takes the publish."""
    mgr = await manager_factory()
    look_up = mgr.reload_queues
    # The manager also reloads on its own (a NOTIFY of a queue change, its declare_queue), so the
    # patched look-up may run twice at once: one declaration, and `conn` used by one at a time.
    declared = asyncio.Lock()
    done = False

    async def look_up_then_declared_elsewhere() -> None:
        nonlocal done
        await look_up()
        async with declared:
            if not done:
                done = True
                await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', $2, $3)", qname,
                                    [f"$queue/{qname}/#", "orders/#"], CUSTOM)

    mgr.reload_queues = look_up_then_declared_elsewhere
    assert await mgr.publish(f"$queue/{qname}/a", b"x") == [(qname, 0)]
    mgr.reload_queues = look_up
    row = await queue_row(conn, qname)
    assert row["topics"] == [f"$queue/{qname}/#", "orders/#"]
    assert row["settings"]["retry"]["max_retries"] == 3
    assert mgr.queue_info(qname).topics == [f"$queue/{qname}/#", "orders/#"]


async def test_concurrent_if_absent_creates_make_one_queue(dsn, conn, qname):
    first = await db.connect(dsn)
    try:
        tx = first.transaction()
        await tx.start()
        qid = await first.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}', if_absent => true)", qname)
        second = asyncio.ensure_future(
            conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}', if_absent => true)", qname))
        await asyncio.sleep(0.3)
        assert not second.done()               # the name's lock: no unique violation, no overwrite
        await tx.commit()
        assert await asyncio.wait_for(second, 10) == qid
    finally:
        await first.close()
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", qname) == 1
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.heads WHERE queue_id = $1", qid) == 1
    assert await conn.fetchval("SELECT settings = fluxpg.default_settings('classic') FROM fluxpg.queues "
                               "WHERE id = $1", qid)


async def test_two_nodes_auto_create_one_queue_concurrently(manager_factory, conn, qname):
    """Both nodes find the name absent and both declare it: both publishes succeed, into one
    queue with the auto-create defaults."""
    a, b = await manager_factory(), await manager_factory()
    both_looked = asyncio.Barrier(2)
    for mgr in (a, b):
        declare = mgr._declare

        async def declare_together(qc, *, if_absent=False, declare=declare):
            await both_looked.wait()           # neither declares before both found the name absent
            return await declare(qc, if_absent=if_absent)

        mgr._declare = declare_together
    results = await asyncio.gather(a.publish(f"$queue/{qname}/a", b"from a"), b.publish(f"$queue/{qname}/b", b"from b"))
    assert sorted(results) == [[(qname, 0)], [(qname, 1)]]
    row = await queue_row(conn, qname)
    assert row["topics"] == [f"$queue/{qname}/#"]
    assert row["settings"] == await auto_created_settings(conn, qname, a)
    assert a.queue_info(qname).id == b.queue_info(qname).id == row["id"]
    inbox = Inbox()
    await a.subscribe(qname, "g", "c", on_delivery=inbox)
    assert sorted(d.payload for d in await inbox.wait_for(2)) == [b"from a", b"from b"]


async def test_explicit_declarations_still_update(manager_factory, conn, qname):
    mgr = await manager_factory()
    await mgr.publish(f"$queue/{qname}/a", b"x")                           # auto-created, defaults
    assert (await queue_row(conn, qname))["settings"] == await auto_created_settings(conn, qname, mgr)
    info = await mgr.declare_queue(QueueConfig(name=qname, retry={"max_retries": 4}))   # the API, AMQP
    assert info.settings["retry"]["max_retries"] == 4
    await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', $2, $3)", qname, ["orders/#"], CUSTOM)  # SQL
    row = await queue_row(conn, qname)
    assert (row["topics"], row["settings"]["retry"]["max_retries"]) == (["orders/#"], 3)
    await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}', if_absent => false)", qname)
    assert (await queue_row(conn, qname))["settings"]["retry"]["max_retries"] == 10   # the SQL default


async def test_first_dead_letter_keeps_a_dlq_declared_meanwhile(dsn, conn, qname):
    """The dead-letter queue is auto-created too (fluxpg._dlq_queue): a dlq.topic queue declared
    while a dead-lettering transaction looked it up keeps its settings (not the DLQ defaults)."""
    dead = f"dead-{qname}"
    await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, $2)", qname, {"dlq": {"topic": dead}})
    await conn.fetch("SELECT * FROM fluxpg.append($1, 'm')", f"$queue/{qname}/a")
    [seq] = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 1)", qname)]
    other = await db.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await other.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, $2)", dead,
                             {"limits": {"max_depth": 5}, **CUSTOM})
        rejected = asyncio.ensure_future(conn.fetchval("SELECT fluxpg.reject($1, 'g', $2)", qname, [seq]))
        await asyncio.sleep(0.3)
        assert not rejected.done()             # its DLQ creation waits for the declaration
        await tx.commit()
        await asyncio.wait_for(rejected, 10)
    finally:
        await other.close()
    row = await queue_row(conn, dead)
    assert (row["settings"]["limits"]["max_depth"], row["settings"]["retry"]["max_retries"]) == (5, 3)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                               "WHERE q.name = $1", dead) == 1
