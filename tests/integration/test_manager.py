"""The Python queue manager and the embedding API: group commit, routing, ephemeral queues,
NOTIFY wake-ups across nodes, crashes and lost connections."""
from __future__ import annotations

import asyncio

import pytest

import fluxpg
from fluxpg import db
from fluxpg.config import QueueConfig
from fluxpg.queues import manager as manager_module
from fluxpg.errors import PayloadTooLarge, QueueFull, UnknownQueue


class Inbox:
    def __init__(self):
        self.items = []
        self._changed = asyncio.Event()

    def __call__(self, delivery):
        self.items.append(delivery)
        self._changed.set()

    async def wait_for(self, n: int, timeout: float = 10.0):
        async def loop():
            while len(self.items) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(loop(), timeout)
        return self.items


async def test_group_commit_coalesces_and_keeps_publish_order(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    results = await asyncio.gather(*(mgr.publish(f"$queue/{qname}/k", b"%d" % i) for i in range(300)))
    assert [r for [(q, r)] in results] == list(range(300))    # handed in order → committed in order
    assert mgr.appender.batches < 100                          # coalesced into few transactions
    inbox = Inbox()
    await mgr.subscribe(qname, "g", "c", on_delivery=inbox, credit=None)
    got = await inbox.wait_for(300)
    assert [d.payload for d in got] == [b"%d" % i for i in range(300)]


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


async def test_ephemeral_queue_when_nothing_matches(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname)])
    # Published before any consumer: buffered, not dropped.
    assert await mgr.publish(f"$queue/eph-{qname}/a", b"early") == [(f"eph-{qname}", 0)]
    inbox = Inbox()
    sub = await mgr.subscribe(f"eph-{qname}", "g", "c", on_delivery=inbox)
    assert sub.kind == "ephemeral"
    await mgr.publish(f"$queue/eph-{qname}/b", b"late")
    got = await inbox.wait_for(2)
    assert [d.payload for d in got] == [b"early", b"late"]
    assert await mgr.ack(f"eph-{qname}", "g", [0]) == 0              # no acknowledgements
    await sub.close()
    mgr.ephemeral.grace = 0
    assert mgr.ephemeral.reap() == [f"eph-{qname}"]


async def test_reserved_mqtt_queue_when_no_queues_are_configured(manager_factory, conn, qname):
    mgr = await manager_factory([])
    [(queue, _offset)] = await mgr.publish(f"$queue/{qname}/x", b"p")
    assert queue == "mqtt"
    assert await conn.fetchval("SELECT kind FROM fluxpg.queues WHERE name = 'mqtt'") == "classic"


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
    with pytest.raises(fluxpg.InvalidArgument):
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
    assert queue == f"unbound-{qname}"          # not the leftover catch-all: an ephemeral queue
    [(queue, _)] = await (await manager_factory([])).publish(f"$queue/unbound-{qname}/x", b"p")
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
