"""Durable MQTT sessions (issue 16): a persistent session's subscriptions and QoS 1/2 messages
survive a clean restart, a kill -9 of the broker process, and a move to another node; a CONNECT
on node B takes the session over from node A (A's client gets DISCONNECT 0x8E); expiry removes
the stored state. Real paho clients (3.1.1 and 5.0), counted exactly."""
from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from test_mqtt_paho import V5, V311, Paho, uid, wait_until

from tests.broker_process import BrokerProcess, free_port, tcp_ready
from tests.helpers import stored


def persistent(version, client_id, port, expiry=300, **kw) -> Paho:
    if version == V5:
        cp = PahoProps(PacketTypes.CONNECT)
        cp.SessionExpiryInterval = expiry
        return Paho(port, client_id, version=V5, clean=False, props=cp, **kw)
    return Paho(port, client_id, version=V311, clean=False, **kw)


def collect(client: Paho, n: int) -> list:
    return [client.get() for _ in range(n)]


@pytest.mark.parametrize("version", [V5, V311])
def test_session_survives_a_clean_restart(threaded_broker, dsn, version):
    topic = f"dur/{uid()}"
    cid = uid("dev")
    a = threaded_broker()
    sub = persistent(version, cid, a.port("mqtt"))
    sub.subscribe(f"{topic}/q1", qos=1)
    sub.subscribe(f"{topic}/q2", qos=2)
    sub.close()
    pub = Paho(a.port("mqtt"), version=version)
    for i in range(10):
        pub.publish(f"{topic}/q1", b"one-%d" % i, qos=1)
        pub.publish(f"{topic}/q2", b"two-%d" % i, qos=2)
    pub.close()
    # Offline messages are in the shared offline log (once each), read through the session's
    # cursor; one routed before the broker saw the DISCONNECT is a row of the session's own.
    logged = stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic LIKE $1", f"{topic}/%")
    rows = stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = $1", cid)
    assert (logged + rows, logged > 0) == (20, True)
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1", cid) == 1
    a.close()

    b = threaded_broker()                      # a new process state: only the database remains
    again = persistent(version, cid, b.port("mqtt"))
    assert again.connack_flags.session_present
    got = collect(again, 20)
    assert sorted(m.payload for m in got) == sorted([b"one-%d" % i for i in range(10)] + [b"two-%d" % i for i in range(10)])
    assert [m.payload for m in got if m.topic.endswith("q1")] == [b"one-%d" % i for i in range(10)]
    assert {m.qos for m in got if m.topic.endswith("q2")} == {2}
    again.nothing(0.5)
    # The subscriptions came back too: a new message reaches the resumed session.
    pub = Paho(b.port("mqtt"), version=version)
    pub.publish(f"{topic}/q2", b"after", qos=2)
    assert again.get().payload == b"after"
    again.nothing(0.3)
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = $1", cid) == 0)
    again.close()
    pub.close()


def test_takeover_across_nodes_moves_the_session(threaded_broker, dsn):
    a = threaded_broker()
    b = threaded_broker()
    topic = f"move/{uid()}"
    cid = uid("mover")
    on_a = persistent(V5, cid, a.port("mqtt"), manual_ack=True)
    on_a.subscribe(topic, qos=1)
    pub = Paho(a.port("mqtt"))
    for i in range(5):
        pub.publish(topic, b"m%d" % i, qos=1)
    # A's client received them but does not acknowledge: they are in flight on node A.
    assert sorted(m.payload for m in collect(on_a, 5)) == [b"m%d" % i for i in range(5)]
    # Same client id on node B while connected to A. paho reconnects on its own after a server's
    # DISCONNECT, which would take the session back to A (two devices sharing a client id fight
    # over it): this one stays down, as a device whose session moved does.
    on_a.c.reconnect_delay_set(min_delay=3600, max_delay=3600)
    on_b = persistent(V5, cid, b.port("mqtt"))
    assert on_b.connack_flags.session_present
    assert on_a.disconnected.wait(10)
    assert int(on_a.disconnect_rc.value) == 0x8E
    got = collect(on_b, 5)
    assert sorted(m.payload for m in got) == [b"m%d" % i for i in range(5)]
    # The session's subscription now lives on B: a message published on A reaches it via B.
    pub.publish(topic, b"via-a", qos=1)
    assert on_b.get().payload == b"via-a"
    on_b.nothing(0.5)
    owner = stored(dsn, "SELECT node_id FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid)
    assert owner == b.manager.node_id
    on_b.close()
    pub.close()


def test_expiry_removes_stored_state(threaded_broker, dsn):
    a = threaded_broker()
    cid = uid("short")
    # Long enough for the count below to see the row on a loaded machine (the expiry runs from
    # the DISCONNECT, and `stored` opens a loop and a connection of its own).
    c = persistent(V5, cid, a.port("mqtt"), expiry=3)
    c.subscribe(f"exp/{uid()}", qos=1)
    c.close()
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid) == 1
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid) == 0, 10)
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_subscriptions WHERE client_id = $1", cid) == 0
    again = persistent(V5, cid, a.port("mqtt"))
    assert not again.connack_flags.session_present
    again.close()


def MqttBrokerProcess(dsn: str, port: int, http_port: int | None = None) -> BrokerProcess:
    """A broker process serving MQTT only (and HTTP when asked)."""
    return BrokerProcess(dsn, ["--mqtt", f"127.0.0.1:{port}", "--amqp", "off", "--amqp091", "off",
                               "--http", f"127.0.0.1:{http_port}" if http_port else "off"],
                         ready=tcp_ready(port), name="mqtt-broker")


@pytest.mark.slow
@pytest.mark.parametrize("version", [V5, V311])
def test_session_survives_kill_9(dsn, version):
    """Everything the publisher got a PUBACK/PUBCOMP for, and the messages in flight to the
    subscriber when the broker was killed, arrive after the restart; QoS 2 exactly once."""
    port = free_port()
    broker = MqttBrokerProcess(dsn, port)
    broker.start()
    try:
        topic = f"k9/{uid()}"
        cid = uid("k9")
        sub = persistent(version, cid, port)
        sub.subscribe(f"{topic}/#", qos=2)
        got_before = []
        sub.c.on_message = lambda c, u, m: got_before.append(m.payload)
        pub = Paho(port, version=version)
        for i in range(20):
            pub.publish(f"{topic}/live", b"a%d" % i, qos=2)
        wait_until(lambda: len(got_before) == 20)
        sub.close()
        for i in range(30):
            pub.publish(f"{topic}/q1", b"b%d" % i, qos=1)
            pub.publish(f"{topic}/q2", b"c%d" % i, qos=2)
        broker.kill9()
        pub.c.loop_stop()
        broker.start()
        again = persistent(version, cid, port)
        assert again.connack_flags.session_present
        got = collect(again, 60)
        assert sorted(m.payload for m in got) == sorted([b"b%d" % i for i in range(30)] + [b"c%d" % i for i in range(30)])
        again.nothing(1.0)
        assert sorted(got_before) == sorted(b"a%d" % i for i in range(20))
        again.close()
    finally:
        broker.close()


@pytest.mark.slow
def test_will_of_a_connection_lost_with_a_killed_broker_is_published_after_restart(dsn):
    """The device's connection died with the broker (kill -9): the node that adopts its session
    publishes its will; a persistent watcher gets it when it reconnects."""
    port = free_port()
    broker = MqttBrokerProcess(dsn, port)
    broker.start()
    try:
        topic = f"wills/{uid()}"
        watcher_id = uid("watch")
        watcher = persistent(V5, watcher_id, port)
        watcher.subscribe(topic, qos=1)
        watcher.close()
        device = persistent(V5, uid("device"), port,
                            will={"topic": topic, "payload": b"device lost", "qos": 1, "retain": False})
        device.publish(f"{topic}/alive", b"x", qos=1)
        broker.kill9()
        device.c.loop_stop()
        broker.start()
        again = persistent(V5, watcher_id, port)
        assert again.connack_flags.session_present
        m = again.get()
        assert (m.topic, m.payload) == (topic, b"device lost")
        again.nothing(0.5)
        again.close()
    finally:
        broker.close()


def test_a_qos2_publish_leaves_only_after_its_packet_id_is_stored(threaded_broker, dsn):
    """Exactly once across a crash: a QoS 2 message to a stored session goes out only once its
    packet id is committed, so a broker killed right after sending resends it under the same id
    (the client recognises it) instead of a new one (a second message to a client that delivers
    on PUBLISH). The session store's commits are held back here: nothing is sent meanwhile; QoS 1
    is not held; once the commit is through, the message arrives with the stored id."""
    import asyncio

    srv = threaded_broker()
    cid = uid("exact")
    topic = f"exact/{uid()}"
    sub = persistent(V5, cid, srv.port("mqtt"))     # the router exists from the first connection
    sub.subscribe(f"{topic}/#", qos=2)
    store = srv.server.ctx.state["mqtt.router"].store
    gate = asyncio.Event()
    apply = store._apply

    async def gated(batch):
        # What comes before the first packet-id commit goes through (the row itself, which the
        # publisher's PUBREC waits for); the packet-id commits wait for the gate.
        first = next((i for i, (op, _a, _f) in enumerate(batch) if op in ("msg_stage", "log_take")), None)
        if first is None:
            return await apply(batch)
        if first:
            await apply(batch[:first])
            for _op, _args, fut in batch[:first]:
                if fut is not None and not fut.done():
                    fut.set_result(None)
        await gate.wait()
        return await apply(batch[first:])

    store._apply = gated
    try:
        pub = Paho(srv.port("mqtt"))
        pub.publish(f"{topic}/two", b"exactly-once", qos=2)
        sub.nothing(1.0)
        assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = $1 "
                           "AND packet_id IS NULL", cid) == 1
        srv.loop.call_soon_threadsafe(gate.set)
        m = sub.get()
        assert m.payload == b"exactly-once" and m.qos == 2
        # The QoS 2 flow completes (the row goes) and nothing comes twice.
        wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = $1", cid) == 0)
        sub.nothing(0.5)
        sub.close()
        pub.close()
    finally:
        store._apply = apply
        srv.loop.call_soon_threadsafe(gate.set)
