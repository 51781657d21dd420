"""The outbox end to end: the example's SQLAlchemy transaction (an order row and its event)
commits, and a real aio-pika consumer and a real paho MQTT 5 consumer of the queue each receive the
event exactly once; a rolled-back order is received by neither."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import queue as queue_mod
import uuid
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
from paho.mqtt.properties import Properties
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from fluxpg import db
from fluxpg.config import QueueConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "outbox_orders.py"


def _example():
    spec = importlib.util.spec_from_file_location("outbox_orders", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("outbox_orders", module)   # SQLAlchemy resolves Mapped[...] through it
    spec.loader.exec_module(sys.modules["outbox_orders"])
    module = sys.modules["outbox_orders"]
    return module


async def test_order_and_event_commit_together_to_aio_pika_and_paho(dsn, broker):
    example = _example()
    server = await broker([QueueConfig(name="orders", topics=["$queue/orders/#"])])
    engine = create_async_engine(db.sqlalchemy_url(dsn).replace("+psycopg", "+asyncpg"))
    async with engine.begin() as conn:
        await conn.run_sync(example.Base.metadata.drop_all)
        await conn.run_sync(example.Base.metadata.create_all)

    # AMQP 0-9-1 consumer: the queue's default group.
    amqp = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    channel = await amqp.channel()
    amqp_got: asyncio.Queue = asyncio.Queue()
    q = await channel.declare_queue("orders", durable=True, passive=True)

    async def on_message(msg):
        await amqp_got.put((msg.body, msg.headers.get("source")))
        await msg.ack()
    await q.consume(on_message)

    # MQTT 5 consumer: a group of its own, acknowledging with PUBACK.
    mqtt_got: queue_mod.Queue = queue_mod.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"shop-{uuid.uuid4().hex[:6]}",
                         protocol=mqtt.MQTTv5)
    client.on_message = lambda c, u, m: mqtt_got.put(m.payload)
    client.connect("127.0.0.1", server.port("mqtt"))
    client.loop_start()
    props = Properties(PacketTypes.SUBSCRIBE)
    props.UserProperty = ("consumer-group", "mqtt-audit")
    client.subscribe("$queue/orders/#", options=SubscribeOptions(qos=1), properties=props)
    try:
        await asyncio.sleep(0.5)
        async with AsyncSession(engine) as session:
            await example.place_order(session, 7, "ada", 4200)
        # A rolled-back order: neither the row nor the event.
        async with AsyncSession(engine) as session:
            try:
                async with session.begin():
                    session.add(example.Order(id=8, customer="bob", total_cents=1))
                    await example.fluxpg.publish(session, "$queue/orders/created", b"must not arrive")
                    raise RuntimeError("payment declined")
            except RuntimeError:
                pass

        body, source = await asyncio.wait_for(amqp_got.get(), 10)
        assert json.loads(body) == {"order": 7, "customer": "ada", "total_cents": 4200} and source == "shop"
        payload = await asyncio.to_thread(mqtt_got.get, True, 10)
        assert json.loads(payload)["order"] == 7
        await asyncio.sleep(1.0)
        assert amqp_got.empty() and mqtt_got.empty()
        async with AsyncSession(engine) as session:
            ids = (await session.execute(select(example.Order.id))).scalars().all()
        assert ids == [7]
    finally:
        client.loop_stop()
        client.disconnect()
        await amqp.close()
        async with engine.begin() as conn:
            await conn.run_sync(example.Base.metadata.drop_all)
        await engine.dispose()
