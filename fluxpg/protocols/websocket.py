"""MQTT over WebSocket (`ws://HOST:8082/mqtt`, subprotocol `mqtt`, MQTT 3.1.1/5.0 §6): the HTTP
listener upgrades the request with aiohttp and hands the byte stream to the MQTT connection
handler, the same one TCP connections get, through a StreamReader / StreamWriter pair.

WebSocket message boundaries mean nothing to MQTT (§6: a packet may span messages, a message may
hold several packets), so binary messages are fed to the reader as a byte stream; a text message
is a protocol error (close 1003). Flow control both ways: the next WebSocket message is read only
while the reader's buffer is under its limit, and the writer reports its unsent bytes as the
transport's write buffer, so the MQTT handler's own bounds (pause deliveries above a size) apply.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from aiohttp import WSMsgType, web

log = logging.getLogger("fluxpg.websocket")

READ_LIMIT = 1 << 20            # bytes buffered for the MQTT handler before we stop reading
WRITE_HIGH_WATER = 1 << 20      # drain() waits while more than this is unsent
MAX_MESSAGE = 16 << 20          # largest WebSocket message accepted


class _Transport:
    """What the MQTT handler asks of `writer.transport`."""

    def __init__(self, writer: WebSocketWriter):
        self._writer = writer

    def get_write_buffer_size(self) -> int:
        return self._writer.buffered

    def abort(self) -> None:
        self._writer.abort()

    def is_closing(self) -> bool:
        return self._writer.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._writer.get_extra_info(name, default)


class WebSocketWriter:
    """A StreamWriter look-alike that sends what is written as binary WebSocket messages, in
    order, from one task."""

    def __init__(self, ws: web.WebSocketResponse, request: web.Request):
        self.ws = ws
        self._transport = request.transport
        self.transport = _Transport(self)
        self.buffered = 0
        self.closing = False
        self._queue: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._pump_task = asyncio.create_task(self._pump(), name="fluxpg-ws-writer")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if self._transport is None:
            return default
        return self._transport.get_extra_info(name, default)

    def write(self, data: bytes) -> None:
        if self.closing or not data:
            return
        self._queue.append(bytes(data))
        self.buffered += len(data)
        if self.buffered > WRITE_HIGH_WATER:
            self._drained.clear()
        self._wake.set()

    def can_write_eof(self) -> bool:
        return False

    def is_closing(self) -> bool:
        return self.closing

    async def drain(self) -> None:
        if self._pump_task.done():
            raise ConnectionResetError("WebSocket closed")
        await self._drained.wait()

    def close(self) -> None:
        """Send what is queued, then close the WebSocket."""
        self.closing = True
        self._wake.set()

    def abort(self) -> None:
        self.closing = True
        self._queue.clear()
        self.buffered = 0
        self._pump_task.cancel()
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        try:
            await asyncio.shield(self._pump_task)
        except (asyncio.CancelledError, ConnectionError):
            pass

    async def _pump(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    # Coalesce what piled up into one message (MQTT does not care about boundaries).
                    data = b"".join(self._queue)
                    self._queue.clear()
                    await self.ws.send_bytes(data)
                    self.buffered -= len(data)
                    if self.buffered <= WRITE_HIGH_WATER:
                        self._drained.set()
                if self.closing:
                    await self.ws.close()
                    return
        except (ConnectionError, RuntimeError) as exc:   # the peer went away while we sent
            log.debug("WebSocket writer stopped: %s", exc)
        finally:
            self.closing = True
            self._drained.set()


async def mqtt_over_websocket(request: web.Request) -> web.StreamResponse:
    """GET /mqtt with `Upgrade: websocket` and `Sec-WebSocket-Protocol: mqtt`."""
    from fluxpg import connections  # noqa: PLC0415
    from fluxpg.protocols.http import CTX  # noqa: PLC0415
    from fluxpg.protocols.mqtt.session import handle  # noqa: PLC0415

    ctx = request.app[CTX]
    ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=MAX_MESSAGE, autoping=True)
    if not ws.can_prepare(request).ok:
        raise web.HTTPBadRequest(text="MQTT over WebSocket: expected a WebSocket upgrade "
                                      "(Sec-WebSocket-Protocol: mqtt)")
    await ws.prepare(request)
    if ws.ws_protocol != "mqtt":
        # MQTT §6.0: the client must offer the "mqtt" subprotocol.
        await ws.close(code=1002, message=b"subprotocol mqtt required")
        return ws
    info = connections.current()
    if info is not None:
        info.protocol = "mqtt-ws"
    reader = asyncio.StreamReader(limit=READ_LIMIT)
    writer = WebSocketWriter(ws, request)
    session = asyncio.create_task(handle(reader, writer, b"", ctx), name="fluxpg-mqtt-ws")
    try:
        while not session.done():
            receive = asyncio.ensure_future(ws.receive())
            await asyncio.wait({receive, session}, return_when=asyncio.FIRST_COMPLETED)
            if not receive.done():
                receive.cancel()
                break
            msg = receive.result()
            if msg.type == WSMsgType.BINARY:
                reader.feed_data(msg.data)
                # Read on only once the handler has taken most of it (bounded memory).
                while len(reader._buffer) > READ_LIMIT and not session.done():  # noqa: SLF001
                    await asyncio.sleep(0.005)
            elif msg.type == WSMsgType.TEXT:
                await ws.close(code=1003, message=b"MQTT needs binary WebSocket messages")
                break
            else:    # CLOSE, CLOSING, CLOSED, ERROR
                break
    finally:
        reader.feed_eof()
        try:
            await asyncio.wait_for(asyncio.shield(session), 5)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            session.cancel()
        except Exception:  # noqa: BLE001 - the handler logs its own failures
            pass
        writer.close()
        await writer.wait_closed()
        if not ws.closed:
            await ws.close()
    return ws
