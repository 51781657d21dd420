"""A running broker: the queue manager plus the configured listeners (used by `fluxpg serve` and
by tests that need a real server on free ports)."""
from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module

from fluxpg.auth import authenticator_for
from fluxpg.config import Config, parse_address
from fluxpg.protocols.listener import BrokerContext, Listener, ListenerError
from fluxpg.queues.connection_sync import ConnectionSync
from fluxpg.queues.manager import QueueManager

log = logging.getLogger("fluxpg.server")

LISTENER_NAMES = ("mqtt", "amqp", "amqp091", "http", "ws")


class Server:
    def __init__(self, manager: QueueManager, config: Config):
        self.manager = manager
        self.config = config
        self.ctx = BrokerContext(manager=manager, config=config, auth=authenticator_for(config, manager))
        self.listeners: dict[str, Listener] = {}
        self.connection_sync: ConnectionSync | None = None

    @classmethod
    async def start(cls, dsn: str, config: Config | None = None, *, addresses: dict[str, str | None] | None = None,
                    migrate: bool = True, retention: bool = True, reuse_port: bool = False,
                    ssl: ssl_module.SSLContext | None = None) -> Server:
        """Start the manager and listeners. `addresses` overrides config.listeners per name
        ("HOST:PORT", port 0 for a free one, None to disable)."""
        config = config or Config()
        tls = config.tls.ssl_context() if ssl is None and config.tls is not None else None  # before anything starts
        manager = await QueueManager.start(dsn, config, migrate=migrate, retention=retention)
        server = cls(manager, config)
        try:
            wanted = {name: getattr(config.listeners, name) for name in LISTENER_NAMES}
            wanted.update(addresses or {})
            for name, address in wanted.items():
                if not address:
                    continue
                host, port = parse_address(address)
                listener_ssl = ssl or (tls if tls is not None and config.tls.applies_to(name) else None)
                if name == "ws":
                    # MQTT over WebSocket: an HTTP upgrade, not a sniffed TCP protocol.
                    from fluxpg.protocols.mqtt.websocket import WebSocketListener
                    listener = WebSocketListener(name, host, port, server.ctx, ssl=listener_ssl,
                                                 reuse_port=reuse_port)
                else:
                    listener = Listener(name, host, port, server.ctx, ssl=listener_ssl, reuse_port=reuse_port)
                await listener.start()
                server.listeners[name] = listener
            # Every node's connections in the database, for the console of any node.
            server.connection_sync = ConnectionSync(manager, server.ctx.registry)
            await server.connection_sync.start()
        except BaseException:
            await server.close()
            raise
        return server

    def port(self, name: str) -> int:
        return self.listeners[name].port

    async def close(self) -> None:
        for listener in self.listeners.values():
            await listener.close()
        if self.connection_sync is not None:
            await self.connection_sync.close()
        for task in list(self.ctx.connections):
            task.cancel()
        if self.ctx.connections:
            await asyncio.wait(list(self.ctx.connections), timeout=5)
        closers = self.ctx.state.get("closers", [])
        for close in closers:
            try:
                await close()
            except Exception:  # noqa: BLE001
                log.exception("closing protocol state failed")
        await self.manager.close()


__all__ = ["Server", "ListenerError"]
