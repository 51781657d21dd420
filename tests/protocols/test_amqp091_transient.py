"""AMQP 0-9-1 transient queues and requeues with real clients (pika, aio-pika) over real sockets:
temporary reply queues and RPC, requeue on channel close / connection loss / recover in order with
the redelivered flag, basic.get on exclusive queues, max-length overflow, TTL to a dead-letter
exchange, exclusive 405, auto-delete on the last cancel. Each checks the log's contents too."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import aio_pika
import asyncpg
import pika
import pytest

from fluxpg.config import QueueConfig


def _connect(server, **params) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=server.port("amqp091"), credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, **params))


async def _aio(server) -> aio_pika.abc.AbstractRobustConnection:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")


def _rows(server, sql: str, *args):
    async def q():
        conn = await asyncpg.connect(server.server.manager.dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()
    return asyncio.run(q())


def _consume(ch, queue: str, n: int) -> list[tuple[bytes, bool, int]]:
    got = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"timed out after {got}"
        got.append((body, method.redelivered, method.delivery_tag))
        if len(got) == n:
            break
    return got


def _log(server, queue: str) -> list[tuple[int, bytes, str]]:
    return _rows(server, "SELECT l.seq, l.payload, l.tableoid::regclass::text FROM fluxpg.log l "
                         "JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = $1 ORDER BY l.seq", queue)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient"])
def test_requeue_on_channel_close_keeps_order_with_redelivered_flag(threaded_broker, qname, durable):
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.queue_declare(qname, durable=durable)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", qname, b"m%d" % i)
        # What the log holds: durable queues in their own partition, transient ones in the
        # unlogged default partition.
        log = _log(server, qname)
        assert [(s, p) for s, p, _ in log] == [(i, b"m%d" % i) for i in range(5)]
        assert {part for _, _, part in log} == ({f"fluxpg.log_{_rows(server, 'SELECT id FROM fluxpg.queues WHERE name = $1', qname)[0][0]}_p0_0"}
                                                if durable else {"fluxpg.log_transient"})
        ch.basic_qos(prefetch_count=10)
        first = _consume(ch, qname, 5)
        assert [(b, r) for b, r, _ in first] == [(b"m%d" % i, False) for i in range(5)]
        ch.basic_ack(first[1][2])                     # m1 done; the other four are requeued
        ch.close()
        ch = conn.channel()
        again = _consume(ch, qname, 4)
        assert [(b, r) for b, r, _ in again] == [(b"m0", True), (b"m2", True), (b"m3", True), (b"m4", True)]
        for *_x, tag in again:
            ch.basic_ack(tag)
        ch.cancel()
        assert ch.basic_get(qname) == (None, None, None)
        if not durable:   # acknowledged messages of a transient queue leave the log at once
            assert _log(server, qname) == []
    finally:
        conn.close()


def test_basic_recover_and_nack_requeue_are_immediate_and_ordered(threaded_broker, qname):
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.queue_declare(qname, exclusive=True)
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("", qname, b"r%d" % i)
        ch.basic_qos(prefetch_count=10)
        first = _consume(ch, qname, 3)
        ch.basic_recover(requeue=True)
        again = _consume(ch, qname, 3)
        assert [(b, r) for b, r, _ in again] == [(b"r0", True), (b"r1", True), (b"r2", True)]
        # nack with requeue: back at once (no retry backoff unless the queue sets nack_backoff).
        t0 = time.monotonic()
        ch.basic_nack(again[0][2], requeue=True)
        [(body, redelivered, tag)] = _consume(ch, qname, 1)
        assert (body, redelivered) == (b"r0", True) and time.monotonic() - t0 < 3
        assert _rows(server, "SELECT seq, delivery_count FROM fluxpg.pending_entries WHERE queue = $1 ORDER BY seq",
                     qname) == [(0, 3), (1, 2), (2, 2)]
        assert len(first) == 3
    finally:
        conn.close()


CRASHING_CONSUMER = textwrap.dedent("""
    import sys, pika
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=int(sys.argv[1]),
                                   credentials=pika.PlainCredentials("guest", "guest")))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    n = 0
    for method, props, body in ch.consume(sys.argv[2], inactivity_timeout=10):
        n += 1
        print(body.decode(), flush=True)
        if n == 4:
            break
    sys.stdin.read()   # hold the deliveries unacknowledged until killed
""")


def test_requeue_on_connection_loss(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(4):
            ch.basic_publish("", qname, b"c%d" % i)
        proc = subprocess.Popen([sys.executable, "-c", CRASHING_CONSUMER, str(server.port("amqp091")), qname],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            seen = [proc.stdout.readline().strip() for _ in range(4)]
            assert seen == ["c0", "c1", "c2", "c3"]
            proc.kill()                                  # the connection is lost, nothing acked
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
        again = _consume(ch, qname, 4)
        assert [(b, r) for b, r, _ in again] == [(b"c%d" % i, True) for i in range(4)]
        ch.basic_ack(again[-1][2], multiple=True)
    finally:
        conn.close()


def test_basic_get_on_exclusive_queue_and_405_for_others(threaded_broker, qname):
    server = threaded_broker()
    owner, other = _connect(server), _connect(server)
    try:
        ch = owner.channel()
        ok = ch.queue_declare("", exclusive=True)
        name = ok.method.queue
        assert name.startswith("amq.gen-") and ok.method.message_count == 0
        ch.confirm_delivery()
        ch.basic_publish("", name, b"g1")
        ch.basic_publish("", name, b"g2")
        assert ch.queue_declare(name, passive=True).method.message_count == 2
        method, _props, body = ch.basic_get(name)
        assert (body, method.message_count) == (b"g1", 1)
        assert ch.queue_declare(name, passive=True).method.message_count == 1   # consistent with get
        ch.basic_ack(method.delivery_tag)
        for attempt in ("get", "consume", "declare"):
            och = other.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                if attempt == "get":
                    och.basic_get(name)
                elif attempt == "consume":
                    och.basic_consume(name, lambda *a: None)
                else:
                    och.queue_declare(name, exclusive=True)
            assert err.value.reply_code == 405, attempt
        method, _props, body = ch.basic_get(name)
        assert body == b"g2"
        assert _rows(server, "SELECT kind, depth FROM fluxpg.queue_stats WHERE queue = $1", name) == [("transient", 1)]
    finally:
        owner.close()
    # Gone with its connection, messages and all.
    deadline = time.monotonic() + 10
    while _rows(server, "SELECT 1 FROM fluxpg.queues WHERE name = $1", name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rows(server, "SELECT 1 FROM fluxpg.queues WHERE name = $1", name) == []
    och = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        och.queue_declare(name, passive=True)
    assert err.value.reply_code == 404
    other.close()


def test_max_length_overflow_drop_head_and_reject_publish(threaded_broker, qname):
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(f"{qname}-dh", exclusive=True, arguments={"x-max-length": 2, "x-overflow": "drop-head"})
        for i in range(5):
            ch.basic_publish("", f"{qname}-dh", b"d%d" % i)
        got = [ch.basic_get(f"{qname}-dh", auto_ack=True)[2] for _ in range(3)]
        assert got == [b"d3", b"d4", None]
        ch.queue_declare(f"{qname}-rp", exclusive=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        ch.basic_publish("", f"{qname}-rp", b"k0")
        ch.basic_publish("", f"{qname}-rp", b"k1")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", f"{qname}-rp", b"k2")   # refused: a basic.nack, never accepted and dropped
        assert [p for _s, p, _ in _log(server, f"{qname}-rp")] == [b"k0", b"k1"]
    finally:
        conn.close()


def test_ttl_and_expiration_dead_letter_to_an_exchange(threaded_broker, qname):
    server = threaded_broker(heartbeat_interval="200ms", heartbeat_timeout="5s")
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dlx", exchange_type="direct")
        ch.queue_declare(f"{qname}-dead", exclusive=True)
        ch.queue_bind(f"{qname}-dead", "dlx", routing_key="dead")
        ch.queue_declare(f"{qname}-ttl", exclusive=True, arguments={
            "x-message-ttl": 200, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"})
        ch.queue_declare(f"{qname}-exp", exclusive=True, arguments={"x-dead-letter-exchange": "",
                                                                   "x-dead-letter-routing-key": f"{qname}-dead"})
        ch.basic_publish("", f"{qname}-ttl", b"t1")
        ch.basic_publish("", f"{qname}-exp", b"e1", pika.BasicProperties(expiration="150"))
        ch.basic_publish("", f"{qname}-exp", b"e2")                       # no expiration: stays
        dead = _consume(ch, f"{qname}-dead", 2)
        assert sorted(b for b, _r, _t in dead) == [b"e1", b"t1"]
        reasons = _rows(server, "SELECT l.payload, l.headers->>'_dlq_reason', l.headers->>'_dlq_original_queue' "
                                "FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id WHERE q.name = $1 "
                                "ORDER BY l.payload", f"{qname}-dead")
        assert reasons == [(b"e1", "expired", f"{qname}-exp"), (b"t1", "expired", f"{qname}-ttl")]
        ch.cancel()
        assert ch.basic_get(f"{qname}-exp", auto_ack=True)[2] == b"e2"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("", f"{qname}-exp", b"bad", pika.BasicProperties(expiration="soon"))
        assert err.value.reply_code == 406
    finally:
        conn.close()


def test_auto_delete_on_last_cancel_then_mandatory_publish_is_returned(threaded_broker, qname):
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(qname, auto_delete=True)
        tag = ch.basic_consume(qname, lambda *a: None)
        ch.basic_publish("", qname, b"x", mandatory=True)
        ch.basic_cancel(tag)
        assert _rows(server, "SELECT 1 FROM fluxpg.queues WHERE name = $1", qname) == []
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", qname, b"late", mandatory=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(qname, passive=True)
        assert err.value.reply_code == 404
    finally:
        conn.close()


async def test_aio_pika_rpc_with_temporary_reply_queues(broker, qname):
    """aio-pika's RPC pattern: a server queue, per-client exclusive reply queues, mandatory
    replies; once a client is gone its reply queue is gone and a reply to it is returned."""
    server = await broker()
    srv = await _aio(server)
    client = await _aio(server)
    returned: list[bytes] = []
    try:
        sch = await srv.channel(on_return_raises=False)
        sch.return_callbacks.add(lambda _ch, msg: returned.append(msg.body))
        requests = await sch.declare_queue(f"{qname}-rpc", durable=False)

        async def serve(msg: aio_pika.abc.AbstractIncomingMessage):
            async with msg.process():
                await sch.default_exchange.publish(
                    aio_pika.Message(b"re:" + msg.body, correlation_id=msg.correlation_id),
                    routing_key=msg.reply_to, mandatory=True)

        await requests.consume(serve)
        cch = await client.channel()
        reply_q = await cch.declare_queue(exclusive=True, auto_delete=True)
        replies: asyncio.Queue = asyncio.Queue()
        async def on_reply(msg: aio_pika.abc.AbstractIncomingMessage):
            replies.put_nowait(msg.body)

        await reply_q.consume(on_reply, no_ack=True)
        for i in range(3):
            await cch.default_exchange.publish(
                aio_pika.Message(b"q%d" % i, reply_to=reply_q.name, correlation_id=str(i)), routing_key=requests.name)
        got = [await asyncio.wait_for(replies.get(), 10) for _ in range(3)]
        assert got == [b"re:q0", b"re:q1", b"re:q2"]
        reply_name = reply_q.name
        await client.close()
        for _ in range(100):
            if server.manager.queue_info(reply_name) is None:
                break
            await asyncio.sleep(0.05)
        assert server.manager.queue_info(reply_name) is None
        # A late request whose client is gone: the reply is returned, not routed anywhere.
        await sch.default_exchange.publish(aio_pika.Message(b"late", reply_to=reply_name, correlation_id="9"),
                                           routing_key=requests.name)
        for _ in range(100):
            if returned:
                break
            await asyncio.sleep(0.05)
        assert returned == [b"re:late"]
    finally:
        await srv.close()


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "transient"])
def test_cancel_from_the_callback_then_close_leaves_nothing_pending(threaded_broker, qname, durable):
    """pika's acceptance case: no qos, the callback acks the first message and cancels, the
    channel closes; a new channel finds the second at once (not after the visibility timeout),
    whether or not it was handed out before the cancel."""
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.queue_declare(qname, durable=durable)
        ch.confirm_delivery()
        for i in range(2):
            ch.basic_publish("", qname, b"s%d" % i)
        seen = []

        def on_message(chan, method, _props, body):
            seen.append(body)
            chan.basic_ack(method.delivery_tag)
            chan.basic_cancel(method.consumer_tag)

        ch.basic_consume(qname, on_message)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        assert seen == [b"s0"]
        ch.close()
        ch = conn.channel()
        assert ch.queue_declare(qname, passive=True).method.message_count == 1
        method, _props, body = ch.basic_get(qname)
        assert body == b"s1" and method.redelivered
        ch.basic_ack(method.delivery_tag)
    finally:
        conn.close()
