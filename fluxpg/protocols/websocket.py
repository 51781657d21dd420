"""MQTT over WebSocket on the HTTP listener (`ws://HOST:8082/mqtt`, subprotocol `mqtt`): aiohttp
upgrades the request, and the MQTT session is served by the same code as the `ws` listener's,
fluxpg.protocols.mqtt.websocket.serve_mqtt, over aiohttp's WebSocketResponse wrapped in its
three-method message stream (receive / send / close).

A text frame is a protocol error (MQTT §6.0): the socket is closed with 1003. A client that does
not offer the `mqtt` subprotocol is closed with 1002.

After the upgrade the socket's protocol is wrapped (`_Observed`) so that an InboundWatch sees the
raw bytes before aiohttp's WebSocket reader assembles them: the frame deadline and the inbound
byte count work as on the `ws` listener (fluxpg/protocols/mqtt/websocket.py). No permessage-deflate
(as on the `ws` listener): the bytes counted are the bytes held.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import WSMsgType, web

from fluxpg.protocols.mqtt.websocket import SUBPROTOCOLS, InboundWatch, max_message, serve_mqtt

log = logging.getLogger("fluxpg.websocket")


class AiohttpStream:
    """serve_mqtt's MessageStream over an aiohttp WebSocketResponse."""

    def __init__(self, ws: web.WebSocketResponse, peer: str | None, watch: InboundWatch | None = None):
        self.ws = ws
        self.peer = peer
        self.watch = watch

    async def receive(self) -> bytes | None:
        watch = self.watch
        if watch is not None:
            watch.receiving = True
        try:
            msg = await self.ws.receive()
        finally:
            if watch is not None:
                watch.receiving = False
        if msg.type in (WSMsgType.BINARY, WSMsgType.TEXT) and watch is not None:
            watch.taken()      # MQTT charges these bytes from here on
        if msg.type == WSMsgType.BINARY:
            return msg.data
        if msg.type == WSMsgType.TEXT:
            await self.ws.close(code=1003, message=b"MQTT needs binary WebSocket messages")
        return None     # CLOSE, CLOSING, CLOSED, ERROR: the session ends

    async def send(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close(self) -> None:
        await self.ws.close()


class _Observed(asyncio.Protocol):
    """The socket's protocol after the upgrade: shows every chunk read to the InboundWatch, then
    hands it to aiohttp's own protocol (which feeds its WebSocket reader)."""

    def __init__(self, inner: Any, watch: InboundWatch):
        self.inner = inner
        self.watch = watch

    def connection_made(self, transport: Any) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.watch.feed(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.watch.close()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def mqtt_over_websocket(request: web.Request) -> web.StreamResponse:
    """GET /mqtt with `Upgrade: websocket` and `Sec-WebSocket-Protocol: mqtt`."""
    from fluxpg import connections  # noqa: PLC0415
    from fluxpg.protocols.http import CTX  # noqa: PLC0415
    from fluxpg.protocols.listener import frame_limit  # noqa: PLC0415

    ctx = request.app[CTX]
    ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=max_message(ctx), autoping=True,
                               compress=False)
    if not ws.can_prepare(request).ok:
        raise web.HTTPBadRequest(text="MQTT over WebSocket: expected a WebSocket upgrade "
                                      "(Sec-WebSocket-Protocol: mqtt)")
    await ws.prepare(request)
    if ws.ws_protocol not in SUBPROTOCOLS:
        await ws.close(code=1002, message=b"subprotocol mqtt required")
        return ws
    info = connections.current()
    if info is not None:
        info.protocol = "mqtt-ws"
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport else None
    peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else None
    watch = None
    if transport is not None and not transport.is_closing():
        # From the 101 on, the bytes read are frames (a client sends none before it has read it).
        watch = InboundWatch(frame_limit(ctx), transport)
        transport.set_protocol(_Observed(transport.get_protocol(), watch))
    try:
        await serve_mqtt(AiohttpStream(ws, peer_text, watch), ctx, peer=peer_text)
    finally:
        if not ws.closed:
            await ws.close()
    return ws
