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


def test_retained_messages_and_clearing(server):
    port = server.port("mqtt")
    pub = Paho(port)
    topic = f"ret/{uid()}"
    pub.publish(f"{topic}/a", b"A", qos=1, retain=True)
    pub.publish(f"{topic}/b", b"B", qos=0, retain=True)
    time.sleep(0.2)   # the QoS 0 retained store has no PUBACK to wait for
    sub = Paho(port)
    sub.subscribe(f"{topic}/#", qos=1)
    got = {sub.get().topic: True, sub.get().topic: True}
    assert set(got) == {f"{topic}/a", f"{topic}/b"}
    # A live message is not retained for this subscriber (retain-as-published off)...
    pub.publish(f"{topic}/a", b"A2", qos=1, retain=True)
    m = sub.get()
    assert (m.payload, m.retain) == (b"A2", False)
    # ...and an empty retained payload clears the topic.
    pub.publish(f"{topic}/a", b"", qos=1, retain=True)
    assert sub.get().payload == b""
    late = Paho(port)
    late.subscribe(f"{topic}/#", qos=1)
    m = late.get()
    assert (m.topic, m.payload, m.retain) == (f"{topic}/b", b"B", True)
    late.nothing(0.3)
    # retain handling 2: never send retained messages
    never = Paho(port)
    never.subscribe(f"{topic}/#", qos=1, retainHandling=2)
    never.nothing(0.3)
    for c in (pub, sub, late, never):
        c.close()


@pytest.mark.parametrize("version", [V5, V311])
def test_will_on_abnormal_close_not_on_disconnect(server, version):
    port = server.port("mqtt")
    topic = f"will/{uid()}"
    watcher = Paho(port)
    watcher.subscribe(topic, qos=1)
    polite = Paho(port, version=version, will={"topic": topic, "payload": b"polite", "qos": 1})
    polite.close(clean=True)
    watcher.nothing(0.5)
    rude = Paho(port, version=version, will={"topic": topic, "payload": b"gone", "qos": 1})
    rude.close(clean=False)
    assert watcher.get().payload == b"gone"
    watcher.close()


def test_will_delay_cancelled_by_reconnect(server):
    port = server.port("mqtt")
    topic = f"will/{uid()}"
    watcher = Paho(port)
    watcher.subscribe(topic, qos=1)
    cid = uid()
    wprops = PahoProps(PacketTypes.WILLMESSAGE)
    wprops.WillDelayInterval = 1
    cprops = PahoProps(PacketTypes.CONNECT)
    cprops.SessionExpiryInterval = 60
    c = Paho(port, cid, clean=False, props=cprops,
             will={"topic": topic, "payload": b"late", "qos": 1, "properties": wprops})
    c.close(clean=False)
    again = Paho(port, cid, clean=False, props=cprops)   # back within the delay: no will
    watcher.nothing(1.2)
    again.close(clean=False)   # no will this time (the new connection set none)
    c2 = Paho(port, uid(), props=cprops, will={"topic": topic, "payload": b"delayed", "qos": 1,
                                                  "properties": wprops})
    t0 = time.monotonic()
    c2.close(clean=False)
    assert watcher.get().payload == b"delayed"
    assert time.monotonic() - t0 >= 0.8
    watcher.close()


def test_keep_alive_timeout_publishes_will(server):
    port = server.port("mqtt")
    topic = f"ka/{uid()}"
    watcher = Paho(port)
    watcher.subscribe(topic, qos=1)
    # A raw client that says keep alive 1 s and then stays silent: closed after 1.5 s.
    s = socket.create_connection(("127.0.0.1", port))
    from fluxpg.protocols.mqtt.codec import Will
    s.sendall(encode(Connect(uid(), keep_alive=1, will=Will(topic, b"timeout", 1)), 5))
    dec = Decoder(version=5)
    dec.feed(s.recv(1024))
    assert isinstance(dec.next_packet(), Connack)
    t0 = time.monotonic()
    s.settimeout(5)
    data = s.recv(1024)
    elapsed = time.monotonic() - t0
    dec.feed(data)
    pkt = dec.next_packet()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x8D
    assert 1.2 <= elapsed <= 3.5
    assert watcher.get().payload == b"timeout"
    s.close()
    watcher.close()


@pytest.mark.parametrize("version", [V5, V311])
def test_persistent_session_resumes_with_queued_qos1(server, version):
    port = server.port("mqtt")
    cid = uid()
    topic = f"persist/{uid()}"
    props = None
    if version == V5:
        props = PahoProps(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
    sub = Paho(port, cid, version=version, clean=False, props=props)
    sub.subscribe(topic, qos=1)
    sub.close()
    pub = Paho(port)
    for i in range(3):
        pub.publish(topic, f"m{i}".encode(), qos=1)
    pub.publish(topic, b"qos0 is not queued", qos=0)
    back = Paho(port, cid, version=version, clean=False, props=props)
    assert back.connack_flags.session_present
    assert [back.get().payload for _ in range(3)] == [b"m0", b"m1", b"m2"]
    back.nothing(0.3)
    back.close()
    # A clean start forgets the session.
    fresh = Paho(port, cid, version=version, clean=True)
    assert not fresh.connack_flags.session_present
    pub.publish(topic, b"nobody", qos=1)
    fresh.nothing(0.3)
    fresh.close()
    pub.close()


def test_session_takeover(server):
    port = server.port("mqtt")
    cid = uid()
    first = Paho(port, cid)
    second = Paho(port, cid)
    assert first.disconnected.wait(TIMEOUT)
    assert first.disconnect_rc == 0x8E   # session taken over
    second.subscribe("takeover/x", qos=1)
    second.publish("takeover/x", b"still fine")
    assert second.get().payload == b"still fine"
    first.c.loop_stop()
    second.close()


def test_shared_subscription_balances(server):
    port = server.port("mqtt")
    topic = f"shared/{uid()}"
    members = [Paho(port) for _ in range(2)]
    for m in members:
        m.subscribe(f"$share/g1/{topic}", qos=1)
    plain = Paho(port)
    plain.subscribe(topic, qos=1)
    pub = Paho(port)
    for i in range(10):
        pub.publish(topic, str(i).encode(), qos=1)
    assert sorted(int(plain.get().payload) for _ in range(10)) == list(range(10))
    counts = []
    seen = []
    for m in members:
        n = 0
        while True:
            try:
                seen.append(int(m.get(1).payload))
                n += 1
            except queue_mod.Empty:
                break
        counts.append(n)
    assert sorted(seen) == list(range(10)) and all(counts), counts
    for c in (*members, plain, pub):
        c.close()


def test_v5_properties_round_trip_and_expiry(server):
    port = server.port("mqtt")
    topic = f"props/{uid()}"
    sub = Paho(port)
    sp = PahoProps(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 42
    sub.subscribe(topic, qos=1, props=sp)
    pub = Paho(port)
    p = PahoProps(PacketTypes.PUBLISH)
    p.UserProperty = [("a", "1"), ("b", "2"), ("a", "3")]
    p.ContentType = "application/json"
    p.ResponseTopic = "reply/here"
    p.CorrelationData = b"\x00\x01corr"
    p.PayloadFormatIndicator = 1
    p.MessageExpiryInterval = 100
    pub.publish(topic, b"{}", qos=1, props=p)
    m = sub.get()
    mp = m.properties
    assert mp.UserProperty == [("a", "1"), ("b", "2"), ("a", "3")]
    assert mp.ContentType == "application/json"
    assert mp.ResponseTopic == "reply/here"
    assert mp.CorrelationData == b"\x00\x01corr"
    assert mp.PayloadFormatIndicator == 1
    assert 98 <= mp.MessageExpiryInterval <= 100
    assert mp.SubscriptionIdentifier == [42]
    # An expired retained message is not delivered.
    e = PahoProps(PacketTypes.PUBLISH)
    e.MessageExpiryInterval = 1
    pub.publish(topic + "/exp", b"soon gone", qos=1, retain=True, props=e)
    time.sleep(1.3)
    late = Paho(port)
    late.subscribe(topic + "/exp", qos=1)
    late.nothing(0.3)
    for c in (sub, pub, late):
        c.close()


def test_no_local_and_retain_as_published(server):
    port = server.port("mqtt")
    topic = f"nl/{uid()}"
    c = Paho(port)
    c.subscribe(topic, qos=1, noLocal=True)
    c.subscribe(topic + "/r", qos=1, retainAsPublished=True)
    c.publish(topic, b"mine", qos=1)
    c.nothing(0.3)
    c.publish(topic + "/r", b"kept flag", qos=1, retain=True)
    m = c.get()
    assert m.retain and m.payload == b"kept flag"
    c.publish(topic + "/r", b"", qos=1, retain=True)
    c.close()


def test_topic_aliases_both_directions(server):
    port = server.port("mqtt")
    topic = f"alias/{uid()}/long/topic/name"
    cp = PahoProps(PacketTypes.CONNECT)
    cp.TopicAliasMaximum = 5
    sub = Paho(port, props=cp)
    assert sub.connack_props.TopicAliasMaximum >= 1
    sub.subscribe(topic, qos=1)
    # Inbound: a raw v5 client sets alias 1 once, then publishes with an empty topic.
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(encode(Connect(uid()), 5))
    dec = Decoder(version=5)
    dec.feed(s.recv(1024))
    assert isinstance(dec.next_packet(), Connack)
    s.sendall(encode(Publish(topic, b"one", 1, packet_id=1, properties=Properties(topic_alias=1)), 5)
              + encode(Publish("", b"two", 1, packet_id=2, properties=Properties(topic_alias=1)), 5))
    # Outbound to paho (alias maximum 5): the first carries the topic and sets alias 1, the second
    # only the alias (paho 2.2 hands that to the application as topic "").
    got = [sub.get(), sub.get()]
    assert [(m.topic, m.payload) for m in got] == [(topic, b"one"), ("", b"two")]
    assert got[0].properties.TopicAlias == got[1].properties.TopicAlias == 1
    # An alias above our maximum is a protocol error: DISCONNECT 0x94.
    s.sendall(encode(Publish("x", b"", 0, properties=Properties(topic_alias=60000)), 5))
    s.settimeout(5)
    while True:
        pkt = dec.next_packet()
        if pkt is None:
            data = s.recv(4096)
            assert data, "closed without DISCONNECT"
            dec.feed(data)
            continue
        if isinstance(pkt, Disconnect):
            assert pkt.reason_code == 0x94
            break
    s.close()
    sub.close()


def test_outbound_topic_alias_on_the_wire(server):
    """Raw v5 subscriber with topic alias maximum 2: the second message comes with an empty
    topic and the alias."""
    port = server.port("mqtt")
    topic = f"alias/{uid()}"
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(encode(Connect(uid(), properties=Properties(topic_alias_maximum=2)), 5))
    s.sendall(encode(Subscribe(1, [Subscription(topic, 0)]), 5))
    dec = Decoder(version=5)
    s.settimeout(5)
    pkts = []

    def next_pkt():
        while True:
            pkt = dec.next_packet()
            if pkt is not None:
                return pkt
            dec.feed(s.recv(4096))

    next_pkt(), next_pkt()   # CONNACK, SUBACK
    pub = Paho(port)
    pub.publish(topic, b"1", qos=1)
    pub.publish(topic, b"2", qos=1)
    pkts = [next_pkt(), next_pkt()]
    assert pkts[0].topic == topic and pkts[0].properties.topic_alias == 1
    assert pkts[1].topic == "" and pkts[1].properties.topic_alias == 1 and pkts[1].payload == b"2"
    s.close()
    pub.close()
