"""The MQTT front-end's own tables (cross-node relay, retained messages, shared-subscription
membership) behind the queue manager: `manager.mqtt` runs the named queries of
sql/mqtt_queries.sql, so the protocol code never holds the pool or imports fluxpg.db (issue 14's
import rule: the queue manager is the only way to the database)."""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fluxpg import db
from fluxpg.db import Channels
from fluxpg.queues.mqtt_sessions import MqttSessionStore

if TYPE_CHECKING:
    from fluxpg.queues.manager import QueueManager

QUERIES = "mqtt_queries.sql"

__all__ = ["Channels", "MqttStore", "NamedConnection"]


def _sql(name: str) -> str:
    return db.queries(QUERIES)[name]


class NamedConnection:
    """One connection inside a transaction, running named queries only."""

    def __init__(self, conn: Any):
        self._conn = conn

    async def execute(self, name: str, *args: Any) -> str:
        return await self._conn.execute(_sql(name), *args)

    async def fetch(self, name: str, *args: Any) -> list[Any]:
        return await self._conn.fetch(_sql(name), *args)


class MqttStore:
    def __init__(self, manager: QueueManager):
        self._manager = manager

    async def execute(self, name: str, *args: Any) -> str:
        return await self._manager.pool.execute(_sql(name), *args)

    async def fetch(self, name: str, *args: Any) -> list[Any]:
        return await self._manager.pool.fetch(_sql(name), *args)

    async def fetchval(self, name: str, *args: Any) -> Any:
        return await self._manager.pool.fetchval(_sql(name), *args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[NamedConnection]:
        """Named queries in one transaction (a relay batch with its retained updates)."""
        async with self._manager.pool.acquire() as conn:
            async with conn.transaction():
                yield NamedConnection(conn)

    def listener(self, handlers: dict[str, Callable[[str | None], Awaitable[None] | None]]) -> Channels:
        """LISTEN on the MQTT channels (relay, shared membership, session takeover), on the node's
        one LISTEN connection."""
        return self._manager.listen(handlers)

    def session_store(self, node_id: int, heartbeat_timeout: timedelta) -> MqttSessionStore:
        return MqttSessionStore(self._manager.pool, node_id, heartbeat_timeout)
