"""pika (blocking client) against a fluxpg server running on a background loop."""
from __future__ import annotations

import pika
import pytest

from fluxpg.config import QueueConfig


def _connect(server, **params) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=server.port("amqp091"), credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, **params))


def test_pika_publish_confirm_consume_get(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname, retry={"initial_backoff": "0s"})])
    conn = _connect(server, heartbeat=5)
    try:
        ch = conn.channel()
        ok = ch.queue_declare(qname, durable=True)
        assert ok.method.queue == qname
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", qname, b"m%d" % i, pika.BasicProperties(content_type="text/plain",
                                                                         headers={"i": i}, delivery_mode=2),
                             mandatory=True)
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", f"{qname}-nowhere", b"lost", mandatory=True)
        method, props, body = ch.basic_get(qname)
        assert body == b"m0" and props.headers["i"] == 0 and props.content_type == "text/plain"
        ch.basic_nack(method.delivery_tag, requeue=True)
        ch.basic_qos(prefetch_count=2)
        seen = []
        for method, props, body in ch.consume(qname, inactivity_timeout=10):
            assert method is not None, "timed out"
            seen.append((body, method.redelivered))
            ch.basic_ack(method.delivery_tag)
            if len(seen) == 5:
                break
        ch.cancel()
        # The nacked m0 came back (redelivered) after the others already queued or before them.
        assert sorted(b for b, _ in seen) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert dict(seen)[b"m0"] is True and dict(seen)[b"m1"] is False
        method, props, body = ch.basic_get(qname)
        assert method is None   # get-empty
    finally:
        conn.close()


def test_pika_channel_error_and_exchange(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    conn = _connect(server)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(f"{qname}-missing", passive=True)
        assert err.value.reply_code == 404
        ch = conn.channel()
        ch.exchange_declare("fan", exchange_type="fanout")
        ch.queue_bind(qname, "fan")
        ch.basic_publish("fan", "anything", b"via-fanout")
        method, props, body = ch.basic_get(qname, auto_ack=True)
        assert body == b"via-fanout" and method.exchange == "fan"
        assert props.headers["x-source-topic"] == f"$queue/{qname}/anything"
    finally:
        conn.close()
