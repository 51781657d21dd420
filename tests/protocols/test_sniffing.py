"""Every listener serves every protocol: the first bytes decide (fluxpg/protocols/listener.py)."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import aio_pika
import paho.mqtt.client as mqtt
import pytest
from proton import Message
from proton.utils import BlockingConnection

from fluxpg.config import QueueConfig
from fluxpg.protocols.listener import AMQP10_HEADER, AMQP10_SASL_HEADER, AMQP091_HEADER, sniff

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("data, protocol", [
    (b"\x10", "mqtt"),
    (b"\x10\x0c\x00\x04MQTT", "mqtt"),
    (AMQP091_HEADER, "amqp091"),
    (AMQP10_HEADER, "amqp10"),
    (AMQP10_SASL_HEADER, "amqp10"),
    (b"GET / HTTP/1.1\r\n", "http"),
    (b"AMQP\x00\x00\x08\x00", None),     # AMQP 0-8: not ours
    (b"AMQP\x02\x01\x00\x00", None),     # AMQP 1.0 TLS-in-AMQP header: not supported
    (b"\x16\x03\x01\x02\x00", None),     # a TLS ClientHello on a plain listener
    (b"", None),
    (b"\x00\x00\x00\x00", None),
])
def test_sniff(data, protocol):
    assert sniff(data) == protocol


def _exchange(port: int, data: bytes) -> tuple[bytes, float]:
    """Send `data`, read until the server closes; (what came back, seconds until the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        started = time.monotonic()
        received = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        return received, time.monotonic() - started


@pytest.mark.parametrize("header", [b"XXXXXXXX", b"AMQP\x00\x00\x08\x00", b"AMQP\x02\x01\x00\x00"])
def test_unknown_header_gets_the_amqp_header_and_a_close(threaded_broker, header):
    srv = threaded_broker()
    for name in ("amqp", "mqtt"):
        received, elapsed = _exchange(srv.port(name), header)
        assert received == AMQP091_HEADER
        assert elapsed < 2


def test_three_protocols_on_one_port(threaded_broker, qname):
    """paho-mqtt, aio-pika and proton against the MQTT port; a message goes round all three."""
    srv = threaded_broker([QueueConfig(name=qname)])
    port = srv.port("mqtt")

    # MQTT 5 publishes into the queue
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sniff-mqtt", protocol=mqtt.MQTTv5)
    connected, published = threading.Event(), threading.Event()
    client.on_connect = lambda c, u, f, rc, p: connected.set()
    client.on_publish = lambda c, u, mid, rc, p: published.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        assert connected.wait(10)
        client.publish(f"$queue/{qname}/from-mqtt", b"m1", qos=1)
        assert published.wait(10)
    finally:
        client.loop_stop()
        client.disconnect()

    # AMQP 0-9-1 (aio-pika) publishes and reads it back
    async def amqp091() -> list[bytes]:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=10)
        async with conn:
            channel = await conn.channel()
            await channel.default_exchange.publish(aio_pika.Message(b"m2"), routing_key=f"$queue/{qname}/from-091")
            return [b"ok"]

    assert asyncio.run(asyncio.wait_for(amqp091(), 20)) == [b"ok"]

    # AMQP 1.0 (proton, with SASL) publishes a third and consumes all three
    conn = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=10)
    try:
        conn.create_sender(f"$queue/{qname}/from-amqp10").send(Message(body=b"m3", inferred=True))
        rcv = conn.create_receiver(qname)
        got = []
        for _ in range(3):
            m = rcv.receive(timeout=10)
            got.append((bytes(m.body), m.properties["x-source-topic"].rsplit("/", 1)[1]))
            rcv.accept()
    finally:
        conn.close()
    assert got == [(b"m1", "from-mqtt"), (b"m2", "from-091"), (b"m3", "from-amqp10")]


def test_amqp10_without_sasl_on_the_amqp091_port(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = BlockingConnection(f"amqp://127.0.0.1:{srv.port('amqp091')}", timeout=10, sasl_enabled=False)
    try:
        conn.create_sender(qname).send(Message(body="plain header"))
    finally:
        conn.close()
