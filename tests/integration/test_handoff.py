"""A publish handed to a consumer of the same node waiting for it: claimed inside the append's own
transaction (fluxpg.append_claim, LocalHandoff), with the queue semantics of an ordinary claim."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

import fluxpg
from fluxpg.aio import cancel_and_wait
from fluxpg.config import QueueConfig
from fluxpg.queues import manager as manager_module
from fluxpg.queues.appender import Appender, AppendRow, ClaimTarget
from tests.helpers import Inbox, claim, declare, publish_many


async def until_idle(mgr, *subs) -> None:
    """Until every subscription waits for a wake-up (the state in which it can be handed messages)."""
    async def loop():
        while not all(s in mgr._idle.get(s.queue_id, {}) for s in subs):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(loop(), 10)


async def test_publish_to_a_waiting_consumer_is_claimed_in_the_append(manager_factory, conn, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    sub = await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=100)
    for i in range(20):
        await until_idle(mgr, sub)
        await mgr.publish(f"$queue/{qname}/k", b"%d" % i)
        await inbox.wait_for(i + 1)
    assert [d.payload for d in inbox.items] == [b"%d" % i for i in range(20)]
    assert [d.seq for d in inbox.items] == list(range(20))
    assert mgr.appender.handed == 20
    # Each is pending for the consumer it went to, delivered once, as after fluxpg.claim.
    rows = await conn.fetch("SELECT seq, consumer, delivery_count FROM fluxpg.pending_entries WHERE queue = $1 "
                            "ORDER BY seq", qname)
    assert [tuple(r) for r in rows] == [(i, "c", 1) for i in range(20)]
    assert await mgr.ack(qname, "g", list(range(20))) == 20


async def test_handoff_gives_each_group_every_message_and_one_consumer_each(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    a1, a2, b = Inbox(), Inbox(), Inbox()
    subs = [await mgr.subscribe(qname, "ga", "a1", on_delivery=a1, credit=1000),
            await mgr.subscribe(qname, "ga", "a2", on_delivery=a2, credit=1000),
            await mgr.subscribe(qname, "gb", "b", on_delivery=b, credit=1000)]
    await until_idle(mgr, *subs)
    for _ in range(5):
        await asyncio.gather(*(mgr.publish(f"$queue/{qname}/k", b"x") for _ in range(20)))
    await b.wait_for(100)
    deadline = asyncio.get_running_loop().time() + 10
    while len(a1.items) + len(a2.items) < 100 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    ga = sorted(d.seq for d in a1.items + a2.items)
    assert ga == list(range(100))                       # each message once in group ga
    assert [d.seq for d in b.items] == list(range(100))  # and every one, in order, in group gb
    for inbox in (a1, a2):
        assert [d.seq for d in inbox.items] == sorted(d.seq for d in inbox.items)
    assert mgr.appender.handed > 0


async def test_a_failing_claim_does_not_fail_the_publish(dsn, conn, qname):
    """A target whose claim raises (here: an empty consumer name) makes the batch retry without
    claims; the publish commits and the target is told nothing was claimed."""
    qid = await declare(conn, qname)
    assert await claim(conn, qname, "g", "c", 5) == []   # the group exists: the claim is tried
    told = []

    class BadHandoff:
        def plan(self, queue_ids):
            return [ClaimTarget(qname, "g", "", 5)]

        def done(self, queue_ids, targets, claimed):
            told.append(claimed)

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    appender = Appender(pool, handoff=BadHandoff())
    appender.start()
    try:
        [(q, part, seq)] = await appender.append([AppendRow(qid, f"$queue/{qname}/k", b"x", None)])
        assert (q, part, seq) == (qid, 0, 0)
        assert told == [None]
        assert appender.handed == 0
    finally:
        await appender.close()
        await pool.close()
    assert await claim(conn, qname, "g", "c", 5) == [0]


async def test_append_claim_skips_a_busy_cursor_without_waiting(dsn, conn, qname):
    await declare(conn, qname)
    await claim(conn, qname, "g", "c", 1)               # creates the group
    holder = await asyncpg.connect(dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id "
                             "JOIN fluxpg.queues q ON q.id = g.queue_id WHERE q.name = $1 FOR UPDATE", qname)
        # A wait would hit the lock timeout and raise: the target is skipped instead.
        await conn.execute("SET lock_timeout = '5s'")
        qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
        rows = await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7)",
                                [qid], [f"$queue/{qname}/k"], [b"x"], [qname], ["g"], ["c"], [10])
        assert [tuple(r) for r in rows] == [(0, 0)]
        await tx.rollback()
    finally:
        await conn.execute("RESET lock_timeout")
        await holder.close()
    assert await claim(conn, qname, "g", "c", 10) == [0]


async def test_append_claim_leaves_due_redeliveries_to_the_consumer(conn, qname):
    """Redeliveries go first: with one due, the append does not claim (the consumer's own claim
    then takes the redelivery before the new message)."""
    await declare(conn, qname, settings={"retry": {"initial_backoff": "0s", "max_backoff": "0s"}})
    await publish_many(conn, qname, 1)
    assert await claim(conn, qname, "g", "c", 1) == [0]
    assert await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[0]::bigint[])", qname) == 1
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    rows = await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7)",
                            [qid], [f"$queue/{qname}/k"], [b"x"], [qname], ["g"], ["c"], [10])
    assert [tuple(r) for r in rows] == [(0, 1)]
    got = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'c', 10)", qname)
    assert [tuple(r) for r in got] == [(0, 2), (1, 1)]


async def test_append_claim_returns_the_claim_in_its_transaction(conn, qname):
    await declare(conn, qname)
    await claim(conn, qname, "g", "c", 1)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    rows = await conn.fetch("SELECT r_target, r_ord, r_seq, r_payload, r_delivery_count FROM "
                            "fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7)",
                            [qid] * 3, [f"$queue/{qname}/k"] * 3, [b"a", b"b", b"c"], [qname], ["g"], ["c"], [2])
    assert [tuple(r) for r in rows] == [(0, 1, 0, None, None), (0, 2, 1, None, None), (0, 3, 2, None, None),
                                        (1, None, 0, b"a", 1), (1, None, 1, b"b", 1)]
    assert await claim(conn, qname, "g", "c", 10) == [2]


@pytest.mark.parametrize("tag, woken", [("@999999", True), (None, False)])
async def test_own_tagged_notify_is_not_a_second_wake_up(manager_factory, qname, tag, woken):
    """The listener skips append_claim's NOTIFY from its own node (woken at commit already) and
    wakes on another node's."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    qid = mgr.queues[qname].id
    before = mgr._wake_state(qid)
    mgr._on_log_notify(f"{qid},{tag or '@' + str(mgr.node_id)}")
    assert (mgr._wake_state(qid) != before) is woken


async def test_messages_handed_to_a_subscription_that_went_away_are_released(manager_factory, conn, qname):
    """The subscription's task ends while the append claims for it: what was claimed is released
    at once (due again), not left pending until the visibility timeout."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    gone = Inbox()
    sub = await mgr.subscribe(qname, "g", "c1", on_delivery=gone, credit=10)
    await until_idle(mgr, sub)
    handoff = mgr.appender._handoff
    plan = handoff.plan

    def plan_then_cancel(queue_ids):
        targets = plan(queue_ids)
        sub._task.cancel()            # gone before the append's transaction returns
        return targets

    handoff.plan = plan_then_cancel
    await mgr.publish(f"$queue/{qname}/k", b"m")
    handoff.plan = plan
    assert mgr.appender.handed == 1 and gone.items == []
    async def released():   # fluxpg.release: visible at once (visible_at -infinity), same consumer
        while not await conn.fetchval("SELECT count(*) FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id "
                                      "JOIN fluxpg.queues q ON q.id = g.queue_id WHERE q.name = $1 "
                                      "AND p.visible_at = '-infinity'", qname):
            await asyncio.sleep(0.02)
    await asyncio.wait_for(released(), 10)
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c2", on_delivery=inbox, credit=10)
    [d] = await inbox.wait_for(1)
    assert (d.seq, d.payload) == (0, b"m")


async def test_a_due_redelivery_is_not_left_for_the_poll(manager_factory, conn, qname):
    """A publish while a redelivery is due (its visibility timeout passed, no wake-up for that):
    append_claim skips the consumer, which then claims at once — the redelivery first, then the
    new message — instead of waiting for the next poll."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    await mgr.publish(f"$queue/{qname}/k", b"old")
    assert [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, $1, 'other', 1)", qname)] == [0]
    inbox = Inbox()
    mgr_poll, manager_module.CLASSIC_POLL = manager_module.CLASSIC_POLL, 60.0   # read when the subscription starts
    try:
        sub = await mgr.subscribe(qname, qname, "c", on_delivery=inbox, credit=10)
        await until_idle(mgr, sub)
        # Due now, as after its visibility timeout: nothing wakes the consumer for it.
        await conn.execute("UPDATE fluxpg.pending p SET visible_at = now() - interval '1 second' FROM fluxpg.groups g "
                           "WHERE g.id = p.group_id AND g.name = $1", qname)
        await mgr.publish(f"$queue/{qname}/k", b"new")
        got = await inbox.wait_for(2, timeout=5)     # far below the (raised) poll interval
    finally:
        manager_module.CLASSIC_POLL = mgr_poll
    assert [(d.seq, d.payload, d.delivery_count) for d in got] == [(0, b"old", 2), (1, b"new", 1)]


async def test_transactional_publish_is_claimed_in_the_sequencer_round(manager_factory, conn, qname):
    """fluxpg.publish inside an application transaction: the sequencer's move into the log claims
    for this node's waiting consumer in the same transaction (fluxpg.sequence_claim), in commit
    order, pending for that consumer as after fluxpg.claim."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    sub = await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=100)
    for i in range(10):
        await until_idle(mgr, sub)
        async with conn.transaction():
            assert await fluxpg.publish(conn, f"$queue/{qname}/k", b"%d" % i) == [qname]
        await inbox.wait_for(i + 1)
    assert [d.payload for d in inbox.items] == [b"%d" % i for i in range(10)]
    # The first move only makes the queue a candidate; the later ones hand off.
    assert mgr.sequencer.handed >= 8
    rows = await conn.fetch("SELECT seq, consumer, delivery_count FROM fluxpg.pending_entries WHERE queue = $1 "
                            "ORDER BY seq", qname)
    assert [tuple(r) for r in rows] == [(i, "c", 1) for i in range(10)]
    assert await mgr.ack(qname, "g", list(range(10))) == 10


async def test_a_sequencer_round_that_moves_nothing_into_a_queue_frees_its_consumer(manager_factory, conn, qname):
    """A consumer reserved by a sequencer round that moved nothing into its queue is not left
    reserved: the next direct publish still hands off to it, and nothing is delivered twice."""
    other = qname + "_other"
    mgr = await manager_factory([QueueConfig(name=qname), QueueConfig(name=other)])
    await cancel_and_wait([mgr.sequencer._task])  # rounds only when the test says
    inbox = Inbox()
    sub = await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=100)
    async with conn.transaction():
        await fluxpg.publish(conn, f"$queue/{qname}/k", b"tx")
    await mgr.sequencer.run_once()
    await inbox.wait_for(1)                       # the queue is now a recent sequencer target
    for i in range(5):
        await until_idle(mgr, sub)
        async with conn.transaction():            # a round that moves into the other queue only
            await fluxpg.publish(conn, f"$queue/{other}/k", b"o")
        await mgr.sequencer.run_once()
        assert sub._handoff is None               # not left reserved by that round
        await mgr.publish(f"$queue/{qname}/k", b"%d" % i)
        await inbox.wait_for(i + 2)
    assert [d.payload for d in inbox.items] == [b"tx"] + [b"%d" % i for i in range(5)]
    assert mgr.appender.handed == 5
