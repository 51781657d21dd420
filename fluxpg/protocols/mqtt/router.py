"""MQTT pub/sub for ordinary (non-`$queue/`) topics: subscriptions, sessions, retained messages,
and the relay that carries messages to the other fluxpg nodes sharing the database.

One `Router` per broker process (created on the first MQTT connection, kept in ctx.state).

* Local delivery is immediate and in publish order: `publish()` matches the topic against a
  `TopicTree` of every session's filters and hands each matching session one copy.
* Other nodes: when other live nodes exist (fluxpg.nodes), messages are batched into the UNLOGGED
  table `fluxpg.mqtt_relay` with one `NOTIFY fluxpg_mqtt '<node>:<first>:<last>'` per batch; the
  other nodes read exactly that id range (ids from a sequence do not commit in order, ranges do
  not care) and deliver locally. The publisher's PUBACK waits for that commit.
* Retained messages live in `fluxpg.mqtt_retained`, so every node and a restarted node see them;
  a SUBSCRIBE reads the rows under its filter's literal prefix and matches them in Python.
* Sessions live in the memory of the node that owns them; persistent ones (expiry > 0) are also
  written through to PostgreSQL (fluxpg.queues.mqtt_sessions: subscriptions, QoS 1/2 messages
  queued or in flight, inbound QoS 2 ids, the will, the expiry). A node adopts the sessions of
  dead nodes at start and in housekeeping (a restart or kill -9 loses nothing confirmed); a CONNECT
  on node B for a session node A owns asks A over NOTIFY fluxpg_mqtt_session to disconnect its
  client (0x8E) and hand the session over, then B loads it. The publisher's PUBACK/PUBREC waits
  for the rows of the persistent sessions its message was queued for.
* Offline persistent sessions get no row per message: a message matching any of them is appended
  ONCE to this node's stream of the shared offline log (fluxpg.mqtt_offline_log, `_log_append`),
  and each keeps a cursor range into that stream, opened when it goes offline here
  (Session.open_log) and closed at the stream position when it reconnects or moves
  (Session.close_log). Subscriptions do not change while a session is offline, so on reconnect
  its matching rows are exactly its messages: Session.replay puts them ahead of newer ones. One
  writer per node (the session store) applies appends and cursor changes in order, so a row is
  never visible before the cursors that read it. Housekeeping moves dormant cursors past rows
  their sessions do not match (SQL fluxpg.topic_matches) and deletes rows below every cursor.
* Shared subscriptions `$share/<group>/<filter>`: each message goes to one member of the group
  across all nodes (§4.8.2). `fluxpg.mqtt_shared` holds a row per (group, filter, node) while that
  node has members; every node keeps a copy in memory (`shared_nodes`), reloaded when the table's
  trigger sends NOTIFY fluxpg_mqtt_shared and every housekeeping round. Every message carries its
  publishing node and that node's own sequence number (the relay stores both), so every node
  computes the same owner -- a hash of (node, seq, group, filter) over the sorted node ids having
  members -- without asking the database; only the owner delivers, round robin over its local
  members. Change window: while a node joins or leaves a group (its row written, the NOTIFY not yet
  handled everywhere; a node dead but not yet past heartbeat_timeout) nodes may disagree, so a
  message may reach the group twice or not at all. A node whose first member just subscribed
  delivers to it only once the other nodes can see it (unless no node is listed yet: then it
  delivers, as a single node always does).
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from fluxpg.aio import cancel_and_wait
from fluxpg.errors import FluxError
from fluxpg.queues.mqtt_sessions import MqttSessionStore
from fluxpg.queues.mqtt_store import Channels
from fluxpg.topics import TopicTree, parse_shared, topic_matches

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

log = logging.getLogger("fluxpg.mqtt.router")

RELAY_CHANNEL = "fluxpg_mqtt"
SESSION_CHANNEL = "fluxpg_mqtt_session"   # '<owner>:<new node>:<client id>': hand a session over
HANDOVER_TIMEOUT = 5.0            # seconds a node waits for a session's owner to hand it over
SHARED_CHANNEL = "fluxpg_mqtt_shared"     # sent by fluxpg.mqtt_shared's trigger (sql/mqtt_shared.sql)
RELAY_KEEP = timedelta(seconds=60)    # relay rows older than this are pruned by their node
HOUSEKEEPING_INTERVAL = 2.0       # seconds between remote-node checks and prunes
RELAY_MAX_BATCH = 1000
MATCH_CACHE_MAX = 10_000          # topics whose matching subscriptions are remembered ...
MATCH_CACHE_TOPIC = 512           # ... if no longer than this (bounded memory whatever is published)
OFFLINE_QUEUE_LIMIT = 10_000      # QoS 1/2 messages kept for a disconnected persistent session
SHARED_RETRY = 1.0                # seconds before a failed shared-membership write is retried
_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash that is the same in every process
    (Python's hash() of a str is salted per process, so nodes would disagree)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _key_hash(share: str, inner: str) -> int:
    h = 0xCBF29CE484222325                      # FNV-1a over the group and filter, then mixed
    for byte in f"{share}\x00{inner}".encode():
        h = ((h ^ byte) * 0x100000001B3) & _M64
    return _mix64(h)


def shared_owner(nodes: tuple[int, ...], node: int, seq: int, key_hash: int) -> int:
    """The node that delivers message (node, seq) to a shared group, among `nodes` (sorted).

    Every node evaluates this with the same arguments, so exactly one of them delivers.
    """
    return nodes[_mix64(_mix64((node << 40) ^ seq) ^ key_hash) % len(nodes)]


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Message:
    """An application message on its way to subscribers.

    props holds the MQTT 5 properties forwarded unchanged (§3.3.2.3): content_type,
    response_topic, correlation_data (bytes), payload_format_indicator, user_properties (list of
    pairs). expires_at is wall-clock unix time (nodes share it), None = never.
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    props: dict[str, Any] = field(default_factory=dict)
    expires_at: float | None = None
    origin: str | None = None         # publisher's client id (no-local)
    node: int = 0                     # fluxpg.nodes.id of the node it was published on
    seq: int = 0                      # that node's message number: with node, picks shared owners

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at


def props_to_json(props: dict[str, Any]) -> str | None:
    if not props:
        return None
    out = dict(props)
    if out.get("correlation_data") is not None:
        out["correlation_data"] = base64.b64encode(out["correlation_data"]).decode("ascii")
    return json.dumps(out, separators=(",", ":"))


def props_from_json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    out = json.loads(text)
    if out.get("correlation_data") is not None:
        out["correlation_data"] = base64.b64decode(out["correlation_data"])
    if "user_properties" in out:
        out["user_properties"] = [tuple(p) for p in out["user_properties"]]
    return out


def _ts(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, timezone.utc) if value is not None else None


def _unix(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


_LIKE_SPECIAL = re.compile(r"([\\%_])")


def retained_like_pattern(topic_filter: str) -> str:
    """LIKE pattern selecting the topics a filter can match: its literal leading levels."""
    literal = []
    for level in topic_filter.split("/"):
        if level in ("+", "#"):
            break
        literal.append(level)
    else:
        return _LIKE_SPECIAL.sub(r"\\\1", topic_filter)       # no wildcard: exact topic
    prefix = "/".join(literal)
    if literal:
        prefix += "/"
    pattern = _LIKE_SPECIAL.sub(r"\\\1", prefix) + "%"
    if topic_filter.endswith("/#") and literal and len(literal) == len(topic_filter.split("/")) - 1:
        # `a/#` also matches `a` itself: widen to `a%` (the Python match sorts out the rest).
        pattern = _LIKE_SPECIAL.sub(r"\\\1", "/".join(literal)) + "%"
    return pattern


# --------------------------------------------------------------------------------------------
# Subscriptions
# --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class SubOptions:
    """One plain subscription of a session (the v5 subscription options, §3.8.3.1)."""

    topic_filter: str            # as subscribed, including any $share/<group>/ prefix
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None
    share: str | None = None     # shared subscription group
    inner: str = ""              # the filter without $share/<group>/


class Router:
    def __init__(self, manager: Any):
        self.manager = manager
        self.node_id: int = manager.node_id
        self.tree: TopicTree[tuple] = TopicTree()
        # topic -> _targets(topic), for topics published again while the subscriptions stay
        # as they are (every change of the tree empties it; at most MATCH_CACHE_MAX topics).
        self._matches: dict[str, tuple[tuple, tuple]] = {}
        self.sessions: dict[str, Session] = {}
        # (share, inner filter) -> client ids of members, in join order; round robin position
        self.shared: dict[tuple[str, str], list[str]] = {}
        self._rr: dict[tuple[str, str], int] = {}
        # (share, inner) -> sorted ids of the live nodes with members, as fluxpg.mqtt_shared says
        # (this node included once its own row is visible); hashes of the keys, cached
        self.shared_nodes: dict[tuple[str, str], tuple[int, ...]] = {}
        self._key_hashes: dict[tuple[str, str], int] = {}
        self._shared_dirty: dict[tuple[str, str], None] = {}     # ordered set: rows to write
        self._shared_waiters: list[asyncio.Future] = []
        self._shared_writing = False                             # a write is under way
        self._shared_wake = asyncio.Event()
        self._shared_reload = asyncio.Event()
        self._seq = itertools.count(1)
        self._reload_tickets = itertools.count(1)
        self._reload_applied = 0
        self.remote_nodes = 0
        self._writes: deque[tuple[str, Message, asyncio.Future | None]] = deque()
        self._write_wake = asyncio.Event()
        self._incoming: asyncio.Queue[str | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._listener: Channels | None = None
        self.closing = False
        # statistics
        self.relayed_out = 0
        self.relayed_in = 0
        self.qos0_dropped = 0          # QoS 0 messages not sent: the connection's write buffer was full
        self.offline_dropped = 0       # oldest offline messages dropped above the session bound
        self.slow_disconnects = 0      # connections ended with 0x97: over the session outbound bound
        # Outbound bounds (set from config.bounds by get_router; 0 = unbounded).
        self.outbound_messages = OFFLINE_QUEUE_LIMIT
        self.outbound_bytes = 0
        self.connection_outbound_bytes = 0
        self.store: MqttSessionStore | None = None
        self._handovers: set[asyncio.Task] = set()
        # The shared offline log (fluxpg.mqtt_offline_log): this node's stream position -- the seq
        # of the last message appended for offline sessions -- and the offline sessions whose
        # oldest messages went above the bound since the last housekeeping round.
        self.log_seq = 0
        # False: offline messages become rows of every session (fluxpg.mqtt_session_messages),
        # the design before the shared log; kept for benchmarks/mqtt_offline_broker.py to compare.
        self.offline_log = True
        self.offline_logged = 0        # messages appended to the offline log (once each)
        self._drops: dict[str, Session] = {}

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._refresh_nodes()
        self.store = self.manager.mqtt.session_store(self.node_id, self.manager.qm.heartbeat_timeout)
        self.store.start()
        self.log_seq = await self.store.offline_head()
        self._listener = self.manager.mqtt.listener({RELAY_CHANNEL: self._on_notify,
                                                        SHARED_CHANNEL: self._on_shared_notify,
                                                        SESSION_CHANNEL: self._on_session_notify})
        await self._listener.start()
        await self._reload_shared()
        await self.adopt_sessions()
        self._tasks = [
            asyncio.create_task(self._writer(), name="fluxpg-mqtt-relay-writer"),
            asyncio.create_task(self._reader(), name="fluxpg-mqtt-relay-reader"),
            asyncio.create_task(self._housekeeping(), name="fluxpg-mqtt-housekeeping"),
            asyncio.create_task(self._shared_syncer(), name="fluxpg-mqtt-shared-sync"),
            asyncio.create_task(self._shared_reloader(), name="fluxpg-mqtt-shared-reload"),
        ]

    async def close(self) -> None:
        self.closing = True
        # Let the writer finish what publishers were promised.
        self._write_wake.set()
        for sess in list(self.sessions.values()):
            sess.cancel_timers()
        deadline = time.monotonic() + 5
        while self._writes and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await cancel_and_wait(self._tasks)
        for fut in self._shared_waiters:
            if not fut.done():
                fut.set_result(None)
        self._shared_waiters.clear()
        await cancel_and_wait(list(self._handovers))
        if self.store is not None:
            await self.store.close()      # what sessions wrote reaches the database
        try:
            # Tell the other nodes at once that this node's members are gone (deregistering the
            # node would cascade too, but only once the queue manager closes).
            await self.manager.mqtt.execute("shared_clear_node", self.node_id)
        except Exception as exc:  # noqa: BLE001 - the node row's ON DELETE CASCADE still cleans up
            log.warning("removing this node's shared subscription groups failed: %s", exc)
        for _kind, _msg, fut in self._writes:
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError("broker shutting down"))
        self._writes.clear()
        if self._listener is not None:
            await self._listener.close()

    async def _refresh_nodes(self) -> None:
        timeout = self.manager.qm.heartbeat_timeout
        self.remote_nodes = await self.manager.mqtt.fetchval("remote_nodes", self.node_id, timeout)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL)
            try:
                await self._refresh_nodes()
                await self._reload_shared()
                await self.manager.mqtt.execute("relay_prune", self.node_id, RELAY_KEEP)
                await self.manager.mqtt.execute("retained_prune")
                await self._expire_stored()
                await self.adopt_sessions()
                self._save_drops()
                await self.store.offline_prune()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next round retries
                log.warning("MQTT housekeeping failed: %s", exc)

    # --- subscriptions ------------------------------------------------------------------------

    def add_subscription(self, sess: Session, opts: SubOptions) -> bool:
        """Register (or replace) a subscription; True if it is new for the session."""
        existed = opts.topic_filter in sess.subs
        if existed:
            self.remove_subscription(sess, opts.topic_filter)
        sess.subs[opts.topic_filter] = opts
        if opts.share is not None:
            key = (opts.share, opts.inner)
            members = self.shared.setdefault(key, [])
            if not members:
                self.tree.add(opts.inner, ("s", opts.share, opts.inner))
                self._matches.clear()
            if sess.client_id not in members:
                members.append(sess.client_id)
                self._shared_changed(key)
        else:
            self.tree.add(opts.inner, ("c", sess.client_id, opts.topic_filter))
            self._matches.clear()
        return not existed

    def remove_subscription(self, sess: Session, topic_filter: str) -> bool:
        opts = sess.subs.pop(topic_filter, None)
        if opts is None:
            return False
        if opts.share is not None:
            key = (opts.share, opts.inner)
            members = self.shared.get(key, [])
            if sess.client_id in members:
                members.remove(sess.client_id)
                self._shared_changed(key)
            if not members:
                self.shared.pop(key, None)
                self._rr.pop(key, None)
                self._key_hashes.pop(key, None)
                self.tree.remove(opts.inner, ("s", opts.share, opts.inner))
                self._matches.clear()
        else:
            self.tree.remove(opts.inner, ("c", sess.client_id, opts.topic_filter))
            self._matches.clear()
        return True

    def drop_session(self, sess: Session) -> None:
        for f in list(sess.subs):
            self.remove_subscription(sess, f)
        if self.sessions.get(sess.client_id) is sess:
            del self.sessions[sess.client_id]

    # --- durable sessions (fluxpg.queues.mqtt_sessions) ---------------------------------------

    async def fetch_session(self, client_id: str, load: bool = True) -> Session | None:
        """A session stored in the database but not in this node's memory: have its owner hand
        it over if that node is alive (it disconnects the client with 0x8E), then load it
        (load=False: a clean start; the stored state is deleted instead)."""
        from .session import restore_session

        owner = await self.store.owner(client_id)
        if owner is None:
            return None
        node, alive = owner
        if node is not None and node != self.node_id and alive:
            await self.store.notify_owner(node, client_id)
            deadline = time.monotonic() + HANDOVER_TIMEOUT
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                now = await self.store.owner(client_id)
                if now is None or now[0] == self.node_id or not now[1]:
                    break
            else:
                log.warning("MQTT %s: node %s did not hand the session over in %.0f s; taking it",
                            client_id, node, HANDOVER_TIMEOUT)
        if client_id in self.sessions:
            return self.sessions[client_id]
        await self.store.claim(client_id)
        if not load:
            self.store.submit("session_delete", client_id)
            return None
        data = await self.store.load(client_id)
        if data is None:
            return None
        return restore_session(self, client_id, data)

    async def adopt_sessions(self) -> None:
        """Take the sessions of dead nodes (a crash, a restart) into memory: offline, their
        expiry counting from their disconnect, their will published if a connection was
        attached when the node died."""
        from .session import restore_session, stored_will

        try:
            adopted = await self.store.adopt()
        except FluxError as exc:
            log.warning("adopting MQTT sessions failed: %s", exc)
            return
        except Exception as exc:  # noqa: BLE001 - housekeeping retries
            log.warning("adopting MQTT sessions failed: %s", exc)
            return
        wills: list[tuple[Message, int]] = []
        for client_id in adopted:
            if client_id in self.sessions:
                continue
            data = await self.store.load(client_id)
            if data is None:
                continue
            sess = restore_session(self, client_id, data)
            self.sessions[client_id] = sess
            sess.open_log()           # offline here from now on: its messages go to this node's stream
            row = data["session"]
            if row["connected"]:
                self.store.submit("session_disconnected", client_id, sess.expiry_interval)
                will = stored_will(client_id, row)
                if will is not None:
                    wills.append((will[0], min(will[1], sess.expiry_interval)))
            remaining = sess.expiry_interval - (row["offline_for"] or 0)
            if sess.expiry_interval < 0xFFFFFFFF:
                sess._expiry_timer = asyncio.get_running_loop().call_later(max(0.0, remaining), sess.end)
            log.info("MQTT: adopted the session of %s (%d messages)", client_id,
                     len(sess.inflight) + len(sess.outbox))
        # Wills only once every adopted session is back, so persistent subscribers get them too.
        for msg, delay in wills:
            if delay <= 0:
                self._publish_will(msg)
            else:
                asyncio.get_running_loop().call_later(delay, self._publish_will, msg)

    def _publish_will(self, msg: Message) -> None:
        if self.closing:
            return
        fut = self.publish(msg)
        if fut is not None:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _expire_stored(self) -> None:
        for client_id in await self.store.expired():
            sess = self.sessions.get(client_id)
            if sess is not None and sess.conn is None:
                sess.stored = False
                sess.end()

    def _on_session_notify(self, payload: str | None) -> None:
        if payload is None:
            return
        try:
            owner, new, client_id = payload.split(":", 2)
            owner_id, new_id = int(owner), int(new)
        except ValueError:
            log.warning("ignoring malformed %s notification %r", SESSION_CHANNEL, payload)
            return
        if owner_id != self.node_id or new_id == self.node_id:
            return
        task = asyncio.create_task(self._hand_over(client_id, new_id), name=f"fluxpg-mqtt-handover-{client_id}")
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)

    async def _hand_over(self, client_id: str, new_node: int) -> None:
        """Another node got a CONNECT for a session of ours: disconnect our client (0x8E), let
        its state reach the database, and pass ownership on."""
        sess = self.sessions.get(client_id)
        if sess is not None:
            if sess.conn is not None:
                await sess.conn.takeover()
            sess.cancel_timers()
            if self.sessions.get(client_id) is sess:
                self.drop_session(sess)
            closed = sess.close_log()     # this node's stream ends here for the session
            if closed is not None:        # claim() below waits for it (ordered writes)
                closed.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await self.store.claim(client_id, new_node)
        except Exception as exc:  # noqa: BLE001 - the other node takes it after its timeout
            log.warning("MQTT %s: handing the session to node %s failed: %s", client_id, new_node, exc)
        log.info("MQTT %s: session handed over to node %s", client_id, new_node)

    # --- publish ------------------------------------------------------------------------------

    def publish(self, msg: Message) -> asyncio.Future | None:
        """Deliver on this node now; store retained / relay to other nodes in the background.

        Returns a future that resolves when what the publisher must wait for (retained store,
        relay to other nodes) has committed, or None when nothing needs the database.
        """
        msg.node = self.node_id
        msg.seq = next(self._seq)
        waits: list[asyncio.Future] = []
        self.route(msg, waits)
        fut: asyncio.Future | None = None
        if msg.retain:
            fut = asyncio.get_running_loop().create_future()
            self._writes.append(("retain", msg, fut))
            self._write_wake.set()
        if self.remote_nodes:
            rfut = asyncio.get_running_loop().create_future()
            self._writes.append(("relay", msg, rfut))
            self._write_wake.set()
            fut = rfut  # the writer handles items in order: the later future covers both
        if waits:
            # Rows of persistent sessions the message was queued for: confirmed only once stored.
            fut = asyncio.gather(*waits) if fut is None else asyncio.gather(fut, *waits)
        return fut

    def _targets(self, topic: str) -> tuple[tuple, tuple]:
        """Who a topic's messages go to, as the tree says now: ((client id, (filter, ...)), ...)
        for plain subscriptions, grouped by session in match order, and the ((share, inner), ...)
        shared groups. Remembered per topic until the tree changes."""
        targets = self._matches.get(topic)
        if targets is None:
            by_session: dict[str, list[str]] = {}
            shared = []
            for value in self.tree.match(topic):
                if value[0] == "c":
                    by_session.setdefault(value[1], []).append(value[2])
                else:
                    shared.append((value[1], value[2]))
            targets = (tuple((cid, tuple(filts)) for cid, filts in by_session.items()), tuple(shared))
            if len(topic) <= MATCH_CACHE_TOPIC:
                if len(self._matches) >= MATCH_CACHE_MAX:
                    self._matches.clear()
                self._matches[topic] = targets
        return targets

    def route(self, msg: Message, waits: list | None = None) -> int:
        """Hand msg to every matching local session; returns how many got it. The commits of
        rows stored for persistent sessions are appended to `waits`."""
        plain, shared = self._targets(msg.topic)
        if not plain and not shared:
            return 0
        if msg.expires_at is not None and msg.expired():
            return 0
        delivered = 0
        for share, inner in shared:
            # Shared: one member of the group gets it, as its own delivery (§4.8.2).
            if not self._owns_shared((share, inner), msg):
                continue        # another node delivers it to this group
            target = self._pick_shared((share, inner))
            opts = target.subs.get(f"$share/{share}/{inner}") if target is not None else None
            if opts is not None:
                fut = target.deliver_plain(msg, [opts])
                if fut is not None and waits is not None:
                    waits.append(fut)
                delivered += 1
        seq = 0
        sessions = self.sessions
        for cid, filts in plain:
            sess = sessions.get(cid)
            if sess is None:
                continue
            subs = sess.subs
            opts_list = []
            for filt in filts:
                opts = subs.get(filt)
                if opts is not None and not (opts.no_local and msg.origin == cid):
                    opts_list.append(opts)
            if not opts_list:
                continue
            delivered += 1
            if sess.log_open and sess.conn is None and self.offline_log:
                # Offline persistent session: the message goes to the shared offline log, once
                # for all of them; the session replays it from there when it reconnects.
                if min(msg.qos, max(o.qos for o in opts_list)):
                    if not seq:
                        seq = self._log_append(msg, waits)
                    sess.logged(seq, len(msg.payload))
                continue
            # Overlapping subscriptions of one session: one copy, highest QoS, every identifier.
            fut = sess.deliver_plain(msg, opts_list)
            if fut is not None and waits is not None:
                waits.append(fut)
        return delivered

    def _log_append(self, msg: Message, waits: list | None) -> int:
        """Append msg to this node's offline stream; the commit's future goes to `waits` (the
        publisher's PUBACK waits for it). The store applies it after every cursor opened before
        it, in one ordered write-through, so the row is never visible without its readers."""
        self.log_seq += 1
        self.offline_logged += 1
        fut = self.store.submit("offline_append", self.node_id, self.log_seq, msg.topic, msg.payload, msg.qos,
                                msg.retain, props_to_json(msg.props), _ts(msg.expires_at), msg.origin,
                                wait=waits is not None)
        if fut is not None:
            waits.append(fut)
        return self.log_seq

    def dropped_offline(self, sess: Session) -> None:
        """sess dropped its oldest offline messages: move its cursor in the next housekeeping
        round (one write per session per round, however many were dropped)."""
        self._drops[sess.client_id] = sess

    def _save_drops(self) -> None:
        drops, self._drops = self._drops, {}
        for cid, sess in drops.items():
            if sess.log_open and sess.drop_unsaved and self.sessions.get(cid) is sess:
                self.store.submit("cursor_advance", cid, self.node_id, sess.drop_to, sess.drop_unsaved)
                sess.drop_unsaved = 0

    def _owns_shared(self, key: tuple[str, str], msg: Message) -> bool:
        """Does this node deliver msg to shared group `key` (this node has members of it)?"""
        nodes = self.shared_nodes.get(key)
        if not nodes:
            # No node is listed yet (this node's first member has not been written, or the
            # database is unreachable): deliver, as a single node does.
            return True
        if len(nodes) == 1:
            # Only this node: its own. Only another: this node's members are not visible to the
            # others yet, so that node takes every message; this one takes none (no duplicates).
            return nodes[0] == self.node_id
        kh = self._key_hashes.get(key)
        if kh is None:
            kh = self._key_hashes[key] = _key_hash(*key)
        return shared_owner(nodes, msg.node, msg.seq, kh) == self.node_id

    def _pick_shared(self, key: tuple[str, str]) -> Session | None:
        """Round robin over the group's members, preferring connected sessions."""
        members = self.shared.get(key)
        if not members:
            return None
        n = len(members)
        start = self._rr.get(key, 0) % n
        fallback = None
        for i in range(n):
            sess = self.sessions.get(members[(start + i) % n])
            if sess is None:
                continue
            if sess.conn is not None and sess.conn.can_send():
                self._rr[key] = (start + i + 1) % n
                return sess
            if fallback is None:
                fallback = sess
        self._rr[key] = (start + 1) % n
        return fallback

    # --- retained -----------------------------------------------------------------------------

    async def retained(self, topic_filter: str) -> list[Message]:
        rows = await self.manager.mqtt.fetch("retained_prefix",
                                             retained_like_pattern(topic_filter))
        out = []
        for r in rows:
            if topic_matches(topic_filter, r["topic"]):
                out.append(Message(r["topic"], bytes(r["payload"]), r["qos"], True,
                                   props_from_json(r["props"]), _unix(r["expires_at"])))
        return out

    # --- the relay writer (retained store + cross-node relay), one batch at a time ------------

    async def _writer(self) -> None:
        while True:
            await self._write_wake.wait()
            self._write_wake.clear()
            while self._writes:
                batch = []
                while self._writes and len(batch) < RELAY_MAX_BATCH:
                    batch.append(self._writes.popleft())
                try:
                    await self._write_batch(batch)
                except asyncio.CancelledError:
                    for _k, _m, fut in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(ConnectionError("broker shutting down"))
                    raise
                except Exception as exc:  # noqa: BLE001 - publishers are told
                    log.warning("MQTT relay/retained write failed: %s", exc)
                    for _k, _m, fut in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(exc)
                    continue
                for _k, _m, fut in batch:
                    if fut is not None and not fut.done():
                        fut.set_result(None)

    async def _write_batch(self, batch: list) -> None:
        # One transaction: the batch's retained updates and relay rows commit together.
        async with self.manager.mqtt.transaction() as conn:
            relay = []
            for kind, msg, _fut in batch:
                if kind == "retain":
                    if msg.payload:
                        await conn.execute("retain_set", msg.topic, msg.payload, msg.qos,
                                           props_to_json(msg.props), _ts(msg.expires_at), self.node_id)
                    else:
                        await conn.execute("retain_clear", msg.topic)
                else:
                    relay.append(msg)
            if relay:
                await conn.execute(
                    "relay_insert", self.node_id,
                    [m.origin for m in relay], [m.topic for m in relay], [m.payload for m in relay],
                    [m.qos for m in relay], [m.retain for m in relay],
                    [props_to_json(m.props) for m in relay], [_ts(m.expires_at) for m in relay],
                    [m.seq for m in relay])
                self.relayed_out += len(relay)

    # --- the relay reader ---------------------------------------------------------------------

    def _on_notify(self, payload: str | None) -> None:
        if payload is not None:
            self._incoming.put_nowait(payload)

    async def _reader(self) -> None:
        while True:
            payload = await self._incoming.get()
            try:
                node, first, last = (int(x) for x in payload.split(":"))
            except ValueError:
                log.warning("ignoring malformed %s notification %r", RELAY_CHANNEL, payload)
                continue
            if node == self.node_id:
                continue
            if not self.remote_nodes:
                self.remote_nodes = 1   # somebody else is alive: relay to it from now on
            try:
                rows = await self.manager.mqtt.fetch("relay_range", first, last, node)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("reading relayed MQTT messages %s failed: %s", payload, exc)
                continue
            for r in rows:
                self.relayed_in += 1
                self.route(Message(r["topic"], bytes(r["payload"]), r["qos"], r["retain"],
                                   props_from_json(r["props"]), _unix(r["expires_at"]), r["origin"],
                                   node, r["seq"]))

    # --- shared groups across nodes (fluxpg.mqtt_shared) ---------------------------------------

    def _shared_changed(self, key: tuple[str, str]) -> None:
        self._shared_dirty[key] = None
        self._shared_wake.set()

    def shared_written(self) -> asyncio.Future:
        """Resolves once this node's shared-group changes made so far are in the database (or the
        write failed and will be retried): SUBACK waits for it, so that after it the other nodes
        learn of the new member within one NOTIFY."""
        fut = asyncio.get_running_loop().create_future()
        if (not self._shared_dirty and not self._shared_writing) or self.closing:
            fut.set_result(None)
        else:
            self._shared_waiters.append(fut)
            self._shared_wake.set()
        return fut

    async def _shared_syncer(self) -> None:
        """Writes this node's member count of each changed group: first member inserts the row,
        last one deletes it (the table's trigger tells every node), others update the count."""
        while True:
            await self._shared_wake.wait()
            self._shared_wake.clear()
            if not self._shared_dirty:
                waiters, self._shared_waiters = self._shared_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
                continue
            keys = list(self._shared_dirty)
            self._shared_dirty.clear()
            waiters, self._shared_waiters = self._shared_waiters, []
            self._shared_writing = True
            failed = False
            try:
                async with self.manager.mqtt.transaction() as conn:  # all changed groups at once
                    for share, inner in keys:
                        count = len(self.shared.get((share, inner), ()))
                        if count:
                            await conn.execute("shared_set", share, inner, self.node_id, count)
                        else:
                            await conn.execute("shared_clear", share, inner, self.node_id)
            except asyncio.CancelledError:
                for key in keys:
                    self._shared_dirty.setdefault(key, None)
                self._shared_waiters[:0] = waiters
                raise
            except Exception as exc:  # noqa: BLE001 - retried; until then the other nodes lag
                log.warning("writing shared subscription groups failed (retrying): %s", exc)
                for key in keys:
                    self._shared_dirty.setdefault(key, None)
                # Nobody waits for the retry: SUBACKs go out, the members count locally.
                waiters += self._shared_waiters
                self._shared_waiters = []
                failed = True
                asyncio.get_running_loop().call_later(SHARED_RETRY, self._shared_wake.set)
            finally:
                self._shared_writing = False
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            if not failed and (self._shared_dirty or self._shared_waiters):
                self._shared_wake.set()

    def _on_shared_notify(self, _payload: str | None) -> None:
        # Any change (or a LISTEN reconnect, payload None): reload the whole small table.
        self._shared_reload.set()

    async def _shared_reloader(self) -> None:
        while True:
            await self._shared_reload.wait()
            self._shared_reload.clear()
            try:
                await self._reload_shared()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - housekeeping reloads again
                log.warning("reloading shared subscription groups failed: %s", exc)

    async def _reload_shared(self) -> None:
        # Housekeeping and the NOTIFY reloader may overlap: a reload started earlier (an older
        # snapshot) must not replace the result of one started later.
        ticket = next(self._reload_tickets)
        rows = await self.manager.mqtt.fetch("shared_nodes", self.manager.qm.heartbeat_timeout)
        if ticket < self._reload_applied:
            return
        self._reload_applied = ticket
        nodes = {(r["share_group"], r["filter"]): tuple(r["nodes"]) for r in rows}
        self.shared_nodes = nodes
        if not self.remote_nodes and any(n != self.node_id for ids in nodes.values() for n in ids):
            # Another node has shared members: it must get this node's messages from now on,
            # without waiting for the next remote_nodes count.
            self.remote_nodes = 1


def make_sub_options(topic_filter: str, qos: int, no_local: bool, rap: bool, rh: int,
                     sid: int | None) -> SubOptions:
    """Parse a plain (non-$queue/) filter; raises InvalidArgument for a bad one."""
    share, inner = parse_shared(topic_filter)
    return SubOptions(topic_filter, qos, no_local, rap, rh, sid, share, inner)


__all__ = ["Router", "Message", "SubOptions", "make_sub_options", "retained_like_pattern",
           "shared_owner"]
