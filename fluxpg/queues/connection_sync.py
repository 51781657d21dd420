"""Every node's client connections in the database, for the console of any node.

This node reports its connection registry (fluxpg/connections.py) to fluxpg.connections whenever
it changed, at most every INTERVAL seconds (one statement for the whole list, so a burst of
connects costs one write), and listens on the channel fluxpg_close: a console on another node asks
for a connection to be closed with NOTIFY fluxpg_close '<node>:<connection id>'. The rows of a
node go with its fluxpg.nodes row (stopped, or timed out by the others' heartbeat check).

Its channel is one more on the queue manager's LISTEN connection (a node has one: db.Listener).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from fluxpg import connections, db

log = logging.getLogger("fluxpg.connections")

INTERVAL = 1.0       # seconds between checks for changes


class ConnectionSync:
    def __init__(self, manager: Any, registry: connections.Registry, interval: float = INTERVAL):
        self.manager = manager
        self.registry = registry
        self.interval = interval
        self._channels: db.Channels | None = None
        self._task: asyncio.Task | None = None
        self._reported = -1

    async def start(self) -> None:
        self._channels = self.manager.listen({"fluxpg_close": self._on_close})
        await self._channels.start()
        self._task = asyncio.create_task(self._run(), name="fluxpg-connection-sync")

    def _on_close(self, payload: str | None) -> None:
        if not payload:
            return   # reconnected: nothing to re-check (a lost request is asked again by the operator)
        node, _, conn_id = payload.partition(":")
        try:
            if int(node) != self.manager.node_id:
                return
            info = self.registry.get(int(conn_id))
        except ValueError:
            log.warning("fluxpg_close: malformed request %r", payload)
            return
        if info is not None and info.close():
            log.info("closed connection %s (%s %s) as asked on fluxpg_close", info.id, info.protocol,
                     info.client_id or info.peer)

    async def report(self) -> None:
        """Write this node's connections now (if they changed since the last report)."""
        version = connections.changes
        if version == self._reported:
            return
        rows = [info.as_row() for info in self.registry.all()]
        await db.fetchval(self.manager.pool, "report_connections", self.manager.node_id, rows)
        self._reported = version

    async def _run(self) -> None:
        while True:
            try:
                await self.report()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be away; report later
                log.debug("reporting connections failed: %s", exc)
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        if self._channels is not None:
            await self._channels.close()
