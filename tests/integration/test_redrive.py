"""Redrive of dead letters: the SQL API (fluxpg.redrive), its atomicity under a concurrent consumer
and redrives, the admin browse that hides redriven messages, and `fluxpg dlq redrive` run as a
user runs it."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from fluxpg import db
from fluxpg.errors import UnknownQueue
from fluxpg.queues.admin import Admin

REPO = Path(__file__).resolve().parents[2]


async def dead_letter(conn, queue: str, n: int, reject: list[int] | None = None) -> list[int]:
    """Publish n messages m0..m{n-1} to `queue`, claim them all as group g, reject `reject` (all by
    default) and ack the rest. Returns the rejected offsets."""
    await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}')", queue)
    # Appended directly (fluxpg.publish stages for a broker's sequencer; no broker runs here).
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue)
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[], $4::jsonb[])",
                     [qid] * n, [f"$queue/{queue}/t{i % 3}" for i in range(n)], [f"m{i}".encode() for i in range(n)],
                     [{"n": i} for i in range(n)])
    claimed = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c1', $2)", queue, n)]
    assert claimed == list(range(n))
    reject = list(range(n)) if reject is None else reject
    assert await conn.fetchval("SELECT fluxpg.reject($1, 'g', $2::bigint[], 'bad')", queue, reject) == len(reject)
    rest = [s for s in claimed if s not in reject]
    if rest:
        await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2::bigint[])", queue, rest)
    return reject


async def live_dlq(conn, dlq: str) -> list[tuple[int, bytes]]:
    """(offset, payload) of the messages still in the DLQ (not redriven)."""
    rows = await conn.fetch("""
        SELECT l.seq, l.payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id
         WHERE q.name = $1 AND NOT EXISTS (SELECT 1 FROM fluxpg.redriven r
                                            WHERE r.queue_id = q.id AND r.partition = l.partition AND r.seq = l.seq)
         ORDER BY l.seq""", dlq)
    return [(r["seq"], bytes(r["payload"])) for r in rows]


async def test_redrive_offsets_then_all(conn, qname):
    await dead_letter(conn, qname, 5, reject=[0, 2, 4])
    dlq = f"$dlq/{qname}"
    assert [p for _, p in await live_dlq(conn, dlq)] == [b"m0", b"m2", b"m4"]
    depth = "SELECT depth FROM fluxpg.queue_stats WHERE queue = $1"
    assert await conn.fetchval(depth, dlq) == 3

    assert await conn.fetchval("SELECT fluxpg.redrive($1, dry_run => true)", dlq) == 3
    assert len(await live_dlq(conn, dlq)) == 3            # a dry run moves nothing

    assert await conn.fetchval("SELECT fluxpg.redrive($1, ARRAY[1]::bigint[])", dlq) == 1   # m2
    assert await conn.fetchval("SELECT fluxpg.redrive($1, ARRAY[1]::bigint[])", dlq) == 0   # once only
    assert [p for _, p in await live_dlq(conn, dlq)] == [b"m0", b"m4"]
    assert await conn.fetchval(depth, dlq) == 2            # a redriven message left the DLQ's depth

    # Back in the original queue as a new message (offset 5), original topic, headers saying where
    # it came from; the group that rejected it gets it again.
    (got,) = await conn.fetch("SELECT seq, topic, payload, headers FROM fluxpg.claim($1, 'g', 'c1', 10)", qname)
    assert (got["seq"], got["topic"], bytes(got["payload"])) == (5, f"$queue/{qname}/t2", b"m2")
    h = got["headers"]
    assert h["n"] == 2 and h["_dlq_original_id"] == f"{qname}:2" and h["_dlq_reason"] == "bad"
    assert h["_redriven_from"] == f"{dlq}:1" and h["_redrive_count"] == 1 and h["_redriven_at"].endswith("Z")
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[5]::bigint[])", qname)

    assert await conn.fetchval("SELECT fluxpg.redrive($1)", dlq) == 2
    assert await live_dlq(conn, dlq) == []
    assert await conn.fetchval(depth, dlq) == 0
    rows = await conn.fetch("SELECT seq, payload FROM fluxpg.claim($1, 'g', 'c1', 10)", qname)
    assert [(r["seq"], bytes(r["payload"])) for r in rows] == [(6, b"m0"), (7, b"m4")]
    moved = await conn.fetch("""SELECT r.seq, r.to_seq FROM fluxpg.redriven r JOIN fluxpg.queues q ON q.id = r.queue_id
                                 WHERE q.name = $1 ORDER BY r.seq""", dlq)
    assert [(r["seq"], r["to_seq"]) for r in moved] == [(0, 6), (1, 5), (2, 7)]


async def test_redrive_by_range_and_the_admin_browse(manager_factory, conn, qname):
    await dead_letter(conn, qname, 10)
    dlq = f"$dlq/{qname}"
    assert await conn.fetchval("SELECT fluxpg.redrive($1, from_offset => 3, to_offset => 6)", dlq) == 3
    mgr = await manager_factory()
    admin = Admin(mgr)
    page = await admin.browse(dlq, from_offset=0, limit=4)
    assert [m.seq for m in page] == [0, 1, 2, 6]                 # keyset page, redriven hidden
    assert page[0].headers["_dlq_original_topic"] == f"$queue/{qname}/t0" and page[0].payload == b"m0"
    everything = await admin.browse(dlq, from_offset=0, limit=20, include_redriven=True)
    assert [(m.seq, m.redriven) for m in everything][2:7] == [(2, False), (3, True), (4, True), (5, True), (6, False)]
    assert await admin.redrive(dlq, offsets=[0, 9], dry_run=True) == 2
    assert await admin.redrive(dlq, offsets=[0, 9]) == 2
    assert [m.seq for m in await admin.browse(dlq, limit=20)] == [1, 2, 6, 7, 8]


async def test_messages_a_dlq_consumer_holds_stay_and_redriven_ones_are_not_delivered_from_the_dlq(conn, qname):
    await dead_letter(conn, qname, 4)
    dlq = f"$dlq/{qname}"
    held = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'audit', 'a1', 1)", dlq)
    assert [r["seq"] for r in held] == [0]
    assert await conn.fetchval("SELECT fluxpg.redrive($1, ARRAY[0, 1]::bigint[])", dlq) == 1   # 0 is pending
    rest = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'audit', 'a1', 10)", dlq)
    assert [r["seq"] for r in rest] == [2, 3]                    # 1 left the DLQ: not delivered there
    await conn.fetchval("SELECT fluxpg.ack($1, 'audit', ARRAY[0, 2]::bigint[])", dlq)
    # 0 and 2 were consumed by the DLQ's only group (no longer in it), 3 is being processed.
    assert await conn.fetchval("SELECT fluxpg.redrive($1)", dlq) == 0


async def test_redrive_errors(conn, qname):
    with pytest.raises(asyncpg.PostgresError, match="unknown queue"):
        await conn.fetchval("SELECT fluxpg.redrive('$dlq/no-such-queue')")
    await dead_letter(conn, qname, 2)
    dlq = f"$dlq/{qname}"
    with pytest.raises(asyncpg.PostgresError, match="offsets or a range"):
        await conn.fetchval("SELECT fluxpg.redrive($1, ARRAY[0]::bigint[], 0, 1)", dlq)
    # The original queue is gone: refused, nothing moves.
    await conn.execute("DELETE FROM fluxpg.queues WHERE name = $1", qname)
    with pytest.raises(asyncpg.PostgresError, match=f"original queue '{qname}'"):
        await conn.fetchval("SELECT fluxpg.redrive($1)", dlq)
    assert len(await live_dlq(conn, dlq)) == 2


async def test_admin_redrive_errors_are_flux_errors(manager_factory):
    admin = Admin(await manager_factory())
    with pytest.raises(UnknownQueue):
        await admin.redrive("$dlq/nothing-here")


async def test_concurrent_redrives_and_a_consumer_see_every_message_in_exactly_one_queue(dsn, conn, qname):
    """Three redrivers race over overlapping batches while a consumer drains the original queue
    and a checker takes snapshots: in every snapshot each dead letter is in exactly one of the two
    queues, and in the end the consumer got each exactly once."""
    n = 300
    await dead_letter(conn, qname, n)
    dlq = f"$dlq/{qname}"
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[]::bigint[])", qname)
    stop = asyncio.Event()
    consumed: list[str] = []
    snapshots = 0
    check_sql = """
        WITH dl AS (SELECT l.headers ->> '_dlq_original_id' AS id FROM fluxpg.log l
                     WHERE l.queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1)
                       AND NOT EXISTS (SELECT 1 FROM fluxpg.redriven r WHERE r.queue_id = l.queue_id AND r.seq = l.seq)),
             back AS (SELECT l.headers ->> '_dlq_original_id' AS id FROM fluxpg.log l
                       WHERE l.queue_id = (SELECT id FROM fluxpg.queues WHERE name = $2) AND l.headers ? '_redriven_from')
        SELECT count(*) FILTER (WHERE c <> 1) AS wrong, count(*) AS ids
          FROM (SELECT id, count(*) AS c FROM (SELECT id FROM dl UNION ALL SELECT id FROM back) u GROUP BY id) x"""

    async def redriver(offset_step: int) -> int:
        c = await db.connect(dsn)
        moved = 0
        try:
            for lo in range(0, n, offset_step):
                moved += await c.fetchval("SELECT fluxpg.redrive($1, from_offset => $2, to_offset => $3)",
                                          dlq, lo, lo + offset_step)
        finally:
            await c.close()
        return moved

    async def consumer() -> None:
        c = await db.connect(dsn)
        try:
            while not stop.is_set() or len(consumed) < n:
                rows = await c.fetch("SELECT seq, headers FROM fluxpg.claim($1, 'g', 'c2', 25)", qname)
                if rows:
                    consumed.extend(r["headers"]["_dlq_original_id"] for r in rows)
                    await c.fetchval("SELECT fluxpg.ack($1, 'g', $2::bigint[])", qname, [r["seq"] for r in rows])
                else:
                    await asyncio.sleep(0.01)
        finally:
            await c.close()

    async def checker() -> None:
        nonlocal snapshots
        c = await db.connect(dsn)
        try:
            while not stop.is_set():
                row = await c.fetchrow(check_sql, dlq, qname)
                assert row["wrong"] == 0 and row["ids"] == n, dict(row)
                snapshots += 1
                await asyncio.sleep(0)
        finally:
            await c.close()

    consuming = asyncio.create_task(consumer())
    checking = asyncio.create_task(checker())
    moved = await asyncio.wait_for(asyncio.gather(redriver(7), redriver(20), redriver(50)), 120)
    stop.set()
    await asyncio.wait_for(consuming, 60)
    await asyncio.wait_for(checking, 30)
    assert sum(moved) == n                   # each moved by exactly one of the racing redrives
    assert sorted(consumed) == sorted(f"{qname}:{i}" for i in range(n))
    assert snapshots > 0
    assert await live_dlq(conn, dlq) == []


def test_cli_dlq_redrive(dsn, qname):
    async def setup():
        c = await db.connect(dsn)
        try:
            await dead_letter(c, qname, 25)
        finally:
            await c.close()

    asyncio.run(setup())
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}

    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "fluxpg.cli", "dlq", "redrive", qname, "--dsn", dsn, *args],
                              capture_output=True, env=env, timeout=120)
        return proc.returncode, proc.stdout.decode(), proc.stderr.decode()

    code, out, err = cli()
    assert code == 2 and "--offsets" in err and "Traceback" not in err
    code, out, err = cli("--offsets", "1,x")
    assert code == 2 and "expected offsets" in err
    code, out, err = cli("--all", "--dry-run")
    assert code == 0 and out.strip() == f"would move 25 messages from $dlq/{qname} to {qname}", err
    code, out, err = cli("--offsets", "0,3-5")
    assert code == 0 and out.strip() == f"moved 4 messages from $dlq/{qname} to {qname}", err
    code, out, err = cli("--all", "--batch", "7")          # several batches: the progress bar path
    assert code == 0 and out.strip() == f"moved 21 messages from $dlq/{qname} to {qname}", err
    code, out, err = cli("--all")
    assert code == 0 and out.strip() == f"moved 0 messages from $dlq/{qname} to {qname}"
    proc = subprocess.run([sys.executable, "-m", "fluxpg.cli", "dlq", "redrive", "no-such-queue", "--all",
                           "--dsn", dsn], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 1 and b"unknown queue '$dlq/no-such-queue'" in proc.stderr
