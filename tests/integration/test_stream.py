"""Stream groups through the SQL API: cursor reads, checkpoints, seeks, auto-commit."""
from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from tests.helpers import declare, expire, publish, publish_many, read, status

MANUAL = {"delivery": {"auto_commit_interval": "1h"}}


async def test_read_has_no_pending_and_ack_checkpoints(conn, qname):
    await declare(conn, qname, "stream", MANUAL)
    await publish_many(conn, qname, 5)
    assert await read(conn, qname, "g", "c", 3) == [0, 1, 2]
    s = await status(conn, qname, "g")
    assert (s["cursor"], s["committed"], s["pending"]) == (3, 0, 0)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.pending_entries WHERE queue = $1", qname) == 0
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[1]::bigint[])", qname)
    assert (await status(conn, qname, "g"))["committed"] == 2     # everything up to offset 1 done
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[0]::bigint[])", qname)
    assert (await status(conn, qname, "g"))["committed"] == 2     # never backwards
    assert await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[2]::bigint[])", qname) == 0  # no-op
    assert await read(conn, qname, "g", "c", 10) == [3, 4]


async def test_reject_advances_the_cursor_past_the_message(conn, qname):
    await declare(conn, qname, "stream", MANUAL)
    await publish_many(conn, qname, 5)
    assert await read(conn, qname, "g", "c", 3) == [0, 1, 2]
    await conn.fetchval("SELECT fluxpg.seek($1, 'g', '2')", qname)        # read 2 again…
    await conn.fetchval("SELECT fluxpg.reject($1, 'g', ARRAY[2]::bigint[])", qname)  # …and skip it
    assert await read(conn, qname, "g", "c", 10) == [3, 4]
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.log WHERE queue_id = "
                               "(SELECT id FROM fluxpg.queues WHERE name = $1)", qname) == 5  # log keeps it


async def test_manual_commit_and_resume(conn, qname):
    await declare(conn, qname, "stream", MANUAL)
    await conn.fetchval("SELECT fluxpg.configure_group($1, 'g', false)", qname)
    await publish_many(conn, qname, 6)
    assert await read(conn, qname, "g", "c", 4) == [0, 1, 2, 3]
    await conn.fetchval("SELECT fluxpg.commit($1, 'g', 2)", qname)   # offsets 0 and 1 processed
    with pytest.raises(asyncpg.PostgresError, match="between 0 and the cursor") as info:
        await conn.fetchval("SELECT fluxpg.commit($1, 'g', 5)", qname)
    assert info.value.sqlstate == "FP004"
    # A consumer restarting resumes from the checkpoint: 2 and 3 come again.
    assert await conn.fetchval("SELECT fluxpg.seek($1, 'g', 'resume')", qname) == 2
    assert await read(conn, qname, "g", "c", 10) == [2, 3, 4, 5]


async def test_auto_commit_commits_what_earlier_reads_delivered(conn, qname):
    await declare(conn, qname, "stream", {"delivery": {"auto_commit_interval": "0"}})
    await publish_many(conn, qname, 4)
    assert await read(conn, qname, "g", "c", 2) == [0, 1]
    assert (await status(conn, qname, "g"))["committed"] == 0
    assert await read(conn, qname, "g", "c", 2) == [2, 3]          # commit-on-get: 0, 1 committed
    assert (await status(conn, qname, "g"))["committed"] == 2


async def test_auto_commit_interval_is_respected(conn, qname):
    await declare(conn, qname, "stream", {"delivery": {"auto_commit_interval": "1h"}})
    await publish_many(conn, qname, 4)
    await read(conn, qname, "g", "c", 2)
    await read(conn, qname, "g", "c", 2)      # first commit happens (never committed before)
    await read(conn, qname, "g", "c", 2)
    assert (await status(conn, qname, "g"))["committed"] == 2      # not again within the hour


async def test_seek_positions(conn, qname):
    await declare(conn, qname, "stream", MANUAL)
    await publish_many(conn, qname, 3)
    await asyncio.sleep(0.05)
    cut = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    await publish_many(conn, qname, 3)

    async def seek(pos):
        return await conn.fetchval("SELECT fluxpg.seek($1, 'g', $2)", qname, pos)

    assert await seek("first") == 0
    assert await seek("last") == 6 and await seek("next") == 6
    assert await seek("2") == 2 and await seek("offset=4") == 4
    assert await seek("offset=999") == 6           # clamped to the log
    assert await seek(f"timestamp={cut}") == 3     # milliseconds
    assert await seek(f"timestamp={cut // 1000 - 3600}") == 0   # seconds
    await seek("last")
    assert await read(conn, qname, "g", "c", 10) == []
    await seek(f"timestamp={cut}")
    assert await read(conn, qname, "g", "c", 10) == [3, 4, 5]
    with pytest.raises(asyncpg.PostgresError, match="invalid position"):
        await seek("yesterday")
    with pytest.raises(asyncpg.PostgresError, match="is a stream queue") as info:
        await conn.fetch("SELECT * FROM fluxpg.claim($1, 'g', 'c', 1)", qname)
    assert info.value.sqlstate == "FP002"


async def test_new_group_starts_at_oldest_retained_and_groups_are_independent(conn, qname):
    await declare(conn, qname, "stream", MANUAL)
    await publish_many(conn, qname, 3)
    assert await read(conn, qname, "a", "c", 10) == [0, 1, 2]
    assert await read(conn, qname, "b", "c", 1) == [0]
    await publish(conn, f"$queue/{qname}/x")
    assert await read(conn, qname, "a", "c", 10) == [3]
    assert await read(conn, qname, "b", "c", 10) == [1, 2, 3]


async def test_stream_filters_and_ttl(conn, qname):
    await declare(conn, qname, "stream", {"limits": {"message_ttl": "1h"}, **MANUAL})
    await publish(conn, f"$queue/{qname}/sensors/a")
    await expire(conn, qname, [0])
    for key in ("sensors/b", "other", "sensors/c/d"):
        await publish(conn, f"$queue/{qname}/{key}")
    assert await read(conn, qname, "r@sensors/#", "c", 10) == [1, 3]   # 0 expired, 2 filtered out


async def test_each_batch_goes_to_one_consumer(dsn, qname):
    """The cursor row is locked for a read: concurrent readers of a group never get the same
    message."""
    from fluxpg import db

    conns = [await db.connect(dsn) for _ in range(3)]
    try:
        await declare(conns[0], qname, "stream", MANUAL)
        await publish_many(conns[0], qname, 600)

        async def reader(c, name):
            got = []
            while True:
                batch = await read(c, qname, "g", name, 7)
                if not batch:
                    return got
                got += batch

        results = await asyncio.gather(*(reader(c, f"r{i}") for i, c in enumerate(conns)))
        everything = sorted(s for r in results for s in r)
        assert everything == list(range(600))
    finally:
        for c in conns:
            await c.close()
