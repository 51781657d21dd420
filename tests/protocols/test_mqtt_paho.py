"""The MQTT front-end with paho-mqtt (MQTT 5 and 3.1.1) over real sockets, against fluxpg servers
running on background loops (`threaded_broker`): pub/sub, sessions, v5 features, `$queue/` topics
(consumer groups, acks, flow control, streams), two nodes on one database, and bad input."""
from __future__ import annotations

import queue as queue_mod
import socket
import threading
import time
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from paho.mqtt.subscribeoptions import SubscribeOptions

from fluxpg.config import QueueConfig
from fluxpg.protocols.mqtt.codec import (Connack, Connect, Decoder, Disconnect, Properties, Publish, Puback,
                                         Subscribe, Subscription, encode)
from fluxpg.protocols.mqtt.session import MqttOptions

V5 = mqtt.MQTTv5
V311 = mqtt.MQTTv311
TIMEOUT = 10


def uid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Paho:
    """A paho client with blocking helpers: connect, subscribe (returns SUBACK codes), publish
    (returns the PUBACK reason code), and a queue of received messages."""

    def __init__(self, port: int, client_id: str | None = None, *, version=V5, clean=True,
                 keepalive: int = 60, props: PahoProps | None = None, will=None, manual_ack=False,
                 connect: bool = True, username: str | None = None, password: str | None = None):
        self.port = port
        self.version = version
        self.client_id = client_id if client_id is not None else uid()
        kwargs = {}
        if version != V5:
            kwargs["clean_session"] = clean
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=version,
                             manual_ack=manual_ack, **kwargs)
        self.clean = clean
        self.keepalive = keepalive
        self.connect_props = props
        self.messages: queue_mod.Queue = queue_mod.Queue()
        self.connack = threading.Event()
        self.connack_rc = None
        self.connack_flags = None
        self.connack_props = None
        self.disconnected = threading.Event()
        self.disconnect_rc = None
        self.subacks: dict[int, list] = {}
        self.pubacks: dict[int, object] = {}
        self.events = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = lambda *a: None
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = self._on_disconnect
        if will is not None:
            self.c.will_set(**will)
        if username is not None:
            self.c.username_pw_set(username, password)
        if connect:
            self.connect()

    # callbacks (paho's thread)
    def _on_connect(self, c, u, flags, rc, props):
        self.connack_rc, self.connack_flags, self.connack_props = rc, flags, props
        self.connack.set()

    def _on_subscribe(self, c, u, mid, codes, props):
        with self.events:
            self.subacks[mid] = codes
            self.events.notify_all()

    def _on_publish(self, c, u, mid, rc, props):
        with self.events:
            self.pubacks[mid] = rc
            self.events.notify_all()

    def _on_disconnect(self, c, u, flags, rc, props):
        self.disconnect_rc = rc
        self.disconnected.set()

    def _wait(self, table: dict, mid: int):
        with self.events:
            assert self.events.wait_for(lambda: mid in table, TIMEOUT), f"no answer for mid {mid}"
            return table.pop(mid)

    def connect(self, expect_ok: bool = True):
        self.connack.clear()
        kwargs = {"properties": self.connect_props}
        if self.version == V5:
            kwargs["clean_start"] = self.clean
        self.c.connect("127.0.0.1", self.port, self.keepalive, **kwargs)
        self.c.loop_start()
        assert self.connack.wait(TIMEOUT), "no CONNACK"
        if expect_ok:
            assert not self.connack_rc.is_failure, self.connack_rc
        return self

    def subscribe(self, topic: str, qos: int = 1, props: PahoProps | None = None, **opts) -> list:
        if self.version == V5:
            rc, mid = self.c.subscribe(topic, options=SubscribeOptions(qos=qos, **opts), properties=props)
        else:
            rc, mid = self.c.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self._wait(self.subacks, mid)

    def publish(self, topic: str, payload=b"", qos: int = 1, retain=False, props=None, wait=True):
        info = self.c.publish(topic, payload, qos, retain, properties=props)
        if not wait or qos == 0:
            return info
        return self._wait(self.pubacks, info.mid)

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def nothing(self, wait: float = 0.5) -> bool:
        try:
            m = self.messages.get(timeout=wait)
        except queue_mod.Empty:
            return True
        raise AssertionError(f"unexpected message on {m.topic}: {m.payload!r}")

    def close(self, clean=True):
        if clean:
            self.c.disconnect()
        else:
            # Drop the socket without DISCONNECT (an abnormal end: the will is published).
            self.c._sock.close() if self.c._sock else None
        self.c.loop_stop()


def user_props(**kv) -> PahoProps:
    p = PahoProps(PacketTypes.SUBSCRIBE)
    p.UserProperty = [(k.replace("_", "-"), str(v)) for k, v in kv.items()]
    return p


def pub_props(**kv) -> PahoProps:
    p = PahoProps(PacketTypes.PUBLISH)
    p.UserProperty = [(k.replace("_", "-"), str(v)) for k, v in kv.items()]
    return p


def msg_props(m: mqtt.MQTTMessage) -> dict:
    return dict(getattr(m.properties, "UserProperty", []) or [])


@pytest.fixture
def server(threaded_broker):
    return threaded_broker()


# ============================================================================== pub/sub


@pytest.mark.parametrize("version", [V5, V311])
def test_pubsub_qos_0_1_2_and_wildcards(server, version):
    port = server.port("mqtt")
    sub = Paho(port, version=version)
    assert [int(getattr(c, "value", c)) for c in sub.subscribe("t/+/temp", qos=2)] == [2]
    sub.subscribe("t/#", qos=0)
    pub = Paho(port, version=version)
    for qos in (0, 1, 2):
        pub.publish(f"t/room{qos}/temp", f"v{qos}".encode(), qos=qos)
    got = {}
    for _ in range(3):
        m = sub.get()
        got[m.topic] = m.qos
    # Overlapping subscriptions: one copy per session at the highest granted QoS (MQTT 5 §3.3.4),
    # so each message keeps its publish QoS.
    assert got == {"t/room0/temp": 0, "t/room1/temp": 1, "t/room2/temp": 2}
    sub.nothing(0.3)
    pub.publish("t/x", b"only hash", qos=1)
    assert sub.get().payload == b"only hash"
    pub.close()
    sub.close()
