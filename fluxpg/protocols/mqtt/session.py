"""The MQTT 3.1.1 / 5.0 connection handler: drives the sans-I/O codec from asyncio.

`handle(reader, writer, initial, ctx)` serves one TCP connection (the listener sniffed a CONNECT).

Ordering. One ordered pipeline per connection (FACTS.md): the read loop decodes packets in
order and starts each publish at once -- queue appends are handed to the engine's appender in
arrival order, which commits them in that order -- then puts "await this, then answer that" items
on a queue that one task works through in order. So several publishes are in flight together
(group commit), yet PUBACK/PUBREC go out in publish order and only after the commit. A plain
SUBSCRIBE/UNSUBSCRIBE takes effect in the read loop as soon as it is decoded (no window in which
another client's message is lost); SUBACK/UNSUBACK and the retained-message read are pipeline items,
so a SUBSCRIBE sees the retained message the same client published just before it.

Queues (`$queue/<q>/…`, DESIGN §4):
* PUBLISH → QueueManager.publish; a failed append is answered with a v5 reason code (0x97 quota
  exceeded for a full queue or a message above the queue's max_message_size -- 0x95 is not a valid
  PUBACK code, §3.4.2.1 --, 0x90 invalid topic, 0x83 wrong queue kind, 0x80 otherwise). A 3.1.1
  client cannot be told, so its connection is closed instead of lying with a PUBACK.
* PUBLISH to `$queue/<q>/[…/]$ack|$nack|$reject` with user properties message-id and group-id
  (optional `reason`, `x-stream-partition`) acks/nacks/rejects; `$commit` with group-id and
  x-offset commits a stream (offset = last processed). Unknown ids are answered with success (a
  documented no-op, as FluxMQ); a missing or malformed message-id gets PUBACK 0x83
  implementation-specific error with a reason string (it is a bad property, not a bad payload, so
  not 0x99). 3.1.1 cannot carry properties: such an ack closes a 3.1.1 connection.
* SUBSCRIBE `$queue/<q>[/<filter>]`: group = v5 user property consumer-group, else the client id
  (v5) or the client-id prefix before the first `-` (3.1.1); stream start from user property
  x-stream-offset. A QoS 0 subscription to a classic queue is refused with SUBACK 0x80
  (unspecified error, with a reason string): 0x9B is not a valid SUBACK code and 0x9E would claim
  shared subscriptions are unsupported. Deliveries carry Delivery.properties() as user properties.
* The engine subscription's credit is the in-flight window: a delivery takes one, PUBACK (QoS 1)
  or PUBCOMP (QoS 2) gives it back, so at most `receive maximum` deliveries are unacknowledged.
  A 3.1.1 subscriber's PUBACK (PUBREC for QoS 2) also acknowledges the message in its group.

Bad input: a malformed packet, a protocol violation or a packet above the advertised maximum
packet size ends the connection -- v5 with DISCONNECT and the reason code, 3.1.1 by closing.
Nothing of it reaches other connections.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import secrets
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fluxpg import bounds as inbound_bounds
from fluxpg import connections
from fluxpg.aio import cancel_and_wait
from fluxpg.auth import authorize, subscription
from fluxpg.delivery import Delivery, parse_message_id
from fluxpg.protocols.appends import OrderedPublisher
from fluxpg.protocols.errors import reply_for
from fluxpg.protocols.settle import Settler
from fluxpg.errors import FluxError, InvalidArgument, PayloadTooLarge, QueueFull, UnknownQueue, WrongQueueKind
from fluxpg.protocols.reads import AGAIN, STAY, InlineReader
from fluxpg.protocols.writes import CoalescingWriter
from fluxpg.topics import ack_verb, is_queue_topic, parse_queue_topic, split_queue_subscription, topic_matches

from .codec import (MQTT_5, Auth, Connack, Connect, Decoder, Disconnect, MQTTError, Pingreq, Pingresp,
                    Properties, ProtocolError, Puback, Pubcomp, Publish, Pubrec, Pubrel, Suback, Subscribe,
                    Unsuback, Unsubscribe, UnsupportedProtocolVersion, encode, encode_ack_ok,
                    encode_publish_plain, encode_publish_users)
from .reasons import CONNACK_CODES, DISCONNECT_CODES, ReasonCode
from .router import Message, Router, SubOptions, _ts, make_sub_options, props_from_json, props_to_json

log = logging.getLogger("fluxpg.mqtt")

RC = ReasonCode
SESSION_NEVER_EXPIRES = 0xFFFFFFFF
_RESERVED_PREFIXES = ("$SYS/", "$share/", "$dlq/")   # `$queue/` is handled before
_FORWARDED = ("content_type", "response_topic", "correlation_data", "payload_format_indicator")
ACK_LINGER = 0.01     # seconds a fire-and-forget queue ack waits for more (Settler.linger)


@dataclass
class MqttOptions:
    """Limits of the MQTT front-end. Put an instance in ctx.state["mqtt.options"] before the first
    MQTT connection to change them (tests do)."""

    max_packet_size: int = 16 * 1024 * 1024 + 1024   # advertised in CONNACK; above the queues' 10 MiB
    receive_maximum: int = 1024       # inbound QoS 1/2 publishes a v5 client may have unanswered
    topic_alias_maximum: int = 256    # inbound topic aliases per v5 connection
    v3_inflight: int = 64             # outbound window for 3.1.1 clients (no receive maximum there)
    queue_credit_cap: int = 256       # claim-ahead cap per queue subscription
    connect_timeout: float = 10.0
    pipeline_depth: int = 1024        # answers waiting for the database before reading pauses
    max_write_buffer: int = 16 * 1024 * 1024   # QoS 0 messages are dropped above this backlog


async def get_router(ctx: Any) -> Router:
    router = ctx.state.get("mqtt.router")
    if router is not None:
        return router
    lock = ctx.state.setdefault("mqtt.lock", asyncio.Lock())
    async with lock:
        router = ctx.state.get("mqtt.router")
        if router is None:
            router = Router(ctx.manager)
            bounds = getattr(getattr(ctx, "config", None), "bounds", None)
            if bounds is not None:
                router.outbound_messages = bounds.mqtt_session_outbound_messages
                router.outbound_bytes = bounds.mqtt_session_outbound_bytes
                router.connection_outbound_bytes = bounds.connection_outbound_bytes
            await router.start()
            ctx.state["mqtt.router"] = router
            ctx.state.setdefault("closers", []).append(router.close)
    return router


# --------------------------------------------------------------------------------------------
# Session state (survives the connection when the session is persistent)
# --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Outgoing:
    msg: Message
    qos: int
    retain: bool
    sub_ids: list[int]
    qref: tuple[QueueSub, Delivery] | None = None
    pid: int = 0
    released: bool = False    # QoS 2: PUBREC received, PUBREL sent
    key: int = 0              # row key in fluxpg.mqtt_session_messages (0 = not stored)
    log: tuple[int, int] | None = None   # replayed from the offline log: (cursor range id, seq)


class QueueSub:
    """A `$queue/` subscription of a session: the spec (kept across reconnects of a persistent
    session) and, while connected, the engine Subscription delivering into the session."""

    def __init__(self, session: Session, topic_filter: str, queue: str, filt: str | None, group: str,
                 qos: int, position: str | None, sub_id: int | None):
        self.session = session
        self.topic_filter = topic_filter
        self.queue = queue
        self.filter = filt
        self.group = group
        self.qos = qos
        self.position = position
        self.sub_id = sub_id
        self.engine: Any = None
        self.window = 0       # the engine's credit at open: deliveries unacknowledged at most
        self.returned = 0     # acknowledged deliveries whose credit is not granted back yet

    async def open(self, manager: Any, credit: int) -> None:
        self.window, self.returned = credit, 0
        self.engine = await manager.subscribe(self.queue, self.group, self.session.client_id,
                                              on_delivery=self.on_delivery, filter=self.filter,
                                              position=self.position, credit=credit, on_error=self.on_error)
        # A resumed persistent session continues from the group's checkpoint, not the old position.
        self.position = None

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.close()

    def on_delivery(self, d: Delivery) -> None:
        sess = self.session
        if sess.conn is None or self.engine is None:
            return  # classic: stays pending and comes back (reclaim / visibility timeout)
        msg = Message(d.topic, d.payload, self.qos, False, delivery_props(d))
        out = Outgoing(msg, self.qos, False, [self.sub_id] if self.sub_id else [], qref=(self, d))
        sess.enqueue(out)
        if self.qos == 0:
            self.engine.grant(1)   # nothing will acknowledge it

    def give_back(self) -> None:
        """A delivery was acknowledged (PUBACK, PUBCOMP): its credit goes back to the engine --
        in chunks of a quarter window while the subscriber still has at least half a window in
        flight, so that a busy subscriber's engine claims a chunk at a time instead of one claim
        (a transaction) per few acknowledgements; at once when it is running short. The window
        (at most `window` unacknowledged) is unchanged; only when the engine may claim again."""
        engine = self.engine
        if engine is None:
            return
        self.returned += 1
        window = self.window
        if self.returned < window // 4 and window - (engine.credit or 0) - self.returned >= window // 2:
            return
        engine.grant(self.returned)
        self.returned = 0

    def on_error(self, exc: FluxError) -> None:
        log.warning("MQTT %s: queue subscription %s ended: %s", self.session.client_id, self.topic_filter, exc)
        self.engine = None


def delivery_props(d: Delivery) -> dict[str, Any]:
    """A queue delivery's headers and DESIGN §4 properties as MQTT 5 properties."""
    props: dict[str, Any] = {}
    users: list[tuple[str, str]] = []
    dprops = d.properties()
    for key, value in (d.headers or {}).items():
        if key == "content-type":
            props["content_type"] = str(value)
        elif key == "response-topic":
            props["response_topic"] = str(value)
        elif key == "correlation-data":
            props["correlation_data"] = str(value).encode("utf-8")
        elif key not in dprops:
            users.append((str(key), value if isinstance(value, str) else json.dumps(value, default=str)))
    users.extend(dprops.items())
    props["user_properties"] = users
    return props


class Session:
    def __init__(self, router: Router, client_id: str):
        self.router = router
        self.client_id = client_id
        self.subs: dict = {}                       # topic filter → SubOptions (router's index)
        self.queue_subs: dict[str, QueueSub] = {}
        self.inflight: dict[int, Outgoing] = {}    # insertion order = send order (resend order)
        # QoS 2 messages in flight whose packet ids are being committed, not sent yet (_send_new).
        self._unsent_qos2: deque[tuple[asyncio.Future, Outgoing]] = deque()
        self.outbox: deque[Outgoing] = deque()
        self.inbound_qos2: set[int] = set()
        self.conn: Connection | None = None
        self.expiry_interval = 0
        self._pids = itertools.cycle(range(1, 0x10000))
        self.pending_will: tuple[Any, Message] | None = None
        self._will_timer: asyncio.TimerHandle | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self.dropped = 0          # offline messages dropped (oldest first) above the bound
        # Plain QoS 1/2 messages held for the client (outbox + in flight), counted and sized for
        # the outbound bound; queue deliveries are bounded by their credit instead.
        self.held = 0
        self.held_bytes = 0
        # Durable state (fluxpg.mqtt_session_*): written through while the session is persistent.
        self.stored = False
        self.next_key = 1
        # The shared offline log (fluxpg.mqtt_offline_log): log_open while this node has an open
        # cursor range for the session (it is offline here and its messages go to the log);
        # offline_seqs holds the seqs of its newest logged messages, up to the bound, so the
        # oldest can be dropped (drop_to: the last dropped seq, drop_unsaved: not yet written).
        self.log_open = False
        self.offline_seqs: deque[tuple[int, int]] = deque()     # (seq, payload size)
        self.offline_bytes = 0
        self.drop_to = 0
        self.drop_unsaved = 0
        self.replaying = False
        self.replay_left = 0      # replayed messages neither taken (made rows) nor dropped yet
        self.log_end = 0          # this node's stream position when the session last reconnected

    # --- durable state ------------------------------------------------------------------------

    @property
    def store(self) -> Any:
        """The session store while this session is persistent (expiry > 0), else None."""
        return self.router.store if (self.stored and self.expiry_interval > 0) else None

    def persist_new(self, out: Outgoing, wait: bool = False) -> asyncio.Future | None:
        """Store a plain QoS 1/2 message for a persistent session (before it is handed on)."""
        store = self.store
        if store is None or not out.qos or out.qref is not None:
            return None
        out.key = self.next_key
        self.next_key += 1
        msg = out.msg
        return store.submit("msg_insert", self.client_id, out.key, None, 0, msg.topic, msg.payload, out.qos,
                            out.retain, props_to_json(msg.props), _ts(msg.expires_at), out.sub_ids or None,
                            wait=wait)

    @property
    def state_store(self) -> Any:
        """The session store while the session has stored state (whatever its expiry now: what
        was stored is delivered and cleaned up through it), else None. Compare `store`."""
        return self.router.store if self.stored else None

    def resendable(self) -> list[Outgoing]:
        """Messages in flight to resend on a reconnect, in send order: not the QoS 2 ones whose
        packet ids are still being committed (_send_committed_qos2 sends those)."""
        unsent = {id(o) for _f, o in self._unsent_qos2}
        return [o for o in self.inflight.values() if id(o) not in unsent]

    def _store(self, op: str, *args: Any, wait: bool = False) -> asyncio.Future | None:
        store = self.state_store
        if store is not None:
            return store.submit(op, self.client_id, *args, wait=wait)
        return None

    # --- the shared offline log ----------------------------------------------------------------

    def open_log(self) -> None:
        """The session is offline on this node from now on: messages for it go to this node's
        offline stream after the current position. Only a persistent session, and only with no
        replayed message still waiting (those become rows first: a range is read whole)."""
        store = self.store
        if store is None or self.log_open:
            return
        for out in [o for o in self.outbox if o.log is not None and not o.key]:
            self._take(out, 0)          # queued rows now: the next range starts after them
        self.log_open = True
        self.offline_seqs.clear()
        self.offline_bytes = 0
        self.drop_to = self.drop_unsaved = 0
        store.submit("cursor_open", self.client_id, self.router.node_id, self.router.log_seq)

    def close_log(self) -> asyncio.Future | None:
        """Stop logging for the session on this node (it reconnected, or moved): its range of
        this node's stream ends at the current position (self.log_end). Returns the future of
        that write -- once it is applied, so is everything submitted before it (the appends the
        range reads) -- or None when nothing needs waiting for: no write of the session pending
        and every append up to the end applied (the usual case: CONNACK waited for the session
        row)."""
        self.log_end = self.router.log_seq
        if not self.log_open:
            return None
        self.log_open = False
        store = self.router.store
        quiet = store.quiet(self.client_id) and store.appended >= self.log_end and not self.drop_unsaved
        if self.drop_unsaved:
            store.submit("cursor_advance", self.client_id, self.router.node_id, self.drop_to, self.drop_unsaved)
            self.drop_unsaved = 0
        closed = store.submit("cursor_close", self.client_id, self.router.node_id, self.log_end, wait=True)
        if quiet:
            closed.add_done_callback(lambda f: f.cancelled() or f.exception())
            return None
        return closed

    def logged(self, seq: int, size: int) -> None:
        """A message for this offline session went to the log at seq. Above the bound (stored
        rows + logged messages) the oldest is dropped and counted at once: a stored row first
        (older than anything logged), else the oldest logged one, whose cursor moves past it
        in the router's next housekeeping round."""
        r = self.router
        if not (r.outbound_messages or r.outbound_bytes):
            return
        self.offline_seqs.append((seq, size))
        self.offline_bytes += size
        while self.offline_seqs and (
                (r.outbound_messages and len(self.offline_seqs) + self.held > r.outbound_messages)
                or (r.outbound_bytes and self.offline_bytes + self.held_bytes > r.outbound_bytes)):
            if not self._drop_oldest_row():
                self.drop_to, old_size = self.offline_seqs.popleft()
                self.offline_bytes -= old_size
                self.drop_unsaved += 1
                r.dropped_offline(self)
            self.dropped += 1
            r.offline_dropped += 1

    def _from_log(self, r: Any, range_id: int) -> Outgoing | None:
        """What a logged message is for this session, by its subscriptions as they are (they do
        not change while it is offline): None when none matches it now at QoS 1/2."""
        cid = self.client_id
        opts_list = [o for o in self.subs.values()
                     if o.share is None and topic_matches(o.inner, r["topic"])
                     and not (o.no_local and r["origin"] == cid)]
        if not opts_list:
            return None
        qos = min(r["qos"], max(o.qos for o in opts_list))
        if not qos:
            return None
        msg = Message(r["topic"], bytes(r["payload"]), r["qos"], r["retain"], props_from_json(r["props"]),
                      r["expires_at"].timestamp() if r["expires_at"] is not None else None, r["origin"])
        if msg.expired():
            return None
        retain = msg.retain and any(o.retain_as_published for o in opts_list)
        sids = [o.subscription_id for o in opts_list if o.subscription_id]
        return Outgoing(msg, qos, retain, sids, log=(range_id, r["seq"]))

    async def replay(self, closed: asyncio.Future | None) -> None:
        """The session reconnected (this node's range closed by the write `closed`): put what the
        log holds for it in the outbox -- after the stored rows (older), before what arrived
        since (newer) -- keeping the newest up to the bound. Rows are written as the messages
        are sent."""
        # What was stored while the session was persistent is delivered even when this CONNECT
        # sets the expiry to 0 (MQTT 5 "resume, then end"): self.store follows the new expiry.
        store = self.state_store
        if store is None:
            return
        held_before = len(self.outbox)
        # Everything this session's ranges depend on is written once the close is (one ordered
        # writer); close_log found it written already unless it returned the close to wait for.
        # (Waiting for the store's whole backlog instead serialised mass reconnects.)
        if closed is not None:
            await closed
        router = self.router
        bound = router.outbound_messages or None
        kept: deque[Outgoing] = deque(maxlen=bound)
        dropped = 0
        seen: set[tuple[int, int]] = set()
        for rng in await store.offline_cursors(self.client_id):
            node = rng["node_id"]
            upto = rng["until_seq"]
            if upto is None and node == router.node_id:
                upto = self.log_end     # its close may not be applied yet: the range ends there
            async for r in store.offline_rows(node, rng["cursor"], upto):
                if (node, r["seq"]) in seen:
                    continue            # two ranges of one stream (a crash between close and open)
                seen.add((node, r["seq"]))
                out = self._from_log(r, rng["id"])
                if out is None:
                    continue
                if bound is not None and len(kept) == bound:
                    dropped += 1
                kept.append(out)
        if dropped:
            self.dropped += dropped
            router.offline_dropped += dropped
            self._store("session_dropped", dropped)
        if not kept:
            self._store("cursors_clear")
            return
        # Above the bound (stored rows + replayed + newer): the oldest replayed ones go. Stored
        # rows stay: some are in flight again (resent with DUP) and the client may be acking them.
        kept_bytes = sum(len(o.msg.payload) for o in kept)
        over = 0
        while kept and ((router.outbound_messages and self.held + len(kept) > router.outbound_messages)
                        or (router.outbound_bytes and self.held_bytes + kept_bytes > router.outbound_bytes)):
            kept_bytes -= len(kept.popleft().msg.payload)
            over += 1
        if over:
            self.dropped += over
            router.offline_dropped += over
            self._store("session_dropped", over)
        if not kept:
            self._store("cursors_clear")
            return
        self.replay_left = len(kept)
        # Messages that arrived during the replay were appended behind the restored rows.
        newer = [self.outbox.pop() for _ in range(len(self.outbox) - held_before)][::-1]
        for out in kept:
            self.held += 1
            self.held_bytes += len(out.msg.payload)
            self.outbox.append(out)
        self.outbox.extend(newer)

    def _take(self, out: Outgoing, stage: int, pid: int | None = None, wait: bool = False) -> asyncio.Future | None:
        """A replayed message becomes a row of fluxpg.mqtt_session_messages, and its range's cursor
        moves past it, in one statement."""
        range_id, seq = out.log
        out.key = self.next_key
        self.next_key += 1
        msg = out.msg
        fut = self._store("log_take", out.key, pid, stage, msg.topic, msg.payload, out.qos, out.retain,
                          props_to_json(msg.props), _ts(msg.expires_at), out.sub_ids or None, range_id, seq,
                          wait=wait)
        self._replayed()
        return fut

    def _replayed(self) -> None:
        self.replay_left -= 1
        if self.replay_left == 0:
            self._store("cursors_clear")    # every replayed message is a row or was dropped

    # --- outbound flow ------------------------------------------------------------------------

    def deliver_plain(self, msg: Message, opts_list: list) -> asyncio.Future | None:
        """Hand msg on; for a persistent session returns the future of its row's commit (the
        publisher's PUBACK waits for it)."""
        if len(opts_list) == 1:
            o = opts_list[0]
            qos = min(msg.qos, o.qos)
            retain = msg.retain and o.retain_as_published
            sids = [o.subscription_id] if o.subscription_id else []
        else:
            qos = min(msg.qos, max(o.qos for o in opts_list))
            retain = msg.retain and any(o.retain_as_published for o in opts_list)
            sids = [o.subscription_id for o in opts_list if o.subscription_id]
        out = Outgoing(msg, qos, retain, sids)
        fut = self.persist_new(out, wait=True) if self.stored else None
        self.enqueue(out)
        return fut

    def enqueue(self, out: Outgoing) -> None:
        """Hand a message to the client, or keep it for the client (bounded, see _over_bound).

        Bounds (issue 13), per session: QoS 0 -- written at once; above the connection's unsent
        byte bound the new message is dropped and counted (router.qos0_dropped): the ones ahead
        of it are already in the socket buffer and cannot be taken back, so "drop the newest" is
        what dropping means here. Plain QoS 1/2 while connected -- above
        bounds.mqtt_session_outbound_messages / _bytes (queued + unacknowledged) the subscriber
        is too slow: DISCONNECT 0x97 quota exceeded (3.1.1: close), counted in
        router.slow_disconnects; a persistent session keeps its messages (offline bound below).
        Offline -- the oldest messages go above the bound, counted in session.dropped and
        router.offline_dropped. Queue deliveries are never dropped: they take engine credit, so
        a slow subscriber stops the claiming and the messages wait in the queue."""
        conn = self.conn
        if out.qos == 0:
            if conn is not None and not conn.closing:
                conn.send_publish(out)
            return
        if out.qref is None:
            self.held += 1
            self.held_bytes += len(out.msg.payload)
        if conn is None or conn.closing:
            if out.qref is not None:
                return
            self.outbox.append(out)
            self.trim()
            return
        if not self.outbox and not self.replaying and len(self.inflight) < conn.send_quota:
            self._send_new(out)
        else:
            self.outbox.append(out)
        if out.qref is None and self._over_bound():
            conn.too_slow()

    def trim(self) -> None:
        """Offline: drop the oldest plain messages above the bound -- unacknowledged ones first
        (they are older than the queued ones), never a QoS 2 message past PUBREC (its PUBREL is
        owed: exactly-once)."""
        while self._over_bound():
            if not self._drop_oldest_row():
                return
            self.dropped += 1
            self.router.offline_dropped += 1

    def _drop_oldest_row(self) -> bool:
        victim = next((pid for pid, o in self.inflight.items() if o.qref is None and not o.released), None)
        if victim is not None:
            old = self.inflight.pop(victim)
        elif self.outbox and self.outbox[0].qref is None:
            old = self.outbox.popleft()
        else:
            return False
        self._release(old)
        return True

    def _over_bound(self) -> bool:
        r = self.router
        return bool((r.outbound_messages and self.held > r.outbound_messages)
                    or (r.outbound_bytes and self.held_bytes > r.outbound_bytes))

    def _release(self, out: Outgoing) -> None:
        if out.qref is None and out.qos:
            self.held -= 1
            self.held_bytes -= len(out.msg.payload)
        if out.key:
            self._store("msg_delete", out.key)
            out.key = 0
        elif out.log is not None:
            self._replayed()                # dropped before it was sent
            out.log = None

    def _alloc_pid(self) -> int:
        pid = next(self._pids)
        if pid not in self.inflight:
            return pid          # the usual case: the window is far from 65535
        for _ in range(0xFFFE):
            pid = next(self._pids)
            if pid not in self.inflight:
                return pid
        raise RuntimeError("no free packet identifier")  # cannot happen: the window is ≤ 65535

    def _send_new(self, out: Outgoing) -> None:
        out.pid = self._alloc_pid()
        self.inflight[out.pid] = out
        # QoS 2 of a stored session: the packet id is committed before the PUBLISH leaves. A
        # broker killed in between would otherwise send it again after the restart under a new
        # packet id, which a client that delivers on PUBLISH (method A) takes as a second message:
        # exactly once needs the resend to carry the id the client saw (§4.3.3, §4.4).
        exact = out.qos == 2
        fut = None
        if out.key:
            fut = self._store("msg_stage", out.key, out.pid, 1, wait=exact)
        elif out.log is not None:
            fut = self._take(out, 1, out.pid, wait=exact)
        if fut is not None:
            self._unsent_qos2.append((fut, out))
            fut.add_done_callback(self._send_committed_qos2)
            return
        self._publish(out)

    def _publish(self, out: Outgoing) -> None:
        if not self.conn.send_publish(out):
            # Expired or too large for the client: treated as delivered (§3.1.2.25).
            self.inflight.pop(out.pid, None)
            self.completed(out)

    def _send_committed_qos2(self, _fut: asyncio.Future) -> None:
        """Send the QoS 2 messages whose packet ids are committed, in the order they were taken
        (the writer commits in order; the queue keeps it so whatever the callbacks' order)."""
        while self._unsent_qos2 and self._unsent_qos2[0][0].done():
            fut, out = self._unsent_qos2.popleft()
            if not fut.cancelled() and fut.exception() is not None:
                log.warning("MQTT %s: storing packet id %s failed (%s); sending it anyway",
                            self.client_id, out.pid, fut.exception())
            conn = self.conn
            if conn is None or conn.closing or self.inflight.get(out.pid) is not out:
                continue    # in flight with its stored id: resent when the session reconnects
            self._publish(out)

    def pump(self) -> None:
        conn = self.conn
        if self.replaying:
            return          # the replay puts older messages ahead first
        while conn is not None and self.outbox and len(self.inflight) < conn.send_quota:
            self._send_new(self.outbox.popleft())

    def completed(self, out: Outgoing) -> None:
        """An outbound QoS 1/2 message is done: give the queue subscription its credit back."""
        self._release(out)
        if out.qref is not None:
            out.qref[0].give_back()

    # --- timers -------------------------------------------------------------------------------

    def cancel_timers(self) -> None:
        for timer in (self._will_timer, self._expiry_timer):
            if timer is not None:
                timer.cancel()
        self._will_timer = self._expiry_timer = None

    def schedule_will(self, conn: Connection, will: Message, delay: int) -> None:
        self.pending_will = (conn, will)
        self._will_timer = asyncio.get_running_loop().call_later(delay, self.fire_will)

    def fire_will(self) -> None:
        pending, self.pending_will = self.pending_will, None
        if self._will_timer is not None:
            self._will_timer.cancel()
            self._will_timer = None
        if pending is not None:
            conn, will = pending
            conn.publish_will(will)

    def schedule_expiry(self) -> None:
        if self.expiry_interval >= SESSION_NEVER_EXPIRES:
            return
        self._expiry_timer = asyncio.get_running_loop().call_later(self.expiry_interval, self.end)

    def end(self) -> None:
        """The session is over (expired, or replaced by a clean start): will, then forget it."""
        self.fire_will()
        self.cancel_timers()
        self.router.drop_session(self)
        self.outbox.clear()
        self.inflight.clear()
        self.held = self.held_bytes = 0
        self.log_open = False
        self.offline_seqs.clear()
        self.offline_bytes = 0
        self.replay_left = 0
        if self.stored:
            self._store("session_delete")
            self.stored = False


def restore_session(router: Router, client_id: str, data: dict[str, Any]) -> Session:
    """A Session in memory from its stored state (fluxpg.queues.mqtt_sessions.load), offline:
    subscriptions back in the router, messages in flight (with their packet ids) and queued."""
    row = data["session"]
    sess = Session(router, client_id)
    sess.stored = True
    sess.expiry_interval = row["expiry_interval"]
    for sub in data["subscriptions"]:
        filt = sub["topic_filter"]
        if sub["queue_group"] is not None:
            try:
                queue, qfilter = split_queue_subscription(filt)
            except InvalidArgument:
                continue
            sess.queue_subs[filt] = QueueSub(sess, filt, queue, qfilter, sub["queue_group"], sub["qos"], None,
                                             sub["subscription_id"])
            continue
        try:
            opts = make_sub_options(filt, sub["qos"], sub["no_local"], sub["retain_as_published"],
                                    sub["retain_handling"], sub["subscription_id"])
        except InvalidArgument:
            continue
        router.add_subscription(sess, opts)
    for m in data["messages"]:
        msg = Message(m["topic"], bytes(m["payload"]), m["qos"], m["retain"], props_from_json(m["props"]),
                      m["expires_at"].timestamp() if m["expires_at"] is not None else None)
        out = Outgoing(msg, m["qos"], m["retain"], list(m["sub_ids"] or []), key=m["key"])
        sess.next_key = max(sess.next_key, m["key"] + 1)
        sess.held += 1
        sess.held_bytes += len(msg.payload)
        if m["packet_id"] is not None and m["stage"] >= 1 and m["packet_id"] not in sess.inflight:
            out.pid = m["packet_id"]
            out.released = m["stage"] == 2
            sess.inflight[out.pid] = out
        else:
            sess.outbox.append(out)
    sess.inbound_qos2.update(data["inbound"])
    # Packet ids continue after the highest in flight, so new ones do not collide.
    if sess.inflight:
        start = max(sess.inflight) % 0xFFFF + 1
        sess._pids = itertools.chain(range(start, 0x10000), itertools.cycle(range(1, 0x10000)))
    return sess


def stored_will(client_id: str, row: dict[str, Any]) -> tuple[Message, int] | None:
    """The will kept with a session row whose connection was attached when its node died."""
    w = row.get("will")
    if not w or row.get("will_payload") is None:
        return None
    msg = Message(w["topic"], bytes(row["will_payload"]), w["qos"], w["retain"], props_from_json(w.get("props")),
                  w.get("expires_at"), client_id)
    return msg, int(w.get("delay") or 0)


# --------------------------------------------------------------------------------------------
# The connection
# --------------------------------------------------------------------------------------------

class _Close(Exception):
    """End the connection; v5 clients get a DISCONNECT with `reason` first."""

    def __init__(self, reason: ReasonCode | None, message: str = ""):
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class _Item:
    awaitable: Any                       # future/task to wait for, or None
    answer: Any                          # callable(result, exc) → packet | None (may raise _Close)
    run: Any = None                      # coroutine function run in order instead (SUBSCRIBE)


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: Any, router: Router,
                 options: MqttOptions):
        self.reader = reader
        if isinstance(writer, asyncio.StreamWriter):
            # One send() per event-loop turn instead of one per packet (fluxpg/protocols/writes.py);
            # the WebSocket transport already gathers its frames itself.
            writer = CoalescingWriter(writer)
        self.writer = writer
        self.transport = writer.transport
        # The write buffer's size in one call where it is looked at per read (CoalescingWriter).
        self._write_buffered = getattr(writer, "buffer_size", None) or self.transport.get_write_buffer_size
        self.ctx = ctx
        self.manager = ctx.manager
        self.router = router
        self.opt = options
        self.decoder = Decoder(max_packet_size=options.max_packet_size)
        self.version = 4
        self.client_id = ""
        self.session: Session | None = None
        self.principal: Any = None
        self.peer = _peer(writer)
        self.keep_alive = 0
        self.send_quota = options.v3_inflight
        self.client_max_packet = 0
        self.client_alias_max = 0
        self.out_aliases: dict[str, int] = {}
        self.in_aliases: dict[int, str] = {}
        self.inbound_unacked = 0
        # bounds.connection_inbound_bytes / broker_inbound_bytes (fluxpg/bounds.py): the bytes of
        # the packet being read, and of every publish from its decoding until its commit (the
        # payload is held by the append or the router's write meanwhile).
        self.inbound = inbound_bounds.connection_inbound(ctx)
        self.inbound_held = 0             # of which: publishes waiting for their commit
        self._inbound_freed = asyncio.Event()
        self._packet_size = 0             # encoded size of the packet being handled
        self._partial = 0                 # bytes of the read buffer charged to self.inbound
        self.reading_paused = False       # over the inbound bound: keep alive does not run out
        self.will: Message | None = None
        self.will_delay = 0
        self.default_group = ""
        self.closing = False
        self.end_reason = "eof"         # eof | normal | will | error | takeover | keepalive
        self.last_rx = 0.0
        self._loop = asyncio.get_running_loop()
        self.closed = asyncio.Event()
        self._pipeline: asyncio.Queue[_Item] = asyncio.Queue(maxsize=options.pipeline_depth)
        # Items pushed and not finished yet (queued or being worked on). At 0 an answer that
        # waits for nothing has nothing to wait behind either: it is written at once (_on_publish).
        self._unfinished = 0
        self._tasks: list[asyncio.Task] = []
        self._appends = OrderedPublisher(ctx.manager)   # queue publishes, in arrival order
        # $ack/$nack/$reject and 3.1.1 PUBACKs. Fire-and-forget acks (QoS 0 `$ack`, a 3.1.1
        # PUBACK) linger up to ACK_LINGER for more: one ack call per batch of a busy subscriber
        # instead of one per round trip (a few messages each); anything waited for goes at once.
        self.acks = Settler(ctx.manager, f"mqtt {self.peer}", linger=ACK_LINGER)
        self._lingering = False

    @property
    def v5(self) -> bool:
        return self.version == MQTT_5

    @property
    def _qos0_limit(self) -> int:
        bound = self.router.connection_outbound_bytes
        return min(bound, self.opt.max_write_buffer) if bound else self.opt.max_write_buffer

    def too_slow(self) -> None:
        """The session's outbound bound is exceeded while connected (Session.enqueue)."""
        if self.closing:
            return
        sess = self.session
        log.warning("MQTT %s: subscriber too slow (%d messages, %d bytes waiting): disconnecting",
                    self.client_id, sess.held, sess.held_bytes)
        self.router.slow_disconnects += 1
        self._shutdown(RC.QUOTA_EXCEEDED, "outbound queue limit exceeded: the client does not read fast enough")

    # --- output -------------------------------------------------------------------------------

    def write(self, packet: Any) -> None:
        """Write a packet, or bytes already encoded (the fast encoders' answers)."""
        if self.closing:
            return
        self.writer.write(packet if type(packet) is bytes else encode(packet, self.version))

    def can_send(self) -> bool:
        return not self.closing

    def send_publish(self, out: Outgoing) -> bool:
        """Write one PUBLISH; False when it must not be sent (expired, too large for the client)."""
        if self.closing:
            return True     # stays in flight; resent on the next connection of the session
        msg = out.msg
        if out.qos == 0 and self.transport.get_write_buffer_size() > self._qos0_limit:
            self.router.qos0_dropped += 1
            return False    # a QoS 0 message may be dropped (§4.3.1); the client is not reading
        topic = msg.topic
        props = msg.props
        v5 = self.version == MQTT_5
        plain = not v5 or (msg.expires_at is None and not out.sub_ids and not self.client_alias_max)
        if plain and (not props or not v5 or (len(props) == 1 and "user_properties" in props)):
            # Nothing, or only user properties (queue deliveries), to put in properties:
            # encode(Publish(...)) byte for byte, without objects.
            if props and v5:
                data = encode_publish_users(topic, msg.payload, out.qos, out.retain, out.pid or None,
                                            props["user_properties"])
            else:
                data = encode_publish_plain(topic, msg.payload, out.qos, out.retain, out.pid or None, self.version)
            if self.client_max_packet and len(data) > self.client_max_packet:
                log.info("MQTT %s: dropping a %d-byte message on %s above the client's maximum packet size",
                         self.client_id, len(data), topic)
                return False
            self.writer.write(data)
            return True
        props = None
        new_alias = None
        if self.v5:
            props = Properties()
            for name in _FORWARDED:
                value = msg.props.get(name)
                if value is not None:
                    setattr(props, name, value)
            ups = msg.props.get("user_properties")
            if ups:
                props.user_properties = list(ups)
            if msg.expires_at is not None:
                remaining = msg.expires_at - time.time()
                if remaining <= 0:
                    return False
                props.message_expiry_interval = math.ceil(remaining)
            if out.sub_ids:
                props.subscription_identifiers = list(out.sub_ids)
            if self.client_alias_max:
                alias = self.out_aliases.get(topic)
                if alias is not None:
                    props.topic_alias = alias
                    topic = ""
                elif len(self.out_aliases) < self.client_alias_max:
                    new_alias = len(self.out_aliases) + 1
                    props.topic_alias = new_alias
        pkt = Publish(topic, msg.payload, out.qos, out.retain, False, out.pid or None,
                      props if props is not None else Properties())
        data = encode(pkt, self.version)
        if self.client_max_packet and len(data) > self.client_max_packet:
            log.info("MQTT %s: dropping a %d-byte message on %s above the client's maximum packet size",
                     self.client_id, len(data), msg.topic)
            return False
        if new_alias is not None:
            self.out_aliases[msg.topic] = new_alias
        self.writer.write(data)
        return True

    def resend(self, out: Outgoing) -> None:
        """After a reconnect: PUBLISH again with DUP, or PUBREL for a QoS 2 message past PUBREC."""
        if out.released:
            self.write(Pubrel(out.pid))
            return
        msg = out.msg
        props = Properties()
        if self.v5:
            for name in _FORWARDED:
                if msg.props.get(name) is not None:
                    setattr(props, name, msg.props[name])
            if msg.props.get("user_properties"):
                props.user_properties = list(msg.props["user_properties"])
            if out.sub_ids:
                props.subscription_identifiers = list(out.sub_ids)
            if msg.expires_at is not None:
                props.message_expiry_interval = max(1, math.ceil(msg.expires_at - time.time()))
        self.write(Publish(msg.topic, msg.payload, out.qos, out.retain, True, out.pid, props))

    # --- life cycle ---------------------------------------------------------------------------

    async def run(self, initial: bytes) -> None:
        try:
            connect = await self._read_connect(initial)
            if connect is None or not await self._accept(connect):
                return
            self._tasks.append(asyncio.create_task(self._run_pipeline(), name=f"mqtt-pipeline-{self.client_id}"))
            if self.keep_alive:
                self._tasks.append(asyncio.create_task(self._watch_keep_alive(), name=f"mqtt-ka-{self.client_id}"))
            await self._read_loop()
        except _Close as exc:
            self._shutdown(exc.reason, str(exc))
        except MQTTError as exc:
            log.info("MQTT %s from %s: %s", self.client_id or "?", self.peer, exc)
            self._shutdown(_disconnect_code(exc.reason_code), str(exc))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await self._cleanup()
            if self._lingering:
                await self._linger()

    async def _linger(self) -> None:
        """After a DISCONNECT we sent: discard input until the client closes (or the abort timer)."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), 2.5):
                pass
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass

    def _shutdown(self, reason: ReasonCode | None, message: str = "", end: str = "error") -> None:
        """Stop the connection from anywhere: DISCONNECT (v5, when a reason is given), then close."""
        if self.closing:
            return
        if self.end_reason not in ("normal", "will"):
            self.end_reason = end
        if reason is not None and self.v5 and self.session is not None:
            props = Properties(reason_string=message[:200]) if message else Properties()
            try:
                self.writer.write(encode(Disconnect(reason, props), MQTT_5))
            except Exception:  # noqa: BLE001
                pass
        self.closing = True
        self._inbound_freed.set()   # a read loop paused at the inbound bound ends now, not at a commit
        sent = reason is not None and self.v5 and self.session is not None
        if sent and getattr(self.transport, "can_write_eof", lambda: False)():
            # Lingering close: half-close after the DISCONNECT and keep reading (and discarding)
            # until the client closes. Closing with its packets unread would reset the connection,
            # and a client still answering earlier packets (PUBREL for our PUBRECs) would see the
            # reset before it reads why we disconnected (Paho's test_flow_control2).
            self._lingering = True
            try:
                self.writer.write_eof()
            except Exception:  # noqa: BLE001
                pass
        else:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001
                pass
            # Wake the read loop if it is waiting on the socket.
            self.reader.feed_eof()
        # A client that stopped reading must not keep us waiting for the flush.
        asyncio.get_running_loop().call_later(2.0, self.transport.abort)

    async def takeover(self) -> None:
        """Another connection with our client id arrived: step aside (v5: DISCONNECT 0x8E)."""
        self._shutdown(RC.SESSION_TAKEN_OVER, "session taken over", end="takeover")
        try:
            await asyncio.wait_for(self.closed.wait(), 5)
        except asyncio.TimeoutError:
            log.warning("MQTT %s: previous connection did not close in time", self.client_id)

    async def _cleanup(self) -> None:
        try:
            await cancel_and_wait(self._tasks)
            # Acks still gathering (Settler.linger) are written before the subscriptions close
            # (or a connection taking the session over claims): a client must not get back
            # what it acked on this connection.
            await self.acks.close(5.0)
            sess = self.session
            if sess is not None and sess.conn is self:
                await self._detach(sess)
        finally:
            self.closing = True
            self.closed.set()

    async def _detach(self, sess: Session) -> None:
        sess.conn = None
        if sess.expiry_interval > 0 and not self.router.closing:
            sess.open_log()     # at once: what is routed from now on goes to the offline log
        for qsub in list(sess.queue_subs.values()):
            try:
                await qsub.close()
            except Exception:  # noqa: BLE001
                log.exception("closing queue subscription %s", qsub.topic_filter)
        # Queue deliveries are not kept: the engine has them pending and delivers them again.
        for pid in [pid for pid, out in sess.inflight.items() if out.qref is not None]:
            del sess.inflight[pid]
        if any(out.qref is not None for out in sess.outbox):
            sess.outbox = deque(o for o in sess.outbox if o.qref is None)
        sess.trim()
        if sess.stored:
            if sess.expiry_interval > 0:
                sess._store("session_disconnected", sess.expiry_interval)
            elif self.router.closing:
                sess._store("session_delete")
        if self.router.closing:
            return
        will = self.will if self.end_reason not in ("normal",) else None
        if sess.expiry_interval == 0:
            if will is not None:
                self.publish_will(will)
            sess.end()
            return
        if will is not None:
            delay = min(self.will_delay, sess.expiry_interval)
            if delay <= 0:
                self.publish_will(will)
            else:
                sess.schedule_will(self, will, delay)
        sess.schedule_expiry()

    def publish_will(self, will: Message) -> None:
        if self.router.closing:
            return
        log.info("MQTT %s: publishing will on %s", self.client_id, will.topic)
        if is_queue_topic(will.topic):
            task = asyncio.ensure_future(self.manager.publish(will.topic, will.payload, _headers(will.props)))
            task.add_done_callback(_log_failure)
            return
        fut = self.router.publish(will)
        if fut is not None:
            fut.add_done_callback(_log_failure)

    # --- CONNECT ------------------------------------------------------------------------------

    async def _read_connect(self, initial: bytes) -> Connect | None:
        self.decoder.feed(initial)
        deadline = asyncio.get_running_loop().time() + self.opt.connect_timeout
        while True:
            try:
                pkt = self.decoder.next_packet()
            except UnsupportedProtocolVersion:
                # A v3.1.1-format CONNACK every client version can read (reasons.py).
                self.writer.write(encode(Connack(reason_code=RC.UNSUPPORTED_PROTOCOL_VERSION), 4))
                return None
            except MQTTError as exc:
                log.info("MQTT CONNECT from %s refused: %s", self.peer, exc)
                if self.decoder.version is not None:
                    self.version = self.decoder.version
                    if self.v5:
                        rc = exc.reason_code if exc.reason_code in CONNACK_CODES else RC.UNSPECIFIED_ERROR
                        self.writer.write(encode(Connack(reason_code=rc), MQTT_5))
                    elif exc.reason_code == RC.CLIENT_IDENTIFIER_NOT_VALID:
                        self.writer.write(encode(Connack(reason_code=exc.reason_code), self.version))
                return None
            if pkt is not None:
                return pkt  # the decoder only lets a CONNECT through first
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(65536), remaining)
            except asyncio.TimeoutError:
                return None
            if not data:
                return None
            self.decoder.feed(data)

    async def _accept(self, c: Connect) -> bool:
        self.version = c.protocol_level
        if self.version == 3:
            self.version = 4   # 3.1 is read and answered like 3.1.1
        v5 = self.v5
        props = c.properties
        if v5 and props.authentication_method is not None:
            self._connack_fail(RC.BAD_AUTHENTICATION_METHOD)
            return False
        try:
            self.principal = await self._authenticate(c)
        except _Close as exc:
            self._connack_fail(exc.reason)
            return False
        assigned = None
        client_id = c.client_id
        if not client_id:
            client_id = assigned = "fluxpg-" + secrets.token_hex(8)
        self.client_id = client_id
        if (info := connections.current()) is not None:   # the console's list of connections
            info.client_id, info.user = client_id, getattr(self.principal, "username", None)
        self.default_group = client_id if v5 else client_id.split("-", 1)[0]
        if c.will is not None:
            w = c.will
            if not self._allowed("publish", w.topic):
                self._connack_fail(RC.NOT_AUTHORIZED)
                return False
            wprops = w.properties
            self.will = Message(w.topic, w.payload, w.qos, w.retain, _message_props(wprops) if v5 else {},
                                _expiry(wprops) if v5 else None, client_id)
            self.will_delay = (wprops.will_delay_interval or 0) if v5 else 0
        self.keep_alive = c.keep_alive
        if v5:
            self.send_quota = props.receive_maximum or 65535
            self.client_max_packet = props.maximum_packet_size or 0
            self.client_alias_max = props.topic_alias_maximum or 0
            expiry = props.session_expiry_interval or 0
        else:
            expiry = 0 if c.clean_start else SESSION_NEVER_EXPIRES
        # Session: take over a live connection, then resume or start afresh.
        router = self.router
        existing = router.sessions.get(client_id)
        if existing is None and router.store is not None:
            # Not here: stored by another node (takeover across nodes), by a dead one (crash,
            # restart), or nowhere.
            try:
                existing = await router.fetch_session(client_id, load=not c.clean_start)
            except FluxError as exc:
                log.warning("MQTT %s: loading the stored session failed: %s", client_id, exc)
                self._connack_fail(RC.SERVER_UNAVAILABLE if v5 else RC.UNSPECIFIED_ERROR)
                return False
        if existing is not None and existing.conn is not None:
            await existing.conn.takeover()
            existing = router.sessions.get(client_id)
        if existing is not None and c.clean_start:
            existing.end()
            existing = None
        present = existing is not None
        sess = existing or Session(router, client_id)
        sess.cancel_timers()
        sess.pending_will = None
        sess.expiry_interval = expiry
        router.sessions[client_id] = sess
        self.session = sess
        if (expiry > 0 or self.will is not None) and router.store is not None:
            # The session row (with this connection's will) is committed before CONNACK. A clean
            # session gets a row only for its will: if the node dies with the connection, the
            # node that adopts the row publishes it (then the row goes, expiry 0).
            sess.stored = True
            will = self.will
            will_json = None if will is None else {
                "topic": will.topic, "qos": will.qos, "retain": will.retain, "props": props_to_json(will.props),
                "delay": self.will_delay, "expires_at": will.expires_at}
            try:
                await router.store.submit("session_upsert", client_id, router.node_id, expiry, self.version,
                                          will_json, will.payload if will is not None else None, wait=True)
            except FluxError as exc:
                log.warning("MQTT %s: storing the session failed: %s", client_id, exc)
                self._connack_fail(RC.SERVER_UNAVAILABLE if v5 else RC.UNSPECIFIED_ERROR)
                return False
        ack_props = Properties()
        if v5:
            ack_props.receive_maximum = self.opt.receive_maximum
            ack_props.maximum_packet_size = self.opt.max_packet_size
            ack_props.topic_alias_maximum = self.opt.topic_alias_maximum
            if assigned:
                ack_props.assigned_client_identifier = assigned
        self.write(Connack(present, RC.SUCCESS, ack_props))
        connections.logged_in()   # the listener's handshake deadline no longer applies
        self.last_rx = asyncio.get_running_loop().time()
        sess.conn = self
        # Offline messages in the log up to here are replayed; from here on they arrive live.
        closed = sess.close_log()
        log.debug("MQTT %s connected (v%s, session %s)", client_id, self.version, "resumed" if present else "new")
        if present:
            for out in sess.resendable():
                self.resend(out)
            if sess.state_store is not None:
                sess.replaying = True
                try:
                    await sess.replay(closed)
                except Exception as exc:  # noqa: BLE001 - the ranges stay: the next connection replays them
                    log.warning("MQTT %s: replaying offline messages failed: %s", client_id, exc)
                finally:
                    sess.replaying = False
            sess.pump()
            for qsub in list(sess.queue_subs.values()):
                try:
                    await qsub.open(self.manager, self._queue_credit())
                except FluxError as exc:
                    log.warning("MQTT %s: cannot resume %s: %s", client_id, qsub.topic_filter, exc)
                    sess.queue_subs.pop(qsub.topic_filter, None)
        return True

    def _connack_fail(self, rc: ReasonCode) -> None:
        self.writer.write(encode(Connack(False, rc), self.version))

    async def _authenticate(self, c: Connect) -> Any:
        auth = self.ctx.auth
        if auth is None:
            return None
        from fluxpg.auth import AuthError
        try:
            return await auth.authenticate(c.username, c.password, protocol="mqtt", peer=self.peer)
        except AuthError as exc:
            log.info("MQTT login of %r from %s refused: %s", c.username, self.peer, exc)
            code = getattr(exc, "code", None)
            raise _Close(RC.NOT_AUTHORIZED if code in ("not-authorized", "forbidden")
                         else RC.BAD_USER_NAME_OR_PASSWORD) from None

    def _allowed(self, action: str, resource: str, group: str | None = None) -> bool:
        """fluxpg.auth.authorize: the one decision all protocols share."""
        return authorize(self.principal, action, resource, group=group)

    # --- reading ------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        # The bytes of a partially received packet count toward bounds.connection_inbound_bytes
        # and bounds.broker_inbound_bytes (fluxpg/bounds.py), like AMQP bodies do; so does every
        # publish until its commit (_hold_inbound).
        try:
            await self._read_packets(self.inbound)
        finally:
            # The packet being read is gone; publishes still committing give their bytes back
            # when they finish (their payloads are held until then, connection or not).
            self.inbound.release(self._partial)
            self._partial = 0

    def _hold_inbound(self, futures: list) -> None:
        """A decoded publish stays charged (its packet's bytes) until its futures are done."""
        n = self._packet_size
        self._packet_size = 0
        if n <= 0 or not futures:
            return
        self._sync_partial(self.inbound)   # the packet's bytes are no longer the read buffer's
        self.inbound.charge(n)
        self.inbound_held += n

        def freed() -> None:
            self.inbound_held -= n
            self._inbound_freed.set()
        self.inbound.release_after(futures, n, freed)

    def _sync_partial(self, inbound: Any) -> None:
        """Release the charged bytes of the read buffer that decoding has taken out of it."""
        if self._partial > self.decoder.buffered:
            inbound.release(self._partial - self.decoder.buffered)
            self._partial = self.decoder.buffered

    async def _read_packets(self, inbound: Any) -> None:
        loop = asyncio.get_running_loop()
        reader = self.reader
        decoder = self.decoder
        # A started packet must be complete within bounds.frame_timeout of its first byte, however
        # slowly its bytes trickle in (keep alive restarts with every byte; this does not).
        bounds = getattr(self.ctx.config, "bounds", None)
        frame_timeout = bounds.frame_timeout.total_seconds() if bounds is not None else 0.0
        started: float | None = None
        # TCP and TLS: no StreamReader from here on. While this loop waits for input with no
        # partial packet buffered it is parked, and the transport's data_received decodes and
        # handles the packets itself (_consume), waking the loop only for what must be awaited
        # (fluxpg/protocols/reads.py). The same steps, in the same order, as the loop below.
        raw = getattr(self.writer, "_writer", self.writer).transport
        park = None
        if InlineReader.usable(reader, raw):
            reader = self.reader = InlineReader(reader, raw, self._consume)
            park = reader.park
        # Bytes that came with the CONNECT may already hold further packets: decode before reading.
        while not self.closing:
            decoded = False
            while not self.closing:
                pkt = decoder.next_fast()
                if pkt is None:
                    break
                decoded = True
                # The packet's bytes leave the read buffer; a publish charges them again until
                # its commit (_hold_inbound), so nothing is counted twice. The read buffer's
                # charge follows the decoding (_sync_partial) before a charge and before this
                # task waits -- the only points where the counts are looked at -- not per packet.
                self._packet_size = decoder.last_size
                result = self._handle(pkt)
                self._packet_size = 0
                if result is not None:
                    self._sync_partial(inbound)
                    await result
            self._sync_partial(inbound)
            if self.transport.get_write_buffer_size() > 65536:
                await self.writer.drain()
            paused = False
            while self.inbound_held and inbound.over and not self.closing:
                # Publishes waiting for their commit hold this connection (or the broker) at its
                # bound: stop reading until one finishes -- TCP pushes back on the client. (Only
                # while something will finish: with nothing held the bound refuses instead.)
                paused = self.reading_paused = True
                self._inbound_freed.clear()
                try:
                    await self._inbound_freed.wait()
                finally:
                    self.reading_paused = False
            if paused:
                self.last_rx = loop.time()   # keep alive counts from when we read again
            if self.closing:
                return
            if not decoder.buffered:
                started = None
            elif decoded or started is None or paused:
                started = loop.time()   # the broker's pause is not the client's slowness
            if park is not None and started is None:
                token = await park()
                if token is not None:
                    if token is not AGAIN:
                        await token     # a handler's awaitable, as `await result` above
                    continue
            if started is not None and frame_timeout:
                try:
                    data = await asyncio.wait_for(reader.read(65536), max(0.0, started + frame_timeout - loop.time()))
                except asyncio.TimeoutError:
                    log.info("MQTT %s: a packet was not completed within %ss of its first byte "
                             "(bounds.frame_timeout)", self.client_id, frame_timeout)
                    self._shutdown(RC.KEEP_ALIVE_TIMEOUT, "packet not completed in time", end="keepalive")
                    return
            else:
                data = await reader.read(65536)
            if not data or self.closing:
                return
            self.last_rx = loop.time()
            if not self._took(data):
                return

    def _handle(self, pkt: Any) -> Any:
        """Dispatch one packet of Decoder.next_fast(): the tuple of a PUBLISH without properties,
        the packet id of a plain PUBACK, or a packet object."""
        t = type(pkt)
        if t is tuple:
            return self._on_plain_publish(*pkt)
        if t is int:
            return self._on_puback_id(pkt)
        handler = self._HANDLERS.get(t)
        if handler is None:
            raise ProtocolError(f"a client must not send {t.__name__.upper()}")
        return handler(self, pkt)

    def _took(self, data: bytes) -> bool:
        """Bytes read: into the decoder, charged to the inbound bounds; False when refused (the
        connection is being shut down)."""
        decoder = self.decoder
        decoder.feed(data)
        grown = decoder.buffered - self._partial
        if grown > 0:
            inbound = self.inbound
            if self.inbound_held:
                # Read already; publishes being committed will free room: the next read
                # waits for that if this passes the bound.
                inbound.charge(grown)
            else:
                refused = inbound.reserve(grown)
                if refused is not None:
                    log.info("MQTT %s: packet refused: %s", self.client_id, refused)
                    self._shutdown(RC.QUOTA_EXCEEDED, "inbound bytes over the broker's bound", end="error")
                    return False
            self._partial += grown
        return True

    def _consume(self, data: bytes) -> Any:
        """Input that arrived while the read loop is parked (InlineReader.data_received): what
        one turn of _read_packets does with it -- charge it, decode and handle the complete
        packets -- without waking the loop. Returns STAY, or what the loop must do: await a
        handler's awaitable, or go round (AGAIN: a partial packet for the frame timeout, a full
        write buffer to drain, the inbound bound to wait at, the connection closing)."""
        if self.closing:
            return AGAIN
        self.last_rx = self._loop.time()
        if not self._took(data):
            return AGAIN
        decoder = self.decoder
        next_fast = decoder.next_fast
        inbound = self.inbound
        handlers = self._HANDLERS
        while not self.closing:
            pkt = next_fast()
            if pkt is None:
                break
            self._packet_size = decoder.last_size
            t = type(pkt)
            if t is tuple:
                result = self._on_plain_publish(*pkt)
            elif t is int:
                result = self._on_puback_id(pkt)
            else:
                handler = handlers.get(t)
                if handler is None:
                    raise ProtocolError(f"a client must not send {t.__name__.upper()}")
                result = handler(self, pkt)
            self._packet_size = 0
            if result is not None:
                self._sync_partial(inbound)
                return result
        self._sync_partial(inbound)
        if (self.closing or decoder.buffered or self._write_buffered() > 65536
                or (self.inbound_held and inbound.over)):
            return AGAIN
        return STAY

    async def _watch_keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        limit = self.keep_alive * 1.5        # §3.1.2.10: one and a half times the keep alive
        while not self.closing:
            wait = self.last_rx + limit - loop.time()
            if wait <= 0 and self.reading_paused:
                wait = limit    # we stopped reading, not the client
            elif wait <= 0:
                log.info("MQTT %s: keep alive of %ss expired", self.client_id, self.keep_alive)
                self._shutdown(RC.KEEP_ALIVE_TIMEOUT, "keep alive timeout", end="keepalive")
                return
            await asyncio.sleep(wait)

    # --- the ordered pipeline -----------------------------------------------------------------

    async def _push(self, awaitable: Any, answer: Any = None, run: Any = None) -> None:
        self._unfinished += 1
        await self._pipeline.put(_Item(awaitable, answer, run))

    async def _run_pipeline(self) -> None:
        queue = self._pipeline
        while True:
            item = await queue.get()
            try:
                if self.closing:
                    continue    # keep taking items so a reader blocked on put() can finish
                if item.run is not None:
                    await item.run()
                    continue
                result = exc = None
                if item.awaitable is not None:
                    try:
                        result = await item.awaitable
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - answered below
                        exc = e
                packet = item.answer(result, exc) if item.answer is not None else None
                if packet is not None:
                    self.write(packet)
                if queue.empty() and self.transport.get_write_buffer_size() > 65536:
                    await self.writer.drain()
            except _Close as c:
                self._shutdown(c.reason, str(c))
            except (ConnectionError, asyncio.IncompleteReadError):
                self._shutdown(None)
            finally:
                self._unfinished -= 1

    # --- packet handlers ----------------------------------------------------------------------

    def _on_connect(self, p: Connect) -> None:
        raise ProtocolError("second CONNECT on a connection")

    def _on_pingreq(self, p: Pingreq) -> None:
        self.write(Pingresp())

    def _on_disconnect(self, p: Disconnect) -> None:
        if self.v5:
            # §3.14.4: only a DISCONNECT with 0x00 discards the will.
            self.end_reason = "normal" if p.reason_code == RC.NORMAL_DISCONNECTION else "will"
            new_expiry = p.properties.session_expiry_interval
            if new_expiry is not None and self.session is not None:
                if self.session.expiry_interval == 0 and new_expiry != 0:
                    raise ProtocolError("session expiry set on DISCONNECT after CONNECT said 0")
                self.session.expiry_interval = new_expiry
        else:
            self.end_reason = "normal"
        self.closing = True   # the read loop ends; the client closes the socket

    def _on_auth(self, p: Auth) -> None:
        raise ProtocolError("AUTH without an authentication method in CONNECT")

    def _on_publish(self, p: Publish):
        topic = p.topic
        props = p.properties
        v5 = self.version == MQTT_5
        if v5:
            alias = props.topic_alias
            if alias is not None:
                if not 1 <= alias <= self.opt.topic_alias_maximum:
                    raise _Close(RC.TOPIC_ALIAS_INVALID, f"topic alias {alias} out of range")
                if topic:
                    self.in_aliases[alias] = topic
                else:
                    topic = self.in_aliases.get(alias)
                    if topic is None:
                        raise ProtocolError(f"topic alias {alias} used before it was set")
        qos = p.qos
        pid = p.packet_id
        if qos:
            if v5 and self.inbound_unacked >= self.opt.receive_maximum:
                raise _Close(RC.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
            if qos == 2 and pid in self.session.inbound_qos2:
                # A resend of a QoS 2 message we have: answer again, do not deliver twice.
                return self._push(None, lambda r, e: Pubrec(pid))
            self.inbound_unacked += 1
            if qos == 2:
                self.session.inbound_qos2.add(pid)
        if is_queue_topic(topic):
            verb = None
            try:
                verb = ack_verb(topic)
            except InvalidArgument as exc:
                return self._refuse(p, RC.TOPIC_NAME_INVALID, str(exc))
            if verb is not None:
                return self._on_queue_ack(p, topic, *verb)
            return self._on_queue_publish(p, topic)
        if topic.startswith(_RESERVED_PREFIXES):
            # Other `$` topics are ordinary topics to publish to, as in Mosquitto; the `$` rule
            # (§4.7.2) keeps them away from `#` / `+` subscriptions.
            return self._refuse(p, RC.TOPIC_NAME_INVALID, f"topic {topic!r} is reserved for the broker")
        if not self._allowed("publish", topic):
            return self._refuse(p, RC.NOT_AUTHORIZED, f"not allowed to publish to {topic!r}")
        if v5 and not props.is_empty():
            msg = Message(topic, p.payload, qos, p.retain, _message_props(props), _expiry(props), self.client_id)
        else:
            msg = Message(topic, p.payload, qos, p.retain, {}, None, self.client_id)
        return self._route(msg, qos, pid)

    def _on_plain_publish(self, topic: str, payload: bytes, qos: int, retain: bool, dup: bool, pid: int | None):
        """_on_publish for a PUBLISH without properties (Decoder.next_fast's tuple): the same
        steps for a QoS 0/1 publish to a plain topic, without the Publish and Properties objects;
        QoS 2 and `$` topics (queues, reserved) take _on_publish."""
        if qos == 2 or topic[0] == "$":
            return self._on_publish(Publish(topic, payload, qos, retain, dup, pid, Properties()))
        if qos:
            if self.version == MQTT_5 and self.inbound_unacked >= self.opt.receive_maximum:
                raise _Close(RC.RECEIVE_MAXIMUM_EXCEEDED, "receive maximum exceeded")
            self.inbound_unacked += 1
        principal = self.principal
        if principal is not None and principal.permissions is not None and not self._allowed("publish", topic):
            # (no principal or no permissions: authorize() allows everything)
            return self._refuse(Publish(topic, b"", qos, retain, dup, pid), RC.NOT_AUTHORIZED,
                                f"not allowed to publish to {topic!r}")
        return self._route(Message(topic, payload, qos, retain, {}, None, self.client_id), qos, pid)

    def _route(self, msg: Message, qos: int, pid: int | None):
        """A publish to a plain topic, checked: to the router, then its PUBACK/PUBREC."""
        fut = self.router.publish(msg)
        if fut is not None:
            self._hold_inbound([fut])   # retained store / relay / session rows hold the payload
        if qos == 0:
            if fut is not None:
                fut.add_done_callback(_log_failure)
            return None
        if qos == 2 and self.session.store is not None:
            # PUBREC only once the packet id is stored: a PUBLISH resent after a restart is
            # then recognised and not delivered twice (exactly once).
            sfut = self.session.store.submit("inbound_add", self.client_id, pid, wait=True)
            fut = sfut if fut is None else asyncio.gather(fut, sfut)
        if fut is None and not self._unfinished:
            # Delivered already, nothing to commit, no earlier answer still owed: PUBACK/PUBREC
            # now, in order with the pipeline's answers (none pending), without a pipeline item.
            if qos == 1:
                self.inbound_unacked -= 1      # QoS 2: when its PUBREL is answered
            if not self.closing:
                self.writer.write(encode_ack_ok(0x40 if qos == 1 else 0x50, pid))
            return None
        return self._push(fut, self._answer(msg.topic, qos, pid, "pub/sub"))

    def _answer(self, topic: str, qos: int, pid: int, what: str):
        """The PUBACK/PUBREC for a publish once its awaitable finished (or failed). A successful
        QoS 1 publish is answered with the encoded PUBACK (bytes: no Puback and Properties
        objects, the same bytes); the answer keeps the topic, QoS and packet id, not the payload."""

        def answer(_result: Any, exc: BaseException | None) -> Any:
            if exc is None:
                if qos == 1:
                    self.inbound_unacked -= 1
                    return encode_ack_ok(0x40, pid)
                return self._ack_packet(Publish(topic, b"", qos, False, False, pid), RC.SUCCESS, None)
            rc, reason = _flux_reason(exc)
            log.info("MQTT %s: %s publish to %s failed: %s", self.client_id, what, topic, exc)
            if not self.v5:
                raise _Close(None, "3.1.1 cannot signal a failed publish")
            return self._ack_packet(Publish(topic, b"", qos, False, False, pid), rc, reason)
        return answer

    def _ack_packet(self, p: Publish, rc: ReasonCode, reason: str | None) -> Any:
        props = Properties(reason_string=reason[:200]) if (reason and self.v5) else Properties()
        if p.qos == 1:
            self.inbound_unacked -= 1
            return Puback(p.packet_id, rc, props)
        if rc.is_error:
            # No PUBREL follows a failed PUBREC: the exchange ends here.
            self.session.inbound_qos2.discard(p.packet_id)
            self.inbound_unacked -= 1
        return Pubrec(p.packet_id, rc, props)

    def _refuse(self, p: Publish, rc: ReasonCode, reason: str):
        """A publish we do not carry out: v5 says why; 3.1.1 cannot, so its connection closes."""
        log.info("MQTT %s: publish to %r refused: %s", self.client_id, p.topic, reason)
        if p.qos == 0:
            return None
        if not self.v5:
            raise _Close(None, reason)
        head = _without_payload(p)
        return self._push(None, lambda r, e: self._ack_packet(head, rc, reason))

    def _on_queue_publish(self, p: Publish, topic: str):
        try:
            qt = parse_queue_topic(topic)
        except InvalidArgument as exc:
            return self._refuse(p, RC.TOPIC_NAME_INVALID, str(exc))
        if not self._allowed("publish", topic):
            return self._refuse(p, RC.NOT_AUTHORIZED, f"not allowed to publish to queue {qt.queue!r}")
        headers = _headers(_message_props(p.properties)) if (self.v5 and not p.properties.is_empty()) else None
        task = self._appends.append(topic, p.payload, headers)
        self._hold_inbound([task])
        if p.qos == 0:
            task.add_done_callback(_log_failure)
            return None
        return self._push(task, self._answer(p.topic, p.qos, p.packet_id, "queue"))

    def _on_queue_ack(self, p: Publish, topic: str, queue: str, verb: str):
        up = dict(p.properties.user_properties) if self.v5 else {}
        group = up.get("group-id") or self.default_group
        # Settling entries needs the consume right on the whole queue and that group.
        if not self._allowed(verb, queue, group):
            return self._refuse(p, RC.NOT_AUTHORIZED, f"not allowed to consume from queue {queue!r}")
        try:
            partition = int(up.get("x-stream-partition", 0) or 0)
            if verb == "commit":
                if "x-offset" not in up:
                    raise InvalidArgument("$commit needs the user property x-offset")
                offset = int(up["x-offset"])
                coro = self.manager.commit(queue, group, offset + 1, partition)
            else:
                _, seq = parse_message_id(up.get("message-id", ""))
                reason = up.get("reason") if verb == "reject" else None
                if p.qos == 0:
                    # Nobody waits: the connection's settler may gather it with the next ones
                    # (its linger); a failure is logged there.
                    self.acks.settle(verb, queue, group, seq, partition, reason)
                    return None
                coro = None
                task = self.acks.submit(verb, queue, group, seq, partition, reason)
        except (InvalidArgument, ValueError) as exc:
            return self._refuse(p, RC.IMPLEMENTATION_SPECIFIC_ERROR, f"${verb}: {exc}")
        if coro is not None:
            task = asyncio.ensure_future(coro)
        if p.qos == 0:
            task.add_done_callback(_log_failure)
            return None
        return self._push(task, self._answer(p.topic, p.qos, p.packet_id, f"${verb}"))

    # -- acknowledgements of our deliveries --

    def _on_puback(self, p: Puback) -> None:
        self._on_puback_id(p.packet_id)

    def _on_puback_id(self, pid: int) -> None:
        sess = self.session
        out = sess.inflight.pop(pid, None)
        if out is None:
            # Mosquitto does the same: a stale PUBACK (e.g. crossing a resend) is harmless.
            log.debug("MQTT %s: PUBACK for unknown packet id %d ignored", self.client_id, pid)
            return
        if out.qref is not None and not self.v5:
            self._ack_delivery(out)
        sess.completed(out)
        sess.pump()

    def _on_pubrec(self, p: Pubrec) -> None:
        sess = self.session
        out = sess.inflight.get(p.packet_id)
        if out is None:
            self.write(Pubrel(p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND if self.v5 else RC.SUCCESS))
            return
        if p.reason_code.is_error:
            del sess.inflight[p.packet_id]
            sess.completed(out)
            sess.pump()
            return
        if not out.released:
            out.released = True
            if out.key:
                sess._store("msg_stage", out.key, out.pid, 2)
            if out.qref is not None and not self.v5:
                self._ack_delivery(out)
        self.write(Pubrel(p.packet_id))

    def _on_pubcomp(self, p: Pubcomp) -> None:
        sess = self.session
        out = sess.inflight.get(p.packet_id)
        if out is None or not out.released:
            log.debug("MQTT %s: PUBCOMP for unknown packet id %d ignored", self.client_id, p.packet_id)
            return
        del sess.inflight[p.packet_id]
        sess.completed(out)
        sess.pump()

    def _on_pubrel(self, p: Pubrel) -> None:
        sess = self.session
        if p.packet_id in sess.inbound_qos2:
            sess.inbound_qos2.discard(p.packet_id)
            if sess.store is not None:
                sess._store("inbound_delete", p.packet_id)
            self.inbound_unacked -= 1
            self.write(Pubcomp(p.packet_id))
        else:
            self.write(Pubcomp(p.packet_id, RC.PACKET_IDENTIFIER_NOT_FOUND if self.v5 else RC.SUCCESS))

    def _ack_delivery(self, out: Outgoing) -> None:
        """3.1.1: the subscriber's PUBACK acknowledges the queue message (DESIGN §4)."""
        qsub, d = out.qref
        self.acks.settle("ack", d.queue, d.group, d.seq, d.partition)

    # -- SUBSCRIBE / UNSUBSCRIBE --

    def _on_subscribe(self, p: Subscribe):
        # Plain subscriptions are registered here, in the read loop, the moment the SUBSCRIBE is
        # decoded: a message another client publishes after this point is delivered even if it
        # arrives before our SUBACK (§3.8.4 allows PUBLISH before SUBACK). Waiting for the
        # pipeline would leave a window in which such messages were lost. `$queue/` subscriptions
        # need the database and are opened in the pipeline; retained messages are read there too.
        sid = p.properties.subscription_identifiers[0] if p.properties.subscription_identifiers else None
        plain: dict[int, tuple[ReasonCode, str]] = {}
        retained: list[tuple[Any, bool]] = []
        shared = False
        for i, s in enumerate(p.subscriptions):
            if not s.topic_filter.startswith("$queue/"):
                rc, why = self._subscribe_plain(s, sid, retained)
                plain[i] = (rc, why)
                shared = shared or (s.topic_filter.startswith("$share/") and rc < 0x80)
        return self._push(None, None, run=lambda: self._subscribe(p, sid, plain, retained, shared))

    async def _subscribe(self, p: Subscribe, sid: int | None, plain: dict, retained: list, shared: bool) -> None:
        sess = self.session
        codes: list[ReasonCode] = []
        reasons: list[str] = []
        for i, s in enumerate(p.subscriptions):
            if i in plain:
                rc, why = plain[i]
            else:
                rc, why = await self._subscribe_queue(s, p.properties, sid)
            codes.append(rc)
            if why:
                reasons.append(f"{s.topic_filter}: {why}")
        if shared:
            # A new shared member: SUBACK once the other nodes can learn of it (fluxpg.mqtt_shared
            # written), so the group's messages are split with it from about then on.
            await self.router.shared_written()
        if sess.store is not None:
            await sess.store.flush()    # SUBACK after the subscription rows are committed
        props = Properties(reason_string="; ".join(reasons)[:200]) if (reasons and self.v5) else Properties()
        self.write(Suback(p.packet_id, codes, props))
        for opts, _new in retained:
            try:
                messages = await self.router.retained(opts.inner)
            except Exception as exc:  # noqa: BLE001
                log.warning("MQTT %s: reading retained messages for %s failed: %s", self.client_id, opts.inner, exc)
                continue
            for msg in messages:
                if msg.expired():
                    continue
                qos = min(msg.qos, opts.qos)
                out = Outgoing(msg, qos, True, [opts.subscription_id] if opts.subscription_id else [])
                sess.persist_new(out)
                sess.enqueue(out)

    def _subscribe_plain(self, s: Any, sid: int | None, retained: list) -> tuple[ReasonCode, str]:
        try:
            opts = make_sub_options(s.topic_filter, s.qos, s.no_local, s.retain_as_published,
                                    s.retain_handling, sid)
        except InvalidArgument as exc:
            return RC.TOPIC_FILTER_INVALID, str(exc)
        if not self._allowed("consume", opts.inner, opts.share):
            return RC.NOT_AUTHORIZED, "not authorized"
        new = self.router.add_subscription(self.session, opts)
        if self.session.store is not None:
            self.session._store("sub_upsert", s.topic_filter, s.qos, bool(s.no_local), bool(s.retain_as_published),
                                s.retain_handling, sid, None)
        if opts.share is None and (opts.retain_handling == 0 or (opts.retain_handling == 1 and new)):
            retained.append((opts, new))
        return ReasonCode(s.qos), ""

    async def _subscribe_queue(self, s: Any, props: Properties, sid: int | None) -> tuple[ReasonCode, str]:
        try:
            queue, filt = split_queue_subscription(s.topic_filter)
        except InvalidArgument as exc:
            return RC.TOPIC_FILTER_INVALID, str(exc)
        up = dict(props.user_properties)
        group = up.get("consumer-group") or self.default_group
        if not self._allowed("consume", subscription(queue, filt), group):
            return RC.NOT_AUTHORIZED, "not authorized"
        position = up.get("x-stream-offset")
        info = self.manager.queue_info(queue)
        if info is None:
            await self.manager.reload_queues()
            info = self.manager.queue_info(queue)
        if info is not None and info.kind == "classic" and s.qos == 0:
            return RC.UNSPECIFIED_ERROR, "QoS 0 subscriptions to classic queues are refused (use QoS 1 or 2)"
        sess = self.session
        old = sess.queue_subs.pop(s.topic_filter, None)
        if old is not None:
            await old.close()
        qsub = QueueSub(sess, s.topic_filter, queue, filt, group, s.qos, position, sid)
        try:
            await qsub.open(self.manager, self._queue_credit())
        except (FluxError, ValueError) as exc:
            rc, _ = _flux_reason(exc)
            return (rc if rc != RC.QUOTA_EXCEEDED else RC.UNSPECIFIED_ERROR), str(exc)
        sess.queue_subs[s.topic_filter] = qsub
        if sess.store is not None:
            sess._store("sub_upsert", s.topic_filter, s.qos, False, False, 0, sid, group)
        return ReasonCode(s.qos), ""

    def _queue_credit(self) -> int:
        return max(1, min(self.send_quota, self.opt.queue_credit_cap))

    def _on_unsubscribe(self, p: Unsubscribe):
        # Plain filters are removed at once, in read order with _on_subscribe (an UNSUBSCRIBE
        # followed by a SUBSCRIBE of the same filter must leave it subscribed).
        sess = self.session
        plain: dict[int, ReasonCode] = {}
        for i, f in enumerate(p.topic_filters):
            if f not in sess.queue_subs:
                plain[i] = RC.SUCCESS if self.router.remove_subscription(sess, f) else RC.NO_SUBSCRIPTION_EXISTED
            if sess.store is not None:
                sess._store("sub_delete", f)
        return self._push(None, None, run=lambda: self._unsubscribe(p, plain))

    async def _unsubscribe(self, p: Unsubscribe, plain: dict) -> None:
        sess = self.session
        codes = []
        for i, f in enumerate(p.topic_filters):
            if i in plain:
                codes.append(plain[i])
                continue
            qsub = sess.queue_subs.pop(f, None)
            if qsub is not None:
                await qsub.close()
                codes.append(RC.SUCCESS)
            else:
                codes.append(RC.NO_SUBSCRIPTION_EXISTED)
        self.write(Unsuback(p.packet_id, codes))

    _HANDLERS: dict = {
        Publish: _on_publish, Puback: _on_puback, Pubrec: _on_pubrec, Pubrel: _on_pubrel,
        Pubcomp: _on_pubcomp, Subscribe: _on_subscribe, Unsubscribe: _on_unsubscribe,
        Pingreq: _on_pingreq, Disconnect: _on_disconnect, Connect: _on_connect, Auth: _on_auth,
    }


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _peer(writer: asyncio.StreamWriter) -> str | None:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else None


def _message_props(p: Properties) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FORWARDED:
        value = getattr(p, name)
        if value is not None:
            out[name] = value
    if p.user_properties:
        out["user_properties"] = list(p.user_properties)
    return out


def _expiry(p: Properties) -> float | None:
    return time.time() + p.message_expiry_interval if p.message_expiry_interval is not None else None


def _headers(props: dict[str, Any]) -> dict[str, Any] | None:
    """MQTT 5 properties as queue message headers (user properties flat; a repeated key keeps
    its last value)."""
    if not props:
        return None
    headers: dict[str, Any] = {}
    for k, v in props.get("user_properties", ()):
        headers[k] = v
    if props.get("content_type") is not None:
        headers["content-type"] = props["content_type"]
    if props.get("response_topic") is not None:
        headers["response-topic"] = props["response_topic"]
    if props.get("correlation_data") is not None:
        headers["correlation-data"] = props["correlation_data"].decode("utf-8", "backslashreplace")
    return headers or None


def _flux_reason(exc: BaseException) -> tuple[ReasonCode, str]:
    """The reason code of fluxpg/protocols/errors.py; an invalid topic says so (0x90)."""
    if isinstance(exc, (InvalidArgument, ValueError)) and "topic" in str(exc):
        return RC.TOPIC_NAME_INVALID, str(exc)
    if isinstance(exc, FluxError):
        return ReasonCode(reply_for(exc).mqtt), str(exc)
    if isinstance(exc, ValueError):
        return RC.IMPLEMENTATION_SPECIFIC_ERROR, str(exc)
    return RC.UNSPECIFIED_ERROR, str(exc) or type(exc).__name__


def _disconnect_code(rc: ReasonCode) -> ReasonCode:
    return rc if rc in DISCONNECT_CODES else RC.PROTOCOL_ERROR


def _log_failure(fut: asyncio.Future) -> None:
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        log.warning("MQTT background publish/ack failed: %s", exc)


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------

def _without_payload(p: Publish) -> Publish:
    """What an answer needs of a publish (topic, QoS, packet id), without its payload."""
    return Publish(p.topic, b"", p.qos, p.retain, p.dup, p.packet_id)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes, ctx: Any) -> None:
    router = await get_router(ctx)
    options = ctx.state.get("mqtt.options") or MqttOptions()
    conn = Connection(reader, writer, ctx, router, options)
    try:
        await conn.run(initial)
    except asyncio.CancelledError:
        # Server shutdown cancels connection tasks; run() has cleaned up. Returning normally keeps
        # asyncio's stream callback from logging the cancellation as an error.
        _flush(conn)
        return
    try:
        await asyncio.wait_for(conn.writer.drain(), 2)   # flushes what is pending first
    except (Exception, asyncio.CancelledError):  # noqa: BLE001
        pass
    _flush(conn)


def _flush(conn: Connection) -> None:
    """Hand what is still pending to the transport before the listener closes it."""
    flush = getattr(conn.writer, "flush", None)
    if flush is not None:
        try:
            flush()
        except Exception:  # noqa: BLE001 - the socket may be gone
            pass


__all__ = ["handle", "MqttOptions", "get_router", "Connection", "Session", "restore_session"]
