"""Real fluxpg servers on free loopback ports for protocol tests.

`broker` starts a Server on the test's own event loop (for asyncio clients: aio-pika, amqtt);
`threaded_broker` runs one on an event loop in a background thread (for blocking clients:
paho-mqtt, pika, proton's BlockingConnection, which would otherwise block the loop that serves
them). Both give every listener a free port; `server.port("mqtt")` etc. tell which.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from fluxpg.aio import loop_factory
from fluxpg.config import Config
from fluxpg.server import Server

LOOPBACK = {"mqtt": "127.0.0.1:0", "amqp": "127.0.0.1:0", "amqp091": "127.0.0.1:0", "http": "127.0.0.1:0"}


def _config(queues=None, config: Config | None = None, **queue_manager) -> Config:
    if config is not None:
        return config
    return Config(queues=queues or [], queue_manager=queue_manager or {})


@pytest.fixture
async def broker(dsn):
    servers: list[Server] = []

    async def start(queues=None, config: Config | None = None, **queue_manager) -> Server:
        server = await Server.start(dsn, _config(queues, config, **queue_manager), addresses=dict(LOOPBACK),
                                    migrate=False, retention=False)
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.close()


class ThreadedServer:
    """A Server running on its own loop in a daemon thread; call() runs a coroutine there."""

    def __init__(self, dsn: str, config: Config):
        self.loop = loop_factory()()   # the broker's loop, as `fluxpg serve` runs it
        self.thread = threading.Thread(target=self.loop.run_forever, name="fluxpg-test-server", daemon=True)
        self.thread.start()
        self.server: Server = self.call(Server.start(dsn, config, addresses=dict(LOOPBACK),
                                                     migrate=False, retention=False))

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def port(self, name: str) -> int:
        return self.server.port(name)

    @property
    def manager(self):
        return self.server.manager

    def close(self) -> None:
        if self.loop.is_closed():
            return      # a test closed it already (e.g. to restart on the same database)
        try:
            self.call(self.server.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def threaded_broker(dsn):
    servers: list[ThreadedServer] = []

    def start(queues=None, config: Config | None = None, **queue_manager) -> ThreadedServer:
        server = ThreadedServer(dsn, _config(queues, config, **queue_manager))
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        server.close()
