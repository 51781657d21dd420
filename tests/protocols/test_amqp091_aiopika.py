"""aio-pika against a real fluxpg server: work queues, acks, confirms, returns, exchanges,
streams, manual commit, properties."""
from __future__ import annotations

import asyncio
import datetime as dt
import re

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from pamqp import constants as pamqp_constants
from pamqp.commands import Basic

from fluxpg.config import QueueConfig
from tests.helpers import nothing_pending, until


async def _connect(server, **kw) -> aio_pika.abc.AbstractRobustConnection:
    query = "&".join(f"{k}={v}" for k, v in kw.items())
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/?{query}")


async def _collect(queue, n: int, *, ack: bool = True, timeout: float = 10.0, **consume_kw) -> list[AbstractIncomingMessage]:
    got: list[AbstractIncomingMessage] = []
    done = asyncio.Event()

    async def on_message(msg: AbstractIncomingMessage) -> None:
        got.append(msg)
        if ack:
            await msg.ack()
        if len(got) >= n:
            done.set()

    tag = await queue.consume(on_message, **consume_kw)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await queue.cancel(tag)
    return got


@pytest.fixture
def widen_queue_names(monkeypatch):
    """pamqp (under aiormq) validates queue names client-side and refuses `$`, so aio-pika cannot
    send `$queue/…` or `$dlq/…` as shipped (FACTS.md); widen the pattern for this test only."""
    monkeypatch.setitem(pamqp_constants.DOMAIN_REGEX, "queue-name", re.compile(r"^[a-zA-Z0-9-_.:@#,/+ $]*$"))


async def test_handshake_capabilities_and_heartbeat(broker, qname):
    server = await broker()
    conn = await _connect(server, heartbeat=2)
    try:
        raw = conn.transport.connection
        caps = raw.server_properties["capabilities"]
        for cap in ("publisher_confirms", "basic.nack", "consumer_cancel_notify", "exchange_exchange_bindings",
                    "connection.blocked", "authentication_failure_close", "per_consumer_qos"):
            assert caps[cap] is True, cap
        assert raw.server_properties["product"] == "fluxpg"
        # Idle for longer than two heartbeat intervals: the server's heartbeats keep it alive.
        await asyncio.sleep(4.5)
        ch = await conn.channel()
        ch2 = await conn.channel()
        assert ch.number != ch2.number
        q = await ch.declare_queue(qname, durable=True)
        assert q.declaration_result.message_count == 0
        await ch.close()
        await ch2.default_exchange.publish(aio_pika.Message(b"x"), routing_key=qname)
    finally:
        await conn.close()


async def test_work_queue_prefetch_each_message_once(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    pub = await _connect(server)
    consumers = [await _connect(server) for _ in range(3)]
    try:
        ch = await pub.channel()
        n = 60
        await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=qname)
                               for i in range(n)))
        seen: list[str] = []
        outstanding = [0, 0, 0]
        peak = [0, 0, 0]
        done = asyncio.Event()

        def handler(k: int):
            async def on_message(msg: AbstractIncomingMessage) -> None:
                outstanding[k] += 1
                peak[k] = max(peak[k], outstanding[k])
                await asyncio.sleep(0.01)   # slow worker: the window fills
                seen.append(msg.body.decode())
                outstanding[k] -= 1
                await msg.ack()
                if len(seen) >= n:
                    done.set()
            return on_message

        for k, c in enumerate(consumers):
            cch = await c.channel()
            await cch.set_qos(prefetch_count=2)
            q = await cch.get_queue(qname, ensure=False)
            await q.consume(handler(k))
        await asyncio.wait_for(done.wait(), 20)
        await asyncio.sleep(0.3)   # room for a duplicate delivery to show
        assert sorted(seen, key=int) == [str(i) for i in range(n)]   # each exactly once
        assert max(peak) <= 2
        assert sum(1 for p in peak if p) >= 2   # the work was spread
        await until(lambda: nothing_pending(server, qname))   # acks are written by the settler a moment later
    finally:
        for c in consumers:
            await c.close()
        await pub.close()


async def test_nack_requeue_redelivers_and_reject_dead_letters(broker, qname, widen_queue_names):
    server = await broker([QueueConfig(name=qname, retry={"initial_backoff": "0s"})])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        await ch.default_exchange.publish(aio_pika.Message(b"job"), routing_key=qname)
        q = await ch.get_queue(qname, ensure=False)
        deliveries: list[AbstractIncomingMessage] = []
        got = asyncio.Event()

        async def on_message(msg: AbstractIncomingMessage) -> None:
            deliveries.append(msg)
            if len(deliveries) == 1:
                await msg.nack(requeue=True)
            elif len(deliveries) == 2:
                await msg.reject(requeue=False)
                got.set()

        tag = await q.consume(on_message)
        await asyncio.wait_for(got.wait(), 10)
        await q.cancel(tag)
        assert [d.redelivered for d in deliveries] == [False, True]
        assert deliveries[1].headers["message-id"] == f"{qname}:0"
        # The rejected message is in the dead-letter queue, with its provenance.
        dlq = await ch.get_queue(f"$dlq/{qname}", ensure=False)
        dead = None
        for _ in range(50):
            dead = await dlq.get(fail=False, no_ack=True)
            if dead is not None:
                break
            await asyncio.sleep(0.1)
        assert dead is not None and dead.body == b"job"
        assert dead.headers.get("_dlq_original_queue") == qname
    finally:
        await conn.close()


async def test_basic_get_and_multiple_ack(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(b"m%d" % i), routing_key=qname)
        q = await ch.get_queue(qname, ensure=False)
        m0 = await q.get(timeout=5)
        m1 = await q.get(timeout=5)
        assert (m0.body, m1.body) == (b"m0", b"m1")
        await m1.ack(multiple=True)   # acks m0 too
        m2 = await q.get(no_ack=True, timeout=5)
        assert m2.body == b"m2"
        assert await q.get(fail=False) is None   # get-empty
        await until(lambda: nothing_pending(server, qname))   # acks are written by the settler a moment later
    finally:
        await conn.close()


async def test_confirms_and_mandatory_return(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel(on_return_raises=True)
        ok = await ch.default_exchange.publish(aio_pika.Message(b"a"), routing_key=qname, mandatory=True)
        assert isinstance(ok, Basic.Ack)
        with pytest.raises(aio_pika.exceptions.DeliveryError) as err:
            await ch.default_exchange.publish(aio_pika.Message(b"b"), routing_key=f"{qname}-nowhere",
                                              mandatory=True)
        assert err.value.frame.reply_code == 312
        # The queue holds only the routed message, and the channel still works.
        q = await ch.get_queue(qname, ensure=False)
        got = await q.get(no_ack=True, timeout=5)
        assert got.body == b"a"
        ex = await ch.declare_exchange("unbound", aio_pika.ExchangeType.DIRECT)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ex.publish(aio_pika.Message(b"c"), routing_key="none", mandatory=True)
    finally:
        await conn.close()


async def test_topic_and_fanout_exchanges(broker, qname):
    q1, q2 = f"{qname}a", f"{qname}b"
    server = await broker([QueueConfig(name=q1), QueueConfig(name=q2)])
    conn = await _connect(server)
    other = await _connect(server)
    try:
        ch = await conn.channel()
        topic = await ch.declare_exchange("events", aio_pika.ExchangeType.TOPIC, durable=True)
        fan = await ch.declare_exchange("everyone", aio_pika.ExchangeType.FANOUT)
        a = await ch.declare_queue(q1, durable=True)
        b = await ch.declare_queue(q2, durable=True)
        await a.bind(topic, "orders.#")
        await b.bind(topic, "*.eu")
        await a.bind(fan)
        await b.bind(fan)
        await topic.publish(aio_pika.Message(b"both"), routing_key="orders.eu")
        await topic.publish(aio_pika.Message(b"only-a"), routing_key="orders.us")
        await fan.publish(aio_pika.Message(b"fan"), routing_key="")
        got_a = [m.body for m in await _collect(a, 3)]
        got_b = [m.body for m in await _collect(b, 2)]
        assert got_a == [b"both", b"only-a", b"fan"]
        assert got_b == [b"both", b"fan"]
        # Exchanges are per connection: another connection does not see them (FluxMQ).
        och = await other.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await och.get_exchange("events", ensure=True)
    finally:
        await other.close()
        await conn.close()


async def test_delivery_of_exchange_message_carries_topic_and_routing_key(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange("direct-x", aio_pika.ExchangeType.DIRECT)
        q = await ch.declare_queue(qname, durable=True)
        await q.bind(ex, "eu")
        await ex.publish(aio_pika.Message(b"1"), routing_key="eu")
        [msg] = await _collect(q, 1)
        assert msg.exchange == "direct-x" and msg.routing_key == "eu"
        assert msg.headers["x-source-topic"] == f"$queue/{qname}/eu"
        await q.unbind(ex, "eu")
        ch2 = await conn.channel(on_return_raises=True)
        ex2 = await ch2.get_exchange("direct-x", ensure=False)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await ex2.publish(aio_pika.Message(b"2"), routing_key="eu", mandatory=True)
    finally:
        await conn.close()


async def test_stream_replay_from_every_offset_form(broker, qname):
    server = await broker()
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(qname, durable=True, arguments={"x-queue-type": "stream", "x-max-age": "7D",
                                                                   "x-max-length": 100000})
        assert server.manager.queue_info(qname).kind == "stream"
        for i in range(5):
            await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname)
        first = await _collect(q, 5, arguments={"x-consumer-group": "g-first", "x-stream-offset": "first"})
        assert [m.body for m in first] == [b"0", b"1", b"2", b"3", b"4"]
        assert [m.headers["x-stream-offset"] for m in first] == ["0", "1", "2", "3", "4"]
        ts_4 = int(first[4].headers["x-stream-timestamp"])
        await asyncio.sleep(0.05)
        for i in range(5, 10):
            await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname)

        async def bodies(args: dict, n: int) -> list[bytes]:
            return [m.body for m in await _collect(q, n, arguments=args)]

        assert await bodies({"x-consumer-group": "g-int", "x-stream-offset": 7}, 3) == [b"7", b"8", b"9"]
        assert await bodies({"x-consumer-group": "g-off", "x-stream-offset": "offset=8"}, 2) == [b"8", b"9"]
        assert (await bodies({"x-consumer-group": "g-ts", "x-stream-offset": f"timestamp={ts_4 + 1}"}, 5)
                == [b"5", b"6", b"7", b"8", b"9"])
        assert (await bodies({"x-consumer-group": "g-ts-s", "x-stream-offset": f"timestamp={ts_4 // 1000 - 3600}"}, 10)
                == [b"%d" % i for i in range(10)])
        for form in ("last", "next"):
            got: list[bytes] = []
            arrived = asyncio.Event()

            async def on_message(msg, got=got, arrived=arrived):
                got.append(msg.body)
                await msg.ack()
                arrived.set()

            tag = await q.consume(on_message, arguments={"x-consumer-group": f"g-{form}", "x-stream-offset": form})
            await asyncio.sleep(0.5)
            assert got == []   # only new messages
            await ch.default_exchange.publish(aio_pika.Message(form.encode()), routing_key=qname)
            await asyncio.wait_for(arrived.wait(), 10)
            await q.cancel(tag)
            assert got == [form.encode()]
    finally:
        await conn.close()


async def test_stream_manual_commit_then_reconnect_resumes(broker, qname, widen_queue_names):
    server = await broker([QueueConfig(name=qname, type="stream")])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        for i in range(8):
            await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=f"$queue/{qname}")
        q = await ch.get_queue(f"$queue/{qname}", ensure=False)
        # Not acknowledged (a stream ack would checkpoint too): only the $commit moves the group.
        got = await _collect(q, 8, ack=False, arguments={"x-consumer-group": "readers", "x-auto-commit": False,
                                                         "x-stream-offset": "first"})
        assert [m.body for m in got] == [b"%d" % i for i in range(8)]
        await ch.default_exchange.publish(
            aio_pika.Message(b"", headers={"x-group-id": "readers", "x-offset": 4}), routing_key=f"$queue/{qname}/$commit")
    finally:
        await conn.close()
    status = {r["grp"]: r for r in await server.manager.group_status(qname)}
    assert status["readers"]["committed"] == 5
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        q = await ch.get_queue(qname, ensure=False)
        resumed = await _collect(q, 3, arguments={"x-consumer-group": "readers", "x-auto-commit": "false"})
        assert [m.body for m in resumed] == [b"5", b"6", b"7"]
        # The commit topic itself was not stored as a message.
        assert all(m.headers["x-source-topic"] == f"$queue/{qname}" for m in resumed)
    finally:
        await conn.close()


async def test_filtered_stream_subscription(broker, qname, widen_queue_names):
    server = await broker([QueueConfig(name=qname, type="stream")])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        for key in ("sensors/a", "other/x", "sensors/b"):
            await ch.default_exchange.publish(aio_pika.Message(key.encode()), routing_key=f"$queue/{qname}/{key}")
        q = await ch.get_queue(f"$queue/{qname}/sensors/#", ensure=False)
        got = await _collect(q, 2, arguments={"x-consumer-group": "sensor-readers", "x-stream-offset": "first"})
        assert [m.body for m in got] == [b"sensors/a", b"sensors/b"]
        assert got[0].headers["group-id"] == "sensor-readers@sensors/#"
        # The same filter without the prefix means the same subscription.
        q2 = await ch.get_queue(f"{qname}/other/#", ensure=False)
        got2 = await _collect(q2, 1, arguments={"x-consumer-group": "o", "x-stream-offset": "first"})
        assert [m.body for m in got2] == [b"other/x"]
    finally:
        await conn.close()


async def test_properties_round_trip_and_foreign_messages(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        ts = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
        sent = aio_pika.Message(
            b"payload", content_type="application/json", content_encoding="utf-8",
            headers={"tenant": "acme", "n": 3, "flag": True, "list": [1, "two"]},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT, priority=7, correlation_id="corr-1",
            reply_to="replies", expiration=60, message_id="my-id", timestamp=ts, type="order.created",
            user_id="guest", app_id="tests")
        await ch.default_exchange.publish(sent, routing_key=qname)
        # What the MQTT front-end stores for an MQTT 5 publish with a content type.
        await server.manager.publish(f"$queue/{qname}/from-mqtt", b"{}", {"content-type": "application/json",
                                                                          "x-user": "u1"})
        q = await ch.get_queue(qname, ensure=False)
        a, b = await _collect(q, 2)
        assert a.body == b"payload"
        assert (a.content_type, a.content_encoding, a.correlation_id, a.reply_to, a.message_id, a.type,
                a.user_id, a.app_id, a.priority) == ("application/json", "utf-8", "corr-1", "replies", "my-id",
                                                     "order.created", "guest", "tests", 7)
        assert a.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert a.timestamp == ts and a.expiration is not None
        assert {k: a.headers[k] for k in ("tenant", "n", "flag", "list")} == {"tenant": "acme", "n": 3, "flag": True,
                                                                               "list": [1, "two"]}
        assert a.headers["message-id"] == f"{qname}:0" and a.headers["queue"] == qname
        assert a.headers["group-id"] == qname and a.headers["offset"] == "0"
        assert b.content_type == "application/json" and b.headers["x-user"] == "u1"
        assert b.message_id == f"{qname}:1" and b.routing_key == f"$queue/{qname}/from-mqtt"
    finally:
        await conn.close()


async def test_consumer_group_argument_and_channel_qos(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        for i in range(6):
            await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname)
        # Two groups read the queue independently; each group sees everything once.
        cch = await conn.channel()
        await cch.set_qos(prefetch_count=1, global_=True)
        q = await cch.get_queue(qname, ensure=False)
        g1 = await _collect(q, 6, arguments={"x-consumer-group": "billing"})
        g2 = await _collect(q, 6, arguments={"x-consumer-group": "audit"})
        assert [m.body for m in g1] == [m.body for m in g2] == [b"%d" % i for i in range(6)]
        assert {m.headers["group-id"] for m in g1} == {"billing"}
    finally:
        await conn.close()


async def test_exclusive_server_named_queue_is_transient(broker):
    server = await broker()
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        fan = await ch.declare_exchange("broadcast", aio_pika.ExchangeType.FANOUT)
        q = await ch.declare_queue(exclusive=True)       # server-named, e.g. an RPC reply queue
        assert q.name.startswith("amq.gen-")
        info = server.manager.queue_info(q.name)         # a transient queue, owned by this connection
        assert (info.display_kind, info.owner_node) == ("transient", server.manager.node_id)
        assert info.owner is not None
        await q.bind(fan)
        got = []
        arrived = asyncio.Event()

        async def on_message(msg):
            got.append(msg.body)
            await msg.ack()
            if len(got) == 2:
                arrived.set()

        await q.consume(on_message)
        await fan.publish(aio_pika.Message(b"one"), routing_key="")
        await ch.default_exchange.publish(aio_pika.Message(b"two"), routing_key=q.name)
        await asyncio.wait_for(arrived.wait(), 5)
        assert got == [b"one", b"two"]
    finally:
        await conn.close()
    # Gone with its connection.
    for _ in range(50):
        if server.manager.queue_info(q.name) is None:
            break
        await asyncio.sleep(0.1)
    assert server.manager.queue_info(q.name) is None


async def test_lone_publishes_are_confirmed_without_a_confirm_task(broker, qname, monkeypatch):
    """A publish into an empty confirm FIFO is confirmed from its append's callback (no confirm
    loop task per message); publishes in flight together still go through the confirm loop, and
    every confirm comes, in order."""
    from fluxpg.protocols.amqp091 import channel as channel_module

    loops = []
    original = channel_module.Channel._confirm_loop

    def counted(self):
        loops.append(self)
        return original(self)

    monkeypatch.setattr(channel_module.Channel, "_confirm_loop", counted)
    server = await broker([QueueConfig(name=qname)])
    conn = await _connect(server)
    try:
        ch = await conn.channel()
        for i in range(20):
            ok = await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname)
            assert isinstance(ok, Basic.Ack)
        assert loops == []
        acks = await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=qname)
                                      for _ in range(50)))
        assert all(isinstance(a, Basic.Ack) for a in acks) and loops
        q = await ch.get_queue(qname, ensure=False)
        got = [(await q.get(no_ack=True, timeout=5)).body for _ in range(20)]
        assert got == [b"%d" % i for i in range(20)]
    finally:
        await conn.close()
