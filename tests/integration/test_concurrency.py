"""Many consumers on separate connections: every message goes to exactly one of them (none timed
out), while publishers keep appending; and a consumer killed mid-batch loses nothing."""
from __future__ import annotations

import asyncio
import random

import pytest

from fluxpg import db
from tests.helpers import declare

MESSAGES = 3000
CONSUMERS = 6


@pytest.mark.parametrize("segment_size", [500, 20])   # 20: a segment attached every 20 appends, mid-claims
async def test_each_message_goes_to_exactly_one_consumer(dsn, qname, segment_size):
    setup = await db.connect(dsn)
    await declare(setup, qname, settings={"segment_size": segment_size, "limits": {"max_depth": 0}})
    conns = [await db.connect(dsn) for _ in range(CONSUMERS + 2)]
    published = asyncio.Event()

    async def publisher(conn, start):
        for i in range(start, MESSAGES, 2):
            await conn.fetchval("SELECT count(*) FROM fluxpg.append($1, $2)", f"$queue/{qname}/k", b"%d" % i)

    async def consumer(conn, name):
        got = []
        while True:
            rows = await conn.fetch("SELECT seq, payload, delivery_count FROM fluxpg.claim($1, 'g', $2, $3)",
                                    qname, name, random.randint(1, 25))
            if rows:
                assert all(r["delivery_count"] == 1 for r in rows)
                got += [r["seq"] for r in rows]
                await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, [r["seq"] for r in rows])
            elif published.is_set():
                return got
            else:
                await asyncio.sleep(0.005)

    try:
        consumers = [asyncio.create_task(consumer(c, f"c{i}")) for i, c in enumerate(conns[:CONSUMERS])]
        await asyncio.gather(publisher(conns[-1], 0), publisher(conns[-2], 1))
        published.set()
        results = await asyncio.wait_for(asyncio.gather(*consumers), 120)
        everything = [s for r in results for s in r]
        assert len(everything) == len(set(everything)) == MESSAGES
        assert sorted(everything) == list(range(MESSAGES))
        assert sum(1 for r in results if r) > 1          # the work was actually shared
        row = await setup.fetchrow("SELECT cursor, committed, pending FROM fluxpg.group_status "
                                   "WHERE queue = $1", qname)
        assert tuple(row) == (MESSAGES, MESSAGES, 0)
    finally:
        for c in conns:
            await c.close()
        await setup.fetchval("SELECT fluxpg.delete_queue($1)", qname)   # its segments: not other tests' work
        await setup.close()


async def test_connection_killed_mid_claim_loses_nothing(dsn, qname):
    """A consumer's connection dies inside its claim transaction: the transaction rolls back,
    so the cursor did not move and nothing is pending; another consumer gets every message."""
    setup = await db.connect(dsn)
    await declare(setup, qname)
    await setup.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3)", [await setup.fetchval(
        "SELECT id FROM fluxpg.queues WHERE name = $1", qname)] * 50, [f"$queue/{qname}/k"] * 50, [b"x"] * 50)
    victim = await db.connect(dsn)
    tx = victim.transaction()
    await tx.start()
    claimed = await victim.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'victim', 20)", qname)
    assert len(claimed) == 20
    pid = victim.get_server_pid()
    await setup.execute("SELECT pg_terminate_backend($1)", pid)
    await asyncio.sleep(0.1)
    survivor = await db.connect(dsn)
    try:
        rows = await survivor.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'survivor', 100)", qname)
        assert [r["seq"] for r in rows] == list(range(50))
        assert {r["delivery_count"] for r in rows} == {1}
    finally:
        await survivor.close()
        await setup.close()
        victim.terminate()
