"""Authentication and permissions end to end: the same users over MQTT (paho), AMQP 0-9-1 (pika)
and AMQP 1.0 (proton SASL PLAIN, and our own SASL frames), against a broker with an `auth:`
section. Matrix: right credentials, wrong password, missing credentials, forbidden queue."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pika
import pika.exceptions
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached

from fluxpg.auth import hash_password
from fluxpg.config import AuthConfig, Config, QueueConfig
from fluxpg.protocols.amqp10 import sasl as sasl_codec
from tests.helpers import paho_loop_stop

pytestmark = pytest.mark.timeout(60)



@pytest.fixture
def secured(threaded_broker, qname):
    """A broker with auth on: alice may do everything; bob only publish to and consume from
    `<qname>`; anonymous clients are refused."""
    allowed = f"{qname}_ok"
    other = f"{qname}_no"
    auth = AuthConfig(users=[
        {"username": "alice", "password": "wonderland"},
        {"username": "bob", "password_hash": hash_password("builder"),
         "permissions": [{"action": "publish", "pattern": f"$queue/{allowed}/#"},
                         {"action": "consume", "pattern": allowed}]},
    ])
    config = Config(queues=[QueueConfig(name=allowed), QueueConfig(name=other)], auth=auth)
    srv = threaded_broker(config=config)
    srv.allowed, srv.other = allowed, other
    return srv


# --------------------------------------------------------------------------- AMQP 1.0


def amqp10(srv, **kwargs) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{srv.port('amqp')}", timeout=10, **kwargs)


def test_amqp10_sasl_plain_matrix(secured):
    srv = secured
    # right credentials: the PyPI proton client does PLAIN itself (no Cyrus needed on the client)
    conn = amqp10(srv, user="bob", password="builder", allowed_mechs="PLAIN", sasl_enabled=True)
    try:
        conn.create_sender(f"$queue/{srv.allowed}/a").send(Message(body="hi"))
        rcv = conn.create_receiver(srv.allowed)
        assert rcv.receive(timeout=10).body == "hi"
        rcv.accept()
        # forbidden queue: publishing and consuming are refused with amqp:unauthorized-access
        with pytest.raises(LinkDetached) as err:
            conn.create_sender(f"$queue/{srv.other}/a")
        assert "amqp:unauthorized-access" in str(err.value)
        with pytest.raises(LinkDetached) as err:
            conn.create_receiver(f"$queue/{srv.other}")
        assert "amqp:unauthorized-access" in str(err.value)
        # the anonymous relay checks each message's address
        relay = conn.create_sender(None)
        bad = relay.send(Message(address=f"$queue/{srv.other}/x", body="no"), error_states=[])
        assert bad.remote.condition.name == "amqp:unauthorized-access"
    finally:
        conn.close()
    # wrong password
    with pytest.raises(ConnectionException) as err:
        amqp10(srv, user="bob", password="wrong", allowed_mechs="PLAIN", sasl_enabled=True)
    assert "unauthorized" in str(err.value).lower() or "authentication" in str(err.value).lower()
    # unknown user
    with pytest.raises(ConnectionException):
        amqp10(srv, user="mallory", password="builder", allowed_mechs="PLAIN", sasl_enabled=True)
    # missing credentials: SASL ANONYMOUS is not offered
    with pytest.raises(ConnectionException):
        amqp10(srv, allowed_mechs="ANONYMOUS", sasl_enabled=True)
    # skipping SASL altogether: the open is answered with close amqp:unauthorized-access
    with pytest.raises(ConnectionException) as err:
        amqp10(srv, sasl_enabled=False)
    assert "amqp:unauthorized-access" in str(err.value)


def _sasl_exchange(port: int, frames: bytes) -> tuple[list[int], int | None, bytes]:
    """Send raw SASL bytes; return (offered mechanisms frame seen, outcome code, what followed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frames)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if _outcome(data) is not None:
                break
    assert data.startswith(sasl_codec.SASL_HEADER)
    return data, _outcome(data)


def _outcome(data: bytes) -> int | None:
    pos = 8
    while len(data) >= pos + 8:
        size = struct.unpack_from(">I", data, pos)[0]
        if len(data) < pos + size:
            return None
        code, fields = sasl_codec.decode_frame(data[pos:pos + size])
        if code == sasl_codec.SASL_OUTCOME:
            return int(fields[0])
        pos += size
    return None


def test_amqp10_own_sasl_frames(secured):
    """Our SASL layer with hand-made client frames: offered mechanisms, PLAIN ok/failed."""
    port = secured.port("amqp")
    data, code = _sasl_exchange(port, sasl_codec.client_frames("PLAIN", "alice", "wonderland"))
    assert code == sasl_codec.SaslCode.OK
    assert b"PLAIN" in data and b"ANONYMOUS" not in data
    _, code = _sasl_exchange(port, sasl_codec.client_frames("PLAIN", "alice", "nope"))
    assert code == sasl_codec.SaslCode.AUTH
    _, code = _sasl_exchange(port, sasl_codec.client_frames("ANONYMOUS"))
    assert code == sasl_codec.SaslCode.AUTH


def test_amqp10_anonymous_allowed_when_configured(threaded_broker, qname):
    auth = AuthConfig(allow_anonymous=True, anonymous_permissions=[{"action": "consume", "pattern": qname}])
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)], auth=auth))
    conn = amqp10(srv)  # proton picks ANONYMOUS
    try:
        conn.create_receiver(qname)
        with pytest.raises(LinkDetached):
            conn.create_sender(f"$queue/{qname}")
    finally:
        conn.close()


def test_users_from_the_database_table(secured):
    srv = secured
    perms = [{"action": "all", "pattern": srv.allowed}]   # the pool's jsonb codec encodes it
    srv.call(srv.manager.pool.execute(
        "INSERT INTO fluxpg.users (username, password_hash, permissions) VALUES ($1, $2, $3) "
        "ON CONFLICT (username) DO UPDATE SET password_hash = EXCLUDED.password_hash, "
        "permissions = EXCLUDED.permissions", "carol", hash_password("pw-from-db"), perms))
    conn = amqp10(srv, user="carol", password="pw-from-db", allowed_mechs="PLAIN", sasl_enabled=True)
    try:
        conn.create_sender(srv.allowed).send(Message(body="db user"))
        with pytest.raises(LinkDetached):
            conn.create_sender(srv.other)
    finally:
        conn.close()
    with pytest.raises(ConnectionException):
        amqp10(srv, user="carol", password="not-it", allowed_mechs="PLAIN", sasl_enabled=True)


def test_failed_logins_are_slowed_and_logged(secured, caplog):
    srv = secured
    caplog.set_level("WARNING", logger="fluxpg.auth")
    times = []
    for _ in range(3):
        started = time.monotonic()
        _, code = _sasl_exchange(srv.port("amqp"), sasl_codec.client_frames("PLAIN", "slowpoke", "guess"))
        times.append(time.monotonic() - started)
        assert code == sasl_codec.SaslCode.AUTH
    assert times[2] > times[0] and times[2] >= 0.35   # 0.1, 0.2, 0.4 s …
    messages = [r.getMessage() for r in caplog.records if r.name == "fluxpg.auth"]
    assert any("slowpoke" in m and "amqp10" in m for m in messages)
    assert not any("guess" in m for m in messages)   # never the password
    # another client logging in meanwhile is not slowed down
    started = time.monotonic()
    _, code = _sasl_exchange(srv.port("amqp"), sasl_codec.client_frames("PLAIN", "alice", "wonderland"))
    assert code == sasl_codec.SaslCode.OK and time.monotonic() - started < 1.0


# --------------------------------------------------------------------------- MQTT (paho)


def _mqtt_connect(srv, username=None, password=None):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"c{time.monotonic_ns()}",
                         protocol=mqtt.MQTTv5)
    if username is not None:
        client.username_pw_set(username, password)
    result: dict = {}
    connected = threading.Event()

    def on_connect(c, userdata, flags, reason_code, properties):
        result["rc"] = reason_code
        connected.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", srv.port("mqtt"), keepalive=30)
    client.loop_start()
    assert connected.wait(10), "no CONNACK"
    return client, result["rc"]


def test_mqtt_matrix(secured):
    srv = secured
    for user, password in (("bob", "wrong"), ("nobody", "builder"), (None, None)):
        client, rc = _mqtt_connect(srv, user, password)
        paho_loop_stop(client)   # refused: its thread may have ended by itself
        client.disconnect()
        assert rc.is_failure, (user, rc)
        assert rc.value in (134, 135)   # bad user name or password / not authorized
    client, rc = _mqtt_connect(srv, "bob", "builder")
    try:
        assert not rc.is_failure
        acks: dict = {}
        done = threading.Event()

        def on_publish(c, userdata, mid, reason_code, properties):
            acks[mid] = reason_code
            done.set()

        client.on_publish = on_publish
        ok = client.publish(f"$queue/{srv.allowed}/x", b"ok", qos=1)
        assert done.wait(10)
        assert not acks[ok.mid].is_failure
        done.clear()
        refused = client.publish(f"$queue/{srv.other}/x", b"no", qos=1)
        assert done.wait(10)
        assert acks[refused.mid].is_failure

        subacks: dict = {}
        subscribed = threading.Event()

        def on_subscribe(c, userdata, mid, reason_codes, properties):
            subacks[mid] = reason_codes
            subscribed.set()

        client.on_subscribe = on_subscribe
        props = Properties(PacketTypes.SUBSCRIBE)
        props.UserProperty = ("consumer-group", "g")
        _, mid = client.subscribe(f"$queue/{srv.other}/#", qos=1, properties=props)
        assert subscribed.wait(10)
        assert subacks[mid][0].is_failure
    finally:
        client.loop_stop()
        client.disconnect()


# --------------------------------------------------------------------------- AMQP 0-9-1 (pika)


def _pika(srv, user, password):
    params = pika.ConnectionParameters(host="127.0.0.1", port=srv.port("amqp091"),
                                       credentials=pika.PlainCredentials(user, password),
                                       connection_attempts=1, socket_timeout=10, blocked_connection_timeout=10)
    return pika.BlockingConnection(params)


def test_amqp091_matrix(secured):
    srv = secured
    for user, password in (("bob", "wrong"), ("nobody", "x"), ("", "")):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            _pika(srv, user, password)
    conn = _pika(srv, "bob", "builder")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", f"$queue/{srv.allowed}/x", b"ok")
        with pytest.raises((pika.exceptions.ChannelClosedByBroker, pika.exceptions.NackError,
                            pika.exceptions.UnroutableError)):
            ch.basic_publish("", f"$queue/{srv.other}/x", b"no")
        ch2 = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch2.basic_consume(srv.other, lambda *a: None)
            conn.process_data_events(1)
        assert err.value.reply_code == 403
    finally:
        if conn.is_open:
            conn.close()
