"""The authorization matrix: every action × protocol × (allowed, forbidden), with real clients
(paho-mqtt v5, pika, python-qpid-proton) against a real broker with an `auth:` section.

Every protocol calls the one function fluxpg.auth.authorize, so each row must give the same answer
on all three. Where an action exists on one protocol only (queue.declare, passive declare) the row
is that protocol's. Besides the client's answer, each case checks the log/queue state: a refused
action changed nothing, an allowed one did what it says.
"""
from __future__ import annotations

import threading
import time
import uuid

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from proton import Message, symbol
from proton.reactor import LinkOption
from proton.utils import BlockingConnection, LinkDetached

from fluxpg.config import AuthConfig, Config, QueueConfig

pytestmark = pytest.mark.timeout(90)

PROTOCOLS = ("mqtt", "amqp091", "amqp10")


@pytest.fixture
def matrix(threaded_broker):
    """Queues `orders`, `sec` (classic), `log` (stream), `jobs`, `other` and the users:
    root (everything), eu (publish orders, consume only orders/eu/#), mallory (all on `other`
    only), keeper (consume sec and log), builder (configure newq*, read orders), grp (consume jobs
    as groups workers-* only)."""
    sfx = uuid.uuid4().hex[:6]
    q = {name: f"{name}_{sfx}" for name in ("orders", "sec", "log", "jobs", "other", "newq", "newq2")}
    users = [
        {"username": "root", "password": "pw"},
        {"username": "eu", "password": "pw", "permissions": [
            {"action": "publish", "pattern": f"$queue/{q['orders']}/#"},
            {"action": "consume", "pattern": f"$queue/{q['orders']}/eu/#"}]},
        {"username": "mallory", "password": "pw", "permissions": [{"action": "all", "pattern": q["other"]}]},
        {"username": "keeper", "password": "pw", "permissions": [
            {"action": "consume", "pattern": q["sec"]}, {"action": "consume", "pattern": q["log"]}]},
        {"username": "builder", "password": "pw", "permissions": [
            {"action": "configure", "pattern": q["newq"]}, {"action": "read", "pattern": q["orders"]}]},
        {"username": "grp", "password": "pw", "permissions": [
            {"action": "consume", "pattern": q["jobs"], "groups": ["workers-*"]}]},
    ]
    config = Config(queues=[QueueConfig(name=q["orders"]), QueueConfig(name=q["sec"]),
                            QueueConfig(name=q["log"], type="stream"), QueueConfig(name=q["jobs"]),
                            QueueConfig(name=q["other"])],
                    auth=AuthConfig(users=users))
    srv = threaded_broker(config=config)
    srv.q = q
    return srv


# --------------------------------------------------------------------------- clients


class Mqtt:
    """A paho v5 client that waits for each answer and returns its reason codes."""

    def __init__(self, srv, user: str):
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{user}-{uuid.uuid4().hex[:8]}",
                             protocol=mqtt.MQTTv5)
        self.c.username_pw_set(user, "pw")
        self.acks: dict = {}
        self.subacks: dict = {}
        self.messages: list = []
        self.cond = threading.Condition()
        self.c.on_connect = self._on_connect
        self.c.on_publish = lambda c, u, mid, rc, p: self._put(self.acks, mid, rc)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self._put(self.subacks, mid, rcs)
        self.c.on_message = lambda c, u, msg: self._put_msg(msg)
        self.connected = None
        self.c.connect("127.0.0.1", srv.port("mqtt"), keepalive=30)
        self.c.loop_start()
        self._wait(lambda: self.connected is not None)
        assert not self.connected.is_failure, self.connected

    def _on_connect(self, c, u, flags, rc, props):
        with self.cond:
            self.connected = rc
            self.cond.notify_all()

    def _put(self, d, key, value):
        with self.cond:
            d[key] = value
            self.cond.notify_all()

    def _put_msg(self, msg):
        with self.cond:
            self.messages.append(msg)
            self.cond.notify_all()

    def _wait(self, pred, timeout=10):
        with self.cond:
            assert self.cond.wait_for(pred, timeout), "no answer from the broker"

    def publish(self, topic: str, payload: bytes = b"x", **user_props) -> bool:
        props = Properties(PacketTypes.PUBLISH)
        if user_props:
            props.UserProperty = [(k.replace("_", "-"), str(v)) for k, v in user_props.items()]
        info = self.c.publish(topic, payload, qos=1, properties=props)
        self._wait(lambda: info.mid in self.acks)
        return not self.acks[info.mid].is_failure

    def subscribe(self, topic_filter: str, group: str | None = None) -> bool:
        props = Properties(PacketTypes.SUBSCRIBE)
        if group:
            props.UserProperty = ("consumer-group", group)
        _, mid = self.c.subscribe(topic_filter, qos=1, properties=props)
        self._wait(lambda: mid in self.subacks)
        return not self.subacks[mid][0].is_failure

    def close(self):
        self.c.loop_stop()
        self.c.disconnect()


def pika_conn(srv, user: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(host="127.0.0.1", port=srv.port("amqp091"),
                                       credentials=pika.PlainCredentials(user, "pw"),
                                       connection_attempts=1, socket_timeout=10, blocked_connection_timeout=10)
    return pika.BlockingConnection(params)


def pika_refused(fn) -> int | None:
    """Run a pika call; the reply code of the channel close it provoked, None when it worked."""
    try:
        fn()
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    return None


class Props(LinkOption):
    def __init__(self, **props):
        self.props = {symbol(k.replace("_", "-")): v for k, v in props.items()}

    def apply(self, link):
        link.properties = self.props


def amqp10(srv, user: str) -> BlockingConnection:
    return BlockingConnection(f"amqp://127.0.0.1:{srv.port('amqp')}", timeout=10, user=user, password="pw",
                              allowed_mechs="PLAIN", sasl_enabled=True)


def amqp10_refused(fn) -> bool:
    try:
        fn()
    except LinkDetached as exc:
        assert "amqp:unauthorized-access" in str(exc), exc
        return True
    return False


def wait_until(pred, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def count(srv, queue: str) -> int:
    """Messages in the queue's log (its depth row)."""
    for row in srv.call(srv.manager.queue_stats()):
        if row["queue"] == queue:
            return int(row["depth"] or 0)
    return 0


def pending(srv, queue: str, group: str) -> list[int]:
    return sorted(int(r["seq"]) for r in srv.call(srv.manager.pending_entries(queue, group)))


def _delivery_count(srv, queue: str, group: str) -> int:
    rows = srv.call(srv.manager.pending_entries(queue, group))
    return max((int(r["delivery_count"]) for r in rows), default=0)


def hold_pending(srv, queue: str, group: str) -> int:
    """Publish one message to `queue` and claim it as `group` without acknowledging it: the
    pending entry another user must not be able to settle. Returns its offset."""
    srv.call(srv.manager.publish(f"$queue/{queue}/x", b"victim", None))
    got: list = []

    async def sub():
        return await srv.manager.subscribe(queue, group, f"victim-{uuid.uuid4().hex[:6]}",
                                           on_delivery=lambda d: got.append(d))
    srv.subscription = srv.call(sub())
    wait_until(lambda: got)
    return got[0].seq


# --------------------------------------------------------------------------- publish


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_publish(matrix, protocol):
    srv, q = matrix, matrix.q
    allowed, forbidden = f"$queue/{q['orders']}/eu/1", f"$queue/{q['other']}/1"
    if protocol == "mqtt":
        c = Mqtt(srv, "eu")
        try:
            assert c.publish(allowed)
            assert not c.publish(forbidden)
        finally:
            c.close()
    elif protocol == "amqp091":
        conn = pika_conn(srv, "eu")
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", allowed, b"x")
            assert pika_refused(lambda: ch.basic_publish("", forbidden, b"x")) == 403
        finally:
            conn.close()
    else:
        conn = amqp10(srv, "eu")
        try:
            conn.create_sender(allowed).send(Message(body="x"))
            assert amqp10_refused(lambda: conn.create_sender(forbidden))
            relay = conn.create_sender(None)
            bad = relay.send(Message(address=forbidden, body="no"), error_states=[])
            assert bad.remote.condition.name == "amqp:unauthorized-access"
        finally:
            conn.close()
    assert count(srv, q["orders"]) == 1
    assert count(srv, q["other"]) == 0


# --------------------------------------------------------------------------- consume with a filter


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_consume_with_filter(matrix, protocol):
    """eu may consume `$queue/orders/eu/#` — and only that — on every protocol."""
    srv, q = matrix, matrix.q
    sub, whole = f"$queue/{q['orders']}/eu/#", q["orders"]
    srv.call(srv.manager.publish(f"$queue/{q['orders']}/eu/de", b"for-eu", None))
    if protocol == "mqtt":
        c = Mqtt(srv, "eu")
        try:
            assert c.subscribe(sub, group="eu-readers")
            c._wait(lambda: c.messages)
            assert [m.payload for m in c.messages] == [b"for-eu"]
            assert not c.subscribe(f"$queue/{whole}/#", group="eu-readers")
            assert not c.subscribe(f"$queue/{whole}", group="eu-readers")
        finally:
            c.close()
    elif protocol == "amqp091":
        conn = pika_conn(srv, "eu")
        try:
            ch = conn.channel()
            got: list = []
            ch.basic_consume(sub, lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                conn.process_data_events(0.1)
            assert got == [b"for-eu"]
            ch2 = conn.channel()

            def consume_whole():
                ch2.basic_consume(whole, lambda *a: None)
                conn.process_data_events(0.5)
            assert pika_refused(consume_whole) == 403
            ch3 = conn.channel()
            assert pika_refused(lambda: ch3.basic_get(whole)) == 403
        finally:
            conn.close()
    else:
        conn = amqp10(srv, "eu")
        try:
            rcv = conn.create_receiver(sub, options=Props(consumer_group="eu-readers"))
            assert rcv.receive(timeout=10).body == b"for-eu"
            rcv.accept()
            assert amqp10_refused(lambda: conn.create_receiver(whole))
            assert amqp10_refused(lambda: conn.create_receiver(f"$queue/{whole}/#"))
        finally:
            conn.close()


# --------------------------------------------------------------------------- consume as a group


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_consume_group(matrix, protocol):
    """grp may consume `jobs` as a workers-* group only."""
    srv, q = matrix, matrix.q
    jobs = q["jobs"]
    if protocol == "mqtt":
        c = Mqtt(srv, "grp")
        try:
            assert c.subscribe(f"$queue/{jobs}", group="workers-1")
            assert not c.subscribe(f"$queue/{jobs}/#", group="spy")
        finally:
            c.close()
        groups = [r["grp"] for r in srv.call(srv.manager.group_status(jobs))]
    elif protocol == "amqp091":
        conn = pika_conn(srv, "grp")
        try:
            ch = conn.channel()
            ch.basic_consume(jobs, lambda *a: None, arguments={"x-consumer-group": "workers-2"})
            ch2 = conn.channel()

            def spy():
                ch2.basic_consume(jobs, lambda *a: None, arguments={"x-consumer-group": "spy"})
                conn.process_data_events(0.5)
            assert pika_refused(spy) == 403
            ch3 = conn.channel()

            def default_group():   # the default group is the queue's name: not workers-*
                ch3.basic_consume(jobs, lambda *a: None)
                conn.process_data_events(0.5)
            assert pika_refused(default_group) == 403
            groups = [r["grp"] for r in srv.call(srv.manager.group_status(jobs))]
        finally:
            conn.close()
    else:
        conn = amqp10(srv, "grp")
        try:
            conn.create_receiver(jobs, options=Props(consumer_group="workers-3"))
            assert amqp10_refused(lambda: conn.create_receiver(jobs, name="spy-link", options=Props(consumer_group="spy")))
            groups = [r["grp"] for r in srv.call(srv.manager.group_status(jobs))]
        finally:
            conn.close()
    assert "spy" not in groups and jobs not in groups


# --------------------------------------------------------------------------- ack / nack / reject / commit


CONTROL = ("ack", "nack", "reject")


@pytest.mark.parametrize("verb", CONTROL)
@pytest.mark.parametrize("protocol", ("mqtt", "amqp091"))
def test_control_publish(matrix, protocol, verb):
    """`$queue/sec/$<verb>` settles another consumer's entry: mallory (rights on `other` only) is
    refused and the entry stays pending; keeper (consume on sec) settles it."""
    srv, q = matrix, matrix.q
    sec, group = q["sec"], "victims"
    seq = hold_pending(srv, sec, group)
    topic = f"$queue/{sec}/${verb}"
    headers = {"message-id": f"{sec}:{seq}", "group-id": group}
    for user, allowed in (("mallory", False), ("keeper", True)):
        if protocol == "mqtt":
            c = Mqtt(srv, user)
            try:
                assert c.publish(topic, b"", **headers) is allowed
            finally:
                c.close()
        else:
            conn = pika_conn(srv, user)
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                code = pika_refused(lambda: ch.basic_publish("", topic, b"",
                                                             pika.BasicProperties(headers=headers)))
                assert code == (None if allowed else 403)
            finally:
                conn.close()
        if not allowed:
            assert pending(srv, sec, group) == [seq], f"{user}'s ${verb} changed the entry"
    if verb == "reject":   # dead-lettered: gone from the group, one message in $dlq/<sec>
        wait_until(lambda: pending(srv, sec, group) == [] and count(srv, f"$dlq/{sec}") == 1)
    elif verb == "ack":
        wait_until(lambda: pending(srv, sec, group) == [])
    else:                  # nack: back for redelivery after the retry backoff (not pending meanwhile)
        wait_until(lambda: pending(srv, sec, group) != [seq] or _delivery_count(srv, sec, group) > 1)


def test_control_publish_amqp10(matrix):
    """AMQP 1.0 links to a control topic need the consume right on the whole queue."""
    srv, q = matrix, matrix.q
    conn = amqp10(srv, "mallory")
    try:
        for verb in ("ack", "nack", "reject", "commit"):
            assert amqp10_refused(lambda v=verb: conn.create_sender(f"$queue/{q['sec']}/${v}"))
        relay = conn.create_sender(None)
        bad = relay.send(Message(address=f"$queue/{q['sec']}/$reject", body=""), error_states=[])
        assert bad.remote.condition.name == "amqp:unauthorized-access"
    finally:
        conn.close()
    conn = amqp10(srv, "keeper")
    try:
        conn.create_sender(f"$queue/{q['sec']}/$ack")   # attached: keeper consumes sec
    finally:
        conn.close()


@pytest.mark.parametrize("protocol", ("mqtt", "amqp091"))
def test_commit(matrix, protocol):
    """A `$commit` moves a stream group's checkpoint: keeper (consume on log) may, mallory not."""
    srv, q = matrix, matrix.q
    log_q, group = q["log"], "readers"
    for i in range(3):
        srv.call(srv.manager.publish(f"$queue/{log_q}/x", f"m{i}".encode(), None))
    topic = f"$queue/{log_q}/$commit"
    got: list = []

    async def reader():   # the group exists: a stream reader of `readers` got the messages
        return await srv.manager.subscribe(log_q, group, "reader", on_delivery=lambda d: got.append(d),
                                           auto_commit=False)
    srv.subscription = srv.call(reader())
    wait_until(lambda: len(got) == 3)

    def committed():
        rows = [r for r in srv.call(srv.manager.group_status(log_q)) if r["grp"] == group]
        return rows[0]["committed"] if rows else None

    for user, allowed in (("mallory", False), ("keeper", True)):
        if protocol == "mqtt":
            c = Mqtt(srv, user)
            try:
                assert c.publish(topic, b"", group_id=group, x_offset=1) is allowed
            finally:
                c.close()
        else:
            conn = pika_conn(srv, user)
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                code = pika_refused(lambda: ch.basic_publish(
                    "", topic, b"", pika.BasicProperties(headers={"x-group-id": group, "x-offset": 1})))
                assert code == (None if allowed else 403)
            finally:
                conn.close()
        if not allowed:
            assert committed() in (None, 0), "mallory's $commit moved the checkpoint"
    wait_until(lambda: committed() == 2)   # x-offset 1 processed: the checkpoint is 2


# --------------------------------------------------------------------------- declare / passive declare


def test_declare_needs_configure(matrix):
    srv, q = matrix, matrix.q
    conn = pika_conn(srv, "eu")
    try:
        ch = conn.channel()
        assert pika_refused(lambda: ch.queue_declare(q["newq2"], durable=True)) == 403
        ch = conn.channel()
        assert pika_refused(lambda: ch.queue_declare("", exclusive=True)) == 403   # server-named too
    finally:
        conn.close()
    srv.call(srv.manager.reload_queues())
    assert srv.manager.queue_info(q["newq2"]) is None
    conn = pika_conn(srv, "builder")
    try:
        ch = conn.channel()
        assert ch.queue_declare(q["newq"], durable=True).method.queue == q["newq"]
        assert pika_refused(lambda: ch.queue_declare(q["newq2"], durable=True)) == 403
    finally:
        conn.close()
    srv.call(srv.manager.reload_queues())
    assert srv.manager.queue_info(q["newq"]) is not None
    assert srv.manager.queue_info(q["newq2"]) is None
    conn = pika_conn(srv, "root")
    try:
        conn.channel().queue_declare(q["newq2"], durable=True)
    finally:
        conn.close()


def test_passive_declare_needs_read(matrix):
    srv, q = matrix, matrix.q
    for i in range(2):
        srv.call(srv.manager.publish(f"$queue/{q['orders']}/us/{i}", b"x", None))
    conn = pika_conn(srv, "builder")     # read on orders
    try:
        ok = conn.channel().queue_declare(q["orders"], passive=True)
        assert ok.method.message_count == 2
        ch = conn.channel()
        assert pika_refused(lambda: ch.queue_declare(q["sec"], passive=True)) == 403
    finally:
        conn.close()
    conn = pika_conn(srv, "eu")          # consumes only part of orders: no read on the queue
    try:
        ch = conn.channel()
        assert pika_refused(lambda: ch.queue_declare(q["orders"], passive=True)) == 403
    finally:
        conn.close()
    conn = pika_conn(srv, "keeper")      # consume on sec implies read on it
    try:
        assert conn.channel().queue_declare(q["sec"], passive=True).method.message_count == 0
    finally:
        conn.close()
