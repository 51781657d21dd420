"""MQTT over WebSocket on the HTTP listener's /mqtt, with paho-mqtt's websockets transport (MQTT
3.1.1 and 5): connect, subscribe, publish, receive; a queue subscription; refusals."""
from __future__ import annotations

import asyncio
import queue
import threading

import aiohttp
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from fluxpg.config import QueueConfig


def ws_client(port: int, client_id: str, protocol=mqtt.MQTTv311) -> tuple[mqtt.Client, queue.Queue]:
    got: queue.Queue = queue.Queue()
    connected = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, transport="websockets")
    c.ws_set_options(path="/mqtt")
    c.on_connect = lambda client, userdata, flags, rc, props=None: connected.set()
    c.on_message = lambda client, userdata, msg: got.put((msg.topic, msg.payload, msg.qos))
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    assert connected.wait(10), "no CONNACK over WebSocket"
    return c, got


@pytest.mark.parametrize("version", [mqtt.MQTTv311, mqtt.MQTTv5])
def test_publish_and_subscribe_over_websocket(threaded_broker, version):
    server = threaded_broker()
    port = server.port("http")
    sub, got = ws_client(port, "ws-sub", version)
    pub, _ = ws_client(port, "ws-pub", version)
    try:
        subscribed = threading.Event()
        sub.on_subscribe = lambda *a, **k: subscribed.set()
        sub.subscribe("sensors/+/temp", qos=1)
        assert subscribed.wait(10)
        for i in range(20):
            pub.publish(f"sensors/s{i % 3}/temp", f"{i}".encode() * 100, qos=1).wait_for_publish(10)
        received = [got.get(timeout=10) for _ in range(20)]
        assert [int(p[:len(p) // 100]) for _t, p, _q in received] == list(range(20))
        assert {t for t, _p, _q in received} == {"sensors/s0/temp", "sensors/s1/temp", "sensors/s2/temp"}
    finally:
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()


def test_queue_subscription_over_websocket(threaded_broker, qname):
    server = threaded_broker([QueueConfig(name=qname)])
    port = server.port("http")
    c, got = ws_client(port, "ws-worker")
    try:
        c.subscribe(f"$queue/{qname}/#", qos=1)
        for i in range(5):
            server.call(server.manager.publish(f"$queue/{qname}/job", f"job{i}".encode()))
        assert sorted(got.get(timeout=10)[1] for _ in range(5)) == [f"job{i}".encode() for i in range(5)]
    finally:
        c.disconnect()
        c.loop_stop()


def test_websocket_without_the_mqtt_subprotocol_or_upgrade_is_refused(threaded_broker):
    server = threaded_broker()
    port = server.port("http")

    async def probe():
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/mqtt") as r:       # no upgrade
                assert r.status == 400
            async with http.ws_connect(f"http://127.0.0.1:{port}/mqtt", protocols=("chat",)) as ws:
                msg = await ws.receive(timeout=10)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                assert ws.close_code == 1002
            async with http.ws_connect(f"http://127.0.0.1:{port}/mqtt", protocols=("mqtt",)) as ws:
                await ws.send_str("CONNECT")                                # text frames: refused
                msg = await ws.receive(timeout=10)
                assert ws.close_code == 1003

    asyncio.run(probe())
