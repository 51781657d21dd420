"""AMQP 0-9-1 connection: handshake (PLAIN), tuning, heartbeats, channel multiplexing, errors.

`Connection` is the state machine: frames in (`handle_frame`), bytes out through a transport with
`write(bytes)`. `handle()` at the bottom is the thin asyncio adapter the listener calls: it reads
the socket, splits frames (framing.FrameDecoder) and feeds them in order — one ordered pipeline
per connection (FACTS.md) — and sends/checks heartbeats.

Errors follow the spec and RabbitMQ: a channel exception closes that channel only
(channel.close with the reply code); a connection exception (bad frame 501, wrong-state method
503, frame on a channel never opened 504, unexpected content frame 505, …) sends connection.close
and waits briefly for close-ok; a failed login is connection.close 403 ACCESS_REFUSED
(capability `authentication_failure_close`). Other connections are never affected.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from pamqp import commands

from fluxpg import connections
from fluxpg.auth import AuthError, OpenAuthenticator
from fluxpg import bounds
from fluxpg.protocols.writes import CoalescingWriter
from fluxpg.protocols import prescan
from fluxpg.protocols.amqp091 import framing
from fluxpg.protocols.amqp091.channel import Channel
from fluxpg.protocols.amqp091.exchanges import ExchangeTable
from fluxpg.protocols.amqp091.framing import (ACCESS_REFUSED, CHANNEL_ERROR, COMMAND_INVALID, CONNECTION_FORCED,
                                              FRAME_ERROR, FRAME_HEARTBEAT, FRAME_METHOD, MIN_FRAME_MAX,
                                              NOT_ALLOWED, AMQPError, FrameError, connection_error)

log = logging.getLogger("fluxpg.amqp091")

Conn = commands.Connection

SERVER_FRAME_MAX = 131072
SERVER_CHANNEL_MAX = 2047
SERVER_HEARTBEAT = 60
HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 3.0          # how long we wait for close-ok after sending connection.close
VERSION = "0.1"

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

_ids = itertools.count(1)


class Connection:
    def __init__(self, ctx: Any, transport: Any, peer: str = "?"):
        self.ctx = ctx
        self.transport = transport
        # CoalescingWriter.buffer_size: the transport's buffer plus what is not handed over yet
        self._buffer_size = getattr(transport, "buffer_size", None)
        self.id = next(_ids)
        self.name = f"#{self.id} {peer}"
        self.peer = peer
        self.state = "start"     # start → tune → open-wait → open → closing → closed
        self.frame_max = MIN_FRAME_MAX
        self.channel_max = SERVER_CHANNEL_MAX
        self.heartbeat = 0
        self.principal = None
        self.vhost = "/"
        self.client_properties: dict[str, Any] = {}
        self.channels: dict[int, Channel] = {}
        self.exchanges = ExchangeTable()
        # Exclusive (transient) queues this connection declared: deleted when it ends.
        self.exclusive_queues: set[str] = set()
        self.reserved_queues = {q.name for q in ctx.config.effective_queues() if q.reserved} \
            if ctx.config is not None else set()
        self.finished = False
        self.close_deadline: float | None = None
        # Memory bounds (config `bounds:`): partially received / unconfirmed bodies of all
        # channels, and unsent bytes above which deliveries wait for the client to read.
        self.inbound = bounds.connection_inbound(ctx)
        self.outbound_limit = bounds.connection_outbound_limit(ctx) or 2 ** 62
        loop = asyncio.get_running_loop()
        self._time = loop.time   # per write: no get_running_loop() (a getpid system call) each time
        self.last_sent = loop.time()

    # ------------------------------------------------------------------ I/O helpers

    def write(self, data: bytes) -> None:
        if self.state == "closed" or self.transport.is_closing():
            return
        self.transport.write(data)
        self.last_sent = self._time()

    def write_buffer_size(self) -> int:
        if self._buffer_size is not None:
            return self._buffer_size()
        t = getattr(self.transport, "transport", None)
        return t.get_write_buffer_size() if t is not None else 0

    async def drain_writes(self) -> None:
        try:
            await self.transport.drain()
        except (ConnectionError, RuntimeError):
            pass

    def client_capability(self, name: str) -> bool:
        caps = self.client_properties.get("capabilities") or {}
        return bool(caps.get(name)) if isinstance(caps, dict) else False

    def drop_channel(self, channel_id: int) -> None:
        self.channels.pop(channel_id, None)

    # ------------------------------------------------------------------ handshake

    def start(self) -> None:
        props = {
            "product": "fluxpg", "version": VERSION, "platform": "Python/asyncio",
            "information": "fluxpg: a message broker whose log is PostgreSQL",
            "capabilities": dict(SERVER_CAPABILITIES),
        }
        self.write(framing.method_frame(0, Conn.Start(0, 9, props, "PLAIN", "en_US")))

    async def _start_ok(self, m: Conn.StartOk) -> None:
        self.client_properties = dict(m.client_properties or {})
        if m.mechanism != "PLAIN":
            raise connection_error(ACCESS_REFUSED, f"unsupported authentication mechanism '{m.mechanism}' "
                                   "(PLAIN is)", m)
        response = m.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        parts = bytes(response).split(b"\x00")
        if len(parts) != 3:
            raise connection_error(ACCESS_REFUSED, "malformed PLAIN response", m)
        user = parts[1].decode("utf-8", "replace")
        password = parts[2].decode("utf-8", "replace")
        auth = self.ctx.auth or OpenAuthenticator()
        try:
            self.principal = await auth.authenticate(user or None, password, protocol="amqp091", peer=self.peer)
        except AuthError as exc:
            log.info("amqp091 %s: login of %r refused: %s", self.name, user, exc)
            raise connection_error(ACCESS_REFUSED, "Login was refused using authentication mechanism PLAIN. "
                                   "For details see the broker logfile.", m) from None
        if (info := connections.current()) is not None:   # the console's list of connections
            info.user = self.principal.username
        self.state = "tune"
        self.write(framing.method_frame(0, Conn.Tune(SERVER_CHANNEL_MAX, SERVER_FRAME_MAX, SERVER_HEARTBEAT)))

    def _tune_ok(self, m: Conn.TuneOk) -> None:
        frame_max = m.frame_max or SERVER_FRAME_MAX
        if frame_max < MIN_FRAME_MAX or frame_max > SERVER_FRAME_MAX:
            raise connection_error(FRAME_ERROR, f"frame_max {m.frame_max} outside {MIN_FRAME_MAX}..{SERVER_FRAME_MAX}", m)
        self.frame_max = frame_max
        self.channel_max = min(m.channel_max or SERVER_CHANNEL_MAX, SERVER_CHANNEL_MAX)
        self.heartbeat = m.heartbeat or 0
        self.state = "open-wait"

    def _open(self, m: Conn.Open) -> None:
        # fluxpg has one namespace of queues: "/" and the vhosts the config names
        # (amqp091.virtual_hosts) all reach it; any other is refused as RabbitMQ refuses a vhost
        # that does not exist (530, pika: ProbableAccessDeniedError).
        vhost = m.virtual_host or "/"
        amqp091 = getattr(self.ctx.config, "amqp091", None) if self.ctx.config is not None else None
        accepted = amqp091.accepts(vhost) if amqp091 is not None else vhost == "/"
        if not accepted:
            raise connection_error(NOT_ALLOWED, f"vhost {vhost} not found (fluxpg accepts '/' and "
                                   "amqp091.virtual_hosts of its config)", m)
        self.vhost = vhost
        self.state = "open"
        self.write(framing.method_frame(0, Conn.OpenOk()))
        connections.logged_in()   # the listener's handshake deadline no longer applies

    async def _update_secret(self, m: Conn.UpdateSecret) -> None:
        """A new secret (e.g. a refreshed token) for the logged-in user: checked like the login
        was; refused is connection.close 403, as RabbitMQ does. The new principal's permissions
        apply from now on."""
        secret = m.new_secret
        if isinstance(secret, (bytes, bytearray)):
            secret = bytes(secret).decode("utf-8", "replace")
        user = self.principal.username if self.principal is not None else None
        auth = self.ctx.auth or OpenAuthenticator()
        try:
            principal = await auth.authenticate(user, secret, protocol="amqp091", peer=self.peer)
        except AuthError as exc:
            log.info("amqp091 %s: update-secret of %r refused: %s", self.name, user, exc)
            raise connection_error(ACCESS_REFUSED, "New secret was refused by one of the backends", m) from None
        if principal.username != user:
            raise connection_error(ACCESS_REFUSED, "New secret belongs to another user", m)
        self.principal = principal
        log.info("amqp091 %s: secret of %r updated (%s)", self.name, user, m.reason)
        self.write(framing.method_frame(0, Conn.UpdateSecretOk()))

    # ------------------------------------------------------------------ frames

    def fast_frame(self, frame: framing.Frame) -> bool:
        """The frames a client sends per message (basic.ack; basic.publish, its content header
        and body) handled at once, without handle_frame's chain of coroutines; False: handle_frame
        must take it. An AMQPError or FrameError raised here goes to `failed`, as in handle_frame."""
        if self.state != "open" or frame.channel == 0:
            return False
        channel = self.channels.get(frame.channel)
        if channel is None:
            return False
        if frame.type == FRAME_METHOD:
            fields = framing.ack_fields(frame.payload)
            if fields is not None:
                return channel.fast_ack(*fields)
        return channel.fast_content(frame)

    async def handle_frame(self, frame: framing.Frame) -> None:
        try:
            await self._handle_frame(frame)
        except (AMQPError, FrameError) as exc:
            await self.failed(exc)

    async def failed(self, exc: AMQPError | FrameError) -> None:
        """A connection exception raised while handling a frame: connection.close."""
        if isinstance(exc, FrameError):
            await self.close_with(connection_error(exc.code, str(exc)))
            return
        if exc.channel:   # a channel error escaped its channel (cannot happen on channel 0)
            exc = connection_error(exc.code, exc.text, exc.method)
        await self.close_with(exc)

    async def _handle_frame(self, frame: framing.Frame) -> None:
        if self.state == "closing":
            # We sent connection.close: only close-ok (or a crossing close) matters now.
            if frame.channel == 0 and frame.type == FRAME_METHOD:
                method = framing.decode_method(frame.payload)
                if isinstance(method, Conn.Close):
                    self.write(framing.method_frame(0, Conn.CloseOk()))
                    self.finished = True
                elif isinstance(method, Conn.CloseOk):
                    self.finished = True
            return
        if frame.type == FRAME_HEARTBEAT:
            if frame.channel != 0:
                raise connection_error(FRAME_ERROR, f"heartbeat frame on channel {frame.channel}")
            return
        if frame.channel == 0:
            if frame.type != FRAME_METHOD:
                raise connection_error(COMMAND_INVALID, f"content frame (type {frame.type}) on channel 0")
            return await self._connection_method(framing.decode_method(frame.payload))
        if self.state != "open":
            raise connection_error(COMMAND_INVALID, f"frame on channel {frame.channel} before the connection is open")
        channel = self.channels.get(frame.channel)
        if channel is None:
            method = framing.decode_method(frame.payload) if frame.type == FRAME_METHOD else None
            if not isinstance(method, commands.Channel.Open):
                what = method.name if method is not None else f"a frame of type {frame.type}"
                raise connection_error(CHANNEL_ERROR, f"expected 'channel.open' on channel {frame.channel}, got {what}",
                                       method)
            if frame.channel > self.channel_max:
                raise connection_error(CHANNEL_ERROR, f"channel {frame.channel} is above channel_max "
                                       f"{self.channel_max}", method)
            self.channels[frame.channel] = Channel(self, frame.channel)
            self.write(framing.method_frame(frame.channel, commands.Channel.OpenOk()))
            return
        if frame.type == FRAME_METHOD and frame.payload[:4] == b"\x00\x14\x00\x0a":   # channel.open again
            raise connection_error(CHANNEL_ERROR, f"second 'channel.open' seen on channel {frame.channel}",
                                   commands.Channel.Open)
        await channel.handle_frame(frame)

    async def _connection_method(self, m) -> None:
        expected = {"start": Conn.StartOk, "tune": Conn.TuneOk, "open-wait": Conn.Open}.get(self.state)
        if isinstance(m, Conn.Close):
            self.write(framing.method_frame(0, Conn.CloseOk()))
            await self._release_channels()
            self.finished = True
            return
        if expected is not None:
            if not isinstance(m, expected):
                raise connection_error(COMMAND_INVALID, f"expected {expected.name}, got {m.name}", m)
            if self.state == "start":
                await self._start_ok(m)
            elif self.state == "tune":
                self._tune_ok(m)
            else:
                self._open(m)
            return
        if isinstance(m, Conn.CloseOk):
            raise connection_error(COMMAND_INVALID, "connection.close-ok without connection.close", m)
        if isinstance(m, Conn.UpdateSecret):
            return await self._update_secret(m)
        raise connection_error(COMMAND_INVALID, f"{m.name} is not valid on channel 0 of an open connection", m)

    # ------------------------------------------------------------------ closing

    async def close_with(self, err: AMQPError) -> None:
        """Send connection.close for a connection exception; wait for close-ok (adapter)."""
        if self.state in ("closing", "closed"):
            return
        log.info("amqp091 %s: closing connection with %d %s", self.name, err.code, err.text)
        class_id, method_id = err.ids
        self.write(framing.method_frame(0, Conn.Close(err.code, err.reply_text, class_id, method_id)))
        self.state = "closing"
        self.close_deadline = asyncio.get_running_loop().time() + CLOSE_TIMEOUT
        await self._release_channels()

    async def _release_channels(self) -> None:
        channels = list(self.channels.values())
        self.channels.clear()
        for ch in channels:
            await ch.connection_lost()
        # After the channels requeued what they held: an exclusive queue goes with its connection.
        exclusive, self.exclusive_queues = self.exclusive_queues, set()
        for name in exclusive:
            try:
                await self.ctx.manager.delete_transient(name)
            except Exception as exc:  # noqa: BLE001 - it goes with the node at the latest
                log.warning("amqp091 %s: deleting exclusive queue %r failed: %s", self.name, name, exc)

    @property
    def owner(self) -> str:
        """This connection as the owner of exclusive queues (unique across nodes)."""
        return f"{self.ctx.manager.node_id}:{self.id}"

    async def shutdown(self) -> None:
        """The socket is gone or the handler is ending: release everything."""
        await self._release_channels()
        self.state = "closed"
        self.inbound.close()   # whatever is still counted (a publish still appending) is ours no more


async def _heartbeats(conn: Connection) -> None:
    """Send a heartbeat when nothing was sent for half the interval (RabbitMQ's rhythm)."""
    loop = asyncio.get_running_loop()
    while True:
        interval = conn.heartbeat
        if not interval or conn.state != "open":
            await asyncio.sleep(1.0)
            continue
        await asyncio.sleep(interval / 2)
        if loop.time() - conn.last_sent >= interval / 2 - 0.05:
            conn.write(framing.heartbeat_frame())


class _ReadDeadline:
    """asyncio.timeout for the reads of one connection without a timer per read: one timer,
    moved only when a read's deadline comes before it, re-armed when it fires early (the common
    case: each read pushes the deadline later). On expiry it cancels the reading task, as
    asyncio.timeout does; `expired()` tells that cancellation from any other."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._task = asyncio.current_task()
        self._base = self._task.cancelling()
        self._deadline: float | None = None   # of the current read (None: none)
        self._at = 0.0                        # when the timer fires
        self._timer: asyncio.TimerHandle | None = None
        self._fired = False
        self.reading = False

    def arm(self, timeout: float | None) -> None:
        """Before a read: it may take `timeout` seconds (None: forever)."""
        self.reading = True
        if timeout is None:
            self._deadline = None
            return
        deadline = self._deadline = self._loop.time() + timeout
        if self._timer is None or deadline < self._at:
            if self._timer is not None:
                self._timer.cancel()
            self._at = deadline
            self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if not self.reading or deadline is None:
            return   # the next arm() sets a timer again
        if deadline <= self._at:
            self._fired = True
            self._task.cancel()
        else:
            self._at = deadline
            self._timer = self._loop.call_at(deadline, self._fire)

    def expired(self) -> bool:
        """After a CancelledError out of a read: True when the deadline caused it (and nothing
        else asked to cancel the task meanwhile); the cancellation is then taken back."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._base

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes, ctx: Any) -> None:
    peername = writer.get_extra_info("peername")
    peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername)
    if initial[:8] != framing.PROTOCOL_HEADER:
        writer.write(framing.PROTOCOL_HEADER)
        await writer.drain()
        return
    # Writes of one event-loop turn go out as one send() (fluxpg/protocols/writes.py): a batch of
    # deliveries was one system call each.
    conn = Connection(ctx, CoalescingWriter(writer), peer)
    decoder = framing.FrameDecoder(SERVER_FRAME_MAX, prescan.Limits.from_config(ctx.config))
    loop = asyncio.get_running_loop()
    settings = getattr(ctx.config, "bounds", None)
    frame_timeout = settings.frame_timeout.total_seconds() if settings is not None else 0.0
    frame_started: float | None = None   # when the first byte of the incomplete frame arrived
    conn.start()
    beat = asyncio.create_task(_heartbeats(conn), name=f"amqp091-heartbeat-{conn.id}")
    watch = _ReadDeadline(loop)
    try:
        while not conn.finished:
            if conn.state == "closing":
                timeout = max(conn.close_deadline - loop.time(), 0.0)
            elif conn.state != "open":
                timeout = HANDSHAKE_TIMEOUT
            elif conn.heartbeat:
                timeout = 2 * conn.heartbeat   # two missed intervals: the peer is gone
            else:
                timeout = None
            if frame_started is not None and frame_timeout and conn.state != "closing":
                # Absolute from the frame's first byte: trickling bytes does not extend it.
                left = max(frame_started + frame_timeout - loop.time(), 0.0)
                timeout = left if timeout is None else min(timeout, left)
            # _ReadDeadline, not asyncio.timeout or wait_for: no timer (or task) per read.
            watch.arm(timeout)
            try:
                data = await reader.read(65536)
            except asyncio.CancelledError:
                if not watch.expired():
                    raise   # not the deadline's: server shutdown (below)
                data = None
            finally:
                watch.reading = False
            if data is None:   # the read's deadline passed
                if (frame_started is not None and frame_timeout and conn.state != "closing"
                        and loop.time() - frame_started >= frame_timeout):
                    await conn.close_with(connection_error(
                        FRAME_ERROR, f"frame not completed within {frame_timeout:g}s of its first byte "
                        "(bounds.frame_timeout)"))
                    await conn.transport.drain()   # flushes what is pending too
                elif conn.state == "open":
                    log.info("amqp091 %s: no traffic for %ss (2 heartbeat intervals): closing", conn.name, timeout)
                elif conn.state != "closing":
                    log.info("amqp091 %s: handshake timed out", conn.name)
                break
            if not data:
                break
            try:
                frames = decoder.feed(data)
            except FrameError as exc:
                # The stream cannot be framed any more: say why, then hang up.
                await conn.close_with(connection_error(exc.code, str(exc)))
                await conn.transport.drain()   # flushes what is pending too
                break
            decoder.max_frame = conn.frame_max if conn.state in ("open", "open-wait") else SERVER_FRAME_MAX
            if not decoder.buffered:
                frame_started = None
            elif frames or frame_started is None:
                frame_started = loop.time()
            for frame in frames:
                try:
                    if conn.fast_frame(frame):
                        continue
                except (AMQPError, FrameError) as exc:
                    await conn.failed(exc)
                else:
                    await conn.handle_frame(frame)
                if conn.finished:
                    break
            if decoder.error_pending and not conn.finished:
                # Complete frames before a broken one were handled above; now the broken one.
                try:
                    decoder.feed(b"")
                except FrameError as exc:
                    await conn.close_with(connection_error(exc.code, str(exc)))
                    await conn.transport.drain()   # flushes what is pending too
                    break
            if conn.state == "open":
                await conn.transport.drain()   # flushes what is pending too
    except asyncio.CancelledError:
        # Server shutdown (Server.close cancels connection tasks): tell the client why, best
        # effort, and end normally — the connection is over either way, and a cancelled task
        # here makes asyncio's stream callback log a spurious error.
        if conn.state == "open":
            conn.write(framing.method_frame(0, Conn.Close(CONNECTION_FORCED, "CONNECTION_FORCED - broker shutdown",
                                                          0, 0)))
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        beat.cancel()
        watch.close()
        try:
            conn.transport.flush()   # a last frame (connection.close) goes out before the socket closes
        except Exception:  # noqa: BLE001 - the socket may be gone already
            pass
        try:
            await asyncio.shield(conn.shutdown())
        except Exception:  # noqa: BLE001
            log.exception("amqp091 %s: cleanup failed", conn.name)
