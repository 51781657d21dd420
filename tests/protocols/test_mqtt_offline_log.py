"""Offline messages of persistent MQTT sessions through the shared offline log (issue 16,
migration 0012): a message for any number of offline sessions is one row of
fluxpg.mqtt_offline_log; each session replays it from its cursor when it reconnects, in order,
with its own QoS (min of publish and subscription), retain-as-published and subscription
identifiers, then continues live with no gap and no duplicate at the boundary. Real paho clients,
counted exactly."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from test_mqtt_durable_sessions import persistent
from test_mqtt_paho import V5, V311, Paho, uid, wait_until

from fluxpg.queues.mqtt_sessions import MqttSessionStore
from tests.helpers import stored


def _router(server):
    return server.server.ctx.state["mqtt.router"]


def wait_offline(server, client_id: str) -> None:
    """Until the broker has seen the client go (paho's disconnect() returns before that): from
    then on the session's messages go to the offline log."""
    def offline():
        sess = _router(server).sessions.get(client_id)
        return sess is not None and sess.conn is None and sess.log_open
    wait_until(offline)


def assert_in_order(got, payloads: list[bytes]) -> None:
    """Exactly `payloads`, each once, in order per QoS. paho (as MQTT.js) hands a QoS 2 message
    to the application when PUBREL arrives, a round trip after the PUBLISH, so a QoS 1 message
    sent after it on the wire may reach on_message first (see the note of issue 16)."""
    assert sorted(m.payload for m in got) == sorted(payloads)
    for qos in (1, 2):
        seen = [m.payload for m in got if m.qos == qos]
        assert seen == [p for p in payloads if p in set(seen)], f"QoS {qos} out of order: {seen}"


def test_a_burst_for_200_offline_sessions_is_50_log_rows_and_all_arrive_in_order(threaded_broker, dsn):
    a = threaded_broker()
    port = a.port("mqtt")
    topic = f"fleet/{uid()}"
    devices = [uid("dev") for _ in range(200)]
    for i, cid in enumerate(devices):
        c = persistent(V5 if i % 2 else V311, cid, port)
        # Half subscribe at QoS 2 and half at QoS 1; a wildcard for some, the topic for others.
        c.subscribe(f"{topic}/#" if i % 3 else f"{topic}/cmd", qos=2 if i % 2 == 0 else 1)
        c.close()
    for cid in devices:
        wait_offline(a, cid)
    pub = Paho(port)
    for k in range(50):
        assert not pub.publish(f"{topic}/cmd", b"%03d" % k, qos=1 + k % 2).is_failure
    # One row per message, not one per device per message.
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", f"{topic}/cmd") == 50
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = ANY($1::text[])",
                  devices) == 0
    assert _router(a).offline_logged == 50
    clients = [persistent(V5 if i % 2 else V311, cid, port) for i, cid in enumerate(devices)]
    for i, again in enumerate(clients):
        assert again.connack_flags.session_present
        got = [again.get() for _ in range(50)]
        assert_in_order(got, [b"%03d" % k for k in range(50)])
        sub_qos = 2 if i % 2 == 0 else 1
        assert sorted((m.payload, m.qos) for m in got) == [(b"%03d" % k, min(1 + k % 2, sub_qos)) for k in range(50)]
    time.sleep(0.5)
    assert all(c.messages.empty() for c in clients)     # nothing more, to any of them
    # Every replayed message was acknowledged: no session rows, and the ranges read are gone.
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = ANY($1::text[])",
                              devices) == 0)
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = ANY($1::text[])",
                              devices) == 0)
    for c in clients:
        c.close()
    for cid in devices:
        wait_offline(a, cid)
    # Offline again: one open range each, starting after the burst, so housekeeping prunes it.
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = ANY($1::text[]) "
                                   "AND until_seq IS NULL AND cursor >= 50", devices) == 200)
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1",
                              f"{topic}/cmd") == 0, 30)
    pub.close()
    forget(dsn, devices)


def forget(dsn, client_ids) -> None:
    """Sessions that never expire (3.1.1) would be adopted by the next test's broker: remove them."""
    stored(dsn, "WITH d AS (DELETE FROM fluxpg.mqtt_sessions WHERE client_id = ANY($1::text[]) RETURNING 1) "
                "SELECT count(*) FROM d", list(client_ids))


def test_messages_published_during_the_replay_arrive_once_in_order(threaded_broker, dsn, monkeypatch):
    """The boundary: the session reconnects while its backlog is being read (held there by a
    gate), messages published meanwhile arrive after the backlog, each exactly once."""
    a = threaded_broker()
    port = a.port("mqtt")
    topic = f"edge/{uid()}"
    cid = uid("edge")
    sub = persistent(V5, cid, port)
    sub.subscribe(topic, qos=2)
    sub.close()
    wait_offline(a, cid)
    pub = Paho(port)
    for k in range(100):
        pub.publish(topic, b"%03d" % k, qos=1 + k % 2)

    gate, entered = threading.Event(), threading.Event()
    original = MqttSessionStore.offline_cursors

    async def held_at_the_gate(self, client_id):
        if client_id == cid:
            entered.set()
            while not gate.is_set():
                await asyncio.sleep(0.01)
        return await original(self, client_id)

    monkeypatch.setattr(MqttSessionStore, "offline_cursors", held_at_the_gate)
    again = persistent(V5, cid, port)          # CONNACK comes before the replay
    assert again.connack_flags.session_present
    assert entered.wait(10)
    for k in range(100, 200):                  # live: the session is connected, replay pending
        pub.publish(topic, b"%03d" % k, qos=1 + k % 2)
    gate.set()
    got = [again.get() for _ in range(200)]
    assert_in_order(got, [b"%03d" % k for k in range(200)])
    assert sorted((m.payload, m.qos) for m in got) == [(b"%03d" % k, 1 + k % 2) for k in range(200)]
    again.nothing(0.5)
    # Only the backlog went through the log; the rest was delivered live.
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", topic) <= 100
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_session_messages WHERE client_id = $1", cid) == 0)
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1", cid) == 0)
    # Offline again and back: only what was published in between.
    again.close()
    wait_offline(a, cid)
    pub.publish(topic, b"late", qos=2)
    third = persistent(V5, cid, port)
    assert third.get().payload == b"late"
    third.nothing(0.5)
    third.close()
    pub.close()


def test_replay_applies_qos_retain_as_published_and_subscription_ids(threaded_broker):
    a = threaded_broker()
    port = a.port("mqtt")
    topic = f"opts/{uid()}"
    cid_rap, cid_plain = uid("rap"), uid("plain")
    s1 = persistent(V5, cid_rap, port)
    sp = PahoProps(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 7
    s1.subscribe(f"{topic}/#", qos=1, props=sp, retainAsPublished=True)
    s1.close()
    wait_offline(a, cid_rap)
    s2 = persistent(V5, cid_plain, port)
    s2.subscribe(f"{topic}/#", qos=2)
    s2.close()
    wait_offline(a, cid_plain)
    pub = Paho(port)
    pub.publish(f"{topic}/r", b"retained", qos=2, retain=True)
    pub.publish(f"{topic}/n", b"normal", qos=2)
    pub.publish(f"{topic}/z", b"zero", qos=0)          # QoS 0 is not kept for offline sessions
    r1 = persistent(V5, cid_rap, port)
    got = [r1.get() for _ in range(2)]
    assert [(m.payload, m.qos, m.retain) for m in got] == [(b"retained", 1, True), (b"normal", 1, False)]
    assert all(m.properties.SubscriptionIdentifier == [7] for m in got)
    r1.nothing(0.3)
    r2 = persistent(V5, cid_plain, port)
    got = [r2.get() for _ in range(2)]
    assert [(m.payload, m.qos, m.retain) for m in got] == [(b"retained", 2, False), (b"normal", 2, False)]
    r2.nothing(0.3)
    for c in (r1, r2):
        c.close()
    pub.publish(f"{topic}/r", b"", qos=1, retain=True)
    pub.close()


def test_session_expiry_removes_its_cursor_and_the_log_is_pruned(threaded_broker, dsn):
    a = threaded_broker()
    port = a.port("mqtt")
    topic = f"gone/{uid()}"
    cid = uid("gone")
    # Long enough for the ten publishes and the two counts below to finish before the expiry
    # (which runs from the DISCONNECT) on a loaded machine.
    c = persistent(V5, cid, port, expiry=5)
    c.subscribe(topic, qos=1)
    c.close()
    wait_offline(a, cid)
    pub = Paho(port)
    for k in range(10):
        pub.publish(topic, b"%d" % k, qos=1)
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", topic) == 10
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1", cid) == 1
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid) == 0, 30)
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_cursors WHERE client_id = $1", cid) == 0
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", topic) == 0, 30)
    again = persistent(V5, cid, port)
    assert not again.connack_flags.session_present
    again.nothing(0.3)
    again.close()
    pub.close()


def test_offline_backlog_moves_with_the_session_to_another_node(threaded_broker, dsn):
    """Offline on node A with a backlog in A's stream; the client connects to node B, which takes
    the session over: B replays A's range (closed at the handover), then delivers live."""
    a = threaded_broker()
    b = threaded_broker()
    topic = f"roam/{uid()}"
    cid = uid("roam")
    c = persistent(V5, cid, a.port("mqtt"))
    c.subscribe(topic, qos=1)
    c.close()
    wait_offline(a, cid)
    pub = Paho(a.port("mqtt"))
    for k in range(20):
        pub.publish(topic, b"%02d" % k, qos=1)
    on_b = persistent(V5, cid, b.port("mqtt"))
    assert on_b.connack_flags.session_present
    assert [on_b.get().payload for _ in range(20)] == [b"%02d" % k for k in range(20)]
    on_b.nothing(0.3)
    # Published on A after the move: relayed to B, delivered live, once.
    wait_until(lambda: _router(a).remote_nodes)
    pub.publish(topic, b"after", qos=1)
    assert on_b.get().payload == b"after"
    on_b.nothing(0.5)
    on_b.close()
    pub.close()


@pytest.mark.parametrize("version", [V5, V311])
def test_offline_bound_keeps_the_newest_and_counts_the_rest(threaded_broker, dsn, version):
    from fluxpg.config import Config
    limit = 30
    a = threaded_broker(config=Config(bounds={"mqtt_session_outbound_messages": limit}))
    port = a.port("mqtt")
    topic = f"bound/{uid()}"
    cid = uid("bound")
    c = persistent(version, cid, port)
    c.subscribe(topic, qos=1)
    c.close()
    wait_offline(a, cid)
    pub = Paho(port, version=version)
    for k in range(100):
        pub.publish(topic, b"%03d" % k, qos=1)
    router = _router(a)
    assert router.offline_dropped == 70
    # The cursor moves past the dropped ones in housekeeping: visible in the session row.
    wait_until(lambda: stored(dsn, "SELECT offline_dropped FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid) == 70)
    again = persistent(version, cid, port)
    assert [again.get().payload for _ in range(limit)] == [b"%03d" % k for k in range(70, 100)]
    again.nothing(0.5)
    assert router.offline_dropped == 70
    again.close()
    pub.close()
    forget(dsn, [cid])


def test_a_dormant_session_does_not_hold_back_rows_it_does_not_match(threaded_broker, dsn):
    """A device offline for good (3.1.1, never expires) subscribed elsewhere: its cursor moves past
    the rows it does not match (housekeeping), so the log is pruned once the others have them."""
    a = threaded_broker()
    port = a.port("mqtt")
    topic = f"busy/{uid()}"
    dormant, active = uid("dormant"), uid("active")
    d = persistent(V311, dormant, port)
    d.subscribe(f"elsewhere/{uid()}/#", qos=1)
    d.close()
    wait_offline(a, dormant)
    c = persistent(V311, active, port)
    c.subscribe(topic, qos=1)
    c.close()
    wait_offline(a, active)
    pub = Paho(port)
    for k in range(10):
        pub.publish(topic, b"%d" % k, qos=1)
    assert stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", topic) == 10
    again = persistent(V311, active, port)
    assert sorted(again.get().payload for _ in range(10)) == sorted(b"%d" % k for k in range(10))
    again.nothing(0.3)
    again.close()
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_offline_log WHERE topic = $1", topic) == 0, 30)
    pub.close()
    forget(dsn, [dormant, active])


def test_a_v5_reconnect_with_session_expiry_0_still_gets_what_was_queued(threaded_broker, dsn):
    """MQTT 5 "resume, then end": the CONNECT resumes the session (clean start 0) but sets no
    session expiry, so the session ends at this connection's close. What was queued for it while
    it was offline is still delivered (it was dropped: Paho's test_offline_message_queueing and
    test_publication_expiry got nothing), and the session's rows go when it ends."""
    srv = threaded_broker()
    port = srv.port("mqtt")
    cid = uid("resume0")
    topic = f"r0/{uid()}"
    sub = persistent(V5, cid, port)
    sub.subscribe(f"{topic}/+", qos=2)
    sub.close()
    wait_offline(srv, cid)
    pub = Paho(port)
    pub.publish(f"{topic}/one", b"qos 1", qos=1)
    pub.publish(f"{topic}/two", b"qos 2", qos=2)
    pub.close()
    again = Paho(port, cid, version=V5, clean=False)      # no SessionExpiryInterval: 0
    assert again.connack_flags.session_present
    got = [again.get() for _ in range(2)]
    assert [(m.payload, m.qos) for m in got] == [(b"qos 1", 1), (b"qos 2", 2)]
    again.nothing(0.5)
    again.close()
    wait_until(lambda: stored(dsn, "SELECT count(*) FROM fluxpg.mqtt_sessions WHERE client_id = $1", cid) == 0)
