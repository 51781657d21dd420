"""The MQTT front-end with paho-mqtt (MQTT 5 and 3.1.1) over real sockets, against fluxpg servers
running on background loops (`threaded_broker`): pub/sub, sessions, v5 features, `$queue/` topics
(consumer groups, acks, flow control, streams), two nodes on one database, and bad input."""
from __future__ import annotations

import asyncio
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
from tests.helpers import paho_loop_stop, stored

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
        paho_loop_stop(self.c)


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


def test_retained_messages_and_clearing(server, dsn):
    port = server.port("mqtt")
    pub = Paho(port)
    topic = f"ret/{uid()}"
    pub.publish(f"{topic}/a", b"A", qos=1, retain=True)
    pub.publish(f"{topic}/b", b"B", qos=0, retain=True)
    # The QoS 0 retained store has no PUBACK to wait for.
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_retained WHERE topic = $1", f"{topic}/b") == 1)
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
    # 3 s: the reconnect must land within the delay even on a loaded CI machine (1 s did not).
    slow = PahoProps(PacketTypes.WILLMESSAGE)
    slow.WillDelayInterval = 3
    cprops = PahoProps(PacketTypes.CONNECT)
    cprops.SessionExpiryInterval = 60
    c = Paho(port, cid, clean=False, props=cprops,
             will={"topic": topic, "payload": b"late", "qos": 1, "properties": slow})
    c.close(clean=False)
    again = Paho(port, cid, clean=False, props=cprops)   # back within the delay: no will
    watcher.nothing(3.3)
    again.close(clean=False)   # no will this time (the new connection set none)
    wprops = PahoProps(PacketTypes.WILLMESSAGE)
    wprops.WillDelayInterval = 1
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
    # The broker's 1.5 s run from when it read the CONNECT, which is after t0 (CONNACK comes only
    # after a database lookup, so a t0 taken then would shorten the measured wait by that long).
    t0 = time.monotonic()
    s.sendall(encode(Connect(uid(), keep_alive=1, will=Will(topic, b"timeout", 1)), 5))
    dec = Decoder(version=5)
    dec.feed(s.recv(1024))
    assert isinstance(dec.next_packet(), Connack)
    s.settimeout(10)
    data = s.recv(1024)
    elapsed = time.monotonic() - t0
    dec.feed(data)
    pkt = dec.next_packet()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x8D
    assert 1.4 <= elapsed <= 10
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
    # QoS 0 first: the later PUBACKs (same connection, in order) prove it was handled while away.
    pub.publish(topic, b"qos0 is not queued", qos=0)
    for i in range(3):
        pub.publish(topic, f"m{i}".encode(), qos=1)
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
    # paho reconnects by itself a second after the broker's DISCONNECT, and would take the
    # session back from `second` if the steps below took longer than that.
    first.c.reconnect_delay_set(3600, 3600)
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


# ============================================================================== $queue/ topics


def classic(name: str, **kw) -> QueueConfig:
    return QueueConfig(name=name, type="classic", retry={"initial_backoff": "100ms", "max_backoff": "1s"}, **kw)


def wait_until(fn, timeout: float = TIMEOUT, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


def group_row(server, queue: str, grp: str) -> dict | None:
    rows = server.call(server.manager.group_status(queue))
    return next((r for r in rows if r["grp"] == grp), None)


def test_queue_publish_consume_ack_moves_committed(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    pub = Paho(port)
    for i in range(3):
        assert pub.publish(f"$queue/{qname}/orders/eu", f"o{i}".encode(), qos=1, props=pub_props(k=i)) == 0
    sub = Paho(port)
    assert sub.subscribe(f"$queue/{qname}/orders/#", qos=1, props=user_props(consumer_group="workers"))[0] == 1
    got = [sub.get() for _ in range(3)]
    assert [m.payload for m in got] == [b"o0", b"o1", b"o2"]
    props = [msg_props(m) for m in got]
    assert [p["message-id"] for p in props] == [f"{qname}:0", f"{qname}:1", f"{qname}:2"]
    assert {p["group-id"] for p in props} == {"workers@orders/#"}
    assert props[0]["queue"] == qname and props[0]["offset"] == "0" and props[0]["k"] == "0"
    row = group_row(server, qname, "workers@orders/#")
    assert row["pending"] == 3 and row["committed"] == 0
    for p in props:
        rc = sub.publish(f"$queue/{qname}/$ack", b"", qos=1,
                         props=pub_props(message_id=p["message-id"], group_id=p["group-id"]))
        assert rc == 0
    row = group_row(server, qname, "workers@orders/#")
    assert row["pending"] == 0 and row["committed"] == 3
    # Unknown ids are a success (a documented no-op); a malformed one is 0x83.
    assert sub.publish(f"$queue/{qname}/$ack", qos=1,
                       props=pub_props(message_id=f"{qname}:999", group_id="workers@orders/#")) == 0
    assert sub.publish(f"$queue/{qname}/$ack", qos=1, props=pub_props(message_id="nonsense")) == 0x83
    pub.close()
    sub.close()


def test_queue_nack_redelivers_and_reject_dead_letters(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    c = Paho(port)
    c.subscribe(f"$queue/{qname}", qos=1, props=user_props(consumer_group="g"))
    c.publish(f"$queue/{qname}", b"retry me", qos=1)
    first = msg_props(c.get())
    assert c.publish(f"$queue/{qname}/$nack", qos=1,
                     props=pub_props(message_id=first["message-id"], group_id=first["group-id"])) == 0
    again = c.get(5)   # after the 100 ms backoff (the engine polls classic queues every second)
    assert msg_props(again)["message-id"] == first["message-id"] and again.payload == b"retry me"
    assert c.publish(f"$queue/{qname}/$reject", qos=1,
                     props=pub_props(message_id=first["message-id"], group_id="g", reason="bad")) == 0
    stats = {r["queue"]: r for r in server.call(server.manager.queue_stats())}
    assert stats[f"$dlq/{qname}"]["depth"] == 1
    assert group_row(server, qname, "g")["pending"] == 0
    c.close()


def test_v311_puback_acknowledges_queue_delivery(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    pub = Paho(port, version=V311)
    for i in range(4):
        pub.publish(f"$queue/{qname}/jobs", str(i).encode(), qos=1)
    # 3.1.1: the group is the client-id prefix before the first '-'.
    sub = Paho(port, "billing-7", version=V311)
    sub.subscribe(f"$queue/{qname}/#", qos=1)
    assert [sub.get().payload for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    row = wait_until(lambda: (r := group_row(server, qname, "billing@#")) and r["committed"] == 4 and r)
    assert row["pending"] == 0
    pub.close()
    sub.close()


def test_receive_maximum_bounds_in_flight_queue_deliveries(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    pub = Paho(port)
    for i in range(5):
        pub.publish(f"$queue/{qname}", str(i).encode(), qos=1)
    cp = PahoProps(PacketTypes.CONNECT)
    cp.ReceiveMaximum = 2
    sub = Paho(port, props=cp, manual_ack=True)
    sub.subscribe(f"$queue/{qname}", qos=1, props=user_props(consumer_group="slow"))
    first = [sub.get(), sub.get()]
    sub.nothing(0.8)    # two unacknowledged: the window is full
    sub.c.ack(first[0].mid, first[0].qos)
    third = sub.get()
    assert third.payload == b"2"
    sub.nothing(0.5)
    pub.close()
    sub.close()


def test_queue_credit_comes_back_in_chunks_and_qos0_acks_are_applied(threaded_broker, qname):
    # A window of 16: with half a window or more still unacknowledged, credit goes back to the
    # engine four at a time (a claim per chunk, not per PUBACK); order and the window hold.
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    pub = Paho(port)
    infos = [pub.publish(f"$queue/{qname}", b"%02d" % i, qos=1, wait=False) for i in range(40)]
    for info in infos:
        info.wait_for_publish(TIMEOUT)
    cp = PahoProps(PacketTypes.CONNECT)
    cp.ReceiveMaximum = 16
    sub = Paho(port, props=cp, manual_ack=True)
    sub.subscribe(f"$queue/{qname}", qos=1, props=user_props(consumer_group="chunks"))
    got = [sub.get() for _ in range(16)]
    sub.nothing(0.5)                        # the window is full
    for m in got[:3]:
        sub.c.ack(m.mid, m.qos)
    sub.nothing(0.5)                        # 13 still in flight: the credit waits for a chunk
    sub.c.ack(got[3].mid, got[3].qos)
    got += [sub.get() for _ in range(4)]    # a chunk of four
    sub.nothing(0.3)
    for m in got[4:]:                       # running short: every PUBACK gives credit back
        sub.c.ack(m.mid, m.qos)
    while len(got) < 40:
        m = sub.get()
        sub.c.ack(m.mid, m.qos)
        got.append(m)
    assert [m.payload for m in got] == [b"%02d" % i for i in range(40)]
    # Fire-and-forget `$ack`s (QoS 0) are gathered (Settler.linger), then applied.
    for m in got:
        p = msg_props(m)
        sub.publish(f"$queue/{qname}/$ack", b"", qos=0, props=pub_props(message_id=p["message-id"],
                                                                           group_id=p["group-id"]))
    wait_until(lambda: (group_row(server, qname, "chunks") or {}).get("committed") == 40)
    assert group_row(server, qname, "chunks")["pending"] == 0
    pub.close()
    sub.close()


def test_qos0_subscription_to_classic_queue_refused(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    c = Paho(server.port("mqtt"))
    assert c.subscribe(f"$queue/{qname}/#", qos=0)[0] == 0x80
    v3 = Paho(server.port("mqtt"), version=V311)
    assert v3.subscribe(f"$queue/{qname}/#", qos=0)[0] == 0x80
    c.close()
    v3.close()


def test_stream_subscribe_with_offset_first_replays(threaded_broker, qname):
    server = threaded_broker(queues=[QueueConfig(name=qname, type="stream")])
    port = server.port("mqtt")
    pub = Paho(port)
    for i in range(3):
        pub.publish(f"$queue/{qname}/ev", str(i).encode(), qos=1)
    a = Paho(port)
    a.subscribe(f"$queue/{qname}/#", qos=1, props=user_props(consumer_group="replay", x_stream_offset="first"))
    got = [a.get() for _ in range(3)]
    assert [m.payload for m in got] == [b"0", b"1", b"2"]
    assert [msg_props(m)["x-stream-offset"] for m in got] == ["0", "1", "2"]
    assert "x-stream-timestamp" in msg_props(got[0])
    b = Paho(port)
    b.subscribe(f"$queue/{qname}/#", qos=1, props=user_props(consumer_group="tail", x_stream_offset="last"))
    b.nothing(0.5)
    pub.publish(f"$queue/{qname}/ev", b"3", qos=1)
    assert b.get().payload == b"3"
    assert a.get().payload == b"3"
    for c in (pub, a, b):
        c.close()


def test_queue_publish_failures_get_reason_codes_or_close(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname, limits={"max_message_size": 100})])
    port = server.port("mqtt")
    c = Paho(port)
    assert c.publish(f"$queue/{qname}", b"x" * 200, qos=1) == 0x97
    assert c.publish(f"$queue/{qname}", b"small", qos=1) == 0     # the connection goes on
    v3 = Paho(port, version=V311)
    v3.publish(f"$queue/{qname}", b"x" * 200, qos=1, wait=False)
    assert v3.disconnected.wait(TIMEOUT)   # 3.1.1 cannot be told: closed, not PUBACKed
    c.close()
    v3.c.loop_stop()


def test_pipelined_queue_publishes_keep_order(threaded_broker, qname):
    server = threaded_broker(queues=[classic(qname)])
    port = server.port("mqtt")
    pub = Paho(port)
    infos = [pub.publish(f"$queue/{qname}", str(i).encode(), qos=1, wait=False) for i in range(200)]
    for info in infos:
        info.wait_for_publish(TIMEOUT)
    sub = Paho(port)
    sub.subscribe(f"$queue/{qname}", qos=1, props=user_props(consumer_group="order"))
    got = [int(sub.get().payload) for _ in range(200)]
    assert got == list(range(200))
    pub.close()
    sub.close()


# ============================================================================== two nodes


def test_two_nodes_share_pubsub_and_retained(threaded_broker):
    a = threaded_broker()
    b = threaded_broker()
    topic = f"multi/{uid()}"
    sub_b = Paho(b.port("mqtt"))
    sub_b.subscribe(f"{topic}/#", qos=1)
    pub_a = Paho(a.port("mqtt"))
    assert pub_a.publish(f"{topic}/x", b"from a", qos=1) == 0
    m = sub_b.get()
    assert (m.topic, m.payload, m.qos) == (f"{topic}/x", b"from a", 1)
    assert pub_a.publish(f"{topic}/ret", b"kept", qos=1, retain=True) == 0
    assert sub_b.get().payload == b"kept"
    late_b = Paho(b.port("mqtt"))
    late_b.subscribe(f"{topic}/ret", qos=1)
    m = late_b.get()
    assert (m.payload, m.retain) == (b"kept", True)
    # and back: B → A
    sub_a = Paho(a.port("mqtt"))
    sub_a.subscribe(topic + "/back", qos=2)
    Paho(b.port("mqtt")).publish(topic + "/back", b"from b", qos=2)
    assert sub_a.get().payload == b"from b"
    for c in (sub_b, pub_a, late_b, sub_a):
        c.close()


# ============================================================================== bad input


class Raw:
    def __init__(self, port: int, version: int = 5):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.settimeout(5)
        self.version = version
        self.dec = Decoder(version=version)

    def send(self, data: bytes):
        self.s.sendall(data)

    def connect(self, **kw):
        self.send(encode(Connect(uid(), **kw), self.version))
        pkt = self.next()
        assert isinstance(pkt, Connack) and pkt.reason_code == 0
        return pkt

    def next(self):
        """The next packet, or None when the server closed the connection."""
        while True:
            pkt = self.dec.next_packet()
            if pkt is not None:
                return pkt
            try:
                data = self.s.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.dec.feed(data)


def assert_alive(server):
    c = Paho(server.port("mqtt"))
    topic = f"alive/{uid()}"
    c.subscribe(topic, qos=1)
    c.publish(topic, b"ok", qos=1)
    assert c.get().payload == b"ok"
    c.close()


def test_bad_input_gets_reason_codes_and_others_keep_working(server):
    port = server.port("mqtt")
    bystander = Paho(port)
    bystander.subscribe("bystander/#", qos=1)
    # garbage after a valid CONNECT: reserved packet type 0 → DISCONNECT 0x81 malformed packet
    r = Raw(port)
    r.connect()
    r.send(b"\x00\x00garbage")
    pkt = r.next()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x81
    assert r.next() is None
    # a second CONNECT → 0x82 protocol error
    r = Raw(port)
    r.connect()
    r.send(encode(Connect(uid()), 5))
    pkt = r.next()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x82
    # 3.1.1 gets no DISCONNECT: the connection is closed
    r = Raw(port, version=4)
    r.connect()
    r.send(b"\xff\xff\xff\xff\xff\xff")
    assert r.next() is None
    # garbage in place of the CONNECT body: closed
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    s.sendall(b"\x10\x05\x00\x01zzzz")   # protocol name "z", level 'z': not MQTT
    assert s.recv(100) == b"\x20\x02\x00\x01"   # CONNACK unacceptable protocol version
    assert s.recv(100) == b""
    s.close()
    # PUBREL for an id we never saw → PUBCOMP 0x92
    r = Raw(port)
    r.connect()
    from fluxpg.protocols.mqtt.codec import Pubcomp, Pubrel
    r.send(encode(Pubrel(77), 5))
    pkt = r.next()
    assert isinstance(pkt, Pubcomp) and pkt.packet_id == 77 and pkt.reason_code == 0x92
    # unsupported protocol level → CONNACK 0x01 (3.1.1 format)
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    s.sendall(b"\x10\x0c\x00\x04MQTT\x07\x02\x00\x3c\x00\x00")
    assert s.recv(100) == b"\x20\x02\x00\x01"
    s.close()
    bystander.publish("bystander/x", b"still here", qos=1)
    assert bystander.get().payload == b"still here"
    assert_alive(server)
    bystander.close()


def test_oversize_packet_is_refused_with_0x95(threaded_broker):
    server = threaded_broker()
    server.server.ctx.state["mqtt.options"] = MqttOptions(max_packet_size=1024)
    port = server.port("mqtt")
    r = Raw(port)
    ack = r.connect()
    assert ack.properties.maximum_packet_size == 1024
    r.send(encode(Publish("big", b"x" * 2000, 1, packet_id=1), 5))
    pkt = r.next()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x95
    assert_alive(server)


def test_receive_maximum_exceeded_inbound(threaded_broker):
    server = threaded_broker()
    server.server.ctx.state["mqtt.options"] = MqttOptions(receive_maximum=2)
    r = Raw(server.port("mqtt"))
    r.connect()
    # QoS 2 publishes without PUBREL stay unacknowledged: the third exceeds our receive maximum.
    for pid in (1, 2):
        r.send(encode(Publish("rm/x", b"", 2, packet_id=pid), 5))
    assert [type(r.next()).__name__ for _ in range(2)] == ["Pubrec", "Pubrec"]
    r.send(encode(Publish("rm/x", b"", 2, packet_id=3), 5))
    pkt = r.next()
    assert isinstance(pkt, Disconnect) and pkt.reason_code == 0x93


def test_bad_credentials_refused(threaded_broker):
    from fluxpg.auth import AuthError, Principal

    class Auth:
        async def authenticate(self, username, password, *, protocol, peer=None):
            if (username, password) != ("alice", b"secret"):
                raise AuthError("bad user name or password")
            return Principal("alice", permissions=(("publish", "allowed/#"), ("consume", "allowed/#")))

    server = threaded_broker()
    server.server.ctx.auth = Auth()
    port = server.port("mqtt")
    bad = Paho(port, username="alice", password="wrong", connect=False)
    bad.connect(expect_ok=False)
    assert bad.connack_rc == 0x86
    bad.c.loop_stop()
    r = Raw(port, version=4)   # 3.1.1: return code 4, bad user name or password
    r.send(encode(Connect(uid(), username="alice", password=b"wrong"), 4))
    assert r.s.recv(100) == b"\x20\x02\x00\x04"
    assert r.s.recv(100) == b""
    ok = Paho(port, username="alice", password="secret")
    assert ok.subscribe("allowed/x", qos=1)[0] == 1
    assert ok.subscribe("secret/x", qos=1)[0] == 0x87
    assert ok.publish("secret/x", b"no", qos=1) == 0x87
    assert ok.publish("allowed/x", b"yes", qos=1) == 0
    assert ok.get().payload == b"yes"
    ok.close()


def test_default_config_confirmed_queue_publishes_survive_a_broker_restart(threaded_broker, qname):
    """No queues configured (the default): `$queue/<name>` is a durable queue created on first
    use, not an in-memory one. Publish while a consumer exists, stop the broker, start another:
    every confirmed (PUBACKed) message is in fluxpg.log and is delivered."""
    server = threaded_broker()
    port = server.port("mqtt")
    sub = Paho(port, client_id=f"w-{qname}")
    assert sub.subscribe(f"$queue/{qname}/#", qos=1, props=user_props(consumer_group="workers"))[0] == 1
    pub = Paho(port)
    confirmed = [f"m{i}".encode() for i in range(20) if pub.publish(f"$queue/{qname}/k", f"m{i}".encode(), qos=1) == 0]
    assert len(confirmed) == 20
    first = [sub.get().payload for _ in range(20)]
    assert first == confirmed                                 # delivered in order, none acked
    sub.close()
    pub.close()
    dsn = server.manager.dsn
    server.close()                                            # the broker stops

    async def log_rows():
        import asyncpg
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch("SELECT l.payload, q.durability, l.tableoid::regclass::text AS part "
                                    "FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                                    "WHERE q.name = $1 ORDER BY l.seq", qname)
        finally:
            await conn.close()

    rows = asyncio.run(log_rows())
    assert [r["payload"] for r in rows] == confirmed
    assert {r["durability"] for r in rows} == {"durable"} and "fluxpg.log_transient" not in {r["part"] for r in rows}
    again = threaded_broker()                                 # a new broker process's worth of state
    sub = Paho(again.port("mqtt"), client_id=f"w-{qname}")
    assert sub.subscribe(f"$queue/{qname}/#", qos=1, props=user_props(consumer_group="workers"))[0] == 1
    redelivered = [sub.get() for _ in range(20)]
    assert [m.payload for m in redelivered] == confirmed
    for m in redelivered:
        p = msg_props(m)
        assert sub.publish(f"$queue/{qname}/$ack", b"", qos=1,
                           props=pub_props(message_id=p["message-id"], group_id=p["group-id"])) == 0
    row = group_row(again, qname, msg_props(redelivered[0])["group-id"])
    assert row["pending"] == 0 and row["committed"] == 20
    sub.close()
