"""The database restarts under a running broker: publishes fail cleanly while it is down (never a
false confirm), work resumes by itself when it is back, and no confirmed message is lost.

Uses a private embedded PostgreSQL (durable, on a loopback TCP port kept across the restart) so
that stopping it disturbs nobody else's tests."""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from fluxpg import db
from fluxpg.config import Config, QueueConfig
from fluxpg.embedded import EmbeddedPostgres
from fluxpg.queues.manager import QueueManager
from fluxpg.errors import FluxError

pytestmark = pytest.mark.slow


async def test_broker_survives_a_database_restart_without_losing_confirmed_messages():
    tmp = Path(tempfile.mkdtemp(prefix="fluxpg-restart-"))
    pg = EmbeddedPostgres(tmp / "pgdata", durable=True, tcp=True)
    await asyncio.to_thread(pg.start)
    mgr = None
    try:
        mgr = await QueueManager.start(pg.dsn, Config(queues=[QueueConfig(name="jobs")],
                                                      queue_manager={"visibility_timeout": "2s"}),
                                       retention=False)
        received: set[bytes] = set()
        confirmed: set[bytes] = set()
        failed = 0

        async def on_delivery(d):
            received.add(d.payload)
            try:
                await mgr.ack("jobs", d.group, [d.seq])
            except FluxError:
                pass            # not acked: it comes back after the visibility timeout
            sub.grant(1)        # either way it left this consumer's window

        sub = await mgr.subscribe("jobs", "workers", "w1", on_delivery=on_delivery, credit=50)

        async def publisher():
            nonlocal failed
            for i in range(600):
                payload = b"job-%04d" % i
                try:
                    await mgr.publish("$queue/jobs/x", payload)
                    confirmed.add(payload)
                except FluxError:
                    failed += 1             # refused while the database was away: not confirmed
                await asyncio.sleep(0.005)

        async def restart():
            await asyncio.sleep(0.8)
            await asyncio.to_thread(pg.stop)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(pg.start)

        await asyncio.gather(publisher(), restart())
        assert failed > 0, "the restart did not overlap the publishes"
        assert len(confirmed) > 300
        # Delivery resumes by itself (pool reconnects, LISTEN reconnects and wakes everyone).
        for _ in range(150):
            if confirmed <= received:
                break
            await asyncio.sleep(0.2)
        assert confirmed <= received, f"{len(confirmed - received)} confirmed messages never delivered"
        # And the log holds every confirmed message (what was confirmed was committed durably).
        conn = await db.connect(pg.dsn)
        try:
            stored = {bytes(r["payload"]) for r in await conn.fetch(
                "SELECT payload FROM fluxpg.log WHERE queue_id = (SELECT id FROM fluxpg.queues WHERE name = 'jobs')")}
        finally:
            await conn.close()
        assert confirmed <= stored
    finally:
        if mgr is not None:
            await mgr.close()
        await asyncio.to_thread(pg.stop)
