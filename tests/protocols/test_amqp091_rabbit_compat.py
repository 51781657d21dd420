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
