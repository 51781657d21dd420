"""Publishing to a queue that does not exist yet (queue_manager.auto_create: durable, the
default): the messages a client sends while the queue is being created are stored in the order
it sent them, as they are once it exists. proton's examples (simple_send_recv, db_send_recv,
selected_recv) on a fresh database found them stored out of order: every transfer that arrived
while the queue was being created went through its own publish task, and those tasks reached
the group commit in whatever order their queue look-ups came back. A receiver that attaches
first, as simple_recv does, then got them out of order too."""
from __future__ import annotations

import threading

import pytest
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, Selector

from fluxpg.protocols.appends import OrderedPublisher

from tests.protocols.test_amqp10_broker import url
from tests.protocols.test_amqp10_links import log_rows

pytestmark = pytest.mark.timeout(90)

N = 100


class _Send(MessagingHandler):
    """proton's simple_send / colour_send: sends as fast as the credit allows."""

    def __init__(self, url: str, address: str, total: int):
        super().__init__()
        self.url, self.address, self.total = url, address, total
        self.sent = self.confirmed = 0
        self.outcomes: list = []

    def on_start(self, event):
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.total:
            self.sent += 1
            colour = "green" if self.sent % 2 else "red"
            event.sender.send(Message(id=self.sent, properties={"colour": colour}, body=f"{colour} {self.sent}"))

    def _settled(self, event, outcome):
        self.outcomes.append(outcome)
        if len(self.outcomes) == self.total:
            event.connection.close()

    def on_accepted(self, event):
        self._settled(event, "accepted")

    def on_rejected(self, event):
        self._settled(event, "rejected")


class _Recv(MessagingHandler):
    """proton's simple_recv (selected_recv with a selector): the first `total` messages."""

    def __init__(self, url: str, address: str, total: int, selector: str | None = None,
                 attached: threading.Event | None = None):
        super().__init__()
        self.url, self.address, self.total, self.selector = url, address, total, selector
        self.attached = attached or threading.Event()
        self.bodies: list[str] = []

    def on_start(self, event):
        options = Selector(self.selector) if self.selector else None
        event.container.create_receiver(event.container.connect(self.url), self.address, options=options)

    def on_link_opened(self, event):
        self.attached.set()

    def on_message(self, event):
        self.bodies.append(event.message.body)
        if len(self.bodies) == self.total:
            event.receiver.close()
            event.connection.close()


def _run(handler, timeout: float = 30) -> None:
    container = Container(handler)
    thread = threading.Thread(target=container.run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        container.stop()
        thread.join(5)
        raise AssertionError(f"{type(handler).__name__} did not finish in {timeout} s")


def _bodies(n: int, colour: str | None = None) -> list[str]:
    out = [f"{'green' if i % 2 else 'red'} {i}" for i in range(1, n + 1)]
    return [b for b in out if colour is None or b.startswith(colour)]


@pytest.mark.parametrize("form", ["bare", "queue"])
def test_sends_while_the_queue_is_auto_created_keep_their_order(threaded_broker, qname, form):
    srv = threaded_broker()     # no queue declared: the first transfer creates it
    address = qname if form == "bare" else f"$queue/{qname}"
    sender = _Send(url(srv), address, N)
    _run(sender)
    assert sender.outcomes == ["accepted"] * N
    assert [p.decode() for _seq, p, _h in log_rows(srv, qname)] == _bodies(N)
    # selected_recv: a selector sees the messages it selects in offset order
    recv = _Recv(url(srv), address, N // 2, selector="colour = 'green'")
    _run(recv)
    assert recv.bodies == _bodies(N, "green")


def test_receiver_attached_before_the_queue_exists_gets_them_in_order(threaded_broker, qname):
    srv = threaded_broker()
    attached = threading.Event()
    recv = _Recv(url(srv), qname, N, attached=attached)
    thread = threading.Thread(target=_run, args=(recv,), daemon=True)
    thread.start()
    assert attached.wait(20)
    _run(_Send(url(srv), qname, N))
    thread.join(30)
    assert recv.bodies == _bodies(N)


async def test_ordered_publisher_keeps_the_order_while_a_queue_is_created(broker, qname):
    """The path AMQP 0-9-1 channels and MQTT sessions publish through."""
    srv = await broker()
    appends = OrderedPublisher(srv.manager)
    futures = [appends.append(f"$queue/{qname}", f"m{i}".encode(), None) for i in range(N)]
    for fut in futures:
        await fut
    rows = await srv.manager.pool.fetch(
        "SELECT convert_from(l.payload, 'utf8') AS p FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
        "WHERE q.name = $1 ORDER BY l.seq", qname)
    assert [r["p"] for r in rows] == [f"m{i}" for i in range(N)]
