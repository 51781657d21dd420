"""Small helpers for engine tests that talk SQL directly."""
from __future__ import annotations

import asyncio
import inspect

import asyncpg


async def declare(conn: asyncpg.Connection, name: str, kind: str = "classic", settings: dict | None = None,
                  topics: list[str] | None = None) -> int:
    return await conn.fetchval("SELECT fluxpg.declare_queue($1, $2, $3, $4)", name, kind, topics, settings or {})


async def publish(conn: asyncpg.Connection, topic: str, payload: bytes = b"x", headers: dict | None = None):
    return [tuple(r) for r in await conn.fetch("SELECT queue, seq FROM fluxpg.append($1, $2, $3)", topic, payload, headers)]


async def publish_many(conn: asyncpg.Connection, queue: str, n: int, routing_key: str = "k", payload: bytes = b"x"):
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue)
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3)", [qid] * n,
                     [f"$queue/{queue}/{routing_key}"] * n, [payload] * n)


async def claim(conn, queue, group, consumer, n=1):
    return [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, $2, $3, $4)", queue, group, consumer, n)]


async def read(conn, queue, group, consumer, n=1):
    return [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.read($1, $2, $3, $4)", queue, group, consumer, n)]


async def status(conn, queue, group):
    return await conn.fetchrow("SELECT * FROM fluxpg.group_status WHERE queue = $1 AND grp = $2", queue, group)


async def pending(conn, queue, group):
    return [r["seq"] for r in await conn.fetch(
        "SELECT seq FROM fluxpg.pending_entries WHERE queue = $1 AND grp = $2 ORDER BY seq", queue, group)]


async def expire(conn: asyncpg.Connection, queue: str, seqs: list[int]) -> None:
    """Expire these messages now, by moving their expiry into the past: a test that waited out a
    short TTL instead would race it (a stall before the next read expires the fresh ones too)."""
    await conn.execute("UPDATE fluxpg.log SET expires_at = now() - interval '1 second' "
                       "WHERE queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1) AND seq = ANY ($2::bigint[])",
                       queue, seqs)


def stored(dsn: str, sql: str, *args):
    """One value read from the database on a connection of its own (for tests off the event loop)."""
    async def run():
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()
    return asyncio.run(run())


async def until(cond, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Until cond() (a value, or an awaitable of one) is true; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert loop.time() < deadline, f"condition not reached within {timeout} s"
        await asyncio.sleep(interval)


async def pending_count(server, queue: str) -> int:
    """Messages of `queue` delivered and not yet acknowledged, over its groups (a broker's manager)."""
    return sum(r["pending"] for r in await server.manager.group_status(queue))


async def nothing_pending(server, queue: str) -> bool:
    return await pending_count(server, queue) == 0


class Inbox:
    """A subscription's delivery callback that collects deliveries; wait_for(n) waits until n came."""

    def __init__(self):
        self.items = []
        self._changed = asyncio.Event()

    def __call__(self, delivery):
        self.items.append(delivery)
        self._changed.set()

    async def wait_for(self, n: int, timeout: float = 10.0):
        async def loop():
            while len(self.items) < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(loop(), timeout)
        return self.items


def paho_loop_stop(client) -> None:
    """client.loop_stop() after a disconnect: paho's network thread may end by itself between
    loop_stop's check of it and its join, which then raises AttributeError (paho's own race,
    eclipse-paho/paho.mqtt.python#872, open); the thread is joined here instead."""
    thread = client._thread
    try:
        client.loop_stop()
    except AttributeError:
        if thread is not None:
            thread.join(10)
