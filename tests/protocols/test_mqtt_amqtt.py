"""The MQTT front-end with amqtt, a real asyncio MQTT 3.1.1 client, on a server running on the
test's own loop (`broker`): pub/sub at every QoS, retained, and a `$queue/` round trip where the
subscriber's PUBACK acknowledges the delivery (3.1.1 has no properties, DESIGN §4)."""
from __future__ import annotations

import asyncio
import uuid

import pytest
from amqtt.client import MQTTClient

from fluxpg.config import QueueConfig


def uid(prefix: str = "am") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def client(port: int, client_id: str | None = None) -> MQTTClient:
    c = MQTTClient(client_id=client_id or uid(), config={"auto_reconnect": False})
    await c.connect(f"mqtt://127.0.0.1:{port}/", cleansession=True)
    return c


async def test_amqtt_pubsub_all_qos_and_retained(broker):
    server = await broker()
    port = server.port("mqtt")
    topic = f"am/{uid()}"
    pub = await client(port)
    await pub.publish(f"{topic}/kept", b"retained", qos=1, retain=True)
    sub = await client(port)
    assert await sub.subscribe([(f"{topic}/#", 2)]) == [2]
    m = await sub.deliver_message(timeout_duration=5)
    assert (m.topic, bytes(m.data)) == (f"{topic}/kept", b"retained")
    for qos in (0, 1, 2):
        await pub.publish(f"{topic}/q{qos}", f"qos{qos}".encode(), qos=qos)
    got = [await sub.deliver_message(timeout_duration=5) for _ in range(3)]
    assert [(m.topic, bytes(m.data), m.qos) for m in got] == [
        (f"{topic}/q{q}", f"qos{q}".encode(), q) for q in (0, 1, 2)]
    await pub.disconnect()
    await sub.disconnect()


async def test_amqtt_queue_round_trip_puback_acks(broker, qname):
    server = await broker(queues=[QueueConfig(name=qname)])
    port = server.port("mqtt")
    pub = await client(port)
    for i in range(3):
        await pub.publish(f"$queue/{qname}/work", f"job{i}".encode(), qos=1)
    sub = await client(port, "reporting-1")     # 3.1.1 group: "reporting"
    assert await sub.subscribe([(f"$queue/{qname}/#", 1)]) == [1]
    got = [await sub.deliver_message(timeout_duration=5) for _ in range(3)]
    assert [bytes(m.data) for m in got] == [b"job0", b"job1", b"job2"]

    async def committed():
        rows = await server.manager.group_status(qname)
        row = next((r for r in rows if r["grp"] == "reporting@#"), None)
        return row is not None and row["committed"] == 3 and row["pending"] == 0

    for _ in range(50):
        if await committed():
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the subscriber's PUBACKs did not acknowledge the deliveries")
    await pub.disconnect()
    await sub.disconnect()
