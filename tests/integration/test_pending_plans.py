"""The ack's DELETE by offsets never reads the pending_due index (revision 0014): with statistics
that say fluxpg.pending is nearly empty (after a VACUUM, autovacuum's or the broker's), the planner
took it for that DELETE and every ack read all pending entries of its group. Shown on a tiny table
(the planner's estimates after a VACUUM of an emptied table, then 200 entries in flight): with the
old index this generic plan reads pending_due."""
from __future__ import annotations

from tests.helpers import claim, declare, publish_many

ACK_DELETE = ("DELETE FROM fluxpg.pending WHERE group_id = $1 AND partition = $2 "
              "AND seq BETWEEN fluxpg._lo($3) AND fluxpg._hi($3) AND seq = ANY ($3)")


async def _generic_plan(conn, gid, seqs) -> str:
    """EXPLAIN of the ack's DELETE (as fluxpg.ack runs it) with a generic plan, as plpgsql's cached one."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE ack_delete(int, int, bigint[]) AS {ACK_DELETE}")
        try:
            # EXPLAIN EXECUTE takes no bind parameters: the values are literals of the EXECUTE.
            rows = await conn.fetch(f"EXPLAIN EXECUTE ack_delete({int(gid)}, 0, "
                                    f"'{{{','.join(str(int(s)) for s in seqs)}}}'::bigint[])")
        finally:
            await conn.execute("DEALLOCATE ack_delete")
    return "\n".join(r[0] for r in rows)


async def test_the_ack_reads_the_primary_key_after_vacuum(conn, qname):
    await declare(conn, qname)
    await publish_many(conn, qname, 500)
    for _ in range(3):                                  # claimed and acked: dead entries, then VACUUM
        seqs = await claim(conn, qname, "g", "c", 100)
        assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, seqs) == 100
    await conn.execute("VACUUM fluxpg.pending")
    assert len(await claim(conn, qname, "g", "c", 200)) == 200     # in flight again after it
    gid = await conn.fetchval("SELECT g.id FROM fluxpg.groups g JOIN fluxpg.queues q ON q.id = g.queue_id "
                              "WHERE q.name = $1 AND g.name = 'g'", qname)
    plan = await _generic_plan(conn, gid, [1, 2, 3])
    assert "pending_due" not in plan, plan
    assert "pending_pkey" in plan, plan


async def test_due_redeliveries_can_still_read_pending_due(conn):
    """A condition on visible_at proves the index's predicate. Without group_id, so that the
    primary key offers nothing and sequential scans are off: which index a tiny table is read
    with is the planner's call; whether it may use this one at all is the point."""
    async with conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN SELECT 1 FROM fluxpg.pending p WHERE p.visible_at <= now()"))
    assert "pending_due" in plan, plan
