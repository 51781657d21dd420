"""AMQP 1.0 front-end: one asyncio task per connection drives a proton engine (engine.py).

Life of a connection:
1. SASL (sasl.py, our own layer: the PyPI proton has no Cyrus SASL) when the client starts with
   `AMQP\\x03\\x01\\x00\\x00`: PLAIN and, when allowed, ANONYMOUS, checked by `ctx.auth`. A client
   that skips SASL (plain `AMQP\\x00\\x01\\x00\\x00`) is anonymous; when auth is on and anonymous
   access is not allowed its open is answered with a close `amqp:unauthorized-access`.
2. AMQP through proton: sessions, and links.
   - A link the client sends on (our receiver) publishes to its target address: `$queue/<q>/…`
     (a bare queue name means `$queue/<q>`; no address = anonymous relay, each message's `to`).
     A transfer is settled Accepted only after the publish committed; Rejected with
     `amqp:resource-limit-exceeded` (queue full), `amqp:not-found`, `amqp:unauthorized-access`,
     `amqp:link:message-size-exceeded`, `amqp:decode-error`, … otherwise.
   - A link the client receives on (our sender) consumes the source address: `$queue/<q>`,
     `$queue/<q>/<filter>` or a bare queue name; a topic filter may also come as a source filter
     (`topic`, `topic-filter`, `subject-filter`, or the legacy AMQP topic/direct bindings). Attach
     properties: `consumer-group` (default: the queue name, so receivers compete) and `cursor` (stream
     queues: `earliest`, `latest`, a number, `first`, `last`, `offset=N`, `timestamp=N`),
     `auto-commit` (bool). Deliveries stay within the link credit (the Subscription's credit
     mirrors it). snd-settle-mode `settled` is at-most-once: the message is acknowledged when sent.
     Client dispositions: Accepted → ack, Released → nack, Rejected → reject (DLQ),
     Modified(undeliverable-here) → reject, other Modified → nack.
   - A coordinator link (local transactions, spec part 4): declare → a Transaction of
     queues/transactions.py; transfers and dispositions carrying its transactional-state collect
     there and take effect in one PostgreSQL transaction at discharge (or not at all: fail=true,
     or a commit error → Rejected amqp:transaction:rollback). Our deliveries a transaction
     settles stay unsettled until its discharge commits.
3. Heartbeats: proton's idle timeout both ways (`IDLE_TIMEOUT` ours, the client's as it asks).

Ordering: events are handled one at a time in the order proton reports them; a consumer attach
awaits its subscription before later events (its credit) are handled. Publishes are started in
arrival order and settled as they commit: `QueueManager.publish` hands a message to the appender
before its first await, so starting them in order keeps their offsets in order while the
connection keeps reading (no one-commit-per-message stall).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from proton import Condition, Data, Described, Event, Link, Message, Terminus, symbol, ulong
from proton import Delivery as PnDelivery

from fluxpg import connections
from fluxpg.bounds import TX_MESSAGE_OVERHEAD, connection_inbound
from fluxpg.auth import AuthError, OpenAuthenticator, Principal, authorize, subscription
from fluxpg.config import LimitsConfig
from fluxpg.protocols import prescan
from fluxpg.protocols.amqp10.engine import EngineEvent, ProtonEngine
from fluxpg.protocols.appends import OrderedPublisher
from fluxpg.protocols.amqp10.framegate import FrameGate
from fluxpg.protocols.amqp10.messages import MessageError, decode, from_delivery, to_log
from fluxpg.protocols.amqp10.sasl import SASL_HEADER, SaslCode, SaslError, SaslServer
from fluxpg.delivery import Delivery
from fluxpg.protocols.errors import ERRORS, reply_for
from fluxpg.protocols.settle import Settler
from fluxpg.errors import FluxError, InvalidArgument, UnknownQueue
from fluxpg.selectors import SelectorError
from fluxpg.topics import (DLQ_PREFIX, QUEUE_PREFIX, is_queue_topic, parse_queue_topic,
                           split_queue_subscription, validate_queue_name, validate_topic_filter,
                           validate_topic_name)

log = logging.getLogger("fluxpg.amqp10")

READ_SIZE = 64 * 1024
IDLE_TIMEOUT = 60.0          # seconds; a client silent this long is disconnected
SASL_TIMEOUT = 30.0          # seconds to finish the SASL exchange
CLOSE_GRACE = 2.0            # seconds to wait for the client's close after ours
PUBLISH_WINDOW = 256         # credit given to a publishing link (unconfirmed publishes in flight)
COORDINATOR_CREDIT = 16      # control messages (declare / discharge) a coordinator link may have in flight
MAX_TRANSACTIONS = 64        # transactions open at once on one connection

# Transaction control (spec part 4): descriptors as codes and as the symbols proton sends.
DECLARE = {0x31, "amqp:declare:list"}
DISCHARGE = {0x32, "amqp:discharge:list"}
DECLARED = 0x33
TRANSACTIONAL_STATE = 0x34
OUTCOMES = {0x24: "accepted", 0x25: "rejected", 0x26: "released", 0x27: "modified"}
MAX_FRAME_SIZE = 1024 * 1024
# A queue's max_message_size bounds the payload; the encoded message also carries its properties,
# annotations and section headers. A message whose encoding exceeds the limit by more than this is
# refused while it is still arriving (the publish path checks the payload exactly).
ENVELOPE_ALLOWANCE = 64 * 1024
DRAIN_POLL = 0.03            # seconds between looks at a draining link's subscription
DRAIN_QUIET_POLLS = 3        # polls without a delivery before the rest of the credit is given back
DEFAULT_MAX_MESSAGE_SIZE = LimitsConfig().max_message_size

# FluxError.code → AMQP 1.0 error condition
ERROR_CONDITIONS = {code: reply.amqp10 for code, reply in ERRORS.items()}  # fluxpg/protocols/errors.py

TOPIC_FILTER_KEYS = {"topic", "topic-filter", "x-topic-filter", "subject-filter"}
# The AMQP filter registry's JMS selector: its symbolic and its numeric descriptor.
SELECTOR_FILTER_DESCRIPTORS = {"apache.org:selector-filter:string", str(0x0000468C00000004)}
TOPIC_FILTER_DESCRIPTORS = {"apache.org:legacy-amqp-topic-binding:string",
                            "apache.org:legacy-amqp-direct-binding:string"}


def _condition(exc: BaseException) -> Condition:
    if isinstance(exc, FluxError):
        return Condition(reply_for(exc).amqp10, str(exc))
    if isinstance(exc, MessageError):
        return Condition("amqp:decode-error", str(exc))
    return Condition("amqp:internal-error", "internal error")


class Refused(Exception):
    """A link or message the client may not have: carries the AMQP error condition."""

    def __init__(self, name: str, description: str):
        super().__init__(description)
        self.condition = Condition(name, description)


@dataclass(eq=False)
class _Consumer:
    """Our sender link: a subscription to a queue."""

    link: Link
    queue: str
    sub: Any = None
    presettled: bool = False
    unsettled: dict[str, Delivery] = field(default_factory=dict)
    next_tag: int = 0
    closed: bool = False
    drain_task: asyncio.Task | None = None
    dynamic: str | None = None          # the transient queue made for a dynamic source
    flow_task: asyncio.Task | None = None   # credit waiting for this connection's requeues


@dataclass(eq=False)
class _Publisher:
    """Our receiver link: messages the client sends to `topic` (None: each message's `to`).

    A delivery's transfers are contiguous on its link, so a link has at most one unfinished
    delivery (proton's current one): its bytes collect in `buffer`. (proton's Python Delivery
    objects are fresh wrappers per event, so nothing may be keyed by their identity.)"""

    link: Link
    topic: str | None
    in_flight: int = 0
    buffer: bytearray | None = None     # the unfinished delivery's bytes so far
    limit: int = 0                      # its size cutoff in bytes (0: only the connection bound)
    dynamic: str | None = None          # the transient queue made for a dynamic target
    refused: Refused | None = None      # it is over a limit: its further bytes are read and dropped
    closed: bool = False


@dataclass(eq=False)
class _Txn:
    """One declared local transaction (a coordinator's declare … discharge): its publishes and
    settlements collect in a queues.transactions.Transaction and take effect in ONE PostgreSQL
    transaction at discharge, or not at all."""

    id: bytes
    tx: Any
    posts: list[PnDelivery] = field(default_factory=list)          # transfers to settle at discharge
    settles: list[tuple[_Consumer, str, PnDelivery]] = field(default_factory=list)  # our deliveries it settles
    held: int = 0     # bytes of the connection's inbound count its posts hold until discharge


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes, ctx) -> None:
    """The listener's entry point: `initial` is the 8-byte AMQP 1.0 header (plain or SASL)."""
    await AmqpConnection(reader, writer, ctx).run(initial)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "unknown"


class AmqpConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx):
        self.reader = reader
        self.writer = writer
        self.ctx = ctx
        self.manager = ctx.manager
        self.auth = ctx.auth if ctx.auth is not None else OpenAuthenticator()
        self.peer = _peer(writer)
        self.principal: Principal | None = None
        container = ctx.state.get("amqp10.container_id")
        if container is None:
            container = ctx.state["amqp10.container_id"] = f"fluxpg-{socket.gethostname()}-{os.getpid()}"
        self.engine = ProtonEngine(container_id=container, idle_timeout=IDLE_TIMEOUT, max_frame_size=MAX_FRAME_SIZE)
        self.consumers: dict[Link, _Consumer] = {}
        self.publishers: dict[Link, _Publisher] = {}
        self.coordinators: dict[Link, _Publisher] = {}
        self.transactions: dict[bytes, _Txn] = {}
        self._txn_ids = 0
        # owner of this connection's dynamic (transient) queues: no other connection consumes them
        self._owner = f"{getattr(self.manager, 'node_id', 0)}:amqp10:{id(self):x}"
        self._wake = asyncio.Event()
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        # Bytes of messages received but not yet published (unfinished deliveries, and finished
        # ones until their publish commits): bounds.connection_inbound_bytes, and the broker-wide
        # bounds.broker_inbound_bytes.
        bounds = getattr(getattr(ctx, "config", None), "bounds", None)
        self.inbound = connection_inbound(ctx)
        self.decoder_limits = prescan.Limits.from_config(getattr(ctx, "config", None))
        # Whole, pre-scanned frames to proton; a started frame must complete within frame_timeout.
        self.gate = FrameGate(self.decoder_limits, MAX_FRAME_SIZE)
        timeout = getattr(bounds, "frame_timeout", None)
        self.frame_timeout = timeout.total_seconds() if timeout else 0.0
        # acknowledgements go to the database in batches; released / nacked deliveries not yet
        # back in the database are counted there (credit waits for them)
        self.settler = Settler(ctx.manager, f"amqp10 {self.peer}")
        # The connection's publishes reach the group commit in the order their transfers
        # arrived, also while a queue is being auto-created (the offsets are that order).
        self._appends = OrderedPublisher(self.manager, self._spawn)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------------------ life cycle

    async def run(self, initial: bytes) -> None:
        try:
            if initial[:8] == SASL_HEADER:
                if not await self._sasl(initial):
                    return
            else:
                self._receive(initial)
            await self._loop()
        except prescan.DecodeLimitError as exc:
            await self._refuse_input(exc)
        finally:
            await self._cleanup()

    def _kick(self) -> None:
        self._wake.set()

    def _write(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def _sasl(self, initial: bytes) -> bool:
        """Run the SASL exchange; True when the client is authenticated (self.principal set)."""
        enabled = getattr(self.auth, "enabled", False)
        anonymous = getattr(self.auth, "allow_anonymous", True)
        mechanisms = ["PLAIN"] + (["ANONYMOUS"] if anonymous or not enabled else [])
        sasl = SaslServer(mechanisms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SASL_TIMEOUT
        data = initial
        try:
            while True:
                events = sasl.receive(data)
                self._write(sasl.take_output())
                await self.writer.drain()
                if events:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    log.info("amqp10 %s: SASL exchange timed out", self.peer)
                    return False
                data = await asyncio.wait_for(self.reader.read(READ_SIZE), remaining)
                if not data:
                    return False
        except SaslError as exc:
            log.info("amqp10 %s: SASL protocol error: %s", self.peer, exc)
            return False
        except (asyncio.TimeoutError, ConnectionError):
            return False
        init = events[0]
        try:
            if init.mechanism == "PLAIN":
                principal = await self.auth.authenticate(init.username, init.password, protocol="amqp10",
                                                         peer=self.peer)
            elif init.mechanism == "ANONYMOUS" and init.mechanism in sasl.mechanisms:
                principal = await self.auth.authenticate(None, None, protocol="amqp10", peer=self.peer)
            else:
                raise AuthError(f"SASL mechanism {init.mechanism} is not offered")
        except AuthError as exc:
            log.info("amqp10 %s: SASL %s login refused: %s", self.peer, init.mechanism, exc)
            self._write(sasl.outcome(SaslCode.AUTH))
            await self._drain_quietly()
            return False
        except Exception:  # noqa: BLE001 - the authenticator failed (database down…): tell the client
            log.exception("amqp10 %s: authentication failed with an error", self.peer)
            self._write(sasl.outcome(SaslCode.SYS_TEMP))
            await self._drain_quietly()
            return False
        self.principal = principal
        if (info := connections.current()) is not None:   # the console's list of connections
            info.user = principal.username
        self._write(sasl.outcome(SaslCode.OK))
        rest = sasl.take_rest()
        if rest:
            try:
                self._receive(rest)
            except prescan.DecodeLimitError as exc:
                await self._refuse_input(exc)
                return False
        return True

    def _receive(self, data: bytes) -> None:
        """Bytes read → the frame gate → proton. Raises DecodeLimitError (see framegate.py)."""
        self.engine.receive(self.gate.feed(data, time.monotonic()))

    async def _refuse_input(self, exc: Exception) -> None:
        log.info("amqp10 %s: frame refused before decoding: %s; closing", self.peer, exc)
        self._write(self.engine.close_after_input_error("amqp:decode-error", str(exc)))
        await self._drain_quietly()

    async def _drain_quietly(self) -> None:
        try:
            await asyncio.wait_for(self.writer.drain(), CLOSE_GRACE)
        except (Exception, asyncio.CancelledError):  # noqa: BLE001
            pass

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        read_task: asyncio.Task | None = asyncio.ensure_future(self.reader.read(READ_SIZE))
        wake_task: asyncio.Task | None = None
        close_deadline: float | None = None
        self.engine.tick(time.monotonic())
        try:
            while True:
                await self._pump()
                if self.engine.closed:
                    return
                if self.engine.input_failed:
                    log.info("amqp10 %s: invalid AMQP frame; closing", self.peer)
                    self._write(self.engine.close_after_input_error("amqp:decode-error", "invalid AMQP frame"))
                    await self._drain_quietly()
                    return
                if self.engine.output_closed:
                    # We sent our close; give the client a moment to answer with its own.
                    if close_deadline is None:
                        close_deadline = loop.time() + CLOSE_GRACE
                    elif loop.time() >= close_deadline:
                        return
                if wake_task is None:
                    wake_task = asyncio.ensure_future(self._wake.wait())
                waits = {wake_task} | ({read_task} if read_task is not None else set())
                timeout = None
                next_tick = self.engine.next_tick
                if next_tick is not None:
                    timeout = max(0.0, next_tick - time.monotonic())
                if close_deadline is not None:
                    left = max(0.0, close_deadline - loop.time())
                    timeout = left if timeout is None else min(timeout, left)
                if self.frame_timeout and self.gate.started is not None:
                    # Absolute: measured from the frame's first byte, not restarted by more bytes.
                    left = max(0.0, self.gate.started + self.frame_timeout - time.monotonic())
                    timeout = left if timeout is None else min(timeout, left)
                done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if read_task is not None and read_task in done:
                    try:
                        data = read_task.result()
                    except (ConnectionError, OSError):
                        data = b""
                    if data:
                        try:
                            self._receive(data)
                        except BufferError:
                            log.warning("amqp10 %s: input overflow; closing", self.peer)
                            return
                        except prescan.DecodeLimitError as exc:
                            await self._refuse_input(exc)
                            return
                        read_task = asyncio.ensure_future(self.reader.read(READ_SIZE))
                    else:
                        read_task = None
                        self.engine.receive_eof()
                if wake_task in done:
                    self._wake.clear()
                    wake_task = None
                if (self.frame_timeout and self.gate.started is not None
                        and time.monotonic() - self.gate.started >= self.frame_timeout):
                    log.info("amqp10 %s: a frame was not completed within %ss (bounds.frame_timeout); closing",
                             self.peer, self.frame_timeout)
                    self._write(self.engine.close_after_input_error(
                        "amqp:resource-limit-exceeded", "frame not completed in time (bounds.frame_timeout)"))
                    await self._drain_quietly()
                    return
                self.engine.tick(time.monotonic())
        finally:
            for task in (read_task, wake_task):
                if task is not None and not task.done():
                    task.cancel()

    async def _pump(self) -> None:
        """Handle every pending event (handlers may cause more), then write what proton has."""
        while True:
            events = self.engine.events()
            if not events:
                break
            for event in events:
                try:
                    await self._dispatch(event)
                except (FluxError, Refused) as exc:
                    log.info("amqp10 %s: %s", self.peer, exc)
                except Exception:  # noqa: BLE001 - close this connection cleanly, never the listener
                    log.exception("amqp10 %s: handling %s failed", self.peer, event.name)
                    self.engine.close_with_error(Condition("amqp:internal-error", "internal error"))
        out = self.engine.output()
        if out and not self.writer.is_closing():
            self.writer.write(out)
            await self.writer.drain()

    async def _cleanup(self) -> None:
        self._closed = True
        for consumer in list(self.consumers.values()):
            await self._close_consumer(consumer)
        self.consumers.clear()
        for publisher in list(self.publishers.values()):
            await self._delete_dynamic(publisher.dynamic)
        self.publishers.clear()
        # unfinished deliveries die with the connection: give their bytes back to the broker's count
        self.inbound.close()
        # Apply the acknowledgements received before the connection ended (the settler finishes
        # the batch it holds: cancelling it mid-query would lose that batch).
        await self.settler.close(10)
        try:
            out = self.engine.output()
            if out and not self.writer.is_closing():
                self.writer.write(out)
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------------------ dispatch

    async def _dispatch(self, ev: EngineEvent) -> None:
        t = ev.type
        if t == Event.CONNECTION_REMOTE_OPEN:
            await self._on_open(ev.connection)
        elif t == Event.CONNECTION_REMOTE_CLOSE:
            cond = ev.connection.remote_condition
            if cond is not None:
                log.info("amqp10 %s: client closed with %s: %s", self.peer, cond.name, cond.description)
            for consumer in list(self.consumers.values()):
                await self._close_consumer(consumer)
            if not ev.connection.state & ev.connection.LOCAL_CLOSED:
                ev.connection.close()
        elif t == Event.SESSION_REMOTE_OPEN:
            if ev.session.state & ev.session.LOCAL_UNINIT:
                ev.session.open()
        elif t == Event.SESSION_REMOTE_CLOSE:
            for link in list(self.consumers) + list(self.publishers):
                if link.session == ev.session:
                    await self._forget_link(link)
            if not ev.session.state & ev.session.LOCAL_CLOSED:
                ev.session.close()
        elif t == Event.LINK_REMOTE_OPEN:
            await self._on_attach(ev.link)
        elif t in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH):
            link = ev.link
            await self._forget_link(link)
            if not link.state & link.LOCAL_CLOSED:
                if t == Event.LINK_REMOTE_DETACH:
                    link.detach()
                else:
                    link.close()
        elif t == Event.LINK_FLOW:
            consumer = self.consumers.get(ev.link)
            if consumer is not None:
                self._on_flow(consumer)
        elif t == Event.DELIVERY:
            link = ev.link
            if link.is_receiver:
                publisher = self.publishers.get(link)
                if publisher is not None:
                    self._on_transfer(publisher, ev.delivery)
                elif link in self.coordinators:
                    self._on_control(self.coordinators[link], ev.delivery)
            else:
                consumer = self.consumers.get(link)
                if consumer is not None:
                    self._on_disposition(consumer, ev.delivery)
        elif t == Event.TRANSPORT_ERROR:
            cond = self.engine.transport.condition
            if cond is not None:
                log.info("amqp10 %s: transport error %s: %s", self.peer, cond.name, cond.description)

    async def _on_open(self, conn) -> None:
        if self.principal is None:
            # The client skipped SASL: it is anonymous, which the authenticator may refuse.
            try:
                self.principal = await self.auth.authenticate(None, None, protocol="amqp10", peer=self.peer)
            except AuthError as exc:
                log.info("amqp10 %s: connection without SASL refused: %s", self.peer, exc)
                self.engine.close_with_error(Condition(
                    "amqp:unauthorized-access", "authentication required: connect with SASL PLAIN"))
                return
        conn.properties = {symbol("product"): "fluxpg"}
        conn.offered_capabilities = [symbol("ANONYMOUS-RELAY")]
        conn.open()
        connections.logged_in()   # the listener's handshake deadline no longer applies

    # ------------------------------------------------------------------------------ links

    async def _on_attach(self, link: Link) -> None:
        if self.principal is None or self._closed:
            return
        try:
            if link.is_sender:
                await self._attach_consumer(link)
            else:
                await self._attach_publisher(link)
        except (Refused, FluxError) as exc:
            cond = exc.condition if isinstance(exc, Refused) else _condition(exc)
            log.info("amqp10 %s: link %r refused: %s", self.peer, link.name, cond.description)
            # A refused attach: answer with a null terminus, then detach with the error (spec 2.6.3).
            if link.state & link.LOCAL_UNINIT:
                link.open()
            link.condition = cond
            link.close()

    async def _declare_dynamic(self, link: Link) -> str:
        """A transient queue for a dynamic terminus: its name is the address the client gets."""
        name = f"amqp10.dynamic.{uuid.uuid4().hex}"
        await self.manager.declare_transient(name, owner=self._owner)
        log.debug("amqp10 %s: dynamic node %s for link %r", self.peer, name, link.name)
        return name

    async def _delete_dynamic(self, name: str | None) -> None:
        if name is None:
            return
        try:
            await self.manager.delete_transient(name)
        except Exception as exc:  # noqa: BLE001 - the node's transient queues go when it stops
            log.warning("amqp10 %s: deleting dynamic node %s failed: %s", self.peer, name, exc)

    async def _attach_publisher(self, link: Link) -> None:
        remote = link.remote_target
        if remote.type == Terminus.COORDINATOR:
            self._attach_coordinator(link)
            return
        dynamic = None
        if remote.dynamic:
            dynamic = await self._declare_dynamic(link)
            address = dynamic
        else:
            address = remote.address
        topic = self._publish_topic(address) if address else None
        if topic is not None and not authorize(self.principal, "publish", topic):
            await self._delete_dynamic(dynamic)
            raise Refused("amqp:unauthorized-access", f"not allowed to publish to {address!r}")
        link.target.copy(remote)
        if dynamic is not None:
            link.target.address = dynamic
        link.source.copy(link.remote_source)
        link.rcv_settle_mode = Link.RCV_FIRST
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.open()
        self.publishers[link] = _Publisher(link, topic, dynamic=dynamic)
        link.flow(PUBLISH_WINDOW)

    def _attach_coordinator(self, link: Link) -> None:
        """A transaction controller: local transactions only (spec 4.3)."""
        link.target.copy(link.remote_target)
        link.source.copy(link.remote_source)
        link.rcv_settle_mode = Link.RCV_FIRST
        link.open()
        self.coordinators[link] = _Publisher(link, None)
        link.flow(COORDINATOR_CREDIT)

    @staticmethod
    def _publish_topic(address: str) -> str:
        """A target address (or message `to`) → the topic to publish to. Raises Refused."""
        topic = address
        if not (topic.startswith(QUEUE_PREFIX) or topic.startswith(DLQ_PREFIX)):
            # A bare queue name is that queue (`orders` = `$queue/orders`).
            try:
                validate_queue_name(address)
            except InvalidArgument:
                raise Refused("amqp:not-found",
                              f"cannot publish to {address!r}: use $queue/<queue>[/<routing key>] "
                              "or a queue name") from None
            topic = QUEUE_PREFIX + address
        try:
            validate_topic_name(topic)
            if is_queue_topic(topic):
                parse_queue_topic(topic)
        except InvalidArgument as exc:
            raise Refused("amqp:invalid-field", str(exc)) from None
        return topic

    async def _attach_consumer(self, link: Link) -> None:
        # A dynamic source (request/reply): a transient queue of our naming, its address sent
        # back in the attach, deleted with the link (or the connection), or now if the attach fails.
        dynamic = await self._declare_dynamic(link) if link.remote_source.dynamic else None
        try:
            await self._consume(link, dynamic)
        except BaseException:
            await self._delete_dynamic(dynamic)
            raise

    async def _consume(self, link: Link, dynamic: str | None) -> None:
        remote = link.remote_source
        address = dynamic if dynamic is not None else remote.address
        if not address:
            raise Refused("amqp:invalid-field", "a receiver link needs a source address: $queue/<queue>[/<filter>]")
        try:
            queue, topic_filter = split_queue_subscription(address)
        except InvalidArgument as exc:
            raise Refused("amqp:invalid-field", str(exc)) from None
        applied_filters: dict = {}
        source_filter, filter_key, filter_value = _topic_filter(remote)
        if source_filter is not None:
            if topic_filter is not None and topic_filter != source_filter:
                raise Refused("amqp:invalid-field",
                              f"two topic filters: {topic_filter!r} in the address and {source_filter!r} "
                              "as a source filter")
            try:
                validate_topic_filter(source_filter)
            except InvalidArgument as exc:
                raise Refused("amqp:invalid-field", f"source filter: {exc}") from None
            topic_filter = source_filter
            applied_filters[filter_key] = filter_value
        selector, selector_key, selector_value = _selector_filter(remote)
        if selector is not None:
            applied_filters[selector_key] = selector_value   # compiled (and refused) by subscribe
        props = _properties(link.remote_properties)
        conn = link.connection
        # Receivers that name no group share the queue's default group (the queue name, as
        # AMQP 0-9-1 consumers do): they compete for its messages, and a later one resumes where
        # the group is instead of replaying the queue in a group of its own.
        group = props.get("consumer-group") or queue
        # The subscription with its filter, as the other protocols name it: the same answer.
        if not authorize(self.principal, "consume", subscription(queue, topic_filter), group=str(group)):
            raise Refused("amqp:unauthorized-access", f"not allowed to consume from {address!r}")
        position = props.get("cursor")
        if position is not None and not isinstance(position, (str, int)):
            raise Refused("amqp:invalid-field", f"cursor: expected a string or number, got {position!r}")
        auto_commit = props.get("auto-commit")
        if auto_commit is not None:
            if isinstance(auto_commit, str):
                auto_commit = auto_commit.strip().lower() in ("true", "1", "yes")
            else:
                auto_commit = bool(auto_commit)
        consumer_name = f"{conn.remote_container or self.peer}/{link.name}"
        consumer = _Consumer(link, queue, presettled=link.remote_snd_settle_mode == Link.SND_SETTLED,
                             dynamic=dynamic)
        try:
            sub = await self.manager.subscribe(
                queue, str(group), consumer_name, on_delivery=lambda d: self._deliver(consumer, d),
                filter=topic_filter, position=position, auto_commit=auto_commit, credit=0,
                on_error=lambda exc: self._on_subscription_error(consumer, exc), selector=selector)
        except SelectorError as exc:
            raise Refused("amqp:invalid-field", str(exc)) from None
        except ValueError as exc:  # a malformed cursor (stream.normalize_position)
            raise Refused("amqp:invalid-field", f"cursor: {exc}") from None
        consumer.sub = sub
        if self._closed or link.state & link.REMOTE_CLOSED:
            await sub.close()
            await self._delete_dynamic(dynamic)
            return
        link.source.copy(remote)
        if dynamic is not None:
            link.source.address = dynamic
        # Echo only the filters we apply, so the client can tell an ignored one (spec 3.5.8).
        link.source.filter.clear()
        if applied_filters:
            link.source.filter.put_dict(applied_filters)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = Link.SND_SETTLED if consumer.presettled else Link.SND_UNSETTLED
        link.properties = {symbol("consumer-group"): str(group), symbol("queue-kind"): sub.kind,
                           symbol("group-id"): sub.group}
        link.open()
        self.consumers[link] = consumer
        sub.set_credit(_available_credit(link))

    async def _forget_link(self, link: Link) -> None:
        consumer = self.consumers.pop(link, None)
        if consumer is not None:
            await self._close_consumer(consumer)
        publisher = self.publishers.pop(link, None) or self.coordinators.pop(link, None)
        if publisher is not None:
            publisher.closed = True
            await self._delete_dynamic(publisher.dynamic)
            if publisher.buffer is not None:
                self._release_inbound(len(publisher.buffer))
                publisher.buffer = None

    async def _close_consumer(self, consumer: _Consumer) -> None:
        if consumer.closed:
            return
        consumer.closed = True
        if consumer.drain_task is not None:
            consumer.drain_task.cancel()
        if consumer.flow_task is not None:
            consumer.flow_task.cancel()
        if consumer.sub is not None:
            await consumer.sub.close()
        # What the link took and the client did not settle goes back to the queue now, in its
        # order (not after the visibility timeout): another receiver, or this one reattaching,
        # gets it next.
        for delivery in consumer.unsettled.values():
            self._queue_ack("release", delivery)
        consumer.unsettled.clear()
        await self._delete_dynamic(consumer.dynamic)

    def _on_subscription_error(self, consumer: _Consumer, exc: FluxError) -> None:
        link = consumer.link
        consumer.closed = True
        self.consumers.pop(link, None)
        if not link.state & link.LOCAL_CLOSED:
            link.condition = _condition(exc)
            link.close()
        self._kick()

    # ------------------------------------------------------------------------------ consuming

    def _on_flow(self, consumer: _Consumer) -> None:
        link = consumer.link
        if consumer.sub is None:
            return
        # The subscription may send what the link can take now. Deliveries sent beyond the
        # credit (a claim that finished after a drain) wait in proton and count against the new
        # credit: none is ever dropped.
        if self.settler.requeues:
            # A message this connection released (or nacked) goes back first in line: new credit
            # waits until the requeue is in the database, or the claim would pass it by.
            consumer.sub.set_credit(0)
            if consumer.flow_task is None:
                consumer.flow_task = asyncio.ensure_future(self._flow_after_requeues(consumer))
            return
        consumer.sub.set_credit(_available_credit(link))
        if link.drain_mode and link.credit > 0 and consumer.drain_task is None:
            consumer.drain_task = asyncio.ensure_future(self._drain(consumer))

    async def _flow_after_requeues(self, consumer: _Consumer) -> None:
        try:
            while self.settler.requeues and not consumer.closed:
                await self.settler.requeued.wait()
        finally:
            consumer.flow_task = None
        if not consumer.closed and not self._closed:
            self._on_flow(consumer)
            self._kick()

    async def _drain(self, consumer: _Consumer) -> None:
        """The client asked us to use up or give back its credit: send what is available right
        now (the subscription was woken with the credit), then give the rest back (link.drained()
        sends the flow with credit 0). "Available right now" = nothing more was delivered over
        a few polls of the subscription (each poll is longer than a claim takes here)."""
        try:
            quiet = 0
            before = -1
            while quiet < DRAIN_QUIET_POLLS:
                await asyncio.sleep(DRAIN_POLL)
                sub = consumer.sub
                link = consumer.link
                if consumer.closed or sub is None or not link.drain_mode:
                    return
                if _available_credit(link) <= 0:
                    break  # credit used up by deliveries: nothing to give back
                quiet = quiet + 1 if sub.delivered == before else 0
                before = sub.delivered
            sub = consumer.sub
            if sub is not None and not consumer.closed:
                sub.set_credit(0)
                consumer.link.drained()
                self._kick()
        finally:
            consumer.drain_task = None

    def _deliver(self, consumer: _Consumer, delivery: Delivery) -> None:
        """Subscription callback: send one message on the link (synchronously, so the link's
        credit and the subscription's stay equal)."""
        link = consumer.link
        if consumer.closed or self._closed or link.state & link.LOCAL_CLOSED:
            return  # classic: stays pending and comes back (reclaim or visibility timeout)
        tag = str(consumer.next_tag)  # proton gives tags back as str
        consumer.next_tag += 1
        try:
            encoded = from_delivery(delivery).encode()
        except Exception:  # noqa: BLE001 - a message we cannot encode goes to the dead-letter queue
            log.exception("amqp10: cannot encode %s; rejecting it", delivery.message_id)
            self._queue_ack("reject", delivery, "cannot be encoded as an AMQP 1.0 message")
            return
        dlv = link.delivery(tag)
        link.send(encoded)
        link.advance()
        if consumer.presettled:
            dlv.settle()
            self._queue_ack("ack", delivery)
        else:
            consumer.unsettled[tag] = delivery
        self._kick()

    def _on_disposition(self, consumer: _Consumer, dlv: PnDelivery) -> None:
        # proton: `dlv.settled` is the client's settlement; ours is settle(), done once below.
        if not (dlv.updated or dlv.settled):
            return
        delivery = consumer.unsettled.get(dlv.tag)
        if delivery is None:
            return  # already handled
        state = dlv.remote_state
        if state == PnDelivery.RECEIVED or (state is None and not dlv.settled):
            return  # not an outcome yet
        if state == TRANSACTIONAL_STATE:
            self._transactional_disposition(consumer, dlv, delivery)
            return
        del consumer.unsettled[dlv.tag]
        if state == PnDelivery.ACCEPTED or state is None:
            # settled without an outcome: the client took it (AMQP default outcome is accepted
            # for our source, which declares no other default)
            self._queue_ack("ack", delivery)
        elif state == PnDelivery.RELEASED:
            # Not acted upon: back in its place at once, not counted as a failure.
            self._queue_ack("release", delivery)
        elif state == PnDelivery.REJECTED:
            cond = dlv.remote.condition
            reason = (cond.description or cond.name) if cond is not None else "rejected"
            self._queue_ack("reject", delivery, reason)
        elif state == PnDelivery.MODIFIED:
            if dlv.remote.undeliverable:
                self._queue_ack("reject", delivery, "modified: undeliverable-here")
            elif dlv.remote.failed:
                self._queue_ack("nack", delivery)      # a failed attempt: the retry policy applies
            else:
                self._queue_ack("release", delivery)
        dlv.settle()

    def _queue_ack(self, verb: str, delivery: Delivery, reason: str | None = None) -> None:
        self.settler.settle(verb, delivery.queue, delivery.group, delivery.seq, delivery.partition, reason)

    # ------------------------------------------------------------------------------ publishing

    def _message_limit(self, topic: str | None) -> int:
        """Cutoff for one encoded message on a link publishing to `topic` (None: anonymous
        relay, the largest limit of any queue): the queues' max_message_size plus the envelope
        allowance; 0 when a queue it reaches has no limit."""
        try:
            targets = list(self.manager.queues.values()) if topic is None else self.manager.route(topic)
        except (FluxError, ValueError):
            targets = []
        sizes = [q.max_message_size for q in targets] or [DEFAULT_MAX_MESSAGE_SIZE]
        if 0 in sizes:
            return 0
        return (max(sizes) if topic is None else min(sizes)) + ENVELOPE_ALLOWANCE

    def _release_inbound(self, n: int) -> None:
        self.inbound.release(n)

    def _on_transfer(self, publisher: _Publisher, dlv: PnDelivery) -> None:
        link = publisher.link
        if dlv.aborted:
            if publisher.buffer is not None:
                self._release_inbound(len(publisher.buffer))
            publisher.buffer, publisher.refused = None, None
            dlv.settle()
            link.advance()
            self._top_up(publisher)
            return
        if not dlv.readable:
            return
        if publisher.buffer is None and publisher.refused is None:
            publisher.buffer = bytearray()
            publisher.limit = self._message_limit(publisher.topic)
        while True:
            chunk = link.recv(max(dlv.pending, 1))
            if not chunk:
                break
            if publisher.refused is not None:
                continue  # over a limit: read (proton must not keep it) and drop
            size = len(publisher.buffer) + len(chunk)
            if publisher.limit and size > publisher.limit:
                publisher.refused = Refused(
                    "amqp:link:message-size-exceeded",
                    f"message of more than {size} bytes exceeds the queue's max_message_size "
                    f"({publisher.limit - ENVELOPE_ALLOWANCE} bytes of payload)")
            elif (reason := self.inbound.reserve(len(chunk))) is not None:
                publisher.refused = Refused("amqp:resource-limit-exceeded", reason)
            else:
                publisher.buffer += chunk
                continue
            self._release_inbound(len(publisher.buffer))
            publisher.buffer = None
        if dlv.partial:
            return
        buffer, refused = publisher.buffer, publisher.refused
        publisher.buffer, publisher.refused = None, None
        link.advance()
        settled_by_client = dlv.settled
        size = len(buffer) if buffer is not None else 0
        try:
            if refused is not None:
                raise refused
            try:
                message = decode(bytes(buffer), self.decoder_limits)
            except MessageError as exc:
                raise Refused("amqp:decode-error", str(exc)) from None
            topic = publisher.topic
            if topic is None:
                if not message.address:
                    raise Refused("amqp:invalid-field",
                                  "message without a `to` address sent on a link without a target address")
                topic = self._publish_topic(message.address)
                if not authorize(self.principal, "publish", topic):
                    raise Refused("amqp:unauthorized-access", f"not allowed to publish to {message.address!r}")
            try:
                payload, headers = to_log(message)
            except MessageError as exc:
                raise Refused("amqp:decode-error", str(exc)) from None
            del buffer, message
            txn = self._transaction_of(dlv)
            if txn is not None:
                # A transactional post: validated and routed now, written at discharge. Its bytes
                # (and the cost of keeping it) stay charged to bounds.*_inbound_bytes until then:
                # over them it is rejected like a partial message.
                if (reason := self.inbound.reserve(TX_MESSAGE_OVERHEAD)) is not None:
                    raise Refused("amqp:resource-limit-exceeded", f"transaction {txn.id!r} holds {txn.held} "
                                  f"bytes uncommitted; {reason}")
                try:
                    txn.tx.publish(topic, payload, headers)
                except FluxError as exc:
                    self._release_inbound(TX_MESSAGE_OVERHEAD)
                    raise Refused(_condition(exc).name, str(exc)) from None
                txn.held += size + TX_MESSAGE_OVERHEAD
                dlv.local.data = [txn.id, Described(ulong(0x24), [])]
                dlv.update(TRANSACTIONAL_STATE)
                txn.posts.append(dlv)
                self._top_up(publisher)
                return
        except Refused as exc:
            self._release_inbound(size)
            log.info("amqp10 %s: message refused: %s", self.peer, exc)
            if not settled_by_client:
                dlv.local.condition = exc.condition
                dlv.update(PnDelivery.REJECTED)
            dlv.settle()
            self._top_up(publisher)
            return
        publisher.in_flight += 1
        # Started here, in arrival order (not in the task, which may start later than the next
        # transfer's): the offsets are the order the client sent in.
        appended = self._appends.append(topic, payload, headers)
        self._spawn(self._publish(publisher, dlv, topic, appended, settled_by_client, size))

    async def _publish(self, publisher: _Publisher, dlv: PnDelivery, topic: str, appended: asyncio.Future,
                       settled_by_client: bool, size: int) -> None:
        error: BaseException | None = None
        try:
            stored = await appended
            if not stored:
                # Accepted means stored somewhere: a publish no queue took is refused, never
                # confirmed into nothing.
                error = UnknownQueue(f"no queue takes messages published to {topic!r}")
        except FluxError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001
            log.exception("amqp10 %s: publish to %s failed", self.peer, topic)
            error = exc
        finally:
            self._release_inbound(size)
        publisher.in_flight -= 1
        if self._closed or publisher.closed:
            return
        if error is not None:
            log.info("amqp10 %s: publish to %s refused: %s", self.peer, topic, error)
        if not settled_by_client:
            if error is None:
                dlv.update(PnDelivery.ACCEPTED)
            else:
                dlv.local.condition = _condition(error)
                dlv.update(PnDelivery.REJECTED)
        dlv.settle()
        self._top_up(publisher)
        self._kick()

    # ------------------------------------------------------------------------------ transactions

    def _transaction_of(self, dlv: PnDelivery) -> _Txn | None:
        """The transaction a transfer or disposition names in its transactional-state, if any.
        Raises Refused for an id that was never declared (or is discharged)."""
        if dlv.remote_state != TRANSACTIONAL_STATE:
            return None
        data = dlv.remote.data or []
        txn_id = bytes(data[0]) if data and data[0] is not None else b""
        txn = self.transactions.get(txn_id)
        if txn is None:
            raise Refused("amqp:transaction:unknown-id", f"unknown transaction {txn_id!r}")
        return txn

    def _transactional_disposition(self, consumer: _Consumer, dlv: PnDelivery, delivery: Delivery) -> None:
        """The client settles one of our deliveries inside a transaction: the outcome is applied
        at discharge. The delivery stays unsettled until then (a failed transaction leaves it
        with the client, which releases it)."""
        try:
            txn = self._transaction_of(dlv)
        except Refused as exc:
            log.info("amqp10 %s: %s", self.peer, exc)
            return
        data = dlv.remote.data or []
        outcome = data[1] if len(data) > 1 else None
        code = int(outcome.descriptor) if isinstance(outcome, Described) and isinstance(outcome.descriptor, int) \
            else None
        verb = OUTCOMES.get(code, "accepted")
        args = (delivery.queue, delivery.group, [delivery.seq])
        if verb == "accepted":
            txn.tx.ack(*args, partition=delivery.partition)
        elif verb == "rejected":
            txn.tx.reject(*args, reason="rejected", partition=delivery.partition)
        elif verb == "modified" and isinstance(outcome.value, list) and len(outcome.value) > 1 \
                and outcome.value[1]:
            txn.tx.reject(*args, reason="modified: undeliverable-here", partition=delivery.partition)
        else:
            txn.tx.nack(*args, partition=delivery.partition)
        txn.settles.append((consumer, dlv.tag, dlv))

    def _on_control(self, coordinator: _Publisher, dlv: PnDelivery) -> None:
        """A declare or discharge on a coordinator link."""
        link = coordinator.link
        if not dlv.readable:
            return
        buffer = coordinator.buffer if coordinator.buffer is not None else bytearray()
        while True:
            chunk = link.recv(max(dlv.pending, 1))
            if not chunk:
                break
            buffer += chunk
            if len(buffer) > ENVELOPE_ALLOWANCE:
                buffer = bytearray()
                coordinator.refused = Refused("amqp:decode-error", "transaction control message too large")
        if dlv.partial:
            coordinator.buffer = buffer
            return
        refused, coordinator.buffer, coordinator.refused = coordinator.refused, None, None
        link.advance()
        try:
            if refused is not None:
                raise refused
            try:
                body = decode(bytes(buffer)).body
            except MessageError as exc:
                raise Refused("amqp:decode-error", str(exc)) from None
            descriptor = body.descriptor if isinstance(body, Described) else None
            descriptor = int(descriptor) if isinstance(descriptor, int) else str(descriptor)
            fields = body.value if isinstance(body, Described) and isinstance(body.value, list) else []
            if descriptor in DECLARE:
                if len(self.transactions) >= MAX_TRANSACTIONS:
                    raise Refused("amqp:resource-limit-exceeded",
                                  f"at most {MAX_TRANSACTIONS} open transactions per connection")
                if fields and fields[0] is not None:
                    raise Refused("amqp:transaction:unknown-id", "global transactions are not supported")
                self._txn_ids += 1
                txn_id = str(self._txn_ids).encode()
                self.transactions[txn_id] = _Txn(txn_id, self.manager.transaction())
                dlv.local.data = [txn_id]
                dlv.update(DECLARED)
                dlv.settle()
            elif descriptor in DISCHARGE:
                txn_id = bytes(fields[0]) if fields and fields[0] is not None else b""
                txn = self.transactions.pop(txn_id, None)
                if txn is None:
                    raise Refused("amqp:transaction:unknown-id", f"unknown transaction {txn_id!r}")
                fail = bool(fields[1]) if len(fields) > 1 else False
                task = asyncio.ensure_future(self._discharge(coordinator, dlv, txn, fail))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            else:
                raise Refused("amqp:decode-error", f"a coordinator takes declare or discharge, not {body!r:.80}")
        except Refused as exc:
            log.info("amqp10 %s: transaction control refused: %s", self.peer, exc)
            dlv.local.condition = exc.condition
            dlv.update(PnDelivery.REJECTED)
            dlv.settle()
        self._top_up_coordinator(coordinator)

    async def _discharge(self, coordinator: _Publisher, dlv: PnDelivery, txn: _Txn, fail: bool) -> None:
        error: BaseException | None = None
        if fail:
            txn.tx.rollback()
        else:
            try:
                await txn.tx.commit()
            except FluxError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - nothing was applied; tell the client
                log.exception("amqp10 %s: commit of transaction %r failed", self.peer, txn.id)
                error = exc
        self._release_inbound(txn.held)    # stored, or dropped with the rollback
        txn.held = 0
        if self._closed:
            return
        for post in txn.posts:
            post.settle()
        if not fail and error is None:
            # Its settlements took effect: settle our deliveries (a failed or rolled back
            # transaction leaves them with the client, as the spec says).
            for consumer, tag, settled in txn.settles:
                if consumer.unsettled.pop(tag, None) is not None:
                    settled.settle()
        if error is None:
            dlv.update(PnDelivery.ACCEPTED)
        else:
            log.info("amqp10 %s: transaction %r rolled back: %s", self.peer, txn.id, error)
            dlv.local.condition = Condition("amqp:transaction:rollback", str(error))
            dlv.update(PnDelivery.REJECTED)
        dlv.settle()
        self._top_up_coordinator(coordinator)
        self._kick()

    def _top_up_coordinator(self, coordinator: _Publisher) -> None:
        link = coordinator.link
        if not coordinator.closed and not link.state & link.LOCAL_CLOSED and link.credit < COORDINATOR_CREDIT // 2:
            link.flow(COORDINATOR_CREDIT - link.credit)

    def _top_up(self, publisher: _Publisher) -> None:
        """Keep credit + unconfirmed publishes ≤ PUBLISH_WINDOW (back-pressure on a fast sender),
        granting in chunks rather than one flow frame per message."""
        link = publisher.link
        if publisher.closed or link.state & link.LOCAL_CLOSED:
            return
        if self.inbound.limit and self.inbound.used > self.inbound.limit // 2 and publisher.in_flight:
            return  # much unconfirmed data held: more credit when publishes complete
        room = PUBLISH_WINDOW - publisher.in_flight - link.credit
        if room >= PUBLISH_WINDOW // 2 or (link.credit == 0 and room > 0):
            link.flow(room)


def _available_credit(link: Link) -> int:
    """What a sender link may still send. proton's credit is already net of every delivery we
    handed it (advance() takes one, written or not), and goes below zero for deliveries sent
    beyond the credit (they wait in proton for the next credit)."""
    return max(0, link.credit)


def _properties(remote) -> dict[str, Any]:
    """Link attach properties (symbol-keyed map) as a plain dict with str keys."""
    if not remote:
        return {}
    out = {}
    for key, value in dict(remote).items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = bytes(value).decode("utf-8", "replace")
        out[str(key)] = value
    return out


def _source_filters(terminus) -> list[tuple[Any, Any, str | None, str]]:
    """The string-valued filters of a source: (key, value as sent, descriptor, string)."""
    data: Data = terminus.filter
    if data is None:
        return []
    data.rewind()
    if not data.next():
        return []
    try:
        filters = data.get_object()
    except Exception:  # noqa: BLE001
        raise Refused("amqp:decode-error", "malformed source filter") from None
    if not isinstance(filters, dict):
        return []
    out = []
    for key, value in filters.items():
        inner = value
        descriptor = None
        if isinstance(value, Described):
            descriptor, inner = str(value.descriptor), value.value
        if isinstance(inner, (bytes, bytearray, memoryview)):
            inner = bytes(inner).decode("utf-8", "replace")
        if isinstance(inner, str):
            out.append((key, value, descriptor, inner))
    return out


def _topic_filter(terminus) -> tuple[str | None, Any, Any]:
    """A topic filter given as a source filter → (filter, its key, its value as sent)."""
    for key, value, descriptor, text in _source_filters(terminus):
        if str(key) in TOPIC_FILTER_KEYS or descriptor in TOPIC_FILTER_DESCRIPTORS:
            return text, key, value
    return None, None, None


def _selector_filter(terminus) -> tuple[str | None, Any, Any]:
    """A JMS selector given as a source filter (`apache.org:selector-filter:string`, the
    registered filter proton's Selector and Qpid JMS send) → (selector, its key, its value)."""
    for key, value, descriptor, text in _source_filters(terminus):
        if descriptor in SELECTOR_FILTER_DESCRIPTORS or (descriptor is None and str(key) == "jms-selector"):
            return text, key, value
    return None, None, None
