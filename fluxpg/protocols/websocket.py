"""MQTT over WebSocket on the HTTP listener (`ws://HOST:8082/mqtt`, subprotocol `mqtt`): aiohttp
upgrades the request, and the MQTT session is served by the same code as the `ws` listener's,
fluxpg.protocols.mqtt.websocket.serve_mqtt, over aiohttp's WebSocketResponse wrapped in its
three-method message stream (receive / send / close).

A text frame is a protocol error (MQTT §6.0): the socket is closed with 1003. A client that does
not offer the `mqtt` subprotocol is closed with 1002.
"""
from __future__ import annotations

import logging

from aiohttp import WSMsgType, web

from fluxpg.protocols.mqtt.websocket import MAX_MESSAGE, SUBPROTOCOLS, serve_mqtt

log = logging.getLogger("fluxpg.websocket")


class AiohttpStream:
    """serve_mqtt's MessageStream over an aiohttp WebSocketResponse."""

    def __init__(self, ws: web.WebSocketResponse, peer: str | None):
        self.ws = ws
        self.peer = peer

    async def receive(self) -> bytes | None:
        msg = await self.ws.receive()
        if msg.type == WSMsgType.BINARY:
            return msg.data
        if msg.type == WSMsgType.TEXT:
            await self.ws.close(code=1003, message=b"MQTT needs binary WebSocket messages")
        return None     # CLOSE, CLOSING, CLOSED, ERROR: the session ends

    async def send(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close(self) -> None:
        await self.ws.close()


async def mqtt_over_websocket(request: web.Request) -> web.StreamResponse:
    """GET /mqtt with `Upgrade: websocket` and `Sec-WebSocket-Protocol: mqtt`."""
    from fluxpg import connections  # noqa: PLC0415
    from fluxpg.protocols.http import CTX  # noqa: PLC0415

    ws = web.WebSocketResponse(protocols=SUBPROTOCOLS, max_msg_size=MAX_MESSAGE, autoping=True)
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
    peer = request.transport.get_extra_info("peername") if request.transport else None
    peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else None
    try:
        await serve_mqtt(AiohttpStream(ws, peer_text), request.app[CTX], peer=peer_text)
    finally:
        if not ws.closed:
            await ws.close()
    return ws
