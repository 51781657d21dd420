"""TCP listeners. Every listener serves every protocol: the first bytes of a connection say which.

AMQP 0-9-1 starts with `AMQP\\x00\\x00\\x09\\x01`, AMQP 1.0 with `AMQP\\x00\\x01\\x00\\x00` or (SASL)
`AMQP\\x03\\x01\\x00\\x00`, MQTT with a CONNECT packet (first byte 0x10), HTTP with a method name.
An unknown header gets the AMQP 0-9-1 protocol header back (what AMQP peers expect) and a close.

A protocol handler is an async function `handle(reader, writer, initial: bytes, ctx: BrokerContext)`
that owns the connection from then on; `initial` are the bytes already read for sniffing.
"""
from __future__ import annotations

import asyncio
import errno
import importlib
import logging
import socket
import ssl as ssl_module
from dataclasses import dataclass, field
from typing import Any

from fluxpg.connections import ConnectionInfo, Registry

log = logging.getLogger("fluxpg.listener")

SNIFF_TIMEOUT = 10.0
AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"
AMQP10_SASL_HEADER = b"AMQP\x03\x01\x00\x00"
HTTP_METHODS = (b"GET ", b"POST", b"HEAD", b"PUT ", b"DELE", b"OPTI")

# protocol → "module:function" of its connection handler (imported on first use, so a listener
# works with whichever front-ends exist).
HANDLERS = {
    "mqtt": "fluxpg.protocols.mqtt.session:handle",
    "amqp091": "fluxpg.protocols.amqp091.connection:handle",
    "amqp10": "fluxpg.protocols.amqp10.connection:handle",
    "http": "fluxpg.protocols.http:handle",
}


class ListenerError(Exception):
    """A listener could not start (the message is one line, fit for the user)."""


@dataclass
class BrokerContext:
    """What every connection handler gets: the queue manager, the config, and a place for
    protocol-wide state (MQTT retained messages and sessions, the AMQP container id, …)."""

    manager: Any
    config: Any
    auth: Any = None          # fluxpg.auth authenticator; None → open (set by Server)
    state: dict[str, Any] = field(default_factory=dict)
    connections: set[asyncio.Task] = field(default_factory=set)
    registry: Registry = field(default_factory=Registry)   # live connections by id, for the console


def sniff(data: bytes) -> str | None:
    """The protocol of a connection from its first bytes; None when it is none we speak.
    Needs 1 byte for MQTT and 8 for AMQP."""
    if not data:
        return None
    if data[0] == 0x10:
        return "mqtt"
    if data.startswith(b"AMQP"):
        header = data[:8]
        if header == AMQP091_HEADER:
            return "amqp091"
        if header in (AMQP10_HEADER, AMQP10_SASL_HEADER):
            return "amqp10"
        return None
    if data[:4] in HTTP_METHODS:
        return "http"
    return None


_loaded: dict[str, Any] = {}


def _load(protocol: str):
    """The protocol's connection handler, imported once (Listener.start imports them all before
    the first connection: an import on the event loop stalled every connection for it)."""
    if protocol in _loaded:
        return _loaded[protocol]
    module_name, func = HANDLERS[protocol].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            _loaded[protocol] = None
            return None
        raise
    handler = _loaded[protocol] = getattr(module, func, None)
    return handler


async def _read_header(reader: asyncio.StreamReader) -> bytes:
    first = await reader.readexactly(1)
    if first[0] == 0x10:
        return first
    # AMQP and HTTP need more bytes; a short header that then stalls times out.
    rest = await reader.readexactly(7)
    return first + rest


def handshake_limit(ctx: Any) -> float:
    """bounds.handshake_timeout in seconds (0: no deadline)."""
    bounds = getattr(ctx.config, "bounds", None)
    timeout = getattr(bounds, "handshake_timeout", None)
    return timeout.total_seconds() if timeout else 0.0


def frame_limit(ctx: Any) -> float:
    """bounds.frame_timeout in seconds (0: no deadline)."""
    bounds = getattr(ctx.config, "bounds", None)
    timeout = getattr(bounds, "frame_timeout", None)
    return timeout.total_seconds() if timeout else 0.0


def watch_handshake(info: ConnectionInfo, accepted: float, limit: float) -> asyncio.TimerHandle | None:
    """Close the connection `limit` seconds after `accepted` (loop time) unless its protocol has
    called connections.logged_in() by then -- one absolute deadline from accept, whatever bytes
    trickle in meanwhile. Every listener (TCP, HTTP, WebSocket) uses it; cancel the handle when
    the connection ends."""
    if not limit:
        return None
    loop = asyncio.get_running_loop()
    return loop.call_at(accepted + limit, _handshake_expired, info, limit)


def _handshake_expired(info: ConnectionInfo, limit: float) -> None:
    if info.logged_in or info.task is None or info.task.done():
        return
    log.info("%s: %s connection from %s did not finish its handshake and login within %ss of accept "
             "(bounds.handshake_timeout): closing", info.listener, info.protocol, info.peer, limit)
    # Drop the socket as well as cancelling: on Python 3.11 asyncio.wait_for can swallow a
    # cancellation that arrives as its read completes, and the handler would read on.
    info.close()


class Listener:
    def __init__(self, name: str, host: str, port: int, ctx: BrokerContext, *,
                 ssl: ssl_module.SSLContext | None = None, flag: str | None = None, reuse_port: bool = False):
        self.name = name
        self.host = host
        self.port = port
        self.ctx = ctx
        self.ssl = ssl
        self.flag = flag or f"--{name}"
        self.reuse_port = reuse_port
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        for protocol in HANDLERS:   # any port may be spoken to in any of them (sniff)
            _load(protocol)
        try:
            self.server = await asyncio.start_server(self._accept, self.host, self.port, ssl=self.ssl,
                                                     reuse_port=self.reuse_port or None, limit=2 ** 20)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenerError(f"{self.name} listener: {self.host}:{self.port} is already in use; "
                                    f"choose another address with {self.flag} HOST:PORT or listeners.{self.name} "
                                    f"in the config") from None
            raise ListenerError(f"{self.name} listener: cannot listen on {self.host}:{self.port}: "
                                f"{exc.strerror or exc}") from None
        sock = self.server.sockets[0]
        self.port = sock.getsockname()[1]
        log.info("%s listener on %s:%d%s", self.name, self.host, self.port, " (TLS)" if self.ssl else "")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.ctx.connections.add(task)
        loop = asyncio.get_running_loop()
        # An absolute deadline from accept: bytes trickled in one at a time do not extend it.
        limit = handshake_limit(self.ctx)
        accepted = loop.time()
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            try:
                initial = await asyncio.wait_for(_read_header(reader), min(SNIFF_TIMEOUT, limit or SNIFF_TIMEOUT))
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            protocol = sniff(initial)
            handler = _load(protocol) if protocol else None
            if handler is None:
                log.info("%s: unknown or unsupported protocol header %r from %s", self.name, initial,
                         writer.get_extra_info("peername"))
                writer.write(AMQP091_HEADER)
                await writer.drain()
                return
            peer = writer.get_extra_info("peername")
            info = self.ctx.registry.add(ConnectionInfo(
                protocol, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer), self.name, task=task,
                transport=writer.transport))
            # HTTP's "login" is its first request's headers (auth is per request; the HTTP
            # module marks it), or for MQTT over WebSocket on /mqtt the CONNACK.
            watchdog = watch_handshake(info, accepted, limit)
            try:
                await handler(reader, writer, initial, self.ctx)
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                self.ctx.registry.remove(info)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # The server is shutting down (Server.close cancels connections). Ending normally
            # keeps asyncio's stream protocol from logging the cancellation as an error.
            pass
        except Exception:  # noqa: BLE001 - one bad connection never takes the listener down
            log.exception("%s: connection handler failed", self.name)
        finally:
            self.ctx.connections.discard(task)
            try:
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 2)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001
                pass

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
