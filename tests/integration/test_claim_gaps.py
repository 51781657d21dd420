"""A claim never moves its group's cursor past an offset its scan did not read.

Offsets of a queue are dense, but a scan can miss rows below the head it read: ATTACH PARTITION
takes only SHARE UPDATE EXCLUSIVE on the queue's log table, so a plan can be made from a segment
list older than the snapshot the scan reads with — a claim in a transaction that already holds
the log's locks takes no invalidation (the deterministic case below), a generic plan made while
the invalidation arrives is cached without the segment (the concurrency test with small
segments). And retention drops a segment before it moves the queue's first offset up. Real
PostgreSQL; each case is deterministic."""
from __future__ import annotations

from fluxpg import db
from tests.helpers import declare


async def append(conn, qid: int, qname: str, n: int) -> None:
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3)", [qid] * n, [f"$queue/{qname}/k"] * n, [b"x"] * n)


async def segments(conn, qid: int) -> list[int]:
    return [r[0] for r in await conn.fetch(
        "SELECT from_seq FROM fluxpg._segment_list WHERE queue_id = $1 ORDER BY from_seq", qid)]


async def claim_across_a_new_segment(dsn, qname, selector):
    """Claim 2 in a transaction (its backend now holds the log's locks), let another connection
    attach the next segment and fill it, claim the rest in the same transaction, then again."""
    publisher = await db.connect(dsn)
    consumer = await db.connect(dsn)
    try:
        qid = await declare(publisher, qname, settings={"segment_size": 10})
        await append(publisher, qid, qname, 3)
        assert await segments(publisher, qid) == [0]
        got = []
        sql = "SELECT seq FROM fluxpg.claim($1, 'g', 'c', $2, $3::jsonpath)"
        async with consumer.transaction():
            got += [r[0] for r in await consumer.fetch(sql, qname, 2, selector)]
            await append(publisher, qid, qname, 12)                  # offsets 3..14
            assert await segments(publisher, qid) == [0, 10, 20]     # [10, 20) attached meanwhile
            got += [r[0] for r in await consumer.fetch(sql, qname, 100, selector)]
        got += [r[0] for r in await consumer.fetch(sql, qname, 100, selector)]
        assert sorted(got) == list(range(15)) and len(got) == 15
        assert await publisher.fetchval("SELECT cursor FROM fluxpg.group_status WHERE queue = $1", qname) == 15
    finally:
        await consumer.close()
        await publisher.close()


async def test_a_claim_does_not_pass_a_segment_attached_after_its_plan(dsn, qname):
    await claim_across_a_new_segment(dsn, qname, None)


async def test_a_selector_claim_does_not_pass_a_segment_attached_after_its_plan(dsn, qname):
    await claim_across_a_new_segment(dsn, qname, "exists($)")


async def test_a_claim_moves_past_a_dropped_segment_before_retention_moves_the_floor(conn, qname):
    """Retention drops a segment, then moves the first offset up (_forget_segment): between the
    two the claim sees no rows at its cursor, and below the lowest segment left nothing comes
    back, so it goes on from there rather than waiting at the hole."""
    qid = await declare(conn, qname, settings={"segment_size": 10})
    await append(conn, qid, qname, 25)
    assert [r[0] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 1)", qname)] == [0]
    await conn.execute(f"ALTER TABLE fluxpg.log_{qid} DETACH PARTITION fluxpg.log_{qid}_p0_0")
    await conn.execute(f"DROP TABLE fluxpg.log_{qid}_p0_0")
    assert await conn.fetchval("SELECT first_seq FROM fluxpg.heads WHERE queue_id = $1", qid) == 0
    rows = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 3)", qname)
    assert [r[0] for r in rows] == [10, 11, 12]
    assert await conn.fetchval("SELECT cursor FROM fluxpg.group_status WHERE queue = $1", qname) == 13


async def test_expired_and_other_topic_rows_are_passed_over_not_taken_for_gaps(conn, qname):
    """Rows the claim skips (expired, not matching the group's filter) are rows it read: the
    cursor moves past them as before."""
    qid = await declare(conn, qname, settings={"segment_size": 10})
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3, $4)", [qid] * 6, [f"$queue/{qname}/k"] * 6,
                     [b"x"] * 6, [None, {"x-amqp-expiration": "0"}, {"x-amqp-expiration": "0"}, None,
                                  {"x-amqp-expiration": "0"}, {"x-amqp-expiration": "0"}])
    rows = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 5)", qname)
    assert [r[0] for r in rows] == [0, 3]
    assert await conn.fetchval("SELECT cursor FROM fluxpg.group_status WHERE queue = $1", qname) == 6
    rows = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g2', 'c', 1)", qname)
    assert [r[0] for r in rows] == [0]
    rows = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g2', 'c', 1)", qname)
    assert [r[0] for r in rows] == [3]
    assert await conn.fetchval("SELECT cursor FROM fluxpg.group_status WHERE queue = $1 AND grp = 'g2'", qname) == 4


async def test_a_stream_read_does_not_pass_a_segment_attached_after_its_plan(dsn, qname):
    """The same for fluxpg.read: it stops where its scan stopped seeing rows, and the next read
    (its plans made afresh) goes on from there."""
    publisher = await db.connect(dsn)
    consumer = await db.connect(dsn)
    try:
        qid = await declare(publisher, qname, kind="stream", settings={"segment_size": 10})
        await append(publisher, qid, qname, 3)
        got = []
        sql = "SELECT seq FROM fluxpg.read($1, 'g', 'c', $2)"
        async with consumer.transaction():
            got += [r[0] for r in await consumer.fetch(sql, qname, 2)]
            await append(publisher, qid, qname, 12)
            assert await segments(publisher, qid) == [0, 10, 20]
            got += [r[0] for r in await consumer.fetch(sql, qname, 100)]
            got += [r[0] for r in await consumer.fetch(sql, qname, 100)]
        got += [r[0] for r in await consumer.fetch(sql, qname, 100)]
        assert got == list(range(15))
    finally:
        await consumer.close()
        await publisher.close()
