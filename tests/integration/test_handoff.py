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
        notify_tag = None

        def plan(self, queue_ids, carry_acks=False):
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

    def plan_then_cancel(queue_ids, **kw):
        targets = plan(queue_ids, **kw)
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


async def _claim_calls_in(conn, fn):
    """Run fn() in one transaction with function tracking on; how often fluxpg.claim ran in it."""
    async with conn.transaction():
        await conn.execute("SET LOCAL track_functions = 'all'")
        result = await fn()
        calls = await conn.fetchval("SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
                                    "WHERE schemaname = 'fluxpg' AND funcname = 'claim'")
    return result, calls


async def test_append_claim_at_the_head_writes_the_claim_without_reading_the_log(conn, qname):
    """The group's cursor at the first appended offset: the claim is written from the batch
    itself (no fluxpg.claim call) and is what fluxpg.claim would have written and returned."""
    await declare(conn, qname)
    other = f"{qname}_o"
    await declare(conn, other)
    assert await claim(conn, qname, "g", "c", 1) == []
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    oid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", other)

    async def append():
        return await conn.fetch(
            "SELECT r_target, r_ord, r_queue_id, r_seq, r_topic, r_payload, r_headers, r_created_at, r_delivery_count "
            "FROM fluxpg.append_claim($1, $2, $3, $4, NULL, $5, $6, $7, $8)",
            [qid, oid, qid, qid], [f"$queue/{qname}/a", f"$queue/{other}/x", f"$queue/{qname}/b", f"$queue/{qname}/c"],
            [b"a", b"x", b"b", b"c"], [{"h": 1}, None, None, {"h": 3}], [qname], ["g"], ["c"], [2])

    rows, calls = await _claim_calls_in(conn, append)
    assert calls == 0
    assert [tuple(r)[:4] for r in rows[:4]] == [(0, 1, qid, 0), (0, 2, oid, 0), (0, 3, qid, 1), (0, 4, qid, 2)]
    handed = [(r["r_target"], r["r_queue_id"], r["r_seq"], r["r_topic"], bytes(r["r_payload"]), r["r_headers"],
               r["r_delivery_count"]) for r in rows[4:]]
    assert handed == [(1, qid, 0, f"$queue/{qname}/a", b"a", {"h": 1}, 1), (1, qid, 1, f"$queue/{qname}/b", b"b", None, 1)]
    logged = await conn.fetch("SELECT seq, created_at FROM fluxpg.log WHERE queue_id = $1 ORDER BY seq", qid)
    assert [r["r_created_at"] for r in rows[4:]] == [r["created_at"] for r in logged[:2]]
    pending = await conn.fetch("SELECT p.seq, p.consumer, p.delivery_count, p.visible_at - p.delivered_at AS vt "
                               "FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id "
                               "WHERE g.queue_id = $1 AND g.name = 'g' ORDER BY p.seq", qid)
    assert [(r["seq"], r["consumer"], r["delivery_count"]) for r in pending] == [(0, "c", 1), (1, "c", 1)]
    assert {str(r["vt"]) for r in pending} == {"0:00:30"}
    # The cursor went past what was taken (n = 2), not past the third message.
    assert await claim(conn, qname, "g", "c", 10) == [2]


async def test_sequencer_round_at_the_head_writes_the_claim_without_reading_the_log(dsn, conn, qname):
    """fluxpg.sequence_claim: messages of two committed application transactions, the group's
    cursor at the first offset the round appends. The claim is written from the moved rows (no
    fluxpg.claim call), in commit order, and is what fluxpg.claim would have written: pending
    for the consumer, the cursor past what was taken (n = 2 of 3)."""
    await declare(conn, qname)
    other = f"{qname}_o"
    await declare(conn, other)
    assert await claim(conn, qname, "g", "c", 1) == []
    app = await asyncpg.connect(dsn)
    try:
        # A message of another queue between them: the round appends to two queues (append_batch's
        # general path), and each handed message must still carry its own offset.
        for batch in ([(qname, b"a"), (other, b"x"), (qname, b"b")], [(qname, b"c")]):
            async with app.transaction():
                for q, p in batch:
                    await fluxpg.publish(app, f"$queue/{q}/k", p, {"p": p.decode()})
    finally:
        await app.close()

    async def round_():
        return await conn.fetch("SELECT r_target, r_queue_id, r_seq, r_payload, r_headers, r_delivery_count "
                                "FROM fluxpg.sequence_claim(100, $1, $2, $3, $4)", [qname], ["g"], ["c"], [2])

    rows, calls = await _claim_calls_in(conn, round_)
    assert calls == 0
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    oid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", other)
    # (0, count) per queue moved into; the count is in r_seq.
    assert sorted((r["r_queue_id"], r["r_seq"]) for r in rows if r["r_target"] == 0) == sorted([(qid, 3), (oid, 1)])
    assert [(r["r_target"], r["r_seq"], bytes(r["r_payload"]), r["r_headers"], r["r_delivery_count"])
            for r in rows if r["r_target"] != 0] == [(1, 0, b"a", {"p": "a"}, 1), (1, 1, b"b", {"p": "b"}, 1)]
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log WHERE queue_id = $1", qid) == 3
    pending = await conn.fetch("SELECT seq, consumer, delivery_count FROM fluxpg.pending_entries WHERE queue = $1 "
                               "ORDER BY seq", qname)
    assert [tuple(r) for r in pending] == [(0, "c", 1), (1, "c", 1)]
    assert await claim(conn, qname, "g", "c", 10) == [2]


async def test_sequencer_round_with_a_backlog_or_a_refusal_claims_through_fluxpg_claim(dsn, conn, qname):
    """The cursor behind the moved rows (a backlog), or a round that went message by message
    after a queue refused the batch (full): fluxpg.claim runs, oldest first, nothing skipped."""
    await declare(conn, qname, settings={"limits": {"max_depth": 4}})
    assert await claim(conn, qname, "g", "c", 1) == []
    await publish_many(conn, qname, 2)
    app = await asyncpg.connect(dsn)
    try:
        async with app.transaction():
            for p in (b"x", b"y", b"z"):     # 5 waiting in all: the batch does not fit, x and y do
                await fluxpg.publish(app, f"$queue/{qname}/k", p)
    finally:
        await app.close()

    async def round_():
        return await conn.fetch("SELECT r_target, r_seq FROM fluxpg.sequence_claim(100, $1, $2, $3, $4)",
                                [qname], ["g"], ["c"], [10])

    rows, calls = await _claim_calls_in(conn, round_)
    assert calls == 1
    assert [tuple(r) for r in rows] == [(0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox o JOIN fluxpg.queues q ON q.id = o.queue_id "
                               "WHERE q.name = $1", qname) == 1     # z waits, in order, for room
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, [0, 1, 2, 3]) == 4
    assert await conn.fetchval("SELECT fluxpg.sequence_staged()") == 1
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.outbox_commits") == 0   # the markers went with z
    assert [(r["seq"], bytes(r["payload"])) for r in await conn.fetch(
        "SELECT seq, payload FROM fluxpg.claim($1, 'g', 'c', 10)", qname)] == [(4, b"z")]


async def test_append_claim_with_a_backlog_claims_the_oldest_first(conn, qname):
    """The cursor behind the batch (a backlog): fluxpg.claim runs, oldest messages first."""
    await declare(conn, qname)
    assert await claim(conn, qname, "g", "c", 1) == []
    await publish_many(conn, qname, 3)
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)

    async def append():
        return await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7)",
                                [qid], [f"$queue/{qname}/k"], [b"n"], [qname], ["g"], ["c"], [2])

    rows, calls = await _claim_calls_in(conn, append)
    assert calls == 1
    assert [tuple(r) for r in rows] == [(0, 3), (1, 0), (1, 1)]


async def test_append_claim_does_not_hand_over_a_message_expired_on_arrival(conn, qname):
    """x-amqp-expiration 0 expires at once: fluxpg.claim passes over it, so must the handoff."""
    await declare(conn, qname)
    assert await claim(conn, qname, "g", "c", 1) == []
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    rows = await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, $4, NULL, $5, $6, $7, $8)",
                            [qid, qid], [f"$queue/{qname}/k"] * 2, [b"a", b"b"],
                            [{"x-amqp-expiration": "0"}, None], [qname], ["g"], ["c"], [10])
    assert [tuple(r) for r in rows] == [(0, 0), (0, 1), (1, 1)]


async def test_append_claim_near_max_pending_takes_no_more_than_the_cap(conn, qname):
    await declare(conn, qname, settings={"delivery": {"max_pending": 3}})
    assert await claim(conn, qname, "g", "c", 1) == []
    await publish_many(conn, qname, 2)
    assert await claim(conn, qname, "g", "c", 10) == [0, 1]
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    rows = await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7)",
                            [qid] * 3, [f"$queue/{qname}/k"] * 3, [b"a", b"b", b"c"], [qname], ["g"], ["c"], [10])
    assert [tuple(r) for r in rows] == [(0, 2), (0, 3), (0, 4), (1, 2)]


async def test_acks_not_yet_written_ride_in_the_handoff_append(manager_factory, conn, qname):
    """A waiting consumer's acks its front-end has not written (Subscription.carry_acks) are
    applied in the append that claims for it, and the front-end is told they were written."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    sub = await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=100)
    await until_idle(mgr, sub)
    await mgr.publish(f"$queue/{qname}/k", b"0")
    await inbox.wait_for(1)
    told = []
    unwritten = [[0]]

    def carry():
        if not unwritten:
            return None
        return unwritten.pop(), told.append

    sub.carry_acks = carry
    await until_idle(mgr, sub)
    await mgr.publish(f"$queue/{qname}/k", b"1")
    await inbox.wait_for(2)
    assert told == [None] and mgr.appender.handed == 2
    rows = await conn.fetch("SELECT seq FROM fluxpg.pending_entries WHERE queue = $1 ORDER BY seq", qname)
    assert [r["seq"] for r in rows] == [1]


async def test_append_claim_applies_the_carried_acks_before_claiming(conn, qname):
    await declare(conn, qname)
    assert await claim(conn, qname, "g", "c", 1) == []
    await publish_many(conn, qname, 3)
    assert await claim(conn, qname, "g", "c", 10) == [0, 1, 2]
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    rows = await conn.fetch("SELECT r_target, r_seq FROM fluxpg.append_claim($1, $2, $3, NULL, NULL, $4, $5, $6, $7, $8, $9)",
                            [qid], [f"$queue/{qname}/k"], [b"n"], [qname], ["g"], ["c"], [10], [1, 1], [0, 2])
    assert [tuple(r) for r in rows] == [(0, 3), (1, 3)]
    left = await conn.fetch("SELECT seq FROM fluxpg.pending_entries WHERE queue = $1 ORDER BY seq", qname)
    assert [r["seq"] for r in left] == [1, 3]
