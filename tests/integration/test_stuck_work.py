"""Work that was lost or stuck (issue 14): a poison message whose dead-lettering fails inside
claim, max_depth on streams, reclaim paging through a consumer's pending entries — each through
SQL and through the broker's Python path."""
from __future__ import annotations

import asyncio

import pytest

from fluxpg.config import QueueConfig
from fluxpg.errors import QueueFull
from fluxpg.queues import classic
from tests.helpers import claim, declare, pending, publish, read


async def make_due(conn, queue: str) -> None:
    await conn.execute("UPDATE fluxpg.pending SET visible_at = now() WHERE seq = 0 AND group_id = "
                       "(SELECT g.id FROM fluxpg.groups g JOIN fluxpg.queues q ON q.id = g.queue_id "
                       " WHERE q.name = $1 AND g.name = 'g')", queue)


async def test_a_message_that_cannot_be_dead_lettered_is_parked_and_the_group_moves_on(conn, qname):
    dead = f"{qname}_dead"
    await declare(conn, dead, settings={"limits": {"max_depth": 1}})
    await publish(conn, f"$queue/{dead}/x", b"fills the DLQ")
    await declare(conn, qname, settings={"retry": {"max_retries": 0, "initial_backoff": "0s", "max_backoff": "0s"},
                                         "dlq": {"topic": dead}})
    await publish(conn, f"$queue/{qname}/a", b"poison")
    await publish(conn, f"$queue/{qname}/b", b"fine")
    assert await claim(conn, qname, "g", "c") == [0]
    await make_due(conn, qname)  # its visibility timeout passed; no retries left: claim dead-letters it

    # Before: every claim raised "queue … is full" and "fine" was never delivered.
    assert await claim(conn, qname, "g", "c", 5) == [1]
    parked = await conn.fetchrow("SELECT seq, last_error, visible_at > now() AS later FROM fluxpg.pending_entries "
                                 "WHERE queue = $1 AND grp = 'g' AND seq = 0", qname)
    assert parked["later"] and "is full" in parked["last_error"] and "max-deliveries" in parked["last_error"]
    assert await claim(conn, qname, "g", "c", 5) == []  # parked, not retried in a loop

    # Room in the DLQ again: the parked message is dead-lettered at its next turn.
    assert await claim(conn, dead, "ops", "o") == [0]
    await conn.fetchval("SELECT fluxpg.ack($1, 'ops', ARRAY[0]::bigint[])", dead)
    await make_due(conn, qname)
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[1]::bigint[])", qname)
    assert await claim(conn, qname, "g", "c", 5) == []
    assert await pending(conn, qname, "g") == []
    row = await conn.fetchrow("SELECT payload, headers FROM fluxpg.claim($1, 'ops', 'o', 1)", dead)
    assert row["payload"] == b"poison" and row["headers"]["_dlq_reason"] == "max-deliveries"


async def test_max_depth_bounds_a_stream_in_sql(conn, qname):
    await declare(conn, qname, "stream", {"limits": {"max_depth": 2}})
    await publish(conn, f"$queue/{qname}/a")
    await publish(conn, f"$queue/{qname}/b")
    with pytest.raises(Exception, match="is full"):
        await publish(conn, f"$queue/{qname}/c")
    # A group that committed what it read makes room (depth = what the slowest group has not committed).
    assert await read(conn, qname, "g", "c", 2) == [0, 1]
    await conn.fetchval("SELECT fluxpg.commit($1, 'g', 2)", qname)
    assert await publish(conn, f"$queue/{qname}/c") == [(qname, 2)]
    assert await publish(conn, f"$queue/{qname}/d") == [(qname, 3)]  # 2 not committed: 2, 3
    with pytest.raises(Exception, match="is full"):
        await publish(conn, f"$queue/{qname}/e")


async def test_max_depth_bounds_a_stream_through_the_broker(manager_factory, qname):
    mgr = await manager_factory([QueueConfig(name=qname, type="stream", limits={"max_depth": 2})])
    await mgr.publish(f"$queue/{qname}/a", b"1")
    await mgr.publish(f"$queue/{qname}/a", b"2")
    with pytest.raises(QueueFull):
        await mgr.publish(f"$queue/{qname}/a", b"3")


async def test_reclaim_pages_through_pending_entries_after_an_offset(conn, qname, manager_factory):
    await declare(conn, qname)
    for i in range(5):
        await publish(conn, f"$queue/{qname}/k", f"m{i}".encode())
    assert await claim(conn, qname, "g", "c1", 5) == [0, 1, 2, 3, 4]

    async def page(after):
        return [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.reclaim($1, 'g', 'c1', 2, $2)", qname, after)]

    assert [await page(None), await page(1), await page(3), await page(4)] == [[0, 1], [2, 3], [4], []]
    assert [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.reclaim($1, 'g', 'c1', 10)", qname)] == \
        [0, 1, 2, 3, 4]  # without the offset: from the start, as before

    # The broker's Python path, and a consumer that comes back holding more than one batch.
    mgr = await manager_factory([QueueConfig(name=qname)], delivery_batch=2)
    assert [d.seq for d in await classic.reclaim(mgr.pool, qname, "g", "c1", 2, 2)] == [3, 4]
    got: list[int] = []
    done = asyncio.Event()

    def on_delivery(d):
        got.append(d.seq)
        if len(got) == 5:
            done.set()

    sub = await mgr.subscribe(qname, "g", "c1", on_delivery=on_delivery)
    await asyncio.wait_for(done.wait(), 10)  # long before the 30 s visibility timeout
    await sub.close()
    assert got == [0, 1, 2, 3, 4]


async def test_stream_auto_commit_of_the_embedding_api_commits_only_what_the_application_took(dsn, qname):
    import fluxpg

    async with fluxpg.connect(dsn, migrate=False) as broker:
        await broker.declare(qname, type="stream")
        for i in range(6):
            await broker.publish(f"$queue/{qname}/k", f"m{i}".encode())
        async with broker.consume(qname, group="audit", position="first", prefetch=100) as messages:
            taken = [(await messages.get(timeout=10)).payload for _ in range(3)]
            # All six are prefetched by now; the application took three.
            for _ in range(100):
                if messages._inbox.qsize() == 3:
                    break
                await asyncio.sleep(0.05)
            assert messages._inbox.qsize() == 3
        assert taken == [b"m0", b"m1", b"m2"]
        # Before: the close committed all six and m3..m5 were never seen.
        async with broker.consume(qname, group="audit") as messages:
            rest = [(await messages.get(timeout=10)).payload for _ in range(3)]
        assert rest == [b"m3", b"m4", b"m5"]
