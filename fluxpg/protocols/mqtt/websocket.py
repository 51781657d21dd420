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
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

log = logging.getLogger("fluxpg.mqtt.ws")

SUBPROTOCOLS = ("mqtt", "mqttv3.1")     # "mqttv3.1" is what 3.1-era clients offer
MAX_MESSAGE = 16 * 1024 * 1024 + 1024    # one WebSocket message; MQTT's own packet limit applies inside
_SEND_CHUNK = 256 * 1024                 # at most this much per outgoing WebSocket message


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

    peer = peer or getattr(ws, "peer", None)
    router = await get_router(ctx)
    options = ctx.state.get("mqtt.options") or MqttOptions()
    reader = _Reader(ws)
    writer = _Writer(ws, peer)
    conn = Connection(reader, writer, ctx, router, options)   # type: ignore[arg-type]
    try:
        await conn.run(b"")
    except asyncio.CancelledError:
        pass
    finally:
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
        addr = conn.remote_address
        self.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else None

    async def receive(self) -> bytes | None:
        from websockets.exceptions import ConnectionClosed
        try:
            msg = await self.conn.recv()
        except ConnectionClosed:
            return None
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

        from fluxpg.protocols.listener import ListenerError, handshake_limit

        class _Accepted(ServerConnection):
            """Remembers when the TCP connection was accepted: the handshake deadline counts
            from there (the WebSocket handshake and the MQTT CONNECT together)."""

            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                self.accepted = asyncio.get_running_loop().time()

        # bounds.handshake_timeout, absolute from accept: websockets' open_timeout bounds the
        # WebSocket handshake (HTTP upgrade request trickled or not), _handle the rest up to
        # CONNACK (listener.watch_handshake), so the sum is never more than the one deadline.
        limit = handshake_limit(self.ctx)
        try:
            self.server = await serve(self._handle, self.host, self.port, ssl=self.ssl,
                                      subprotocols=list(SUBPROTOCOLS), select_subprotocol=_select,
                                      max_size=MAX_MESSAGE, compression=None, ping_interval=None,
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


__all__ = ["serve_mqtt", "MessageStream", "WebSocketListener", "SUBPROTOCOLS"]
