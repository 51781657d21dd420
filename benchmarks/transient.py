"""Transient queues vs durable classic queues, measured on the SQL engine (issue 11).

What it times, on a throwaway database of FLUXPG_TEST_DSN (or --dsn):
- creating and deleting a transient queue (fluxpg.declare_transient / delete_transient: rows only)
  against creating a durable one (fluxpg.declare_queue: CREATE TABLE + ATTACH of its partition
  and first segment);
- publish (append_batch of --batch messages) and claim + ack of them, on a transient queue (rows in
  the UNLOGGED fluxpg.log_transient, deleted on ack) and on a durable classic queue (its own
  logged partition; retention drops segments later).

    python benchmarks/transient.py [--dsn DSN] [--messages 20000] [--batch 100] [--queues 200]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import time

import asyncpg

from fluxpg import db
from fluxpg.testing import fresh_database


async def timed(label: str, n: int, coro_factory) -> float:
    t = time.perf_counter()
    await coro_factory()
    dt = time.perf_counter() - t
    print(f"{label:<52} {n / dt:>10.0f} /s   ({dt * 1e6 / n:8.1f} µs each)")
    return dt


async def run(dsn: str, messages: int, batch: int, queues: int) -> None:
    conn = await asyncpg.connect(dsn)
    node = await conn.fetchval("SELECT fluxpg.register_node('bench', 1)")

    async def declare_transient():
        for i in range(queues):
            await conn.fetchval("SELECT fluxpg.declare_transient($1, $2, NULL, false, '{}')", f"t{i}", node)

    async def delete_transient():
        for i in range(queues):
            await conn.fetchval("SELECT fluxpg.delete_transient($1)", f"t{i}")

    async def declare_durable():
        for i in range(queues):
            await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic')", f"d{i}")

    await timed("declare_transient", queues, declare_transient)
    await timed("delete_transient", queues, delete_transient)
    await timed("declare_queue (durable: partition + segment DDL)", queues, declare_durable)

    await conn.fetchval("SELECT fluxpg.declare_transient('tq', $1, NULL, false, '{\"limits\": {\"max_depth\": 0}}')", node)
    await conn.fetchval("SELECT fluxpg.declare_queue('dq', 'classic', NULL, '{\"limits\": {\"max_depth\": 0}}')")
    payload = b"x" * 256
    for name in ("dq", "tq"):
        qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", name)
        topics, payloads = [f"$queue/{name}/k"] * batch, [payload] * batch

        async def publish():
            for _ in range(messages // batch):
                await conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3)", [qid] * batch, topics, payloads)

        async def claim_ack():
            while True:
                seqs = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', $2)", name, batch)]
                if not seqs:
                    return
                await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2::bigint[])", name, seqs)

        kind = "transient" if name == "tq" else "durable"
        await timed(f"publish {kind} (batches of {batch}, 256 B)", messages, publish)
        await timed(f"claim + ack {kind} (batches of {batch})", messages, claim_ack)
    print("log_transient rows left after acking everything:",
          await conn.fetchval("SELECT count(*) FROM fluxpg.log_transient"))
    await conn.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--queues", type=int, default=200)
    a = ap.parse_args()
    with fresh_database(a.dsn) as dsn:
        db.migrate(dsn)
        asyncio.run(run(dsn, a.messages, a.batch, a.queues))


if __name__ == "__main__":
    main()
