"""One AMQP 0-9-1 channel: publishes (with confirms and returns), consumers, acknowledgements,
queue and exchange methods, mapped onto the fluxpg queue manager.

The connection hands every frame of this channel to `Channel.handle_frame` in arrival order and
awaits it. Methods that need the database either run inline (declare, consume, get: the client
waits for their -ok anyway) or in an ordered background pipeline:

* publishes: each completed message starts its append at once (so the appender can group-commit
  the publishes of a burst) and joins a FIFO; one confirmer task walks the FIFO in order and sends
  `basic.ack` (coalesced with `multiple`) or `basic.nack` — only after `manager.publish` returned,
  i.e. after the append committed. A failed append is a nack, never an ack.
* acknowledgements (basic.ack/nack/reject): queued and written in batches by one settle task.
  Acks of a classic consumer's deliveries wait a moment instead (ACK_DELAY at most): the
  consumer's next claim carries them in its transaction (fluxpg.ack_claim), so a window of
  deliveries costs one database call rather than a claim plus an ack batch; whatever no claim
  took by then goes to the settle task. The credit acks free is handed to the consumer in
  batches of half its prefetch window (GRANT_DELAY at most): fewer, larger claims.

Before any other synchronous method, and before channel.close-ok, the channel waits for both
pipelines to drain, so a client sees its own publishes and acks in effect (e.g. basic.get after
basic.publish on the same channel finds the message).

Semantics (FluxMQ, DESIGN §4): see fluxpg/protocols/amqp091/__init__.py.
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import functools
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pamqp import commands

from fluxpg.auth import authorize, subscription
from fluxpg.bounds import TX_MESSAGE_OVERHEAD
from fluxpg.config import LimitsConfig, queue_config_from_amqp_args
from fluxpg.protocols.amqp091 import framing
from fluxpg.protocols.amqp091.exchanges import EXCHANGE_TYPES, Binding, Exchange, freeze_args
from fluxpg.protocols.amqp091.framing import (ACCESS_REFUSED, COMMAND_INVALID, CONTENT_TOO_LARGE,
                                              FRAME_BODY, FRAME_HEADER, FRAME_METHOD, INTERNAL_ERROR,
                                              NO_ROUTE, NOT_ALLOWED, NOT_FOUND, NOT_IMPLEMENTED,
                                              PRECONDITION_FAILED, RESOURCE_ERROR, RESOURCE_LOCKED,
                                              UNEXPECTED_FRAME, AMQPError, channel_error, connection_error)
from fluxpg.protocols.amqp091.properties import delivery_properties, encode_delivery, headers_from_properties
from fluxpg.delivery import Delivery, parse_message_id
from fluxpg.protocols.appends import OrderedPublisher
from fluxpg.protocols.errors import reply_for
from fluxpg.protocols.settle import Settler
from fluxpg.errors import (FluxError, InvalidArgument, PayloadTooLarge, QueueFull, ResourceLocked, Unavailable,
                           UnknownQueue, WrongQueueKind)
from fluxpg.topics import (QUEUE_PREFIX, ack_verb, internal_group_name, parse_queue_topic,
                           split_queue_subscription, validate_queue_name, validate_topic_name)

if TYPE_CHECKING:
    from fluxpg.protocols.amqp091.connection import Connection

log = logging.getLogger("fluxpg.amqp091")

Basic, Queue, Exch, Chan, Confirm = commands.Basic, commands.Queue, commands.Exchange, commands.Channel, commands.Confirm

# Consume + ack (issue 17): per database call cost dominated, so acks and credit are gathered.
ACK_DELAY = 0.025    # seconds an ack waits for a claim to carry it before it is written alone
GRANT_DELAY = 0.02   # seconds freed credit is held back while less than half the window is free
MAX_PIPELINE = 2000          # publishes in flight per channel before the reader waits (TCP back-pressure)
SERVER_MAX_BODY = 512 * 2 ** 20   # hard cap when every queue allows unlimited sizes
DEFAULT_MAX_MESSAGE_SIZE = LimitsConfig().max_message_size

# Topics published to that passed validate_topic_name and parse_queue_topic (pure checks), so a
# publisher's next message to them skips both (≤ 1,024 topics of ≤ 512 characters).
_VALID_TOPICS: dict[str, None] = {}

# Methods a client sends without waiting for an answer: they skip the drain barrier.
_ASYNC_METHODS = (Basic.Publish, Basic.Ack, Basic.Nack, Basic.Reject)


def _text_arg(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _error_from_flux(exc: FluxError, method) -> AMQPError:
    """A queue-engine error as the channel exception RabbitMQ would raise (fluxpg/protocols/errors.py)."""
    code = reply_for(exc).amqp091
    text = f"database unavailable: {exc}" if isinstance(exc, Unavailable) else str(exc)
    return channel_error(code, text, method)


@dataclass(eq=False)
class Consumer:
    tag: str
    queue: str
    kind: str
    no_ack: bool
    sub: Any = None          # fluxpg Subscription
    gather: int = 0          # credit handed over in batches of at least this (0/1: at once)
    owed: int = 0            # credit freed by acks, not yet handed to the subscription


@dataclass(slots=True)
class Unacked:
    queue: str
    group: str
    partition: int
    seq: int
    consumer: Consumer | None


@dataclass(eq=False)
class _Entry:
    """One publish in the confirm FIFO."""
    tag: int | None                 # confirm delivery tag (None: not in confirm mode)
    tasks: list[asyncio.Future] = field(default_factory=list)   # its appends (tasks or futures)
    error: AMQPError | None = None  # decided synchronously (e.g. a malformed $commit)
    reserved: int = 0               # bytes of conn.inbound its body holds until it leaves the FIFO


class Channel:
    def __init__(self, conn: Connection, channel_id: int):
        self.conn = conn
        self.id = channel_id
        self.state = "open"          # open | closing (we sent channel.close) | closed
        self.manager = conn.ctx.manager
        # content assembly
        self._publish: Basic.Publish | None = None
        self._header = None
        self._body: list[bytes] = []
        self._received = 0
        self._reserved = 0           # bytes of conn.inbound this channel's partial message holds
        # confirms
        self.confirm = False
        self._confirm_seq = 0
        self._pipeline: deque[_Entry] = deque()
        self._confirmer: asyncio.Task | None = None
        self._pipeline_idle = asyncio.Event()
        self._pipeline_idle.set()
        self._tasks: set[asyncio.Task] = set()
        self._appends = OrderedPublisher(self.manager, self._spawn)   # publishes, in order
        # consumers and deliveries
        self.consumers: dict[str, Consumer] = {}
        self._delivery_tag = 0
        self.unacked: dict[int, Unacked] = {}
        self.prefetch = 0            # per consumer (global=false), for consumers created after
        self.global_prefetch = 0     # per channel (global=true)
        self._held: deque[tuple[Consumer, Delivery]] = deque()
        # acknowledgements
        self.settler = Settler(conn.ctx.manager, f"amqp091 {conn.name} channel {channel_id}")
        # Classic acks not yet written, by (queue, group), in arrival order: the next claim of a
        # consumer of that queue and group carries them (_carry), else ACK_DELAY sends them to
        # the settler (_write_acks). Every path that waits for acks to be written (drain,
        # release) writes these first and waits for the claims carrying some (_carried).
        self._acks: dict[tuple[str, str], list[int]] = {}
        self._acks_timer: asyncio.TimerHandle | None = None
        self._carried = 0
        self._carried_idle = asyncio.Event()
        self._carried_idle.set()
        self._grant_timer: asyncio.TimerHandle | None = None
        self._release_task: asyncio.Task | None = None
        # transactions (tx.select): publishes and settlements wait in a queues Transaction
        # until tx.commit applies them in one PostgreSQL transaction
        self.tx = None
        self._tx_acked: list[tuple[int, Unacked]] = []    # settled in the tx: restored at rollback
        self._tx_returns: list[bytes] = []                # basic.return frames, sent at commit
        # Bytes of conn.inbound the open transaction's publishes hold (bodies + overhead) until
        # tx.commit / tx.rollback / the channel's close: buffered messages count toward
        # bounds.connection_inbound_bytes and broker_inbound_bytes like partial ones.
        self._tx_held = 0

    # ------------------------------------------------------------------ frame entry point

    async def handle_frame(self, frame: framing.Frame) -> None:
        if self.state != "open":
            # After we sent channel.close: discard everything but close / close-ok (spec 2.3.5.2).
            if frame.type == FRAME_METHOD:
                method = framing.decode_method(frame.payload)
                if isinstance(method, Chan.CloseOk):
                    await self._finish_release()
                    self.conn.drop_channel(self.id)
                elif isinstance(method, Chan.Close):
                    self.conn.write(framing.method_frame(self.id, Chan.CloseOk()))
            return
        try:
            await self._dispatch(frame)
        except (AMQPError, FluxError) as exc:
            self._fail_with(exc)

    def _fail_with(self, exc: AMQPError | FluxError) -> None:
        """A frame's handler failed: a channel-level error closes this channel; a connection-level
        AMQPError goes on up (the connection closes)."""
        if isinstance(exc, AMQPError):
            if not exc.channel:
                raise exc
            self.fail(exc)
        else:
            self.fail(_error_from_flux(exc, None))

    async def _dispatch(self, frame: framing.Frame) -> None:
        if self._publish is not None:
            if frame.type == FRAME_HEADER and self._header is None:
                return self._on_header(framing.decode_content_header(frame.payload))
            if frame.type == FRAME_BODY and self._header is not None:
                return await self._on_body(frame.payload)
            raise connection_error(UNEXPECTED_FRAME, f"expected content {'body' if self._header else 'header'} "
                                   f"for basic.publish on channel {self.id}, got a frame of type {frame.type}",
                                   Basic.Publish)
        if frame.type != FRAME_METHOD:
            raise connection_error(UNEXPECTED_FRAME, f"unexpected content frame (type {frame.type}) on channel "
                                   f"{self.id}: no basic.publish precedes it")
        method = framing.decode_method(frame.payload)
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise connection_error(COMMAND_INVALID, f"{method.name} is not a method a client sends on a channel",
                                   method)
        if not isinstance(method, _ASYNC_METHODS):
            await self.drain()
        await handler(self, method)

    # ------------------------------------------------------------------ closing

    def fail(self, err: AMQPError) -> None:
        """Close the channel with a channel exception; the rest of the connection goes on."""
        if self.state != "open":
            return
        log.info("amqp091 %s channel %d: closing with %d %s", self.conn.name, self.id, err.code, err.text)
        self.state = "closing"
        self._drop_partial()
        class_id, method_id = err.ids
        self.conn.write(framing.method_frame(self.id, Chan.Close(err.code, err.reply_text, class_id, method_id)))
        self._release_task = asyncio.create_task(self._release())

    async def _finish_release(self) -> None:
        if self._release_task is None:
            self._release_task = asyncio.create_task(self._release())
        try:
            await self._release_task
        except Exception:  # noqa: BLE001 - cleanup of a dead channel must not kill the connection
            log.exception("releasing channel %d failed", self.id)

    async def _release(self) -> None:
        """Stop consumers, write pending acknowledgements, requeue what was delivered but not
        acknowledged (RabbitMQ: unacked messages return when their channel closes)."""
        self.state = "closing" if self.state == "open" else self.state
        self._drop_partial()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        # Claimed for this channel but held back by its prefetch: never sent, back at once.
        for c, d in self._held:
            if c.kind == "classic":
                self.settler.settle("release", d.queue, d.group, d.seq, d.partition)
        self._held.clear()
        for c in consumers:
            self._drop_exclusive(c)
            if c.sub is not None:
                try:
                    await c.sub.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing consumer %s failed", c.tag)
        if self._grant_timer is not None:
            self._grant_timer.cancel()
            self._grant_timer = None
        await self._acks_written()
        if self.tx is not None:
            self._tx_undo()   # an open transaction is rolled back: its acks never happened
        if self.unacked:
            # Requeued at once, in delivery-tag (= offset) order, no backoff (fluxpg.release).
            for entry in self.unacked.values():
                self.settler.settle("release", entry.queue, entry.group, entry.seq, entry.partition)
            self.unacked.clear()
            await self.settler.flush()
        self.state = "closed"

    async def close_by_client(self) -> None:
        await self.drain()
        await self._finish_release()

    async def connection_lost(self) -> None:
        """The connection ended (or is being closed): release without sending anything."""
        if self.state == "open":
            self.state = "closing"
        await self._finish_release()

    # ------------------------------------------------------------------ pipelines

    async def drain(self) -> None:
        """Wait until every publish of this channel is confirmed (or failed) and every
        acknowledgement written."""
        await self._pipeline_idle.wait()
        await self._acks_written()

    async def _acks_written(self) -> None:
        """Until every acknowledgement so far is written: those waiting for a claim go to the
        settler now; claims carrying some end (a failed one hands its acks to the settler)."""
        self._write_acks()
        await self._carried_idle.wait()
        self._write_acks()
        await self.settler.flush()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ channel class

    async def _channel_flow(self, m: Chan.Flow) -> None:
        if not m.active:
            # RabbitMQ dropped client-initiated flow control too; consumers use basic.qos.
            raise connection_error(NOT_IMPLEMENTED, "channel.flow active=false is not supported; use basic.qos", m)
        self.conn.write(framing.method_frame(self.id, Chan.FlowOk(True)))

    async def _channel_flow_ok(self, m) -> None:
        return None

    async def _channel_close(self, m: Chan.Close) -> None:
        await self.close_by_client()
        self.conn.write(framing.method_frame(self.id, Chan.CloseOk()))
        self.conn.drop_channel(self.id)

    async def _channel_close_ok(self, m) -> None:
        # close-ok without our close: a protocol error of the client.
        raise connection_error(COMMAND_INVALID, "channel.close-ok without channel.close", m)

    # ------------------------------------------------------------------ exchanges

    def _exchange_name(self, name: str) -> str:
        return "" if name == "amq.default" else name

    async def _exchange_declare(self, m: Exch.Declare) -> None:
        name = self._exchange_name(m.exchange)
        table = self.conn.exchanges
        if name == "":
            if not m.passive:
                raise channel_error(ACCESS_REFUSED, "operation not permitted on the default exchange", m)
        elif m.passive:
            if table.get(name) is None:
                raise channel_error(NOT_FOUND, f"no exchange '{name}' on this connection (exchanges are "
                                    "per-connection in fluxpg)", m)
        else:
            ex_type = (m.exchange_type or "direct").lower()
            if ex_type not in EXCHANGE_TYPES:
                raise connection_error(COMMAND_INVALID, f"unknown exchange type '{m.exchange_type}'", m)
            existing = table.get(name)
            if existing is not None:
                if existing.type != ex_type:
                    raise channel_error(PRECONDITION_FAILED, f"inequivalent arg 'type' for exchange '{name}': "
                                        f"received '{ex_type}' but current is '{existing.type}'", m)
            else:
                if name.startswith("amq."):
                    raise channel_error(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", m)
                table.declare(Exchange(name, ex_type, durable=bool(m.durable), auto_delete=bool(m.auto_delete),
                                       internal=bool(m.internal), arguments=dict(m.arguments or {})))
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Exch.DeclareOk()))

    async def _exchange_delete(self, m: Exch.Delete) -> None:
        name = self._exchange_name(m.exchange)
        table = self.conn.exchanges
        if name == "" or name.startswith("amq."):
            raise channel_error(ACCESS_REFUSED, f"operation not permitted on exchange '{name or 'amq.default'}'", m)
        if m.if_unused and table.has_bindings_from(name):
            raise channel_error(PRECONDITION_FAILED, f"exchange '{name}' in use", m)
        table.delete(name)
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Exch.DeleteOk()))

    def _require_exchange(self, name: str, m) -> Exchange:
        if name == "":
            raise channel_error(ACCESS_REFUSED, "operation not permitted on the default exchange", m)
        ex = self.conn.exchanges.get(name)
        if ex is None:
            raise channel_error(NOT_FOUND, f"no exchange '{name}' on this connection", m)
        return ex

    async def _exchange_bind(self, m: Exch.Bind) -> None:
        src, dst = self._exchange_name(m.source), self._exchange_name(m.destination)
        self._require_exchange(src, m)
        self._require_exchange(dst, m)
        self.conn.exchanges.bind(Binding(src, dst, m.routing_key or "", freeze_args(m.arguments), to_exchange=True))
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Exch.BindOk()))

    async def _exchange_unbind(self, m: Exch.Unbind) -> None:
        src, dst = self._exchange_name(m.source), self._exchange_name(m.destination)
        self.conn.exchanges.unbind(Binding(src, dst, m.routing_key or "", freeze_args(m.arguments), to_exchange=True))
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Exch.UnbindOk()))

    # ------------------------------------------------------------------ queues

    def _authorize(self, action: str, resource: str, m, *, group: str | None = None) -> None:
        """fluxpg.auth.authorize, the one decision every protocol uses; 403 ACCESS_REFUSED when no."""
        principal = self.conn.principal
        if not authorize(principal, action, resource, group=group):
            who = principal.display if principal is not None else "anonymous"
            raise channel_error(ACCESS_REFUSED, f"{action} on '{resource}' refused for user '{who}'", m)

    def _queue_name(self, raw: str, m) -> tuple[str, str | None, bool]:
        """(queue, filter, explicit) from `orders`, `orders/eu/#` or `$queue/orders/#`."""
        explicit = raw.startswith(QUEUE_PREFIX)
        try:
            queue, topic_filter = split_queue_subscription(raw)
        except InvalidArgument as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        return queue, topic_filter, explicit

    async def _lookup(self, queue: str):
        """The queue's QueueInfo (durable, stream or transient), or None."""
        info = self.manager.queue_info(queue)
        if info is None:
            # Another node (or the CLI) may have declared it since our last reload.
            await self.manager.reload_queues()
            info = self.manager.queue_info(queue)
        return info

    def _check_exclusive(self, info, m) -> None:
        """An exclusive queue is for its own connection only (RabbitMQ: 405 RESOURCE_LOCKED)."""
        if info is not None and info.owner is not None and info.owner != self.conn.owner:
            raise channel_error(RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{info.name}'. "
                                "It could be originally declared on another connection or the exclusive "
                                "property value does not match that of the original declaration.", m)

    async def _counts(self, queue: str) -> tuple[int, int]:
        """(message_count, consumer_count) as declare-ok reports them: messages the queue's
        default group (its name, what AMQP consumers join) can still get, consumers on it."""
        try:
            ready = await self.manager.ready_count(queue)
        except FluxError as exc:  # a count is informative; the declare still succeeds
            log.warning("message count of %s unavailable: %s", queue, exc)
            ready = 0
        return ready, self.manager.consumer_count(queue)

    async def _declare_ok(self, m, queue: str) -> None:
        if m.nowait:
            return
        count, consumers = await self._counts(queue)
        self.conn.write(framing.method_frame(self.id, framing.build(Queue.DeclareOk, queue, count, consumers)))

    def _queue_config(self, name: str, args: dict, m):
        """QueueConfig from the declare arguments, with x-dead-letter-exchange resolved to a
        queue now (exchanges are per-connection; the SQL engine dead-letters by queue)."""
        try:
            qc = queue_config_from_amqp_args(name, args)
        except InvalidArgument as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        if "x-dead-letter-exchange" in args:
            dlx = self._exchange_name(_text_arg(args["x-dead-letter-exchange"]))
            dlrk = _text_arg(args["x-dead-letter-routing-key"]) if "x-dead-letter-routing-key" in args else None
            if dlx == "":
                target = dlrk or None
                if target is not None and target.startswith(QUEUE_PREFIX):
                    target = parse_queue_topic(target).queue
            else:
                routed = sorted(self.conn.exchanges.route(dlx, dlrk if dlrk is not None else name, {}))
                target = routed[0] if routed else None
            # Dead letters go to that queue; expired messages are dead-lettered too (RabbitMQ).
            # No target: fluxpg's own `$dlq/<queue>` keeps them (never dropped).
            qc = qc.model_copy(update={"dlq": qc.dlq.model_copy(update={"enabled": True, "topic": target or "",
                                                                         "expired": True})})
        return qc

    async def _queue_declare(self, m: Queue.Declare) -> None:
        raw = m.queue or ""
        args = dict(m.arguments or {})
        if raw == "":
            # Server-named: a transient queue (like RabbitMQ's amq.gen-…, it does not survive a restart).
            name = f"amq.gen-{uuid.uuid4().hex}"
        else:
            name = raw[len(QUEUE_PREFIX):] if raw.startswith(QUEUE_PREFIX) else raw
            try:
                validate_queue_name(name)
            except InvalidArgument as exc:
                raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        # A passive declare reveals depth and consumers (read); any other declare may create (configure).
        self._authorize("read" if m.passive else "configure", name, m)
        info = await self._lookup(name) if raw else None
        self._check_exclusive(info, m)
        if raw and info is None and name.startswith("amq.") and not m.passive:
            # Reserved for server-named queues (RabbitMQ checks this for new queues only: an
            # existing exclusive one of another connection is 405 first).
            raise channel_error(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", m)
        if m.passive:
            if info is None:
                raise channel_error(NOT_FOUND, f"no queue '{name}'", m)
            return await self._declare_ok(m, name)
        if "x-queue-type" in args and info is not None:
            wanted = _text_arg(args["x-queue-type"]).strip().lower()
            wanted = "classic" if wanted == "quorum" else wanted
            if wanted != info.kind:
                raise channel_error(PRECONDITION_FAILED, f"inequivalent arg 'x-queue-type' for queue '{name}': "
                                    f"received '{wanted}' but current is '{info.kind}'", m)
        if info is not None:
            # Existing queues keep their settings (the config or the first declare made them);
            # a re-declare does not reset e.g. a configured retry policy.
            return await self._declare_ok(m, name)
        qc = self._queue_config(name, args, m)
        transient = raw == "" or m.exclusive or m.auto_delete or not m.durable
        try:
            if transient:
                # Exclusive / auto-delete / non-durable / server-named: a transient queue, full
                # classic semantics, gone with its connection (exclusive), its last consumer
                # (auto-delete) or at the latest its node.
                if qc.type != "classic":
                    raise channel_error(PRECONDITION_FAILED, f"a {qc.type} queue must be durable, not "
                                        "exclusive or auto-delete", m)
                await self.manager.declare_transient(name, owner=self.conn.owner if m.exclusive else None,
                                                     auto_delete=bool(m.auto_delete), config=qc)
                if m.exclusive:
                    self.conn.exclusive_queues.add(name)
            elif self.manager.qm.auto_create == "off":
                raise channel_error(NOT_FOUND, f"no queue '{name}' (queue_manager.auto_create is off: queues "
                                    "come from the config)", m)
            elif self.manager.qm.auto_create == "transient" and qc.type == "classic":
                await self.manager.declare_transient(name, config=qc)
            else:
                # Create only: a queue of this name declared meanwhile (another node, the CLI)
                # keeps its settings, as an existing one does above.
                await self.manager.declare_queue(qc, if_absent=True)
        except WrongQueueKind as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        except FluxError as exc:
            raise _error_from_flux(exc, m) from None
        await self._declare_ok(m, name)

    async def _queue_bind(self, m: Queue.Bind) -> None:
        queue, _f, _e = self._queue_name(m.queue or "", m)
        exchange = self._exchange_name(m.exchange)
        self._require_exchange(exchange, m)
        self._authorize("read", queue, m)   # the answer tells whether the queue exists
        info = await self._lookup(queue)
        if info is None:
            raise channel_error(NOT_FOUND, f"no queue '{queue}'", m)
        self._check_exclusive(info, m)
        self.conn.exchanges.bind(Binding(exchange, queue, m.routing_key or "", freeze_args(m.arguments)))
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Queue.BindOk()))

    async def _queue_unbind(self, m: Queue.Unbind) -> None:
        queue, _f, _e = self._queue_name(m.queue or "", m)
        exchange = self._exchange_name(m.exchange)
        self.conn.exchanges.unbind(Binding(exchange, queue, m.routing_key or "", freeze_args(m.arguments)))
        self.conn.write(framing.method_frame(self.id, Queue.UnbindOk()))

    async def _queue_purge(self, m: Queue.Purge) -> None:
        # RabbitMQ's purge: what is not delivered yet is gone (group cursors to the head, the log
        # itself is left to retention); delivered, unacknowledged messages stay and come back
        # if released. Streams refuse (fluxpg.purge_queue says why).
        queue, _f, _e = self._queue_name(m.queue or "", m)
        if await self._lookup(queue) is None:
            raise channel_error(NOT_FOUND, f"no queue '{queue}'", m)
        try:
            n = await self.manager.purge_queue(queue)
        except FluxError as exc:
            raise _error_from_flux(exc, m) from None
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Queue.PurgeOk(n)))

    async def _queue_delete(self, m: Queue.Delete) -> None:
        queue, _f, _e = self._queue_name(m.queue or "", m)
        self._authorize("configure", queue, m)
        info = await self._lookup(queue)
        count = 0
        if info is not None:
            # Drops the queue with its messages (fluxpg.delete_queue: segments of a durable queue,
            # rows of a transient one); its consumers everywhere get basic.cancel. Queues of the
            # config file are refused (406); an exclusive queue of another connection is 405.
            self._check_exclusive(info, m)
            try:
                count = await self.manager.delete_queue(queue, if_unused=bool(m.if_unused), if_empty=bool(m.if_empty))
            except FluxError as exc:
                raise _error_from_flux(exc, m) from None
            self.conn.exclusive_queues.discard(queue)
        self.conn.exchanges.unbind_queue(queue)
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Queue.DeleteOk(count)))

    # ------------------------------------------------------------------ publish

    async def _basic_publish(self, m: Basic.Publish) -> None:
        self._begin_publish(m)

    def _begin_publish(self, m: Basic.Publish) -> None:
        exchange = self._exchange_name(m.exchange or "")
        if exchange and self.conn.exchanges.get(exchange) is None:
            # The content frames that follow are discarded while the channel is closing.
            raise channel_error(NOT_FOUND, f"no exchange '{exchange}' on this connection (exchanges are "
                                "per-connection in fluxpg)", m)
        self._publish = m
        self._header = None
        self._body = []
        self._received = 0

    def _max_body(self) -> int:
        # Per content header: the manager caches the limit until its queues change (building a
        # LimitsConfig and scanning every queue here cost ~3 % of the publish path's CPU).
        return self.manager.largest_message_limit(DEFAULT_MAX_MESSAGE_SIZE) or SERVER_MAX_BODY

    def _on_header(self, ch) -> None:
        if ch.class_id != Basic.frame_id:
            raise connection_error(UNEXPECTED_FRAME, f"content header of class {ch.class_id}, expected basic (60)",
                                   Basic.Publish)
        limit = self._max_body()
        if ch.body_size > limit:
            self._publish = None
            raise channel_error(CONTENT_TOO_LARGE, f"message of {ch.body_size} bytes is larger than the broker's "
                                f"maximum of {limit} bytes", Basic.Publish)
        # Reserve the announced size BEFORE buffering any of it: one connection (summed over
        # its channels) and the broker as a whole hold at most bounds.*_inbound_bytes.
        need = ch.body_size + (TX_MESSAGE_OVERHEAD if self.tx is not None else 0)
        refused = self.conn.inbound.reserve(need)
        if refused is not None:
            self._publish = None
            if self.tx is not None:
                # The transaction holding the bytes is this channel's: closing the channel (its
                # transaction rolled back) frees them, the connection's other channels go on.
                # RabbitMQ refuses a transaction over its bound the same way (406).
                setting = "broker_inbound_bytes" if "broker_inbound_bytes" in refused else "connection_inbound_bytes"
                raise channel_error(PRECONDITION_FAILED, f"transaction holds {self._tx_held} bytes uncommitted; "
                                    f"{ch.body_size} more would exceed bounds.{setting}: commit more often",
                                    Basic.Publish)
            raise connection_error(RESOURCE_ERROR, f"message of {ch.body_size} bytes refused: {refused}",
                                   Basic.Publish)
        self._reserved = need
        self._header = ch
        if ch.body_size == 0:
            self._complete()

    async def _on_body(self, payload: bytes) -> None:
        self._body_frame(payload)
        while len(self._pipeline) >= MAX_PIPELINE and self.state == "open":
            # Stop reading until the oldest publish finished: the socket pushes back on the client.
            head = self._pipeline[0]
            if head.tasks:
                await asyncio.wait(head.tasks)
            await asyncio.sleep(0)   # let the confirmer take it off the FIFO

    def _body_frame(self, payload: bytes) -> None:
        self._received += len(payload)
        if self._received > self._header.body_size:
            self._drop_partial()
            raise connection_error(framing.FRAME_ERROR, "content body larger than its header announced", Basic.Publish)
        self._body.append(payload)
        if self._received == self._header.body_size:
            self._complete()

    def fast_content(self, frame: framing.Frame) -> bool:
        """A publish's frames (basic.publish, content header, body) from Connection.fast_frame:
        what handle_frame does with them, without its chain of coroutines (three frames per
        message), when no wait can be needed; False: handle_frame must take the frame. Channel
        errors close the channel as handle_frame does; connection errors (and a FrameError)
        propagate to the caller, which closes the connection as Connection.handle_frame does."""
        if self.state != "open" or self.tx is not None:
            return False
        try:
            if self._publish is not None:
                if frame.type == FRAME_HEADER and self._header is None:
                    self._on_header(framing.decode_content_header(frame.payload))
                    return True
                if frame.type == FRAME_BODY and self._header is not None and len(self._pipeline) < MAX_PIPELINE - 1:
                    # (at MAX_PIPELINE _on_body waits for the oldest publish: the general path)
                    self._body_frame(frame.payload)
                    return True
                return False
            if frame.type != FRAME_METHOD:
                return False
            m = framing.publish_method(frame.payload)
            if m is None:
                return False
            self._begin_publish(m)
        except (AMQPError, FluxError) as exc:
            self._fail_with(exc)
        return True

    def _complete(self) -> None:
        method, header = self._publish, self._header
        body = b"".join(self._body)
        self._publish, self._header, self._body, self._received = None, None, [], 0
        reserved, self._reserved = self._reserved, 0
        if self.tx is not None:
            # Transactional: validated and collected now, applied (or not) at tx.commit; a bad
            # publish closes the channel exactly as outside a transaction. The body stays
            # reserved while the transaction holds it.
            self._tx_held += reserved
            self._start_publish(None, method, header.properties, body)
            return
        tag = None
        if self.confirm:
            self._confirm_seq += 1
            tag = self._confirm_seq
        entry = _Entry(tag)
        try:
            self._start_publish(entry, method, header.properties, body)
        except AMQPError as err:
            if not err.channel:
                self.conn.inbound.release(reserved)
                raise
            entry.error = err
        # The body stays reserved until its appends finished (stored or failed) and the confirm
        # loop took it off the FIFO (one release there, not a done-callback per append).
        entry.reserved = reserved
        self._pipeline.append(entry)
        self._pipeline_idle.clear()
        if self._confirmer is None or self._confirmer.done():
            if len(self._pipeline) == 1 and len(entry.tasks) == 1 and not entry.tasks[0].done():
                # A lone publish (the FIFO was empty: publish, wait for the confirm, publish …):
                # confirmed from its append's done callback, in the loop turn after the commit,
                # instead of by a confirm task started for it (a task, asyncio.wait's future and
                # two more loop turns per message).
                entry.tasks[0].add_done_callback(self._confirm_lone)
            else:
                self._confirmer = self._spawn(self._confirm_loop())

    def _confirm_lone(self, _fut: asyncio.Future) -> None:
        if self._confirmer is not None and not self._confirmer.done():
            return   # more publishes came meanwhile: the confirm loop started for them has this one too
        while self._pipeline and all(t.done() for t in self._pipeline[0].tasks):
            self._confirm_entry(self._pipeline.popleft())
        if self._pipeline:
            self._confirmer = self._spawn(self._confirm_loop())
        else:
            self._pipeline_idle.set()

    def _drop_partial(self) -> None:
        """Forget a partially received message (channel closing, error): free its bytes."""
        self._publish, self._header, self._body, self._received = None, None, [], 0
        self.conn.inbound.release(self._reserved)
        self._reserved = 0

    def _start_publish(self, entry: _Entry | None, m: Basic.Publish, props, body: bytes) -> None:
        """Route a completed publish and start its appends (entry: its place in the confirm
        FIFO), or, in a transaction (entry None), add it to the transaction."""
        exchange = self._exchange_name(m.exchange or "")
        rk = m.routing_key or ""
        if exchange == "":
            if rk.startswith(QUEUE_PREFIX) or rk.startswith("$dlq/"):
                topic = rk
            elif rk:
                topic = QUEUE_PREFIX + rk
            else:
                topic = ""
            if topic.startswith(QUEUE_PREFIX):
                verb = None
                try:
                    verb = ack_verb(topic)
                except InvalidArgument as exc:
                    raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
                if verb is not None:
                    # Acting on entries of the queue: the consume right on the whole queue and
                    # the group named in the headers, not a publish right.
                    self._authorize(verb[1], verb[0], m, group=_control_group(verb[1], props))
                    if entry is None:
                        self._tx_control(verb[0], verb[1], props, m)
                    else:
                        entry.tasks.append(self._spawn(self._control(verb[0], verb[1], props, m)))
                    return
            topics = [topic] if topic and self._routable(topic) else []
            if topic and not topics and not m.mandatory:
                # Not mandatory: queue_manager.auto_create decides (durable: the queue is created;
                # off: 404). Mandatory and no such queue: returned below (aio-pika's RPC relies on it).
                topics = [topic]
        else:
            headers = dict(getattr(props, "headers", None) or {})
            queues = self.conn.exchanges.route(exchange, rk, headers)
            topics = [f"{QUEUE_PREFIX}{q}/{rk}" if rk else f"{QUEUE_PREFIX}{q}" for q in queues]
        if not topics:
            if m.mandatory:
                returned = (framing.method_frame(self.id, framing.build(Basic.Return, NO_ROUTE, "NO_ROUTE", m.exchange or "", rk))
                            + framing.content_frames(self.id, props, body, self.conn.frame_max))
                if entry is None:
                    self._tx_returns.append(returned)   # RabbitMQ returns transactional publishes at commit
                else:
                    self.conn.write(returned)
            return   # routed nowhere: confirmed (RabbitMQ acks unroutable messages)
        for topic in topics:
            self._authorize("publish", topic, m)
            if topic in _VALID_TOPICS:
                continue
            try:
                validate_topic_name(topic)
                parse_queue_topic(topic) if topic.startswith(QUEUE_PREFIX) else None
            except InvalidArgument as exc:
                raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
            if len(topic) <= 512:
                if len(_VALID_TOPICS) >= 1024:
                    _VALID_TOPICS.clear()
                _VALID_TOPICS[topic] = None
        expiration = getattr(props, "expiration", None)
        if expiration not in (None, "") and not (isinstance(expiration, str) and expiration.isdigit()):
            # As RabbitMQ: the per-message TTL is milliseconds as a decimal string.
            raise channel_error(PRECONDITION_FAILED, f"invalid expiration '{expiration}': expected milliseconds "
                                "as a string of digits", m)
        stored = headers_from_properties(props, m.exchange or "", rk)
        if entry is None:
            for topic in topics:
                try:
                    self.tx.publish(topic, body, stored)
                except FluxError as exc:
                    raise _error_from_flux(exc, m) from None
            return
        for topic in topics:
            entry.tasks.append(self._appends.append(topic, body, stored))

    def _routable(self, topic: str) -> bool:
        """Does a default-exchange topic reach a queue that exists (not only the reserved
        catch-all queue)?"""
        try:
            named = parse_queue_topic(topic).queue
        except InvalidArgument:
            return False
        if self.manager.queue_info(named) is not None:
            return True
        # Another queue bound to this topic by its own patterns counts, a catch-all does not
        # (the reserved `mqtt` queue on `$queue/#` would otherwise make everything routable).
        reserved = self.conn.reserved_queues
        return any(q.name not in reserved and f"{QUEUE_PREFIX}#" not in q.topics and "#" not in q.topics
                   for q in self.manager.route(topic))

    async def _control(self, queue: str, verb: str, props, m) -> None:
        """`$queue/<q>/$commit` (stream checkpoint) and `$ack|$nack|$reject` published to the
        default exchange: headers say which group and offset."""
        headers = dict(getattr(props, "headers", None) or {})
        if verb == "commit":
            group = headers.get("x-group-id")
            offset = headers.get("x-offset")
            if group in (None, "") or offset is None:
                raise channel_error(PRECONDITION_FAILED, "a $commit needs the headers x-group-id and x-offset", m)
            try:
                seq = int(_text_arg(offset)) if not isinstance(offset, int) else offset
            except ValueError:
                raise channel_error(PRECONDITION_FAILED, f"x-offset {offset!r} is not an integer", m) from None
            if isinstance(offset, bool) or seq < 0:
                raise channel_error(PRECONDITION_FAILED, f"x-offset {offset!r} is not an offset", m)
            # x-offset is the last processed offset; the checkpoint is the first one not processed.
            await self.manager.commit(queue, _text_arg(group), seq + 1, _partition_header(headers, m))
            return
        message_id = headers.get("message-id")
        group = headers.get("group-id")
        if message_id in (None, "") or group in (None, ""):
            raise channel_error(PRECONDITION_FAILED, f"a ${verb} needs the headers message-id and group-id", m)
        _q, seq = parse_message_id(_text_arg(message_id))
        partition = _partition_header(headers, m)
        if verb == "ack":
            await self.manager.ack(queue, _text_arg(group), [seq], partition=partition)
        elif verb == "nack":
            await self.manager.nack(queue, _text_arg(group), [seq], partition=partition)
        else:
            await self.manager.reject(queue, _text_arg(group), [seq], headers.get("reason"), partition=partition)

    async def _confirm_loop(self) -> None:
        try:
            while self._pipeline:
                entry = self._pipeline[0]
                if entry.tasks:
                    await asyncio.wait(entry.tasks)
                self._pipeline.popleft()
                self._confirm_entry(entry)
        finally:
            if not self._pipeline:
                self._pipeline_idle.set()

    def _confirm_entry(self, entry: _Entry) -> None:
        """`entry` (taken off the FIFO, its appends finished): confirm it, with every following
        entry already done and successful; or nack it, or fail the channel. The bytes of every
        entry taken off the FIFO are released here (conn.inbound)."""
        inbound = self.conn.inbound
        if entry.reserved:
            inbound.release(entry.reserved)
        failure = entry.error or self._failure(entry)
        if self.state != "open":
            return   # the channel closed: no confirm may be sent any more
        if failure is None:
            if entry.tag is not None:
                # Coalesce: every following entry already done and successful.
                last = entry.tag
                pipeline = self._pipeline
                while pipeline and _confirmable(pipeline[0]):
                    done = pipeline.popleft()
                    last = done.tag
                    if done.reserved:
                        inbound.release(done.reserved)
                self.conn.write(framing.ack_frame(self.id, last, last != entry.tag))
        elif isinstance(failure, AMQPError):
            self.fail(failure)
        else:
            if entry.tag is not None:
                self.conn.write(framing.method_frame(self.id, Basic.Nack(entry.tag, False, False)))
            else:
                log.warning("amqp091 %s channel %d: publish failed (no confirms to tell the client): %s",
                            self.conn.name, self.id, failure)

    @staticmethod
    def _failure(entry: _Entry) -> AMQPError | BaseException | None:
        """None when every append committed; an AMQPError the channel closes with (the client
        sent something wrong); any other exception: a nack (nothing or not all was stored)."""
        for task in entry.tasks:
            if task.cancelled():
                return Unavailable("publish cancelled")
            exc = task.exception()
            if exc is None:
                continue
            if isinstance(exc, AMQPError):
                return exc
            if isinstance(exc, (PayloadTooLarge, InvalidArgument, WrongQueueKind)):
                return channel_error(PRECONDITION_FAILED, str(exc), Basic.Publish)
            if isinstance(exc, UnknownQueue):
                return channel_error(NOT_FOUND, str(exc), Basic.Publish)
            if not isinstance(exc, (QueueFull, Unavailable, FluxError)):
                log.error("amqp091 publish failed unexpectedly", exc_info=exc)
            return exc
        return None

    async def _confirm_select(self, m: Confirm.Select) -> None:
        if self.tx is not None:
            # The spec: a transactional channel cannot be put into confirm mode (and back).
            raise channel_error(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", m)
        self.confirm = True
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Confirm.SelectOk()))

    # ------------------------------------------------------------------ transactions

    async def _tx_select(self, m) -> None:
        if self.confirm:
            raise channel_error(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", m)
        if self.tx is None:
            self.tx = self.manager.transaction()
        self.conn.write(framing.method_frame(self.id, commands.Tx.SelectOk()))

    async def _tx_commit(self, m) -> None:
        if self.tx is None:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional", m)
        acked, returns = self._tx_acked, self._tx_returns
        self._tx_acked, self._tx_returns = [], []
        held, self._tx_held = self._tx_held, 0
        try:
            await self.tx.commit()
        except FluxError as exc:
            # Nothing was applied: the acknowledged messages are unacknowledged again (and
            # requeued when the channel closes, which this error does).
            self._tx_acked = acked
            self._tx_undo()
            raise _error_from_flux(exc, m) from None
        finally:
            self.conn.inbound.release(held)    # stored, or dropped with the failed commit
        for frames in returns:
            self.conn.write(frames)
        self._grant([e for _tag, e in acked])
        self.conn.write(framing.method_frame(self.id, commands.Tx.CommitOk()))

    async def _tx_rollback(self, m) -> None:
        if self.tx is None:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional", m)
        self._tx_undo()
        self.conn.write(framing.method_frame(self.id, commands.Tx.RollbackOk()))

    def _tx_undo(self) -> None:
        """Forget the open transaction: publishes dropped, acknowledged deliveries unacknowledged
        again under their delivery tags (RabbitMQ: a rollback discards the acks; the client may
        ack them again)."""
        if self.tx is not None:
            self.tx.rollback()
        self._tx_returns = []
        self.conn.inbound.release(self._tx_held)
        self._tx_held = 0
        if self._tx_acked:
            for tag, entry in self._tx_acked:
                self.unacked[tag] = entry
            self.unacked = dict(sorted(self.unacked.items()))   # `multiple` acks walk tags in order
            self._tx_acked = []

    def _tx_control(self, queue: str, verb: str, props, m) -> None:
        """`$queue/<q>/$ack|$nack|$reject` published in a transaction joins it; a stream `$commit`
        (a cursor move, not a message) takes effect at once."""
        if verb == "commit":
            entry = _Entry(None)
            entry.tasks.append(self._spawn(self._control(queue, verb, props, m)))
            self._pipeline.append(entry)
            self._pipeline_idle.clear()
            if self._confirmer is None or self._confirmer.done():
                self._confirmer = self._spawn(self._confirm_loop())
            return
        headers = dict(getattr(props, "headers", None) or {})
        message_id, group = headers.get("message-id"), headers.get("group-id")
        if message_id in (None, "") or group in (None, ""):
            raise channel_error(PRECONDITION_FAILED, f"a ${verb} needs the headers message-id and group-id", m)
        try:
            _q, seq = parse_message_id(_text_arg(message_id))
            partition = _partition_header(headers, m)
            if verb == "ack":
                self.tx.ack(queue, _text_arg(group), [seq], partition)
            elif verb == "nack":
                self.tx.nack(queue, _text_arg(group), [seq], partition)
            else:
                self.tx.reject(queue, _text_arg(group), [seq], headers.get("reason"), partition)
        except FluxError as exc:
            raise _error_from_flux(exc, m) from None

    # ------------------------------------------------------------------ consume

    async def _basic_qos(self, m: Basic.Qos) -> None:
        # prefetch_size (bytes) is ignored, which the spec allows.
        if m.global_:
            self.global_prefetch = m.prefetch_count
            self._release_held()
        else:
            self.prefetch = m.prefetch_count
        self.conn.write(framing.method_frame(self.id, Basic.QosOk()))

    def _consume_options(self, args: dict, m) -> tuple[str | None, Any, bool | None]:
        group = args.get("x-consumer-group")
        group = _text_arg(group).strip() if group not in (None, "", b"") else None
        position = args.get("x-stream-offset")
        if isinstance(position, (bytes, bytearray)):
            position = bytes(position).decode("utf-8", "replace")
        if isinstance(position, _dt.datetime):
            if position.tzinfo is None:
                position = position.replace(tzinfo=_dt.timezone.utc)
            position = f"timestamp={int(position.timestamp() * 1000)}"
        if isinstance(position, bool) or (position is not None and not isinstance(position, (int, str))):
            raise channel_error(PRECONDITION_FAILED, f"x-stream-offset {position!r}: expected first, last, next, an "
                                "offset, offset=N or timestamp=N", m)
        auto = args.get("x-auto-commit")
        if auto is not None:
            if isinstance(auto, bool):
                pass
            elif isinstance(auto, (str, bytes, bytearray)) and _text_arg(auto).strip().lower() in ("true", "false"):
                auto = _text_arg(auto).strip().lower() == "true"
            else:
                raise channel_error(PRECONDITION_FAILED, f"x-auto-commit {auto!r}: expected a boolean or "
                                    "\"true\"/\"false\"", m)
        return group, position, auto

    async def _basic_consume(self, m: Basic.Consume) -> None:
        queue, topic_filter, explicit = self._queue_name(m.queue or "", m)
        tag = m.consumer_tag or f"amq.ctag-{uuid.uuid4().hex}"
        if tag in self.consumers:
            raise connection_error(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", m)
        args = dict(m.arguments or {})
        group, position, auto = self._consume_options(args, m)
        # Default group: the queue name, so the consumers of a queue share its messages (work
        # queue, as in RabbitMQ) and a stream reader resumes from the same checkpoint.
        group = group or queue
        # The subscription with its filter: the same answer as MQTT and AMQP 1.0 give.
        self._authorize("consume", subscription(queue, topic_filter), m, group=group)
        found = await self._lookup(queue)
        if found is None and not explicit:
            # A bare name must exist (RabbitMQ); `$queue/<name>` is created on first use as
            # queue_manager.auto_create says (FluxMQ).
            raise channel_error(NOT_FOUND, f"no queue '{queue}'", m)
        self._check_exclusive(found, m)
        holder = self.manager.exclusive_consumers.get(queue)
        if holder is not None or (m.exclusive and any(s.queue == queue for s in self.manager.subscriptions)):
            # RabbitMQ: an exclusive consumer is the queue's only consumer, both ways round.
            raise channel_error(ACCESS_REFUSED, f"queue '{queue}' in exclusive use", m)
        consumer = Consumer(tag, queue, found.kind if found is not None else "classic", bool(m.no_ack))
        if m.no_ack:
            credit = None
        elif self.prefetch:
            credit = self.prefetch
        elif self.global_prefetch:
            credit = self.global_prefetch
        else:
            credit = None
        if credit is not None and not self.global_prefetch:
            consumer.gather = credit // 2
        self.consumers[tag] = consumer
        if m.exclusive:
            self.manager.exclusive_consumers[queue] = consumer   # held before the await: no race
        try:
            consumer.sub = await self.manager.subscribe(
                queue, group, f"amqp:{self.conn.id}:{self.id}:{tag}",
                on_delivery=functools.partial(self._on_delivery, consumer),
                filter=topic_filter, position=position, auto_commit=auto, credit=credit,
                on_error=lambda exc, c=consumer: self._on_consumer_error(c, exc))
        except (ValueError, TypeError) as exc:
            self.consumers.pop(tag, None)
            self._drop_exclusive(consumer)
            raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        except FluxError as exc:
            self.consumers.pop(tag, None)
            self._drop_exclusive(consumer)
            raise _error_from_flux(exc, m) from None
        consumer.kind = consumer.sub.kind
        if consumer.kind == "classic":
            consumer.sub.carry_acks = lambda q=consumer.sub.queue, g=consumer.sub.group: self._carry(q, g)
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Basic.ConsumeOk(tag)))

    def _drop_exclusive(self, consumer: Consumer) -> None:
        if self.manager.exclusive_consumers.get(consumer.queue) is consumer:
            del self.manager.exclusive_consumers[consumer.queue]

    async def _basic_cancel(self, m: Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            self._drop_exclusive(consumer)
            # Deliveries held back by the channel's prefetch never reached the client: they go
            # back at once. Delivered, unacknowledged ones stay the client's (it may still ack
            # them after cancel-ok, as with RabbitMQ); they come back on recover, nack or when
            # the channel closes or the connection is lost.
            held = [d for c, d in self._held if c is consumer]
            self._held = deque(h for h in self._held if h[0] is not consumer)
            for d in held:
                if consumer.kind == "classic":
                    self.settler.settle("release", d.queue, d.group, d.seq, d.partition)
            if consumer.sub is not None:
                await consumer.sub.close()
        if not m.nowait:
            self.conn.write(framing.method_frame(self.id, Basic.CancelOk(m.consumer_tag)))

    async def _on_consumer_error(self, consumer: Consumer, exc: FluxError) -> None:
        """The queue went away (or the subscription failed for good): tell the client."""
        if self.consumers.get(consumer.tag) is not consumer or self.state != "open":
            return
        del self.consumers[consumer.tag]
        self._drop_exclusive(consumer)
        log.info("amqp091 %s: consumer %s of %s ended: %s", self.conn.name, consumer.tag, consumer.queue, exc)
        if self.conn.client_capability("consumer_cancel_notify"):
            self.conn.write(framing.method_frame(self.id, Basic.Cancel(consumer.tag, True)))

    def _on_delivery(self, consumer: Consumer, d: Delivery):
        if self.state != "open" or self.consumers.get(consumer.tag) is not consumer:
            if consumer.kind == "classic":
                # Not handed out: give it back now rather than after the visibility timeout.
                self.settler.settle("release", d.queue, d.group, d.seq, d.partition)
            return None
        if (self.global_prefetch and not consumer.no_ack and (self._held or
                                                              len(self.unacked) >= self.global_prefetch)):
            self._held.append((consumer, d))
            return None
        return self._send_delivery(consumer, d)

    def _send_delivery(self, consumer: Consumer, d: Delivery):
        self._delivery_tag += 1
        tag = self._delivery_tag
        frames = encode_delivery(self.id, consumer.tag, tag, d, self.conn.frame_max)
        if consumer.no_ack:
            if consumer.kind == "classic" and d.partition == 0:
                self._ack_later(d.queue, d.group, d.seq)
            else:
                self.settler.settle("ack", d.queue, d.group, d.seq, d.partition)
        else:
            self.unacked[tag] = Unacked(d.queue, d.group, d.partition, d.seq, consumer)
        self.conn.write(frames)
        if self.conn.write_buffer_size() > self.conn.outbound_limit:
            return self.conn.drain_writes()   # awaited by the subscription: back-pressure
        return None

    def _release_held(self) -> None:
        while self._held and self.state == "open" and (not self.global_prefetch
                                                       or len(self.unacked) < self.global_prefetch):
            consumer, d = self._held.popleft()
            if self.consumers.get(consumer.tag) is consumer:
                self._send_delivery(consumer, d)
            elif consumer.kind == "classic":
                self.settler.settle("release", d.queue, d.group, d.seq, d.partition)

    async def _basic_get(self, m: Basic.Get) -> None:
        queue, topic_filter, _explicit = self._queue_name(m.queue or "", m)
        self._authorize("consume", subscription(queue, topic_filter), m, group=queue)
        info = await self._lookup(queue)
        if info is None:
            raise channel_error(NOT_FOUND, f"no queue '{queue}'", m)
        self._check_exclusive(info, m)
        try:
            group = internal_group_name(queue, topic_filter)
        except InvalidArgument as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), m) from None
        consumer = f"amqp:{self.conn.id}:{self.id}:get"
        deliveries = await self.manager.get(queue, group, consumer)
        if not deliveries:
            self.conn.write(framing.method_frame(self.id, Basic.GetEmpty()))
            return
        d = deliveries[0]
        self._delivery_tag += 1
        tag = self._delivery_tag
        props, exchange, rk = delivery_properties(d)
        if m.no_ack:
            self.settler.settle("ack", d.queue, d.group, d.seq, d.partition)
        else:
            self.unacked[tag] = Unacked(d.queue, d.group, d.partition, d.seq, None)
        left, _consumers = await self._counts(queue)
        self.conn.write(framing.method_frame(self.id, framing.build(Basic.GetOk, tag, d.redelivered, exchange, rk, left))
                        + framing.content_frames(self.id, props, d.payload, self.conn.frame_max))

    # ------------------------------------------------------------------ acknowledgements

    def _take(self, delivery_tag: int, multiple: bool, m) -> list[tuple[int, Unacked]]:
        if multiple:
            taken = []
            for tag in list(self.unacked):
                if delivery_tag and tag > delivery_tag:
                    break
                taken.append((tag, self.unacked.pop(tag)))
            return taken
        entry = self.unacked.pop(delivery_tag, None)
        if entry is None:
            raise channel_error(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}", m)
        return [(delivery_tag, entry)]

    def _settle_entries(self, verb: str, taken: list[tuple[int, Unacked]], *, transactional: bool = True) -> None:
        if self.tx is not None and transactional:
            # In a transaction: applied at tx.commit; the window frees up then, too.
            for tag, e in taken:
                if verb == "ack":
                    self.tx.ack(e.queue, e.group, [e.seq], e.partition)
                elif verb == "nack":
                    self.tx.nack(e.queue, e.group, [e.seq], e.partition)
                else:
                    self.tx.reject(e.queue, e.group, [e.seq], "rejected by AMQP client", e.partition)
                self._tx_acked.append((tag, e))
            return
        reason = "rejected by AMQP client" if verb == "reject" else None
        if verb == "ack":
            for _tag, e in taken:
                c = e.consumer
                if c is not None and c.kind == "classic" and e.partition == 0 and c.sub is not None:
                    self._ack_later(e.queue, e.group, e.seq)
                else:
                    self.settler.settle(verb, e.queue, e.group, e.seq, e.partition, reason)
            self._grant([e for _tag, e in taken], gather=True)
            return
        for _tag, e in taken:
            self.settler.settle(verb, e.queue, e.group, e.seq, e.partition, reason)
        self._grant([e for _tag, e in taken])

    def _grant(self, entries: list[Unacked], gather: bool = False) -> None:
        """Give the consumers the credit settling `entries` freed. After acks (`gather`) a
        consumer's credit is handed over once half its window is free (or GRANT_DELAY later):
        the claim it then makes is larger, and carries the acks (one call instead of several).
        The client holds more than half the window meanwhile, so it is not kept waiting."""
        timer = False
        for e in entries:
            c = e.consumer
            if c is None or c.sub is None:
                continue
            if gather and c.gather > 1:
                c.owed += 1
                if c.owed >= c.gather:
                    c.sub.grant(c.owed)
                    c.owed = 0
                else:
                    timer = True
            else:
                c.sub.grant(1)
        if timer and self._grant_timer is None:
            self._grant_timer = asyncio.get_running_loop().call_later(GRANT_DELAY, self._grant_owed)
        if self._held:
            self._release_held()

    def _grant_owed(self) -> None:
        self._grant_timer = None
        for c in self.consumers.values():
            if c.owed and c.sub is not None:
                c.sub.grant(c.owed)
                c.owed = 0

    # Acks of classic deliveries, carried by the next claim (see _acks in __init__).

    def _ack_later(self, queue: str, group: str, seq: int) -> None:
        seqs = self._acks.get((queue, group))
        if seqs is None:
            self._acks[(queue, group)] = [seq]
            if self._acks_timer is None:
                self._acks_timer = asyncio.get_running_loop().call_later(ACK_DELAY, self._write_acks)
        else:
            seqs.append(seq)

    def _write_acks(self) -> None:
        """Acks no claim carried go to the settler (ACK_DELAY passed, or someone waits for them)."""
        if self._acks_timer is not None:
            self._acks_timer.cancel()
            self._acks_timer = None
        acks, self._acks = self._acks, {}
        for (queue, group), seqs in acks.items():
            for seq in seqs:
                self.settler.settle("ack", queue, group, seq, 0)

    def _carry(self, queue: str, group: str):
        """Subscription.carry_acks of this channel's classic consumers: the acks of (queue,
        group) waiting to be written, and the callback the claim carrying them calls."""
        seqs = self._acks.pop((queue, group), None)
        if not seqs:
            return None
        if not self._acks and self._acks_timer is not None:
            self._acks_timer.cancel()
            self._acks_timer = None
        self._carried += 1
        self._carried_idle.clear()

        def done(exc: BaseException | None) -> None:
            if exc is not None:
                # Not committed (or not known to be): written on their own, as if never carried.
                for seq in seqs:
                    self.settler.settle("ack", queue, group, seq, 0)
            self._carried -= 1
            if not self._carried:
                self._carried_idle.set()

        return seqs, done

    def fast_ack(self, delivery_tag: int, multiple: bool) -> bool:
        """basic.ack from Connection.fast_frame: what _basic_ack does, when it cannot fail (an open
        channel not inside a content body, no transaction, a known tag); False otherwise."""
        if self.state != "open" or self._publish is not None or self.tx is not None:
            return False
        if multiple:
            self._settle_entries("ack", self._take(delivery_tag, True, None))
            return True
        entry = self.unacked.pop(delivery_tag, None)
        if entry is None:
            return False    # unknown tag: the general path raises the channel error
        self._settle_entries("ack", [(delivery_tag, entry)])
        return True

    async def _basic_ack(self, m: Basic.Ack) -> None:
        self._settle_entries("ack", self._take(m.delivery_tag, m.multiple, m))

    async def _basic_nack(self, m: Basic.Nack) -> None:
        self._settle_entries("nack" if m.requeue else "reject", self._take(m.delivery_tag, m.multiple, m))

    async def _basic_reject(self, m: Basic.Reject) -> None:
        self._settle_entries("nack" if m.requeue else "reject", self._take(m.delivery_tag, False, m))

    async def _basic_recover(self, m) -> None:
        # Redeliver everything unacknowledged, at once and in order (requeue=false is not
        # supported by RabbitMQ either). basic.recover is not transactional (RabbitMQ): now.
        entries = list(self.unacked.items())
        self.unacked.clear()
        self._settle_entries("release", entries, transactional=False)
        if isinstance(m, Basic.Recover):
            await self.settler.flush()
            self.conn.write(framing.method_frame(self.id, Basic.RecoverOk()))


_HANDLERS = {
    Chan.Flow: Channel._channel_flow,
    Chan.FlowOk: Channel._channel_flow_ok,
    Chan.Close: Channel._channel_close,
    Chan.CloseOk: Channel._channel_close_ok,
    Exch.Declare: Channel._exchange_declare,
    Exch.Delete: Channel._exchange_delete,
    Exch.Bind: Channel._exchange_bind,
    Exch.Unbind: Channel._exchange_unbind,
    Queue.Declare: Channel._queue_declare,
    Queue.Bind: Channel._queue_bind,
    Queue.Unbind: Channel._queue_unbind,
    Queue.Purge: Channel._queue_purge,
    Queue.Delete: Channel._queue_delete,
    Basic.Qos: Channel._basic_qos,
    Basic.Consume: Channel._basic_consume,
    Basic.Cancel: Channel._basic_cancel,
    Basic.CancelOk: Channel._channel_flow_ok,   # answer to our server-initiated cancel: nothing to do
    Basic.Publish: Channel._basic_publish,
    Basic.Get: Channel._basic_get,
    Basic.Ack: Channel._basic_ack,
    Basic.Nack: Channel._basic_nack,
    Basic.Reject: Channel._basic_reject,
    Basic.Recover: Channel._basic_recover,
    Basic.RecoverAsync: Channel._basic_recover,
    Confirm.Select: Channel._confirm_select,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}

__all__ = ["Channel", "Consumer"]


def _confirmable(entry: _Entry) -> bool:
    """A confirm-mode publish whose appends all committed: confirmed with the one before it."""
    if entry.tag is None or entry.error is not None:
        return False
    tasks = entry.tasks
    if len(tasks) == 1:   # the usual case: one append
        t = tasks[0]
        return t.done() and not t.cancelled() and t.exception() is None
    return all(t.done() for t in tasks) and Channel._failure(entry) is None


def _control_group(verb: str, props) -> str | None:
    """The consumer group a control publish names (`x-group-id` for $commit, `group-id` else)."""
    headers = getattr(props, "headers", None) or {}
    value = headers.get("x-group-id" if verb == "commit" else "group-id")
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def _partition_header(headers: dict, method) -> int:
    """The partition of a partitioned stream named by an ack/commit publish (`x-stream-partition`,
    as deliveries carry it); 0 for everything else."""
    value = headers.get("x-stream-partition")
    if value in (None, ""):
        return 0
    try:
        partition = int(_text_arg(value)) if not isinstance(value, int) else value
    except ValueError:
        raise channel_error(PRECONDITION_FAILED, f"x-stream-partition {value!r} is not an integer", method) from None
    if isinstance(value, bool) or partition < 0:
        raise channel_error(PRECONDITION_FAILED, f"x-stream-partition {value!r} is not a partition", method)
    return partition
