"""Durable MQTT session state in PostgreSQL (issue 16): the queue-manager side of the MQTT
front-end's persistent sessions. SQL in sql/mqtt_session_queries.sql and (the shared offline log
of migration 0012) sql/mqtt_offline_queries.sql, tables in sql/0009_mqtt_sessions.sql and
sql/0012_mqtt_offline_log.sql.

Writes are a write-through log: the session code calls `submit(op, *args)` in the order things
happen; one writer task applies whatever has piled up in ONE transaction, in that order (group
commit), and resolves each op's future after the commit. Callers wait only where the protocol
promises durability -- the publisher's PUBACK/PUBREC waits for the rows of the messages its publish
queued for persistent sessions, SUBACK for the subscription row, PUBREC for an inbound QoS 2 id --
and let the rest (a PUBACK from a subscriber deleting its row) trail behind: after a crash such a
message is sent once more, which QoS 1 allows and QoS 2 absorbs (the client knows the packet id).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import timedelta
from typing import Any

from fluxpg import db

log = logging.getLogger("fluxpg.mqtt.store")

_FILES = ("mqtt_session_queries.sql", "mqtt_offline_queries.sql")
MAX_BATCH = 2000
OFFLINE_PAGE = 1000
COMPACT_RANGES = 500      # cursor ranges moved past unmatched rows per housekeeping round


def _q(name: str) -> str:
    for file in _FILES:
        sql = db.queries(file).get(name)
        if sql is not None:
            return sql
    raise KeyError(name)


class MqttSessionStore:
    def __init__(self, pool: Any, node_id: int, heartbeat_timeout: timedelta):
        self.pool = pool
        self.node_id = node_id
        self.heartbeat_timeout = heartbeat_timeout
        self._ops: list[tuple[str, tuple, asyncio.Future | None]] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self.writes = 0
        self.failed = 0
        # Writes submitted and not applied yet, per client id (a replay that finds none for its
        # session need not wait behind other sessions' backlog), and the highest seq of this
        # node's offline stream whose append was applied (appends are applied in seq order).
        self._pending: dict[str, int] = {}
        self.appended = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._writer(), name="fluxpg-mqtt-session-store")

    async def close(self) -> None:
        """Apply what was submitted (a clean shutdown loses nothing), then stop."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), 10)
        except asyncio.TimeoutError:
            log.warning("MQTT session store: %d writes not applied at shutdown", len(self._ops))
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass
        self._task = None

    # --- writes -------------------------------------------------------------------------------

    def submit(self, op: str, *args: Any, wait: bool = False) -> asyncio.Future | None:
        fut = asyncio.get_running_loop().create_future() if wait else None
        self._ops.append((op, args, fut))
        if args and isinstance(args[0], str):
            self._pending[args[0]] = self._pending.get(args[0], 0) + 1
        self._idle.clear()
        self._wake.set()
        return fut

    async def flush(self) -> None:
        """Wait until everything submitted so far is applied (or failed)."""
        while self._ops or not self._idle.is_set():
            await self._idle.wait()

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ops:
                batch, self._ops = self._ops[:MAX_BATCH], self._ops[MAX_BATCH:]
                try:
                    await self._apply(batch)
                except asyncio.CancelledError:
                    self._ops[:0] = batch
                    raise
                except Exception as exc:  # noqa: BLE001 - apply one by one: one bad op must not sink the rest
                    log.warning("MQTT session store batch failed (%s); applying one by one", exc)
                    await self._apply_singly(batch)
                else:
                    for _op, _args, fut in batch:
                        if fut is not None and not fut.done():
                            fut.set_result(None)
                self.writes += len(batch)
                self._applied(batch)
            self._idle.set()

    def _applied(self, batch: list) -> None:
        for op, args, _fut in batch:
            if op == "offline_append":
                self.appended = max(self.appended, args[1])
            elif args and isinstance(args[0], str):
                left = self._pending.get(args[0], 0) - 1
                if left > 0:
                    self._pending[args[0]] = left
                else:
                    self._pending.pop(args[0], None)

    def quiet(self, client_id: str) -> bool:
        """No write of this session is waiting to be applied."""
        return client_id not in self._pending

    async def _apply(self, batch: list) -> None:
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                i = 0
                while i < len(batch):
                    op = batch[i][0]
                    j = i
                    while j < len(batch) and batch[j][0] == op:
                        j += 1
                    rows = [args for _o, args, _f in batch[i:j]]
                    if op == "log_take" and len(rows) > 1:
                        # The rows, then each range's cursor once: same transaction, same effect.
                        await conn.executemany(_q("log_take_row"), [r[:11] for r in rows])
                        moves: dict[int, int] = {}
                        for r in rows:
                            moves[r[11]] = max(moves.get(r[11], 0), r[12])
                        await conn.executemany(_q("cursor_move"), list(moves.items()))
                    elif len(rows) == 1:
                        await conn.execute(_q(op), *rows[0])
                    else:
                        await conn.executemany(_q(op), rows)
                    i = j

    async def _apply_singly(self, batch: list) -> None:
        for op, args, fut in batch:
            try:
                await self.pool.execute(_q(op), *args)
            except Exception as exc:  # noqa: BLE001 - e.g. the session was deleted meanwhile
                self.failed += 1
                log.warning("MQTT session store: %s%r failed: %s", op, args[:2], exc)
                if fut is not None and not fut.done():
                    fut.set_exception(db.translate_error(exc))
                continue
            if fut is not None and not fut.done():
                fut.set_result(None)

    # --- reads --------------------------------------------------------------------------------

    async def owner(self, client_id: str) -> tuple[int | None, bool] | None:
        """(owner node id, owner alive) of a stored session, or None when there is none. A node
        of this host whose process is gone is dead at once (a kill -9 and restart need not
        wait for the heartbeat timeout)."""
        row = await self.pool.fetchrow(_q("session_owner"), client_id, self.heartbeat_timeout)
        if row is None:
            return None
        alive = row["alive"]
        if alive and row["host"] == socket.gethostname() and not _process_alive(row["pid"]):
            alive = False
        return row["node_id"], alive

    async def notify_owner(self, owner: int, client_id: str) -> None:
        await self.pool.execute(_q("session_notify"), owner, self.node_id, client_id)

    async def claim(self, client_id: str, node_id: int | None = None) -> None:
        await self.flush()
        await self.pool.execute(_q("session_release"), client_id, node_id if node_id is not None else self.node_id)

    async def adopt(self) -> list[str]:
        """Take over the sessions of dead nodes; returns their client ids."""
        local = await self.pool.fetch(_q("local_nodes"), socket.gethostname(), self.node_id)
        dead = [r["id"] for r in local if not _process_alive(r["pid"])]
        rows = await self.pool.fetch(_q("session_adopt"), self.node_id, self.heartbeat_timeout, dead)
        return [r["client_id"] for r in rows]

    async def expired(self) -> list[str]:
        rows = await self.pool.fetch(_q("session_expired"))
        return [r["client_id"] for r in rows]

    async def load(self, client_id: str) -> dict[str, Any] | None:
        """Everything stored for one session, or None."""
        await self.flush()
        async with self.pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                row = await conn.fetchrow(_q("session_load"), client_id)
                if row is None:
                    return None
                subs = await conn.fetch(_q("session_subscriptions"), client_id)
                msgs = await conn.fetch(_q("session_messages"), client_id)
                inbound = await conn.fetch(_q("session_inbound"), client_id)
        return {"session": dict(row), "subscriptions": [dict(r) for r in subs],
                "messages": [dict(r) for r in msgs], "inbound": [r["packet_id"] for r in inbound]}


    # --- the shared offline log (sql/mqtt_offline_queries.sql) ----------------------------------

    async def offline_head(self) -> int:
        """The last seq of this node's offline stream (0 for a new node)."""
        return await self.pool.fetchval(_q("offline_head"), self.node_id)

    async def offline_cursors(self, client_id: str) -> list[Any]:
        """The ranges of node streams a session reads, oldest first (the caller waits for the
        writes they depend on)."""
        return await self.pool.fetch(_q("session_cursors"), client_id)

    async def offline_rows(self, node_id: int, after: int, upto: int | None):
        """Rows of one node stream in (after, upto], in order, a page at a time; upto None = to
        the stream's end as it is now (a dead node's stream no longer grows)."""
        if upto is None:
            upto = await self.pool.fetchval(_q("offline_head"), node_id)
        while after < upto:
            rows = await self.pool.fetch(_q("offline_page"), node_id, after, upto, OFFLINE_PAGE)
            for r in rows:
                yield r
            if len(rows) < OFFLINE_PAGE:
                return
            after = rows[-1]["seq"]

    async def offline_prune(self, compact: int = COMPACT_RANGES) -> int:
        """Move the lowest cursor ranges past rows their sessions do not match, then delete the
        rows no range needs; returns how many were deleted."""
        await self.pool.execute(_q("cursors_compact"), compact)
        status = await self.pool.execute(_q("offline_prune"))
        return int(status.split()[-1])


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["MqttSessionStore"]
