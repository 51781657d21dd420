"""AMQP 0-9-1 as RabbitMQ users expect it (issue 12): transactions, queue.purge / queue.delete,
consumer cancel notification, exclusive consumers, reserved `amq.` names, virtual hosts and
connection.update-secret — with pika and aio-pika against a real fluxpg server, checking the log."""
from __future__ import annotations

import pika
import pytest

from fluxpg.config import QueueConfig


def _connect(server, vhost: str = "/", **params) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=server.port("amqp091"), virtual_host=vhost,
        credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1, **params))


def _log(server, queue: str) -> list[bytes]:
    rows = server.call(server.manager.pool.fetch(
        "SELECT l.payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
        "WHERE q.name = $1 ORDER BY l.seq", queue))
    return [bytes(r["payload"]) for r in rows]


def _pending(server, queue: str) -> list[int]:
    rows = server.call(server.manager.pool.fetch(
        "SELECT p.seq FROM fluxpg.pending p JOIN fluxpg.groups g ON g.id = p.group_id "
        "JOIN fluxpg.queues q ON q.id = g.queue_id WHERE q.name = $1 ORDER BY p.seq", queue))
    return [r["seq"] for r in rows]


# ---------------------------------------------------------------------------------- transactions


def test_tx_commit_applies_publishes_and_acks_together(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()    # committed before the other channel looks
        for i in range(3):
            ch.basic_publish("", qname, b"old%d" % i)
        tx = conn.channel()
        tx.tx_select()
        m0, _, b0 = tx.basic_get(qname)
        m1, _, b1 = tx.basic_get(qname)
        assert (b0, b1) == (b"old0", b"old1")
        tx.basic_publish("", qname, b"new0")
        tx.basic_ack(m0.delivery_tag)
        tx.basic_publish("", qname, b"new1")
        tx.basic_reject(m1.delivery_tag, requeue=False)
        # Before the commit nothing of it is in the database.
        assert _log(server, qname) == [b"old0", b"old1", b"old2"]
        assert _pending(server, qname) == [0, 1]
        tx.tx_commit()
        assert _log(server, qname) == [b"old0", b"old1", b"old2", b"new0", b"new1"]
        assert _pending(server, qname) == []
        assert _log(server, f"$dlq/{qname}") == [b"old1"]
        # The channel stays transactional: the next publish waits for the next commit.
        tx.basic_publish("", qname, b"new2")
        assert len(_log(server, qname)) == 5
        tx.tx_commit()
        assert _log(server, qname)[-1] == b"new2"
        bodies = [tx.basic_get(qname, auto_ack=True)[2] for _ in range(4)]
        assert bodies == [b"old2", b"new0", b"new1", b"new2"]
    finally:
        conn.close()


def test_tx_rollback_applies_nothing_and_acks_can_be_repeated(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.basic_publish("", qname, b"m0")
        ch.tx_select()
        method, _, body = ch.basic_get(qname)
        assert body == b"m0"
        ch.basic_publish("", qname, b"never")
        ch.basic_ack(method.delivery_tag)
        ch.tx_rollback()
        assert _log(server, qname) == [b"m0"]
        assert _pending(server, qname) == [0]      # still delivered, not acknowledged
        ch.basic_ack(method.delivery_tag)          # the tag is valid again after the rollback
        ch.tx_commit()
        assert _pending(server, qname) == []
        assert _log(server, qname) == [b"m0"]
    finally:
        conn.close()


def test_tx_and_confirms_exclude_each_other(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.tx_commit()
        assert err.value.reply_code == 406 and "not transactional" in err.value.reply_text
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.tx_select()
        assert err.value.reply_code == 406
        ch = conn.channel()
        ch.tx_select()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.confirm_delivery()
        assert err.value.reply_code == 406
        assert conn.is_open   # channel errors only
    finally:
        conn.close()


def test_tx_closed_channel_rolls_back_and_requeues(threaded_broker, qname):
    # initial_backoff 0s: the requeue on close is immediate whatever the default retry policy is.
    server = threaded_broker([QueueConfig(name=qname, retry={"initial_backoff": "0s"})])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.basic_publish("", qname, b"m0")
        ch.tx_select()
        method, _, _ = ch.basic_get(qname)
        ch.basic_publish("", qname, b"never")
        ch.basic_ack(method.delivery_tag)
        ch.close()
        assert _log(server, qname) == [b"m0"]
        ch = conn.channel()
        method, _, body = ch.basic_get(qname, auto_ack=True)
        assert body == b"m0" and method.redelivered
    finally:
        conn.close()


# ---------------------------------------------------------------------------------- purge / delete


def _queue_exists(server, queue: str) -> tuple[bool, bool]:
    """(row in fluxpg.queues, its log table exists)."""
    qid = server.call(server.manager.pool.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue))
    table = server.call(server.manager.pool.fetchval(
        "SELECT to_regclass('fluxpg.log_' || $1::text) IS NOT NULL", str(qid))) if qid is not None else False
    return qid is not None, table


def test_purge_skips_undelivered_keeps_pending(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname, retry={"initial_backoff": "0s"})])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", qname, b"m%d" % i)
        got = [ch.basic_get(qname) for _ in range(2)]
        assert [b for _, _, b in got] == [b"m0", b"m1"]
        ok = ch.queue_purge(qname)
        assert ok.method.message_count == 3                     # m2..m4 were waiting
        assert ch.basic_get(qname)[0] is None                   # nothing undelivered is left
        assert _pending(server, qname) == [0, 1]                # delivered, unacknowledged: kept
        assert len(_log(server, qname)) == 5                    # the log itself is retention's business
        ch.basic_reject(got[1][0].delivery_tag, requeue=True)   # released: it comes back
        method, _, body = ch.basic_get(qname)
        assert body == b"m1" and method.redelivered
        ch.basic_ack(method.delivery_tag)
        ch.basic_ack(got[0][0].delivery_tag)
        ch.basic_publish("", qname, b"after")                   # later publishes are not purged
        assert ch.basic_get(qname, auto_ack=True)[2] == b"after"
        assert ch.queue_purge(qname).method.message_count == 0
    finally:
        conn.close()


def test_purge_of_a_stream_is_refused_with_a_reason(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname, type="stream")])
    conn = _connect(server)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_purge(qname)
        assert err.value.reply_code == 406 and "stream" in err.value.reply_text
    finally:
        conn.close()


def test_delete_if_empty_if_unused_cancels_consumers_and_drops_segments(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=f"{qname}-configured")])
    conn = _connect(server)
    other = _connect(server)
    try:
        ch = conn.channel()
        ch.queue_declare(qname, durable=True)            # client-declared: a client may delete it
        ch.confirm_delivery()
        ch.basic_publish("", qname, b"a")
        ch.basic_publish("", qname, b"b")
        assert _queue_exists(server, qname) == (True, True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_delete(qname, if_empty=True)
        assert err.value.reply_code == 406 and "not empty" in err.value.reply_text
        # A consumer on another connection (it announces consumer_cancel_notify, as pika does).
        watcher = other.channel()
        cancelled = []
        watcher.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        watcher.basic_qos(prefetch_count=1)
        received = []
        tag = watcher.basic_consume(qname, lambda _ch, _m, _p, body: received.append(body))
        for _ in range(50):
            if received:
                break
            other.process_data_events(time_limit=0.1)
        assert received == [b"a"]                        # prefetch 1: b is still waiting
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_delete(qname, if_unused=True)
        assert err.value.reply_code == 406 and "in use" in err.value.reply_text
        ch = conn.channel()
        ok = ch.queue_delete(qname)
        assert ok.method.message_count == 1              # b waited; a is delivered to the watcher
        assert _queue_exists(server, qname) == (False, False)
        deadline = 50
        while not cancelled and deadline:
            other.process_data_events(time_limit=0.1)
            deadline -= 1
        assert cancelled == [tag]                        # basic.cancel from the broker
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(qname, passive=True)
        assert err.value.reply_code == 404
        # Queues of the config file are not a client's to delete.
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_delete(f"{qname}-configured")
        assert err.value.reply_code == 406 and "config file" in err.value.reply_text
        assert _queue_exists(server, f"{qname}-configured") == (True, True)
    finally:
        other.close()
        conn.close()


# ------------------------------------------------------------------------ exclusive, amq., vhosts


def test_exclusive_consumer_is_the_only_one(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        first = conn.channel()
        tag = first.basic_consume(qname, lambda *a: None, exclusive=True)
        second = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            second.basic_consume(qname, lambda *a: None)
        assert err.value.reply_code == 403 and "exclusive" in err.value.reply_text
        first.basic_cancel(tag)                          # released: others may consume again
        third = conn.channel()
        plain = third.basic_consume(qname, lambda *a: None)
        fourth = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            fourth.basic_consume(qname, lambda *a: None, exclusive=True)   # a consumer exists already
        assert err.value.reply_code == 403
        third.basic_cancel(plain)
        assert conn.is_open
    finally:
        conn.close()


def test_amq_queue_names_are_reserved(threaded_broker):
    server = threaded_broker()
    conn = _connect(server)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("amq.mine", durable=True)
        assert err.value.reply_code == 403 and "amq." in err.value.reply_text
        ch = conn.channel()
        named = ch.queue_declare("", exclusive=True).method.queue   # server-named is fine
        assert named.startswith("amq.gen-")
    finally:
        conn.close()


def test_unknown_vhost_is_refused_configured_ones_accepted(threaded_broker):
    from fluxpg.config import Config

    server = threaded_broker(config=Config(amqp091={"virtual_hosts": ["/", "prod"]}))
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as err:
        _connect(server, vhost="nope")
    assert "530" in str(err.value) and "nope" in str(err.value)
    conn = _connect(server, vhost="prod")
    try:
        assert conn.channel().is_open
    finally:
        conn.close()


def test_update_secret_rechecks_credentials(threaded_broker):
    from fluxpg.config import AuthConfig, Config

    server = threaded_broker(config=Config(auth=AuthConfig(users=[{"username": "alice", "password": "one"}])))
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=server.port("amqp091"), credentials=pika.PlainCredentials("alice", "one"),
        connection_attempts=1))
    conn.update_secret("one", "token refreshed")     # the right secret: update-secret-ok
    assert conn.channel().is_open
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
        conn.update_secret("wrong", "token refreshed")
        conn.process_data_events(time_limit=1)
    assert err.value.reply_code == 403


def test_delete_on_one_node_cancels_consumers_on_another(threaded_broker, qname):
    a = threaded_broker()
    b = threaded_broker()
    deleter, consumer_conn = _connect(a), _connect(b)
    try:
        deleter.channel().queue_declare(qname, durable=True)
        ch = consumer_conn.channel()
        cancelled = []
        ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
        ch.basic_qos(prefetch_count=1)
        tag = ch.basic_consume(qname, lambda *a: None)
        assert deleter.channel().queue_delete(qname).method.message_count == 0
        for _ in range(100):
            if cancelled:
                break
            consumer_conn.process_data_events(time_limit=0.1)
        assert cancelled == [tag]     # NOTIFY fluxpg_queues → node b reloads → basic.cancel
        assert not b.manager.subscriptions
    finally:
        consumer_conn.close()
        deleter.close()


def test_cancel_then_close_gives_back_what_was_claimed_but_not_delivered(threaded_broker, qname):
    # pika's TestStopConsumingFromBasicConsumeCallback: the consumer acks the first of two
    # messages and cancels; the second, claimed for it but never handed over, must be back at
    # once (it stayed hidden for the 30 s visibility timeout).
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", qname, b"one", mandatory=True)
        ch.basic_publish("", qname, b"two", mandatory=True)

        def on_consume(channel, method, _props, _body):
            channel.stop_consuming()
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume(qname, on_consume)
        ch.start_consuming()
        ch.close()
        ch = conn.channel()
        method, _, body = ch.basic_get(qname, auto_ack=True)
        assert body == b"two"
        assert ch.basic_get(qname)[0] is None
        assert _pending(server, qname) == []
        assert _log(server, qname) == [b"one", b"two"]
    finally:
        conn.close()
