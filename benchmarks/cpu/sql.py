"""SQL API: PostgreSQL CPU per message of fluxpg's functions vs pgmq's, same batch and concurrency.

Both sides are plain SQL from asyncpg connections of this process, each in a database of its
own, so only the backends of that database are counted. pgmq is installed from its plain-SQL file
(`pgmq-extension/sql/pgmq.sql` of github.com/pgmq/pgmq, not shipped here: --pgmq-sql or PGMQ_SQL);
without it only fluxpg's rows are measured. fluxpg: 256-byte bytea payloads; pgmq: a 256-byte
JSON string (its messages are jsonb).

Rows: `fluxpg.append_batch` vs `pgmq.send_batch`, `--clients` producers of `--batch` messages per
call; `fluxpg.claim` + `fluxpg.ack` (one group, `--clients` consumers) vs `pgmq.read` + `pgmq.delete`
of that backlog.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import asyncpg

from benchmarks.cpu.accounting import Meter, Sample, backend_pids, dsn_database

PEER = "pgmq"
ROWS = {
    "SQL `append_batch` vs pgmq `send_batch` (batch 100, 4 producers)": ("append", "append"),
    "SQL `claim` + `ack` vs pgmq `read` + `delete` (batch 100, 4 consumers)": ("claim_ack", "claim_ack"),
    # Not a target row: where the first one's limit is. Offsets are dense and commit-ordered per
    # queue partition, so appends to one partition serialise on its heads row from the reserve to
    # the end of the commit (its WAL flush included); a stream of 4 partitions with a producer per
    # partition takes four such rows.
    "SQL `append_batch` into a 4-partition stream (a producer per partition) vs pgmq `send_batch`": ("append_p4", "append"),
}
PAYLOAD = b"x" * 256
JSON_PAYLOAD = '"' + "x" * 254 + '"'


async def _parallel(dsn: str, clients: int, work) -> None:
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    try:
        await asyncio.gather(*(work(i, c) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()


async def _timed(dsn: str, meter: Meter, clients: int, setup, work, n: int) -> Sample:
    conns = [await asyncpg.connect(dsn) for _ in range(clients)]
    try:
        ctx = await setup(conns[0])
        meter.begin()
        start = time.perf_counter()
        await asyncio.gather(*(work(i, c, ctx) for i, c in enumerate(conns)))
        elapsed = time.perf_counter() - start
        return Sample(n, elapsed, meter.end())
    finally:
        for c in conns:
            await c.close()


async def fluxpg_round(dsn: str, meter: Meter, args) -> dict[str, Sample]:
    queue = f"cpu_{uuid.uuid4().hex[:8]}"
    per = args.messages // args.clients // args.batch * args.batch
    n = per * args.clients
    b = args.batch

    async def setup(conn):
        await conn.execute("SELECT fluxpg.declare_queue($1, 'classic', null, '{}')", queue)
        await conn.execute("SELECT fluxpg._group(fluxpg._queue($1), 'bench')", queue)  # the group, before any message
        return await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue)

    async def produce(i, conn, qid):
        topic = f"$queue/{queue}/k"
        for _ in range(per // b):
            await conn.execute("SELECT count(*) FROM fluxpg.append_batch($1, $2, $3)", [qid] * b, [topic] * b, [PAYLOAD] * b)

    done = [0]

    async def consume(i, conn, _ctx):
        while done[0] < n:
            seqs = [r[0] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'bench', $2, $3)", queue, f"c{i}", b)]
            if not seqs:
                await asyncio.sleep(0.001)   # another consumer holds the cursor: try again
                continue
            await conn.execute("SELECT fluxpg.ack($1, 'bench', $2)", queue, seqs)
            done[0] += len(seqs)

    async def nothing(conn):
        return None

    out = {"append": await _timed(dsn, meter, args.clients, setup, produce, n)}
    out["claim_ack"] = await _timed(dsn, meter, args.clients, nothing, consume, n)

    stream = f"{queue}_p"

    async def setup_stream(conn):
        await conn.execute("SELECT fluxpg.declare_queue($1, 'stream', null, $2::jsonb)", stream,
                           '{"partitions": %d}' % args.clients)
        qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", stream)
        # A partition key per producer, each landing on a partition of its own (chosen by
        # append_batch's own rule, fluxpg._partition_of).
        keys = [r[0] for r in await conn.fetch(
            "SELECT min('k' || g) FROM generate_series(0, 999) g "
            "GROUP BY fluxpg._partition_of('k' || g, NULL, $1) ORDER BY 1", args.clients)]
        return qid, keys

    async def produce_partition(i, conn, ctx):
        qid, keys = ctx
        topic = f"$queue/{stream}/k"
        for _ in range(per // b):
            await conn.execute("SELECT count(*) FROM fluxpg.append_batch($1, $2, $3, NULL, $4)",
                               [qid] * b, [topic] * b, [PAYLOAD] * b, [keys[i]] * b)

    out["append_p4"] = await _timed(dsn, meter, args.clients, setup_stream, produce_partition, n)
    return out


async def pgmq_round(dsn: str, meter: Meter, args) -> dict[str, Sample]:
    queue = f"cpu_{uuid.uuid4().hex[:8]}"
    per = args.messages // args.clients // args.batch * args.batch
    n = per * args.clients
    b = args.batch

    async def setup(conn):
        await conn.execute("SELECT pgmq.create($1)", queue)

    async def produce(i, conn, _ctx):
        for _ in range(per // b):
            await conn.execute("SELECT count(*) FROM pgmq.send_batch($1, $2::jsonb[])", queue, [JSON_PAYLOAD] * b)

    done = [0]

    async def consume(i, conn, _ctx):
        while done[0] < n:
            ids = [r[0] for r in await conn.fetch("SELECT msg_id FROM pgmq.read($1, 30, $2)", queue, b)]
            if not ids:
                await asyncio.sleep(0.001)
                continue
            await conn.execute("SELECT count(*) FROM pgmq.delete($1, $2::bigint[])", queue, ids)
            done[0] += len(ids)

    async def nothing(conn):
        return None

    out = {"append": await _timed(dsn, meter, args.clients, setup, produce, n)}
    out["claim_ack"] = await _timed(dsn, meter, args.clients, nothing, consume, n)
    await (await asyncpg.connect(dsn)).execute("SELECT pgmq.drop_queue($1)", queue)
    return out


async def one_round(side: str, dsn: str, meter: Meter, args) -> dict[str, Sample]:
    return await (fluxpg_round if side == "fluxpg" else pgmq_round)(dsn, meter, args)


def sides(args, stack):
    from fluxpg import db
    from fluxpg.testing import fresh_database

    def pg_meter(dsn: str) -> Meter:
        name = dsn_database(dsn)
        return Meter({"pg": lambda: backend_pids(args.dsn, name)})

    flux = stack.enter_context(fresh_database(args.dsn))
    db.migrate(flux)
    out = {"fluxpg": (flux, pg_meter(flux))}
    if args.pgmq_sql:
        peer = stack.enter_context(fresh_database(args.dsn))
        import psycopg
        with psycopg.connect(peer, autocommit=True) as conn:
            conn.execute(Path(args.pgmq_sql).read_text())
        out[PEER] = (peer, pg_meter(peer))
    return out
