"""AMQP 1.0 links against a real fluxpg with python-qpid-proton: credit and drain, large
multi-frame messages and the size limit, malformed messages, unset properties, the default
consumer group, outcomes. Each test checks what the client got and what the log holds."""
from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest
from proton import Data, Described, Delivery, Message, Timeout, symbol, ulong
from proton._message import pn_message_get_content_type
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, LinkOption

from fluxpg.config import QueueConfig

from tests.protocols.test_amqp10_broker import Props, connect, pump, url

pytestmark = pytest.mark.timeout(90)


class DynamicTarget(LinkOption):
    def apply(self, link):
        link.target.dynamic = True

LOG_ROWS = """SELECT l.seq, l.payload, l.headers FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id
              WHERE q.name = $1 ORDER BY l.seq"""


def log_rows(srv, queue: str) -> list:
    rows = srv.call(srv.manager.pool.fetch(LOG_ROWS, queue))
    return [(r["seq"], bytes(r["payload"]),
             json.loads(r["headers"]) if isinstance(r["headers"], str) else (r["headers"] or {})) for r in rows]


def send_raw(conn, snd, raw: bytes, timeout: float = 10) -> Delivery:
    """Send already-encoded message bytes (what proton's Message would refuse to make)."""
    link = snd.link
    dlv = link.delivery(str(time.monotonic_ns()))
    link.send(raw)
    link.advance()
    conn.wait(lambda: dlv.remote_state != 0 or dlv.settled, timeout=timeout, msg="waiting for an outcome")
    return dlv


def sections(*parts) -> bytes:
    data = Data()
    for code, value in parts:
        data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


# ------------------------------------------------------------------------------------ credit


class _LateCredit(MessagingHandler):
    """A receiver that attaches with no credit, waits, then grants 10 at a time, each batch only
    after the previous one arrived (what proton's simple_recv does with its prefetch)."""

    def __init__(self, url: str, address: str, total: int, wait: float, srv_publish):
        super().__init__(prefetch=0, auto_accept=True)
        self.url, self.address, self.total, self.wait, self.publish = url, address, total, wait, srv_publish
        self.received: list = []
        self.done = threading.Event()
        self.outstanding = 0

    def on_start(self, event):
        self.conn = event.container.connect(self.url)
        self.receiver = event.container.create_receiver(self.conn, self.address)
        event.container.schedule(self.wait, self)

    def on_link_opened(self, event):
        if event.receiver == self.receiver:
            self.publish()   # the messages arrive while the link has no credit

    def on_timer_task(self, event):
        self._grant()

    def _grant(self):
        self.outstanding = 10
        self.receiver.flow(10)

    def on_message(self, event):
        self.received.append(event.message.body)
        self.outstanding -= 1
        if len(self.received) == self.total:
            self.conn.close()
        elif self.outstanding == 0:
            self._grant()

    def on_connection_closed(self, event):
        self.done.set()

    def on_transport_error(self, event):
        self.done.set()


@pytest.mark.parametrize("configured", [True, False], ids=["configured-queue", "auto-created"])
def test_credit_granted_late_gets_every_message_in_order(threaded_broker, qname, configured):
    srv = threaded_broker([QueueConfig(name=qname)] if configured else None)
    address = f"$queue/{qname}"

    def publish():
        conn = connect(srv)
        try:
            snd = conn.create_sender(address)
            for i in range(100):
                snd.send(Message(body=i))
        finally:
            conn.close()

    client = _LateCredit(url(srv), address, 100, 0.5, lambda: threading.Thread(target=publish).start())
    thread = threading.Thread(target=Container(client).run, daemon=True)
    thread.start()
    assert client.done.wait(60), f"got {len(client.received)} of 100"
    thread.join(5)
    assert client.received == list(range(100))
    # and all of it is in the log, each message once
    assert [seq for seq, _, _ in log_rows(srv, qname)] == list(range(100))


def test_receiver_attaching_later_gets_what_the_queue_holds(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for i in range(30):
            snd.send(Message(body=i))
        rcv = conn.create_receiver(qname, credit=7)
        got = []
        for _ in range(30):
            got.append(rcv.receive(timeout=10).body)
            rcv.accept()
        assert got == list(range(30))
    finally:
        conn.close()


def test_drain_sends_what_is_there_then_gives_the_credit_back(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for i in range(3):
            snd.send(Message(body=i))
        rcv = conn.create_receiver(qname, credit=0)
        link = rcv.link
        link.drain(10)
        conn.wait(lambda: link.credit == 0, timeout=10, msg="drain did not complete")
        got = []
        for _ in range(3):
            got.append(rcv.receive(timeout=5).body)
            rcv.accept()
        assert got == [0, 1, 2]
        # an empty queue: the whole credit comes back, nothing is sent
        link.drain(5)
        conn.wait(lambda: link.credit == 0, timeout=10, msg="drain of an empty queue did not complete")
        snd.send(Message(body="after"))
        pump(conn, 0.5)
        assert not rcv.fetcher.has_message   # no credit: nothing may arrive
        link.flow(1)
        assert rcv.receive(timeout=10).body == "after"
        rcv.accept()
    finally:
        conn.close()


def test_receivers_without_a_group_compete(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for i in range(40):
            snd.send(Message(body=i))
        other = connect(srv)   # another container id: still the same (default) group
        try:
            a = conn.create_receiver(qname, credit=5)
            b = other.create_receiver(qname, credit=5)
            got_a, got_b = [], []
            deadline = time.monotonic() + 30
            while len(got_a) + len(got_b) < 40 and time.monotonic() < deadline:
                for rcv, got in ((a, got_a), (b, got_b)):
                    try:
                        m = rcv.receive(timeout=0.2)
                    except Timeout:
                        continue
                    got.append(m.body)
                    assert m.properties["group-id"] == qname
                    rcv.accept()
            assert sorted(got_a + got_b) == list(range(40))      # all delivered, none twice
            assert got_a and got_b                                 # shared
            assert got_a == sorted(got_a) and got_b == sorted(got_b)
        finally:
            other.close()
    finally:
        conn.close()
    status = srv.call(srv.manager.group_status(qname))
    assert [r["grp"] for r in status] == [qname]


# ------------------------------------------------------------------------------------ size


@pytest.mark.parametrize("size", [2 * 2 ** 20, 12 * 2 ** 20], ids=["2MB", "12MB"])
def test_large_multi_frame_messages_are_stored_byte_exact(threaded_broker, qname, size):
    srv = threaded_broker([QueueConfig(name=qname, limits={"max_message_size": 16 * 2 ** 20})])
    body = os.urandom(size)
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        assert snd.send(Message(body=body, inferred=True), timeout=60).remote_state == Delivery.ACCEPTED
        rows = log_rows(srv, qname)
        assert len(rows) == 1 and rows[0][1] == body
        rcv = conn.create_receiver(qname, credit=1)
        got = rcv.receive(timeout=60)
        assert bytes(got.body) == body
        rcv.accept()
    finally:
        conn.close()


def test_over_the_limit_is_rejected_and_the_link_goes_on(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, limits={"max_message_size": 2 ** 20})])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        big = snd.send(Message(body=os.urandom(3 * 2 ** 20), inferred=True), timeout=60, error_states=[])
        assert big.remote_state == Delivery.REJECTED
        assert big.remote.condition.name == "amqp:link:message-size-exceeded"
        # just over the payload limit (within the envelope allowance): the publish path refuses it
        near = snd.send(Message(body=b"x" * (2 ** 20 + 1), inferred=True), timeout=60, error_states=[])
        assert near.remote.condition.name == "amqp:link:message-size-exceeded"
        ok = snd.send(Message(body=b"y" * 2 ** 20, inferred=True), timeout=60)
        assert ok.remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert [len(p) for _, p, _ in log_rows(srv, qname)] == [2 ** 20]


def test_unfinished_messages_count_toward_the_connection_bound(threaded_broker, qname):
    from fluxpg.config import Config

    config = Config(queues=[QueueConfig(name=qname, limits={"max_message_size": 0})],
                    bounds={"connection_inbound_bytes": 4 * 2 ** 20})
    srv = threaded_broker(config=config)
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        big = snd.send(Message(body=os.urandom(6 * 2 ** 20), inferred=True), timeout=60, error_states=[])
        assert big.remote_state == Delivery.REJECTED
        assert big.remote.condition.name == "amqp:resource-limit-exceeded"
        assert snd.send(Message(body=b"fits", inferred=True)).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert [p for _, p, _ in log_rows(srv, qname)] == [b"fits"]


# ------------------------------------------------------------------------------------ malformed

MALFORMED = {
    "application-properties-not-a-map": sections((0x74, ["a", 1]), (0x77, "body")),
    "annotations-not-a-map": sections((0x72, ["a"]), (0x77, "body")),
    "invalid-utf8": b"\x00\x53\x77\xa1\x02\xff\xfe",
    "truncated-section": b"\x00\x53\x75\xb0\x00\x00\x00\x10ab",
    "map-with-odd-count": b"\x00\x53\x77\xc1\x03\x03\xa1\x01a",
    # an array of described values: proton decodes it but cannot encode it again
    "body-not-re-encodable": b"\x00\x53\x77\xe0\x07\x02\x00\xa3\x01x\x54\x01\x02",
}


def test_malformed_messages_are_rejected_and_the_connection_stays(threaded_broker, qname, caplog):
    srv = threaded_broker([QueueConfig(name=qname)])
    caplog.set_level(logging.INFO, logger="fluxpg")
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        rcv = conn.create_receiver(qname, credit=10)   # another link on the same connection
        for name, raw in MALFORMED.items():
            dlv = send_raw(conn, snd, raw)
            assert dlv.remote_state == Delivery.REJECTED, name
            assert dlv.remote.condition.name == "amqp:decode-error", name
        assert snd.send(Message(body="fine")).remote_state == Delivery.ACCEPTED
        assert rcv.receive(timeout=10).body == "fine"
        rcv.accept()
    finally:
        conn.close()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert [p for _, p, _ in log_rows(srv, qname)] == [b"fine"]


# ------------------------------------------------------------------------------------ properties


def test_unset_content_type_stays_unset(threaded_broker, qname):
    import pika

    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        snd.send(Message(body="plain"))
        snd.send(Message(body="typed", content_type="text/plain"))
        rcv = conn.create_receiver(qname, options=Props(consumer_group="amqp10"), credit=2)
        got = [rcv.receive(timeout=10) for _ in range(2)]
        rcv.accept()
        assert pn_message_get_content_type(got[0]._msg) is None
        assert got[1].content_type == symbol("text/plain")
    finally:
        conn.close()
    headers = [h for _, _, h in log_rows(srv, qname)]
    assert "content-type" not in headers[0] and headers[1]["content-type"] == "text/plain"
    # an AMQP 0-9-1 consumer sees no content type either
    params = pika.ConnectionParameters("127.0.0.1", srv.port("amqp091"))
    with pika.BlockingConnection(params) as pconn:
        ch = pconn.channel()
        seen = []
        for method, props, body in ch.consume(qname, arguments={"x-consumer-group": "pika"},
                                              inactivity_timeout=10):
            assert method is not None, "no delivery"
            seen.append((body, props.content_type))
            ch.basic_ack(method.delivery_tag)
            if len(seen) == 2:
                break
        ch.cancel()
    assert seen == [(b"plain", None), (b"typed", "text/plain")]


# ------------------------------------------------------------------------------------ transactions


class _TxClient(MessagingHandler, TransactionHandler):
    """Runs `steps` (functions of (client, transaction)) one transaction each, in order; every
    step ends its transaction with commit() or abort(). Records how each ended."""

    def __init__(self, url: str, address: str, steps, receive: int = 0):
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.steps, self.receive = url, address, list(steps), receive
        self.ended: list[str] = []
        self.messages: list = []
        self.deliveries: list = []
        self.done = threading.Event()
        self.error: str | None = None

    def on_start(self, event):
        self.container = event.container
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, self.address)
        if self.receive:
            self.receiver = event.container.create_receiver(self.conn, self.address)
            self.receiver.flow(self.receive)
        else:
            self._next()

    def on_message(self, event):
        self.messages.append(event.message.body)
        self.deliveries.append(event.delivery)
        if len(self.messages) == self.receive:
            self._next()

    def _next(self):
        if self.steps:
            self.container.declare_transaction(self.conn, handler=self)
        else:
            self.conn.close()

    def on_transaction_declared(self, event):
        self.steps.pop(0)(self, event.transaction)

    def on_transaction_declare_failed(self, event):
        self.error = f"declare failed: {event.delivery.remote.condition}"
        self.conn.close()

    def on_transaction_committed(self, event):
        self.ended.append("committed")
        self._next()

    def on_transaction_aborted(self, event):
        self.ended.append("aborted")
        self._next()

    def on_transaction_commit_failed(self, event):
        self.ended.append("commit failed")
        self._next()

    def on_link_error(self, event):
        self.error = str(event.link.remote_condition)

    def on_connection_closed(self, event):
        self.done.set()

    def on_transport_error(self, event):
        self.error = self.error or str(event.transport.condition)
        self.done.set()


def run_client(client) -> None:
    thread = threading.Thread(target=Container(client).run, daemon=True)
    thread.start()
    assert client.done.wait(30), "transaction client did not finish"
    thread.join(5)
    assert client.error is None, client.error


def test_transactional_posts_take_effect_at_commit_only(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])

    def send(bodies, end):
        def step(client, tx):
            for body in bodies:
                tx.send(client.sender, Message(body=body))
            # nothing of this transaction is in the log before its discharge
            client.before_discharge.append(len(log_rows(srv, qname)))
            getattr(tx, end)()
        return step

    def hang_up(client, tx):
        tx.send(client.sender, Message(body="never discharged"))
        client.conn.close()    # a transaction open when its connection ends does nothing

    client = _TxClient(url(srv), qname, [send(["a1", "a2", "a3"], "abort"), send(["c1", "c2"], "commit"),
                                         send(["a4"], "abort"), hang_up])
    client.before_discharge = []
    run_client(client)
    assert client.ended == ["aborted", "committed", "aborted"]
    assert client.before_discharge == [0, 0, 2]
    conn = connect(srv)
    try:
        rcv = conn.create_receiver(qname, credit=10)
        assert [rcv.receive(timeout=10).body for _ in range(2)] == ["c1", "c2"]
        rcv.accept()
        with pytest.raises(Timeout):
            rcv.receive(timeout=0.5)
    finally:
        conn.close()
    assert len(log_rows(srv, qname)) == 2


def test_transactional_acceptance_acks_at_commit_and_not_on_abort(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname, retry={"initial_backoff": "100ms"})])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for body in ("m0", "m1", "m2"):
            snd.send(Message(body=body))
    finally:
        conn.close()

    def accept(indexes, end):
        def step(client, tx):
            for i in indexes:
                tx.accept(client.deliveries[i])
            getattr(tx, end)()
        return step

    # m0 accepted and rolled back (the client releases it), m1 accepted and committed
    client = _TxClient(url(srv), qname, [accept([0], "abort"), accept([1], "commit")], receive=3)
    run_client(client)
    assert client.messages == ["m0", "m1", "m2"]
    assert client.ended == ["aborted", "committed"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pending = sorted(r["seq"] for r in srv.call(srv.manager.pending_entries(qname, qname)))
        if 1 not in pending:
            break
        time.sleep(0.1)
    # m1 is acknowledged; m0 was released by the abort (it is delivered again), m2 was never
    # settled and stays pending until the visibility timeout
    assert pending == [0, 2]
    conn = connect(srv)
    try:
        rcv = conn.create_receiver(qname, credit=1)
        assert rcv.receive(timeout=10).body == "m0"
        rcv.accept()
    finally:
        conn.close()


# ------------------------------------------------------------------------------------ dynamic


def test_dynamic_source_request_reply(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    server = connect(srv)
    client = connect(srv)
    try:
        # the client: a dynamic reply queue, requests carry its address in reply-to
        replies = client.create_receiver(None, dynamic=True, credit=10)
        reply_to = replies.link.remote_source.address
        assert reply_to and reply_to.startswith("amqp10.dynamic.")
        requests = client.create_sender(qname)
        for word in ("one", "two", "three"):
            requests.send(Message(body=word, reply_to=reply_to, correlation_id=word))
        # the server: takes requests, answers through the anonymous relay
        work = server.create_receiver(qname, credit=10)
        relay = server.create_sender(None)
        for _ in range(3):
            req = work.receive(timeout=10)
            relay.send(Message(address=req.reply_to, body=req.body.upper(), correlation_id=req.correlation_id))
            work.accept()
        got = []
        for _ in range(3):
            m = replies.receive(timeout=10)
            got.append((m.correlation_id, m.body))
            replies.accept()
        assert got == [("one", "ONE"), ("two", "TWO"), ("three", "THREE")]
        assert [p for _, p, _ in log_rows(srv, qname)] == [b"one", b"two", b"three"]
        # deleted with its link: a later reply to it has nowhere to go
        replies.close()
        deadline = time.monotonic() + 10
        while srv.call(srv.manager.queue_stats()) and time.monotonic() < deadline:
            if not [r for r in srv.call(srv.manager.queue_stats()) if r["queue"] == reply_to]:
                break
            time.sleep(0.05)
        assert not [r for r in srv.call(srv.manager.queue_stats()) if r["queue"] == reply_to]
    finally:
        client.close()
        server.close()


def test_dynamic_target(threaded_broker):
    srv = threaded_broker()
    conn = connect(srv)
    try:
        snd = conn.create_sender(None, options=DynamicTarget())
        address = snd.link.remote_target.address
        assert address and address.startswith("amqp10.dynamic.")
        assert snd.send(Message(body="to the dynamic node")).remote_state == Delivery.ACCEPTED
        rcv = conn.create_receiver(address, credit=1)
        assert rcv.receive(timeout=10).body == "to the dynamic node"
        rcv.accept()
    finally:
        conn.close()


def test_released_and_modified_outcomes(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        snd.send(Message(body="a"))
        snd.send(Message(body="b"))
        # no prefetch: each receive() grants one credit
        rcv = conn.create_receiver(qname)
        first = rcv.receive(timeout=10)
        assert first.body == "a"
        rcv.release(delivered=False)       # Released: back now, first in line
        # proton writes a flow before a disposition queued with it: let the outcome go out
        # before receive() grants the next credit
        pump(conn, 0.1)
        again = rcv.receive(timeout=10)
        assert again.body == "a" and again.id == first.id
        rcv.release(delivered=True)        # Modified(delivery-failed): back, counted
        pump(conn, 0.1)
        third = rcv.receive(timeout=10)
        assert third.body == "a" and third.delivery_count >= 1
        rcv.reject()                       # Rejected: to the dead-letter queue
        assert rcv.receive(timeout=10).body == "b"
        rcv.accept()
    finally:
        conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and srv.call(srv.manager.pending_entries(qname, qname)):
        time.sleep(0.05)
    assert srv.call(srv.manager.pending_entries(qname, qname)) == []
    assert [p for _, p, _ in log_rows(srv, f"$dlq/{qname}")] == [b"a"]



def test_closing_a_link_releases_what_it_did_not_settle(threaded_broker, qname):
    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for body in ("x", "y"):
            snd.send(Message(body=body))
        first = conn.create_receiver(qname, credit=2)
        assert [first.receive(timeout=10).body for _ in range(2)] == ["x", "y"]
        first.close()                       # neither settled
        started = time.monotonic()
        second = conn.create_receiver(qname, credit=2)
        assert [second.receive(timeout=10).body for _ in range(2)] == ["x", "y"]
        second.accept()
        # back at once, in order: not after the 30 s visibility timeout
        assert time.monotonic() - started < 10
    finally:
        conn.close()


def test_transactional_posts_are_charged_to_the_inbound_bound_until_discharge(threaded_broker, qname):
    """Posts collected in a transaction hold their bytes (and a per-message overhead) against
    bounds.connection_inbound_bytes until discharge: past the bound a post is rejected with
    amqp:resource-limit-exceeded (the transaction goes on with the others); the discharge gives
    the bytes back, so the next transaction on the connection has the whole bound again."""
    from fluxpg import bounds
    from fluxpg.config import BoundsConfig, Config

    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=300_000)))
    body = "b" * 50_000

    class Client(_TxClient):
        rejected: list = []

        def on_rejected(self, event):
            self.rejected.append(event.delivery.remote.condition.name)

    def send(n):
        def step(client, tx):
            for _ in range(n):
                tx.send(client.sender, Message(body=body))
            tx.commit()
        return step

    client = Client(url(srv), qname, [send(8), send(5)])
    run_client(client)
    assert client.ended == ["committed", "committed"]
    # 5 × (50 kB + overhead) fit in 300 kB: 3 of the first 8 and none of the next 5 are refused
    assert client.rejected == ["amqp:resource-limit-exceeded"] * 3
    assert len(log_rows(srv, qname)) == 10
    found = srv.server.ctx.state.get(bounds.STATE_KEY)
    assert found is not None and found.used == 0

def test_a_selector_receiver_gets_what_it_selects_and_leaves_the_rest(threaded_broker, qname):
    """proton's selected_recv example: a receiver with a JMS selector gets the green messages in
    order; a plain receiver on the same queue afterwards gets the red ones, in order; the attach
    echoes the selector it applies. A malformed selector is refused with amqp:invalid-field."""
    from proton.reactor import Selector
    from proton.utils import LinkDetached

    srv = threaded_broker([QueueConfig(name=qname)])
    conn = connect(srv)
    try:
        snd = conn.create_sender(qname)
        for i in range(20):
            colour = "green" if i % 2 == 0 else "red"
            snd.send(Message(body=f"{colour} {i + 1}", properties={"colour": colour}))
        picky = conn.create_receiver(qname, name="picky", options=Selector("colour = 'green'"), credit=5)
        echoed = picky.link.remote_source.filter
        echoed.rewind()
        echoed.next()
        assert "selector" in {str(k) for k in echoed.get_object()}
        greens = []
        for _ in range(10):
            greens.append(picky.receive(timeout=10).body)
            picky.accept()
        assert greens == [f"green {i + 1}" for i in range(0, 20, 2)]
        with pytest.raises(Timeout):
            picky.receive(timeout=0.5)
        picky.close()
        plain = conn.create_receiver(qname, name="plain", credit=5)
        reds = []
        for _ in range(10):
            reds.append(plain.receive(timeout=10).body)
            plain.accept()
        assert reds == [f"red {i + 1}" for i in range(1, 20, 2)]
        with pytest.raises(LinkDetached) as err:
            conn.create_receiver(qname, name="bad", options=Selector("colour = "))
        assert err.value.link.remote_condition.name == "amqp:invalid-field"
        assert "selector" in err.value.link.remote_condition.description
    finally:
        conn.close()


def test_a_selector_on_a_stream_is_refused(threaded_broker, qname):
    from proton.reactor import Selector
    from proton.utils import LinkDetached

    srv = threaded_broker([QueueConfig(name=qname, type="stream")])
    conn = connect(srv)
    try:
        with pytest.raises(LinkDetached) as err:
            conn.create_receiver(qname, name="sel", options=Selector("colour = 'green'"))
        assert "selectors apply to classic queues" in err.value.link.remote_condition.description
    finally:
        conn.close()
