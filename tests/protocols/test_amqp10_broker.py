"""AMQP 1.0 against a real fluxpg, with python-qpid-proton clients: BlockingConnection (on the
`threaded_broker`, since it blocks) and a Container-based client running in its own thread."""
from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest
from proton import Condition, Delivery, Message, symbol, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption
from proton import Timeout
from proton.utils import BlockingConnection, LinkDetached, SendException

from fluxpg.config import QueueConfig
from fluxpg.protocols.amqp10 import connection as amqp10_connection

pytestmark = pytest.mark.timeout(60)


class Props(LinkOption):
    """Attach properties (consumer-group, cursor…) on a link."""

    def __init__(self, **props):
        self.props = {symbol(k.replace("_", "-")): v for k, v in props.items()}

    def apply(self, link):
        link.properties = self.props


def url(server) -> str:
    return f"amqp://127.0.0.1:{server.port('amqp')}"


def connect(server, **kwargs) -> BlockingConnection:
    return BlockingConnection(url(server), timeout=10, **kwargs)


def pump(conn: BlockingConnection, seconds: float) -> None:
    """Run the blocking client's I/O for a while (it only sends — e.g. a disposition — while one
    of its calls runs; a plain sleep would leave it unsent)."""
    try:
        conn.wait(lambda: False, timeout=seconds)
    except Timeout:
        pass


def wait_for_dlq(srv, conn: BlockingConnection, qname: str) -> None:
    """The DLQ is created by the first dead-lettering (which the broker applies shortly after the
    disposition); attaching before would make `$dlq/<q>` an ephemeral queue."""
    pump(conn, 0.1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        srv.call(srv.manager.reload_queues())
        if srv.manager.queue_info(f"$dlq/{qname}") is not None:
            return
        time.sleep(0.05)
    raise AssertionError(f"$dlq/{qname} was not created")


def test_send_receive_accept(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(f"$queue/{qname}/eu")
        for i in range(3):
            snd.send(Message(body=f"m{i}"))
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="workers"))
        got = []
        for _ in range(3):
            m = rcv.receive(timeout=10)
            got.append((m.body, m.properties["offset"], m.properties["group-id"], m.id))
            rcv.accept()
        assert got == [(f"m{i}", str(i), "workers", f"{qname}:{i}") for i in range(3)]
    finally:
        conn.close()
    # Accepted = acked: nothing is pending any more.
    pending = srv.call(srv.manager.pending_entries(qname, "workers"))
    deadline = time.monotonic() + 5
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = srv.call(srv.manager.pending_entries(qname, "workers"))
    assert pending == []


def test_bare_queue_name_for_publish_and_consume(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        conn.create_sender(qname).send(Message(body=b"raw", inferred=True))
        rcv = conn.create_receiver(qname, options=Props(consumer_group="g"))
        m = rcv.receive(timeout=10)
        assert bytes(m.body) == b"raw"
        assert m.properties["x-source-topic"] == f"$queue/{qname}"
        rcv.accept()
    finally:
        conn.close()


def test_released_is_redelivered(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, retry={"initial_backoff": "100ms", "max_backoff": "1s"})])
    conn = connect(srv)
    try:
        conn.create_sender(f"$queue/{qname}").send(Message(body="again"))
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="g"))
        first = rcv.receive(timeout=10)
        assert first.first_acquirer and first.delivery_count == 0
        rcv.release(delivered=False)  # RELEASED → nack
        second = rcv.receive(timeout=10)
        assert second.body == "again" and second.id == first.id
        assert second.delivery_count == 1 and not second.first_acquirer
        rcv.release(delivered=True)   # MODIFIED(delivery-failed) → nack too
        third = rcv.receive(timeout=10)
        assert third.id == first.id and third.delivery_count == 2
        rcv.accept()
    finally:
        conn.close()


def test_rejected_goes_to_the_dlq(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        conn.create_sender(f"$queue/{qname}/x").send(Message(body="poison", properties={"k": "v"}))
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="g"))
        assert rcv.receive(timeout=10).body == "poison"
        rcv.reject()
        wait_for_dlq(srv, conn, qname)
        dlq = conn.create_receiver(f"$dlq/{qname}", options=Props(consumer_group="inspect"))
        dead = dlq.receive(timeout=10)
        assert dead.body == "poison"
        assert dead.properties["k"] == "v"
        assert dead.properties["_dlq_original_queue"] == qname
        dlq.accept()
    finally:
        conn.close()


def test_modified_undeliverable_goes_to_the_dlq(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        conn.create_sender(f"$queue/{qname}").send(Message(body="nope"))
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="g"))
        rcv.receive(timeout=10)
        # BlockingReceiver has no Modified(undeliverable-here): settle the proton delivery by hand.
        fetcher = rcv.fetcher
        dlv = fetcher.unsettled.popleft()
        dlv.local.undeliverable = True
        dlv.update(Delivery.MODIFIED)
        dlv.settle()
        wait_for_dlq(srv, conn, qname)
        dlq = conn.create_receiver(f"$dlq/{qname}", options=Props(consumer_group="inspect"))
        assert dlq.receive(timeout=10).body == "nope"
        dlq.accept()
    finally:
        conn.close()


def test_application_and_message_properties_round_trip(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    msg_id = uuid.uuid4()
    sent = Message(
        body={"order": 42, "items": ["a", "b"]},
        id=msg_id, correlation_id=ulong(99), subject="new-order", reply_to="$queue/replies",
        content_type="application/x-order", durable=True, priority=7,
        properties={"str": "x", "int": 7, "ulong": ulong(5), "bin": b"\x00\x01", "bool": True,
                    "none": None, "float": 1.5, "sym": symbol("s")},
    )
    conn = connect(srv)
    try:
        conn.create_sender(f"$queue/{qname}/orders").send(sent)
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="g"))
        got = rcv.receive(timeout=10)
        rcv.accept()
    finally:
        conn.close()
    assert got.body == {"order": 42, "items": ["a", "b"]}
    assert got.id == msg_id
    assert got.correlation_id == 99
    assert (got.subject, got.reply_to, got.content_type) == ("new-order", "$queue/replies", "application/x-order")
    assert got.durable and got.priority == 7
    props = got.properties
    assert props["str"] == "x" and props["int"] == 7 and props["bool"] is True and props["none"] is None
    assert props["float"] == 1.5
    assert type(props["ulong"]) is ulong and props["ulong"] == 5
    assert bytes(props["bin"]) == b"\x00\x01"
    assert type(props["sym"]) is symbol
    # DESIGN §4 delivery properties ride along as application properties.
    assert props["message-id"] == f"{qname}:0" and props["queue"] == qname and props["offset"] == "0"
    assert props["x-source-topic"] == f"$queue/{qname}/orders"
    # and the log keeps them in the documented layout, readable by the other protocols
    headers = srv.call(_headers(srv, qname))
    assert headers["str"] == "x" and headers["content-type"] == "application/x-order"
    assert headers["x-amqp"]["properties"]["subject"] == "new-order"
    assert headers["x-amqp"]["types"]["ulong"] == "ulong"


async def _headers(srv, qname):
    return await srv.manager.pool.fetchval(
        "SELECT headers FROM fluxpg.log WHERE queue_id = $1 ORDER BY seq LIMIT 1", srv.manager.queue_info(qname).id)


def test_stream_cursor_earliest_replays(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, type="stream")])
    conn = connect(srv)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        for i in range(4):
            snd.send(Message(body=f"s{i}"))
        for group in ("replay-a", "replay-b"):
            rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group=group, cursor="earliest"))
            bodies = []
            for _ in range(4):
                m = rcv.receive(timeout=10)
                bodies.append((m.body, m.properties["x-stream-offset"]))
                rcv.accept()
            assert bodies == [(f"s{i}", str(i)) for i in range(4)]
            assert "x-stream-timestamp" in m.properties
            rcv.close()
        # a numeric cursor starts there
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="from-2", cursor=2))
        assert rcv.receive(timeout=10).body == "s2"
        rcv.accept()
        rcv.close()
        # latest: only what comes after the attach
        rcv = conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="tail", cursor="latest"))
        snd.send(Message(body="new"))
        assert rcv.receive(timeout=10).body == "new"
        rcv.accept()
    finally:
        conn.close()


def test_bad_cursor_refuses_the_link(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, type="stream")])
    conn = connect(srv)
    try:
        with pytest.raises(LinkDetached) as err:
            conn.create_receiver(f"$queue/{qname}", options=Props(consumer_group="g", cursor="sideways"))
        assert "amqp:" in str(err.value)
    finally:
        conn.close()


def test_topic_filter_in_address_and_as_source_filter(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        for key in ("eu/de", "us/ny", "eu/fr"):
            conn.create_sender(f"$queue/{qname}/{key}").send(Message(body=key))
        rcv = conn.create_receiver(f"$queue/{qname}/eu/+", options=Props(consumer_group="eu"))
        got = set()
        for _ in range(2):
            got.add(rcv.receive(timeout=10).body)
            rcv.accept()
        assert got == {"eu/de", "eu/fr"}

        class TopicFilter(LinkOption):
            def apply(self, link):
                link.source.filter.put_dict({symbol("topic"): "us/#"})

        rcv2 = conn.create_receiver(f"$queue/{qname}", options=[TopicFilter(), Props(consumer_group="us")])
        assert rcv2.receive(timeout=10).body == "us/ny"
        rcv2.accept()
        assert rcv2.link.remote_source.filter is not None
    finally:
        conn.close()


def test_publish_errors_reject_with_conditions(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, limits={"max_depth": 1, "max_message_size": 100})])
    conn = connect(srv)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        assert snd.send(Message(body="one")).remote_state == Delivery.ACCEPTED
        full = snd.send(Message(body="two"), error_states=[])
        assert full.remote_state == Delivery.REJECTED
        assert full.remote.condition.name == "amqp:resource-limit-exceeded"
        big = snd.send(Message(body="x" * 500), error_states=[])
        assert big.remote_state == Delivery.REJECTED
        assert big.remote.condition.name == "amqp:link:message-size-exceeded"
        with pytest.raises(SendException):
            snd.send(Message(body="three"))
        # an address that is no queue: the attach is refused
        with pytest.raises(LinkDetached) as err:
            conn.create_sender("not/a/queue")
        assert "amqp:not-found" in str(err.value)
    finally:
        conn.close()


def test_anonymous_relay_uses_the_message_address(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(None)
        assert snd.send(Message(address=f"$queue/{qname}/r", body="relayed")).remote_state == Delivery.ACCEPTED
        bad = snd.send(Message(body="nowhere"), error_states=[])
        assert bad.remote.condition.name == "amqp:invalid-field"
        rcv = conn.create_receiver(qname, options=Props(consumer_group="g"))
        assert rcv.receive(timeout=10).body == "relayed"
        rcv.accept()
    finally:
        conn.close()


def test_presettled_is_at_most_once(threaded_broker, qname):
    from proton.reactor import AtMostOnce

    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        for i in range(3):
            snd.send(Message(body=i))
        rcv = conn.create_receiver(f"$queue/{qname}", options=[AtMostOnce(), Props(consumer_group="fast")])
        assert [rcv.receive(timeout=10).body for _ in range(3)] == [0, 1, 2]
    finally:
        conn.close()
    # acknowledged when sent: nothing pending
    deadline = time.monotonic() + 5
    while srv.call(srv.manager.pending_entries(qname, "fast")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.call(srv.manager.pending_entries(qname, "fast")) == []


class _CreditClient(MessagingHandler):
    """Container client: a receiver that grants exactly `credit` and never more, then reports what
    arrived within `window` seconds."""

    def __init__(self, url: str, address: str, credit: int, window: float):
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.credit, self.window = url, address, credit, window
        self.received: list = []
        self.done = threading.Event()
        self.error: str | None = None

    def on_start(self, event):
        conn = event.container.connect(self.url)
        self.receiver = event.container.create_receiver(conn, self.address, options=Props(consumer_group="credit"))
        event.container.schedule(self.window, self)

    def on_link_opened(self, event):
        if event.receiver == self.receiver:  # proton wrappers compare equal, not identical
            self.receiver.flow(self.credit)

    def on_message(self, event):
        self.received.append(event.message.body)

    def on_timer_task(self, event):
        self.receiver.connection.close()

    def on_link_error(self, event):
        self.error = str(event.link.remote_condition)

    def on_connection_closed(self, event):
        self.done.set()

    def on_transport_error(self, event):
        self.error = self.error or str(event.transport.condition)
        self.done.set()


def test_link_credit_is_respected(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        for i in range(5):
            snd.send(Message(body=i))
    finally:
        conn.close()
    client = _CreditClient(url(srv), f"$queue/{qname}", credit=2, window=1.0)
    thread = threading.Thread(target=Container(client).run, daemon=True)
    thread.start()
    assert client.done.wait(15), "container client did not finish"
    thread.join(5)
    assert client.error is None
    assert client.received == [0, 1]
    # the other three were never claimed
    status = srv.call(srv.manager.group_status(qname))
    assert sum(r["pending"] for r in status) == 2


def test_heartbeats_keep_an_idle_connection_alive(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv, heartbeat=1)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        # Idle for longer than the client's idle timeout (the client's I/O keeps running in
        # wait(); a plain sleep would starve its own timers): our heartbeats keep it open.
        pump(conn, 2.5)
        assert snd.send(Message(body="still here")).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()


def test_silent_client_is_closed_after_the_idle_timeout(threaded_broker, monkeypatch):
    """A client that opens and then says nothing (no heartbeats) gets a close
    amqp:resource-limit-exceeded and is disconnected."""
    from proton import Collector, Connection, Transport

    monkeypatch.setattr(amqp10_connection, "IDLE_TIMEOUT", 1.0)
    srv = threaded_broker()
    # A sans-I/O proton client makes the header and the open frame.
    client = Connection()
    client.collect(Collector())
    transport = Transport()
    transport.bind(client)
    client.open()
    hello = transport.peek(transport.pending())
    transport.pop(len(hello))
    with socket.create_connection(("127.0.0.1", srv.port("amqp")), timeout=10) as sock:
        sock.sendall(hello)
        started = time.monotonic()
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 5
    transport.push(received)
    assert client.remote_condition is not None
    assert client.remote_condition.name == "amqp:resource-limit-exceeded"


def test_garbage_after_the_header_is_a_decode_error(threaded_broker):
    srv = threaded_broker()
    with socket.create_connection(("127.0.0.1", srv.port("amqp")), timeout=10) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00" + b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\xff" * 8)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"AMQP\x00\x01\x00\x00")
    assert b"amqp:decode-error" in data or b"framing-error" in data


def test_consumer_detach_keeps_unsettled_for_reattach(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        conn.create_sender(qname).send(Message(body="keep"))
        rcv = conn.create_receiver(qname, name="stable", options=Props(consumer_group="g"))
        assert rcv.receive(timeout=10).body == "keep"
        rcv.close()  # not settled
        again = conn.create_receiver(qname, name="stable", options=Props(consumer_group="g"))
        m = again.receive(timeout=10)
        assert m.body == "keep" and m.delivery_count == 1
        again.accept()
    finally:
        conn.close()


def test_error_condition_helper_maps_engine_errors():
    from fluxpg.errors import QueueFull, UnknownQueue

    assert amqp10_connection._condition(QueueFull("full")).name == "amqp:resource-limit-exceeded"
    assert amqp10_connection._condition(UnknownQueue("x")).name == "amqp:not-found"
    assert isinstance(amqp10_connection._condition(RuntimeError("boom")), Condition)
