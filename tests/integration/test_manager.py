"""The Python queue manager and the embedding API: group commit, routing, auto-created and
transient queues, NOTIFY wake-ups across nodes, crashes and lost connections."""
from __future__ import annotations

import asyncio

import pytest

import fluxpg
from fluxpg import db
from fluxpg.config import QueueConfig
from fluxpg.queues import appender as appender_module
from fluxpg.queues import manager as manager_module
from fluxpg.errors import PayloadTooLarge, QueueFull, ResourceLocked, UnknownQueue, WrongQueueKind
from tests.helpers import Inbox


async def test_group_commit_coalesces_and_keeps_publish_order(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    results = await asyncio.gather(*(mgr.publish(f"$queue/{qname}/k", b"%d" % i) for i in range(300)))
    assert [r for [(q, r)] in results] == list(range(300))    # handed in order → committed in order
    assert mgr.appender.batches < 100                          # coalesced into few transactions
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=None)
    got = await inbox.wait_for(300)
    assert [d.payload for d in got] == [b"%d" % i for i in range(300)]


async def test_appender_keeps_its_connection_and_replaces_a_broken_one(manager_factory, conn, qname):
    """The group commit runs its batches on one pool connection it holds (no acquire/release per
    batch); a connection that broke meanwhile is given back and replaced, the publish goes on."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    await mgr.publish(f"$queue/{qname}/k", b"0")
    held = mgr.appender._conn
    assert held is not None
    await mgr.publish(f"$queue/{qname}/k", b"1")
    assert mgr.appender._conn is held
    assert await conn.fetchval("SELECT pg_terminate_backend($1)", held.get_server_pid())
    async def closed():
        while not appender_module._broken(held):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(closed(), 10)
    assert await mgr.publish(f"$queue/{qname}/k", b"2") == [(qname, 2)]
    assert mgr.appender._conn is not held and not appender_module._broken(mgr.appender._conn)
    await mgr.close()
    assert mgr.appender._conn is None


async def test_one_bad_publish_fails_alone_in_a_batch(manager_factory, qname):
    small = QueueConfig(name=qname, limits={"max_depth": 5})
    mgr = await manager_factory([small])
    results = await asyncio.gather(*(mgr.publish(f"$queue/{qname}/k", b"x") for i in range(8)),
                                   return_exceptions=True)
    ok = [r for r in results if isinstance(r, list)]
    full = [r for r in results if isinstance(r, QueueFull)]
    assert len(ok) == 5 and len(full) == 3
    assert sorted(seq for [(q, seq)] in ok) == [0, 1, 2, 3, 4]
    with pytest.raises(PayloadTooLarge):
        await (await manager_factory([QueueConfig(name=qname + "s", limits={"max_message_size": 4})])).publish(
            f"$queue/{qname}s/x", b"12345")


async def test_deliveries_carry_the_design_properties(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    await mgr.publish(f"$queue/{qname}/eu/images", b"p", {"x": "1"})
    inbox = Inbox()
    await mgr.subscribe(qname, "workers", "w1", filter="eu/#", on_delivery=inbox)
    [d] = await inbox.wait_for(1)
    assert d.properties() == {"message-id": f"{qname}:0", "group-id": "workers@eu/#", "queue": qname,
                              "offset": "0", "x-source-topic": f"$queue/{qname}/eu/images"}
    assert d.headers == {"x": "1"}


async def test_stream_deliveries_carry_stream_and_work_properties(manager_factory, conn, qname):
    mgr = await manager_factory([QueueConfig(name=qname, type="stream", primary_group="work")])
    for i in range(3):
        await mgr.publish(f"$queue/{qname}/e", b"%d" % i)
    # The primary (work) group has processed offsets 0 and 1.
    await conn.fetch("SELECT * FROM fluxpg.read($1, 'work', 'w', 2)", qname)
    await conn.fetchval("SELECT fluxpg.commit($1, 'work', 2)", qname)
    inbox = Inbox()
    await mgr.subscribe(qname, "audit", "a1", on_delivery=inbox, position="first")
    got = await inbox.wait_for(3)
    props = [d.properties() for d in got]
    assert [p["x-stream-offset"] for p in props] == ["0", "1", "2"]
    assert all(int(p["x-stream-timestamp"]) > 1.7e12 for p in props)
    assert [p["x-work-acked"] for p in props] == ["true", "true", "false"]
    assert {p["x-work-committed-offset"] for p in props} == {"2"} and props[0]["x-work-group"] == "work"


async def test_credit_limits_unacked_deliveries(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    for i in range(5):
        await mgr.publish(f"$queue/{qname}/k", b"x")
    inbox = Inbox()
    sub = await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=2)
    await inbox.wait_for(2)
    await asyncio.sleep(0.3)
    assert len(inbox.items) == 2
    await mgr.ack(qname, "g", [inbox.items[0].seq])
    sub.grant(1)
    await inbox.wait_for(3)


async def test_durable_queue_auto_created_when_nothing_matches(manager_factory, conn, qname):
    """Default config (auto_create: durable): a publish to an unlisted name creates a durable
    classic queue, and what it confirmed is in the log (it was an in-memory queue before)."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    name = f"auto-{qname}"
    assert await mgr.publish(f"$queue/{name}/a", b"early") == [(name, 0)]
    assert tuple(await conn.fetchrow("SELECT kind, durability FROM fluxpg.queues WHERE name = $1", name)) \
        == ("classic", "durable")
    inbox = Inbox()
    sub = await mgr.subscribe(name, "g", "c", on_delivery=inbox)
    assert sub.kind == "classic"
    await mgr.publish(f"$queue/{name}/b", b"late")
    got = await inbox.wait_for(2)
    assert [d.payload for d in got] == [b"early", b"late"]
    rows = await conn.fetch("SELECT l.seq, l.payload, l.tableoid::regclass::text AS part FROM fluxpg.log l "
                            "JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = $1 ORDER BY l.seq", name)
    assert [(r["seq"], r["payload"]) for r in rows] == [(0, b"early"), (1, b"late")]
    assert all(r["part"] != "fluxpg.log_transient" for r in rows)
    assert await mgr.ack(name, "g", [0, 1]) == 2                        # real acknowledgements
    await sub.close()
    # A consumer first also creates it (durably), before anything was published.
    await mgr.subscribe(f"sub-{qname}", "g", "c", on_delivery=Inbox())
    assert await conn.fetchval("SELECT durability FROM fluxpg.queues WHERE name = $1", f"sub-{qname}") == "durable"


async def test_auto_create_off_refuses(manager_factory, conn, qname):
    mgr = await manager_factory([QueueConfig(name=qname)], auto_create="off")
    with pytest.raises(UnknownQueue):
        await mgr.publish(f"$queue/nope-{qname}/a", b"x")
    with pytest.raises(UnknownQueue):
        await mgr.subscribe(f"nope-{qname}", "g", "c", on_delivery=Inbox())
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", f"nope-{qname}") == 0
    assert await mgr.publish(f"$queue/{qname}/a", b"x") == [(qname, 0)]   # configured queues work


async def test_auto_create_transient(manager_factory, conn, qname):
    mgr = await manager_factory([QueueConfig(name=qname)], auto_create="transient")
    name = f"tr-{qname}"
    assert await mgr.publish(f"$queue/{name}/a", b"one") == [(name, 0)]
    row = await conn.fetchrow("SELECT kind, durability, owner_node FROM fluxpg.queues WHERE name = $1", name)
    assert tuple(row) == ("classic", "transient", mgr.node_id)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_transient l JOIN fluxpg.queues q ON q.id = l.queue_id "
                               "WHERE q.name = $1", name) == 1
    stats = {r["queue"]: r for r in await mgr.queue_stats()}
    assert (stats[name]["kind"], stats[name]["depth"]) == ("transient", 1)


async def test_reserved_catch_all_queue_when_configured(manager_factory, conn, qname):
    """No implicit catch-all any more: with no queues configured a name gets its own queue;
    a config that declares a reserved catch-all (FluxMQ) still sends unmatched publishes there."""
    mgr = await manager_factory([])
    [(queue, _offset)] = await mgr.publish(f"$queue/{qname}/x", b"p")
    assert queue == qname
    catch_all = QueueConfig(name=f"all-{qname}", topics=["$queue/#"], reserved=True)
    mgr = await manager_factory([catch_all])
    [(queue, _offset)] = await mgr.publish(f"$queue/other-{qname}/x", b"p")
    assert queue == f"all-{qname}"
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", f"other-{qname}") == 0


async def test_transient_queue_api(manager_factory, conn, qname):
    """declare_transient / delete_transient / release: the API the front-ends share."""
    mgr = await manager_factory([QueueConfig(name=qname)])
    name = f"t-{qname}"
    info = await mgr.declare_transient(name, owner="conn-1", auto_delete=True)
    assert (info.transient, info.owner, info.auto_delete, info.display_kind) == (True, "conn-1", True, "transient")
    assert (await mgr.declare_transient(name, owner="conn-1")).id == info.id       # idempotent
    with pytest.raises(ResourceLocked):
        await mgr.declare_transient(name, owner="conn-2")
    with pytest.raises(WrongQueueKind):
        await mgr.declare_transient(qname)                                         # durable name
    for i in range(4):
        await mgr.publish(f"$queue/{name}/k", b"%d" % i)
    inbox = Inbox()
    sub = await mgr.subscribe(name, "g", "c", on_delivery=inbox, credit=4)
    got = await inbox.wait_for(4)
    assert await mgr.queue_depth(name) == (4, 1)
    assert await mgr.ack(name, "g", [got[0].seq]) == 1
    # Acknowledged messages leave the unlogged partition at once.
    assert [r["seq"] for r in await conn.fetch(
        "SELECT seq FROM fluxpg.log_transient WHERE queue_id = $1 ORDER BY seq", info.id)] == [1, 2, 3]
    assert await mgr.release(name, "g", [3, 1, 2]) == 3
    sub.grant(3)
    again = await inbox.wait_for(7)
    assert [(d.seq, d.redelivered) for d in again[4:]] == [(1, True), (2, True), (3, True)]
    await sub.close()                                                  # auto-delete: last consumer gone
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", name) == 0
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_transient WHERE queue_id = $1", info.id) == 0
    assert mgr.queue_info(name) is None


async def test_transient_queues_go_with_their_node(manager_factory, conn, qname):
    node_a = await manager_factory([QueueConfig(name=qname)])
    node_b = await manager_factory([QueueConfig(name=qname)])
    await node_a.declare_transient(f"a-{qname}")
    await node_a.publish(f"$queue/a-{qname}", b"x")
    # The other node routes to it too (it is a row of fluxpg.queues, announced by NOTIFY).
    for _ in range(100):
        if node_b.queue_info(f"a-{qname}") is not None:
            break
        await asyncio.sleep(0.05)
    assert await node_b.publish(f"$queue/a-{qname}", b"y") == [(f"a-{qname}", 1)]
    await node_a.close()
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", f"a-{qname}") == 0
    for _ in range(100):
        if node_b.queue_info(f"a-{qname}") is None:
            break
        await asyncio.sleep(0.05)
    assert node_b.queue_info(f"a-{qname}") is None


async def test_transient_bytes_are_bounded(manager_factory, conn, qname):
    mgr = await manager_factory([QueueConfig(name=qname)], transient_max_bytes=1000)
    await mgr.declare_transient(f"b-{qname}")
    await mgr.publish(f"$queue/b-{qname}", b"x" * 600)
    with pytest.raises(QueueFull):
        await mgr.publish(f"$queue/b-{qname}", b"x" * 600)
    # Refused, not dropped silently: the first is there, the second never was.
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_transient l JOIN fluxpg.queues q ON q.id = l.queue_id "
                               "WHERE q.name = $1", f"b-{qname}") == 1
    inbox = Inbox()
    await mgr.subscribe(f"b-{qname}", "g", "c", on_delivery=inbox)
    [d] = await inbox.wait_for(1)
    await mgr.ack(f"b-{qname}", "g", [d.seq])                      # frees its bytes
    await mgr.publish(f"$queue/b-{qname}", b"x" * 600)


async def test_notify_wakes_a_consumer_on_another_node(manager_factory, qname, monkeypatch):
    # With the safety-net poll out of the way, only LISTEN/NOTIFY can deliver in time.
    monkeypatch.setattr(manager_module, "CLASSIC_POLL", 3600.0)
    consumer_node = await manager_factory([QueueConfig(name=qname)])
    publisher_node = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    await consumer_node.subscribe(qname, "g", "c", on_delivery=inbox)
    await asyncio.sleep(0.2)  # the consumer found nothing and waits
    for i in range(3):
        await publisher_node.publish(f"$queue/{qname}/k", b"%d" % i)
        await inbox.wait_for(i + 1, timeout=10)
    assert consumer_node.node_id != publisher_node.node_id


async def test_crashed_consumer_messages_come_back_after_visibility_timeout(manager_factory, dsn, qname):
    queue = QueueConfig(name=qname)
    crashed = await manager_factory([queue], visibility_timeout="1s")
    for i in range(5):
        await crashed.publish(f"$queue/{qname}/k", b"%d" % i)
    inbox = Inbox()
    await crashed.subscribe(qname, "g", "doomed", on_delivery=inbox, credit=10)
    await inbox.wait_for(5)
    # Kill the node's database connections mid-batch: nothing is acknowledged.
    killer = await db.connect(dsn)
    await killer.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    await killer.close()
    for sub in list(crashed.subscriptions):
        sub._closed = True
    survivor = await manager_factory([queue], visibility_timeout="1s")
    inbox2 = Inbox()
    await survivor.subscribe(qname, "g", "survivor", on_delivery=inbox2)
    got = await inbox2.wait_for(5, timeout=15)
    assert sorted(d.seq for d in got) == [0, 1, 2, 3, 4]
    assert all(d.delivery_count == 2 for d in got)


async def test_dead_node_pending_entries_are_released_at_once(manager_factory, conn, qname):
    queue = QueueConfig(name=qname)
    dead = await manager_factory([queue], visibility_timeout="1h")
    await dead.publish(f"$queue/{qname}/k", b"x")
    inbox = Inbox()
    await dead.subscribe(qname, "g", "on-dead-node", on_delivery=inbox)
    await inbox.wait_for(1)
    for sub in list(dead.subscriptions):
        await sub.close()
    # The node stops heart-beating (as after SIGKILL).
    await conn.execute("UPDATE fluxpg.nodes SET last_seen_at = now() - interval '1 hour' WHERE id = $1", dead.node_id)
    alive = await manager_factory([queue], visibility_timeout="1h", heartbeat_interval="200ms",
                                  heartbeat_timeout="1s")
    inbox2 = Inbox()
    await alive.subscribe(qname, "g", "on-live-node", on_delivery=inbox2)
    [d] = await inbox2.wait_for(1, timeout=10)
    assert (d.seq, d.delivery_count) == (0, 2)


async def test_manager_survives_lost_database_connections(manager_factory, dsn, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c", on_delivery=inbox)
    await mgr.publish(f"$queue/{qname}/k", b"before")
    await inbox.wait_for(1)
    killer = await db.connect(dsn)
    await killer.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    await killer.close()
    # Publishing may fail once while the pool notices; it must then work again, and the
    # consumer (whose LISTEN connection was killed too) must get the message.
    for attempt in range(20):
        try:
            await mgr.publish(f"$queue/{qname}/k", b"after")
            break
        except fluxpg.Unavailable:
            await asyncio.sleep(0.2)
    got = await inbox.wait_for(2, timeout=15)
    assert [d.payload for d in got] == [b"before", b"after"]


async def test_unknown_queue_errors(manager_factory):
    mgr = await manager_factory([])
    with pytest.raises(UnknownQueue):
        await mgr.ack("never-declared", "g", [1])
    # A plain topic no queue binds: refused like SQL's fluxpg.route (FP001), not auto-created.
    with pytest.raises(UnknownQueue, match="no queue is bound to topic 'plain/topic'"):
        await mgr.publish("plain/topic", b"x")


async def test_embedding_api_example(dsn, qname):
    async with fluxpg.connect(dsn, migrate=False) as broker:
        await broker.declare(qname, retry={"initial_backoff": "0s"})
        await broker.publish(f"$queue/{qname}/a", b"one")
        await broker.publish(f"$queue/{qname}/b", "two")
        await broker.publish(f"$queue/{qname}/c", b"three")
        seen = []
        async with broker.consume(qname, group="workers") as messages:
            async for msg in messages:
                seen.append((msg.payload, msg.delivery_count))
                if msg.payload == b"one":
                    await msg.ack()
                elif msg.payload == b"two" and msg.delivery_count == 1:
                    await msg.nack()
                elif msg.payload == b"two":
                    await msg.ack()
                else:
                    await msg.reject("no thanks")
                if len(seen) == 4:
                    break
        assert sorted(seen) == sorted([(b"one", 1), (b"two", 1), (b"three", 1), (b"two", 2)])
        [g] = await broker.groups(qname)
        assert (g["pending"], g["committed"]) == (0, 3)
        dlq = broker.consume(f"$dlq/{qname}", group="ops")
        msg = await dlq.get(timeout=10)
        assert msg.payload == b"three" and msg.headers["_dlq_reason"] == "no thanks"
        await dlq.close()


async def test_reserved_queue_only_takes_what_no_other_queue_does(manager_factory, conn, qname):
    # A database that once ran with no queues configured keeps its reserved `mqtt` queue; later
    # nodes with real queues must not fan every publish out to it (nor fill it up).
    await manager_factory([])
    mgr = await manager_factory([QueueConfig(name=qname)])
    assert await mgr.publish(f"$queue/{qname}/x", b"p") == [(qname, 0)]
    assert [tuple(r) for r in await conn.fetch("SELECT queue, seq FROM fluxpg.append($1, 'p')",
                                               f"$queue/{qname}/y")] == [(qname, 1)]
    [(queue, _)] = await mgr.publish(f"$queue/unbound-{qname}/x", b"p")
    assert queue == f"unbound-{qname}"          # not the leftover catch-all: a queue of its own
    catch_all = QueueConfig(name="mqtt", topics=["$queue/#"], reserved=True)
    [(queue, _)] = await (await manager_factory([catch_all])).publish(f"$queue/unbound2-{qname}/x", b"p")
    assert queue == "mqtt"                      # while it is configured, the catch-all takes it


async def test_consumer_of_a_dlq_that_does_not_exist_yet(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    inbox = Inbox()
    sub = await mgr.subscribe(f"$dlq/{qname}", "ops", "o1", on_delivery=inbox)
    assert sub.kind == "classic"
    await mgr.publish(f"$queue/{qname}/x", b"bad")
    worker = Inbox()
    await mgr.subscribe(qname, "g", "w", on_delivery=worker)
    [d] = await worker.wait_for(1)
    await mgr.reject(qname, "g", [d.seq], "poison")
    [dead] = await inbox.wait_for(1)
    assert dead.payload == b"bad" and dead.headers["_dlq_reason"] == "poison"


async def test_transient_queues_of_a_dead_node_are_removed_by_the_others(manager_factory, conn, qname):
    """A node killed without a clean stop: the others' heartbeat removes its node row, and with
    it (ON DELETE CASCADE, then the cleanup trigger) its transient queues, messages and pending
    entries. Durable queues are untouched."""
    dead = await manager_factory([QueueConfig(name=qname)])
    await dead.declare_transient(f"d-{qname}")
    for i in range(3):
        await dead.publish(f"$queue/d-{qname}", b"%d" % i)
        await dead.publish(f"$queue/{qname}/k", b"%d" % i)
    inbox = Inbox()
    await dead.subscribe(f"d-{qname}", "g", "c", on_delivery=inbox)
    await inbox.wait_for(3)
    qid = dead.queue_info(f"d-{qname}").id
    await conn.execute("UPDATE fluxpg.nodes SET last_seen_at = now() - interval '1 hour' WHERE id = $1", dead.node_id)
    await manager_factory([QueueConfig(name=qname)], heartbeat_interval="200ms", heartbeat_timeout="1s")
    for _ in range(100):
        if not await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE id = $1", qid):
            break
        await asyncio.sleep(0.1)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE id = $1", qid) == 0
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log_transient WHERE queue_id = $1", qid) == 0
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.pending_entries WHERE queue = $1", f"d-{qname}") == 0
    assert [r["payload"] for r in await conn.fetch(
        "SELECT l.payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = $1 ORDER BY l.seq",
        qname)] == [b"0", b"1", b"2"]
