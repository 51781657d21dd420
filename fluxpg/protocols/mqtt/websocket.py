"""MQTT over WebSocket (MQTT 5 §6, 3.1.1 §6): binary frames carrying MQTT packets, split or joined
arbitrarily, on a connection that negotiated the `mqtt` subprotocol.

Transport-agnostic entry point: `serve_mqtt(ws, ctx)` serves one MQTT session over any object with

    async receive() -> bytes | None     # the next binary message's payload; None once closed
    async send(data: bytes) -> None     # one binary message
    async close() -> None
    peer: str | None                    # "host:port" for logs and auth (optional attribute)

so the same code serves the `ws`/`wss` listener (this module, on the `websockets` library) and the
HTTP listener's `/mqtt` path (aiohttp's WebSocketResponse, wrapped the same way by the HTTP code).
A text frame is a protocol error (§6.0: "MUST close the connection") -- adapters return None for it.

The MQTT Connection was written for asyncio streams; `_Reader`/`_Writer` give it that shape over
the message stream. Reading pulls one WebSocket message per read (no read-ahead buffer: a client
that floods is held back by TCP like on the plain listener); writing coalesces whatever packets are
queued into one binary message, and `get_write_buffer_size()` counts the unsent bytes, so the
session's outbound bounds (send_publish, drain) work as on TCP.

Both libraries hold a message until it is whole, so the MQTT code cannot see a message still
arriving. `InboundWatch` follows the raw bytes beside the library (fluxpg/protocols/wsframes.py;
each listener feeds it from its socket's data_received) and gives MQTT over WebSocket what the TCP
read loop has: a started message must be complete within bounds.frame_timeout of its first byte
(else DISCONNECT 0x8D and close), and the bytes the library holds count toward
bounds.connection_inbound_bytes / broker_inbound_bytes until the message is handed to MQTT
(which charges them from there on, as on TCP).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

log = logging.getLogger("fluxpg.mqtt.ws")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")     # "mqttv3.1" is what 3.1-era clients offer
_SEND_CHUNK = 256 * 1024                 # at most this much per outgoing WebSocket message


_CUT_AFTER = 1.0    # after a frame deadline: the DISCONNECT and the close frame go out, then the socket


def max_message(ctx: Any) -> int:
    """The largest WebSocket message taken: the MQTT maximum packet size (MqttOptions, advertised
    in CONNACK); a bigger message could only carry a packet the decoder refuses."""
    from .session import MqttOptions
    return (ctx.state.get("mqtt.options") or MqttOptions()).max_packet_size


class InboundWatch:
    """The raw bytes of one MQTT-over-WebSocket connection as they arrive, before the WebSocket
    library makes messages of them: the frame deadline and the inbound byte count.

    The listener calls `feed(data)` with every chunk read from the socket once the upgrade is
    done, the stream calls `taken()` when the library hands over a message, and serve_mqtt
    `attach()`es the MQTT connection's count and what to do on a deadline or over the bound."""

    def __init__(self, frame_timeout: float, transport: Any = None):
        from fluxpg.protocols.wsframes import FrameScanner
        self.scanner = FrameScanner()
        self.frame_timeout = frame_timeout
        self.transport = transport          # the socket's transport: cut after a frame deadline
        self.receiving = False              # MQTT waits for the next message (the client owes it)
        self.inbound: Any = None            # the MQTT connection's ConnectionInbound, once attached
        self.charged = 0
        self._expired: Any = None
        self._over: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def attach(self, inbound: Any, expired: Any, over: Any) -> None:
        self.inbound, self._expired, self._over = inbound, expired, over
        self._sync()

    def feed(self, data: bytes) -> None:
        if self._closed:
            return
        scanner = self.scanner
        was_started, done = scanner.started, scanner.messages
        scanner.feed(data)
        if scanner.broken:
            self.close()
            return
        if not scanner.started:
            self._disarm()
        elif not was_started or scanner.messages != done:
            self._arm()      # a new message began with these bytes: its deadline counts from now
        self._sync()

    def taken(self) -> None:
        if self._closed:
            return
        self.scanner.take()
        self._sync()

    def close(self) -> None:
        """The connection ended: whatever is still charged goes back."""
        self._closed = True
        self._disarm()
        if self.inbound is not None and self.charged:
            self.inbound.release(self.charged)
        self.charged = 0

    def _sync(self) -> None:
        inbound = self.inbound
        if inbound is None or self._closed:
            return
        delta = self.scanner.held - self.charged
        if delta > 0:
            inbound.charge(delta)      # read already; too much of it ends the connection (_over)
        elif delta < 0:
            inbound.release(-delta)
        self.charged += delta
        if delta > 0 and inbound.over and self._over is not None:
            self._over()

    def _arm(self) -> None:
        self._disarm()
        if self.frame_timeout:
            self._timer = asyncio.get_running_loop().call_later(self.frame_timeout, self._deadline)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _deadline(self) -> None:
        self._timer = None
        if self._closed or not self.scanner.started:
            return
        if not self.receiving or self.scanner.waiting:
            # MQTT is busy or paused at the inbound bound with whole messages waiting: the library
            # may have stopped reading the socket, so the broker is late, not the client. Count again.
            self._arm()
            return
        if self._expired is not None:
            self._expired()
        if self.transport is not None:
            asyncio.get_running_loop().call_later(_CUT_AFTER, self.transport.abort)
        self.close()


class MessageStream(Protocol):
    async def receive(self) -> bytes | None: ...
    async def send(self, data: bytes) -> None: ...
    async def close(self) -> None: ...


class _Reader:
    """StreamReader-like view (read, feed_eof) of a MessageStream."""

    def __init__(self, ws: MessageStream):
        self.ws = ws
        self._rest = b""
        self._eof = asyncio.Event()
        self._pending: asyncio.Task | None = None

    async def read(self, n: int = -1) -> bytes:
        if not self._rest:
            if self._eof.is_set():
                return b""
            # The receive stays pending across calls (never cancelled half way), so a feed_eof()
            # racing it loses nothing that matters: the connection is ending anyway.
            if self._pending is None:
                self._pending = asyncio.ensure_future(self.ws.receive())
            eof = asyncio.ensure_future(self._eof.wait())
            try:
                await asyncio.wait({self._pending, eof}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                eof.cancel()
            if not self._pending.done():
                return b""
            task, self._pending = self._pending, None
            data = task.result()
            if data is None:
                self._eof.set()
                return b""
            self._rest = bytes(data)
        if n < 0 or n >= len(self._rest):
            data, self._rest = self._rest, b""
        else:
            data, self._rest = self._rest[:n], self._rest[n:]
        return data

    def feed_eof(self) -> None:
        self._eof.set()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()


class _Writer:
    """StreamWriter-like view (write, drain, close, transport) of a MessageStream: one sender task
    sends what was written, joined into messages of up to _SEND_CHUNK bytes."""

    HIGH_WATER = 64 * 1024

    def __init__(self, ws: MessageStream, peer: str | None):
        self.ws = ws
        self.peer = peer
        self._buf = bytearray()
        self._sending = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._closing = False
        self._closed = asyncio.Event()
        self._task = asyncio.ensure_future(self._sender())

    # what Connection uses of asyncio's StreamWriter / Transport
    @property
    def transport(self) -> _Writer:
        return self

    def get_write_buffer_size(self) -> int:
        return len(self._buf) + self._sending

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername" and self.peer:
            host, _, port = self.peer.rpartition(":")
            return (host, int(port)) if port.isdigit() else self.peer
        return default

    def is_closing(self) -> bool:
        return self._closing

    def can_write_eof(self) -> bool:
        return False        # a WebSocket has no half-close: the MQTT code closes instead

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._buf += data
        self._drained.clear()
        self._wake.set()

    async def drain(self) -> None:
        while self.get_write_buffer_size() > self.HIGH_WATER and not self._closed.is_set():
            self._drained.clear()
            waiter = asyncio.ensure_future(self._drained.wait())
            closed = asyncio.ensure_future(self._closed.wait())
            try:
                await asyncio.wait({waiter, closed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                closed.cancel()
        if self._closed.is_set() and self._buf:
            raise ConnectionResetError("WebSocket closed")

    def close(self) -> None:
        """Flush what is queued, then close (like StreamWriter.close)."""
        self._closing = True
        self._wake.set()

    def abort(self) -> None:
        self._buf.clear()
        self._closing = True
        self._task.cancel()
        asyncio.ensure_future(self._close_ws())

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _close_ws(self) -> None:
        try:
            await self.ws.close()
        except Exception:  # noqa: BLE001 - already gone
            pass
        finally:
            self._closed.set()
            self._drained.set()

    async def _sender(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._buf:
                    chunk = bytes(self._buf[:_SEND_CHUNK])
                    del self._buf[:len(chunk)]
                    self._sending = len(chunk)
                    try:
                        await self.ws.send(chunk)
                    finally:
                        self._sending = 0
                    if self.get_write_buffer_size() <= self.HIGH_WATER:
                        self._drained.set()
                self._drained.set()
                if self._closing:
                    break
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - peer gone: the read side sees EOF
            log.debug("MQTT over WebSocket: send failed: %s", exc)
            self._buf.clear()
        await self._close_ws()


async def serve_mqtt(ws: MessageStream, ctx: Any, peer: str | None = None) -> None:
    """Serve one MQTT connection over a WebSocket-like message stream until it ends."""
    from .session import Connection, MqttOptions, get_router

    from .session import RC

    peer = peer or getattr(ws, "peer", None)
    router = await get_router(ctx)
    options = ctx.state.get("mqtt.options") or MqttOptions()
    reader = _Reader(ws)
    writer = _Writer(ws, peer)
    conn = Connection(reader, writer, ctx, router, options)   # type: ignore[arg-type]
    watch: InboundWatch | None = getattr(ws, "watch", None)
    if watch is not None:
        def expired() -> None:
            log.info("MQTT over WebSocket %s from %s: a WebSocket message was not completed within %ss of its "
                     "first byte (bounds.frame_timeout)", conn.client_id or "?", peer, watch.frame_timeout)
            conn._shutdown(RC.KEEP_ALIVE_TIMEOUT, "packet not completed in time", end="keepalive")

        def over() -> None:
            # As on TCP: with publishes committing, MQTT stops taking messages and the library's
            # read-ahead is what waits; with nothing of ours to wait for, the bytes alone are too
            # many: 0x97 (a single message larger than the bound, or the broker full).
            if not conn.inbound_held and not conn.closing:
                log.info("MQTT over WebSocket %s from %s: message refused: inbound bytes over the bound",
                         conn.client_id or "?", peer)
                conn._shutdown(RC.QUOTA_EXCEEDED, "inbound bytes over the broker's bound", end="error")
        watch.attach(conn.inbound, expired, over)
    try:
        await conn.run(b"")
    except asyncio.CancelledError:
        pass
    finally:
        if watch is not None:
            watch.close()
        reader.cancel()
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 2)
        except (Exception, asyncio.CancelledError):  # noqa: BLE001
            writer.abort()


# --------------------------------------------------------------------------------------------
# The `ws` / `wss` listener (the `websockets` library)
# --------------------------------------------------------------------------------------------

class _WebsocketsStream:
    """MessageStream over a `websockets` ServerConnection."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.watch: InboundWatch | None = getattr(conn, "watch", None)
        addr = conn.remote_address
        self.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else None

    async def receive(self) -> bytes | None:
        from websockets.exceptions import ConnectionClosed
        watch = self.watch
        if watch is not None:
            watch.receiving = True
        try:
            msg = await self.conn.recv()
        except ConnectionClosed:
            return None
        finally:
            if watch is not None:
                watch.receiving = False
        if watch is not None:
            watch.taken()      # MQTT charges these bytes from here on
        if isinstance(msg, str):
            log.info("MQTT over WebSocket from %s: text frame, closing (MQTT needs binary frames)", self.peer)
            await self.conn.close(1003, "MQTT needs binary frames")
            return None
        return msg

    async def send(self, data: bytes) -> None:
        await self.conn.send(data)

    async def close(self) -> None:
        await self.conn.close()


class WebSocketListener:
    """`listeners.ws`: MQTT over WebSocket on a port of its own (TLS = wss)."""

    def __init__(self, name: str, host: str, port: int, ctx: Any, *, ssl: Any = None, reuse_port: bool = False):
        self.reuse_port = reuse_port
        self.name = name
        self.host = host
        self.port = port
        self.ctx = ctx
        self.ssl = ssl
        self.server: Any = None

    async def start(self) -> None:
        from websockets.asyncio.server import ServerConnection, serve
        from websockets.protocol import State

        from fluxpg.protocols.listener import ListenerError, frame_limit, handshake_limit

        frame_timeout = frame_limit(self.ctx)

        class _Accepted(ServerConnection):
            """Remembers when the TCP connection was accepted: the handshake deadline counts
            from there (the WebSocket handshake and the MQTT CONNECT together). Shows the raw
            bytes after the upgrade to an InboundWatch (frame deadline, inbound bytes)."""

            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                self.accepted = asyncio.get_running_loop().time()
                self.watch = InboundWatch(frame_timeout)

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                self.watch.transport = transport

            def data_received(self, data: bytes) -> None:
                # OPEN once the 101 is sent: from here on the bytes are frames (a client sends
                # none before it has read the 101).
                if self.protocol.state is State.OPEN:
                    self.watch.feed(data)
                super().data_received(data)

            def connection_lost(self, exc: Exception | None) -> None:
                self.watch.close()
                super().connection_lost(exc)

        # bounds.handshake_timeout, absolute from accept: websockets' open_timeout bounds the
        # WebSocket handshake (HTTP upgrade request trickled or not), _handle the rest up to
        # CONNACK (listener.watch_handshake), so the sum is never more than the one deadline.
        limit = handshake_limit(self.ctx)
        try:
            self.server = await serve(self._handle, self.host, self.port, ssl=self.ssl,
                                      subprotocols=list(SUBPROTOCOLS), select_subprotocol=_select,
                                      max_size=max_message(self.ctx), compression=None, ping_interval=None,
                                      # Read ahead at most one frame beyond the one MQTT is taking
                                      # (websockets' default buffers 16, each up to max_size: what
                                      # the inbound bound charges but cannot stop while publishes
                                      # are committing).
                                      max_queue=1,
                                      open_timeout=limit or None, create_connection=_Accepted,
                                      reuse_port=self.reuse_port or None)
        except OSError as exc:
            raise ListenerError(f"{self.name} listener: cannot listen on {self.host}:{self.port}: "
                                f"{exc.strerror or exc}") from None
        self.port = next(iter(self.server.sockets)).getsockname()[1]
        log.info("%s listener (MQTT over WebSocket) on %s:%d%s", self.name, self.host, self.port,
                 " (TLS)" if self.ssl else "")

    async def _handle(self, conn: Any) -> None:
        from fluxpg.connections import ConnectionInfo
        from fluxpg.protocols.listener import handshake_limit, watch_handshake

        task = asyncio.current_task()
        self.ctx.connections.add(task)
        stream = _WebsocketsStream(conn)
        # Listed like the other listeners' connections (console, handshake deadline).
        info = self.ctx.registry.add(ConnectionInfo("mqtt-ws", stream.peer or "?", self.name, task=task,
                                                    transport=conn.transport))
        accepted = getattr(conn, "accepted", None) or asyncio.get_running_loop().time()
        watchdog = watch_handshake(info, accepted, handshake_limit(self.ctx))
        try:
            await serve_mqtt(stream, self.ctx)
        except Exception:  # noqa: BLE001 - one bad connection never takes the listener down
            log.exception("%s: MQTT over WebSocket connection failed", self.name)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self.ctx.registry.remove(info)
            self.ctx.connections.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _select(conn: Any, offered: Any) -> str | None:
    """Only MQTT: a handshake that does not offer `mqtt` is refused (MQTT 5 §6.0 requires it)."""
    from websockets.exceptions import NegotiationError
    for proto in offered:
        if proto in SUBPROTOCOLS:
            return proto
    raise NegotiationError("MQTT over WebSocket needs the subprotocol 'mqtt'")


__all__ = ["serve_mqtt", "MessageStream", "WebSocketListener", "SUBPROTOCOLS", "InboundWatch", "max_message"]
