"""Queue engine throughput: publish, claim+ack and stream read through the SQL API and the Python
API, against the same row shape inserted raw with COPY as the ceiling; plus end-to-end latency
publish → delivery through the Python API at a fixed rate.

    python benchmarks/engine.py --dsn postgresql://postgres@127.0.0.1/postgres [--messages 100000]

Creates (and drops) a database of its own on that server. Prints a Markdown table of msgs/s and
the ratio to the COPY ceiling at the same batch size; --json writes the numbers to a file.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg  # noqa: E402

from fluxpg import db  # noqa: E402
from fluxpg.config import Config, QueueConfig  # noqa: E402
from fluxpg.queues.manager import QueueManager  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

PAYLOAD = b"x" * 256
UNLIMITED = {"limits": {"max_depth": 0}, "delivery": {"max_pending": 0}}


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


async def copy_ceiling(conn: asyncpg.Connection, n: int, batch: int) -> float:
    """COPY of the log's row shape (same columns, same primary key) in batches of `batch`."""
    await conn.execute("DROP TABLE IF EXISTS bench_copy")
    await conn.execute("CREATE TABLE bench_copy (LIKE fluxpg.log INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
                       "PRIMARY KEY (queue_id, partition, seq))")
    topic = "$queue/bench/k"
    start = time.perf_counter()
    for first in range(0, n, batch):
        rows = [(1, 0, s, topic, PAYLOAD) for s in range(first, min(first + batch, n))]
        await conn.copy_records_to_table("bench_copy", records=rows,
                                         columns=["queue_id", "partition", "seq", "topic", "payload"])
    elapsed = time.perf_counter() - start
    await conn.execute("DROP TABLE bench_copy")
    return rate(n, elapsed)


async def sql_publish(conn, queue: str, n: int, batch: int) -> float:
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue)
    topic = f"$queue/{queue}/k"
    start = time.perf_counter()
    for first in range(0, n, batch):
        k = min(batch, n - first)
        await conn.execute("SELECT count(*) FROM fluxpg.append_batch($1, $2, $3)", [qid] * k, [topic] * k, [PAYLOAD] * k)
    return rate(n, time.perf_counter() - start)


async def sql_claim_ack(conn, queue: str, n: int, batch: int) -> float:
    done = 0
    start = time.perf_counter()
    while done < n:
        seqs = [r[0] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'bench', 'c', $2)", queue, batch)]
        if not seqs:
            break
        await conn.execute("SELECT fluxpg.ack($1, 'bench', $2)", queue, seqs)
        done += len(seqs)
    return rate(done, time.perf_counter() - start)


async def sql_stream_read(conn, queue: str, n: int, batch: int) -> float:
    done = 0
    start = time.perf_counter()
    while done < n:
        k = len(await conn.fetch("SELECT seq FROM fluxpg.read($1, 'bench', 'c', $2)", queue, batch))
        if not k:
            break
        done += k
    return rate(done, time.perf_counter() - start)


async def api_publish(mgr: QueueManager, queue: str, n: int, concurrency: int) -> tuple[float, float]:
    topic = f"$queue/{queue}/k"
    batches0 = mgr.appender.batches

    async def publisher(count: int):
        # One of `concurrency` publishers, each waiting for its confirm before the next
        # publish (as a client with one message in flight would).
        for _ in range(count):
            await mgr.publish(topic, PAYLOAD)

    start = time.perf_counter()
    share, extra = divmod(n, concurrency)
    await asyncio.gather(*(publisher(share + (1 if i < extra else 0)) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    return rate(n, elapsed), n / max(1, mgr.appender.batches - batches0)


async def api_publish_batches(mgr: QueueManager, queue: str, n: int, batch: int) -> float:
    topic = f"$queue/{queue}/k"
    start = time.perf_counter()
    for first in range(0, n, batch):
        await mgr.publish_many([(topic, PAYLOAD, None)] * min(batch, n - first))
    return rate(n, time.perf_counter() - start)


async def api_consume(mgr: QueueManager, queue: str, n: int, classic: bool, credit: int) -> float:
    done = asyncio.Event()
    count = 0
    acks: list[int] = []
    sub = None

    async def flush(batch):
        await mgr.ack(queue, "api", batch)
        sub.grant(len(batch))

    pending_flushes: list[asyncio.Task] = []

    def on_delivery(d):
        nonlocal count, acks
        count += 1
        if classic:
            acks.append(d.seq)
            if len(acks) >= credit // 2:        # ack in batches, as a consumer with a window would
                batch, acks = acks, []
                pending_flushes.append(asyncio.ensure_future(flush(batch)))
        if count >= n:
            done.set()

    start = time.perf_counter()
    sub = await mgr.subscribe(queue, "api", "api-consumer", on_delivery=on_delivery,
                              credit=credit if classic else None, position="first" if not classic else None)
    await asyncio.wait_for(done.wait(), 600)
    if classic and acks:
        await flush(acks)
    await asyncio.gather(*pending_flushes)
    elapsed = time.perf_counter() - start
    await sub.close()
    return rate(n, elapsed)


async def end_to_end(mgr: QueueManager, queue: str, rate_per_s: int, seconds: float, *, wait_confirm: bool) -> dict:
    """Latency publish → delivery at a fixed rate. wait_confirm: one publisher that awaits each
    confirm before the next publish (an MQTT QoS 1 / AMQP confirm client); otherwise publishes
    are fired at the rate without waiting, so they overlap and queue behind each other's commit."""
    latencies: list[float] = []
    sent: dict[bytes, float] = {}
    total = int(rate_per_s * seconds)
    finished = asyncio.Event()
    acks: list[int] = []

    def on_delivery(d):
        latencies.append(time.perf_counter() - sent[d.payload])
        acks.append(d.seq)
        if len(latencies) >= total:
            finished.set()

    group = "e2e-confirmed" if wait_confirm else "e2e-fired"
    sub = await mgr.subscribe(queue, group, "e2e-consumer", on_delivery=on_delivery, credit=None, position=None)
    await asyncio.sleep(0.5)
    interval = 1.0 / rate_per_s
    start = time.perf_counter()
    tasks = []
    for i in range(total):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        key = b"%s-%08d" % (group.encode(), i)
        sent[key] = time.perf_counter()
        if wait_confirm:
            await mgr.publish(f"$queue/{queue}/k", key)
        else:
            tasks.append(asyncio.ensure_future(mgr.publish(f"$queue/{queue}/k", key)))
        if len(acks) >= 100:
            batch, acks[:] = list(acks), []
            tasks.append(asyncio.ensure_future(mgr.ack(queue, group, batch)))
    await asyncio.gather(*tasks)
    await asyncio.wait_for(finished.wait(), 60)
    await sub.close()
    latencies.sort()
    return {"rate": rate_per_s, "messages": total, "wait_confirm": wait_confirm,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1],
            "max_ms": 1000 * latencies[-1]}


async def main(args) -> dict:
    n, batch = args.messages, args.batch
    results: dict = {"messages": n, "batch": batch, "payload_bytes": len(PAYLOAD), "cpus": os.cpu_count(),
                     "concurrency": args.concurrency}
    with fresh_database(args.dsn) as dsn:
        await asyncio.to_thread(db.migrate, dsn)
        conn = await db.connect(dsn)
        await conn.execute("SELECT fluxpg.declare_queue('sqlq', 'classic', NULL, $1)", UNLIMITED)
        await conn.execute("SELECT fluxpg.declare_queue('sqls', 'stream', NULL, $1)", UNLIMITED)
        ceiling = await copy_ceiling(conn, n, batch)
        results["copy_ceiling"] = ceiling
        results["sql_publish"] = await sql_publish(conn, "sqlq", n, batch)
        await sql_publish(conn, "sqls", n, batch)
        results["sql_claim_ack"] = await sql_claim_ack(conn, "sqlq", n, batch)
        results["sql_stream_read"] = await sql_stream_read(conn, "sqls", n, batch)
        await conn.close()

        config = Config(queues=[QueueConfig(name="apiq", **UNLIMITED_QC), QueueConfig(name="apis", type="stream", **UNLIMITED_QC),
                                QueueConfig(name="apiq1", **UNLIMITED_QC), QueueConfig(name="e2e"),
                                QueueConfig(name="e2e-fired")],
                        queue_manager={"max_pending_per_group": 1000000, "delivery_batch": batch})
        mgr = await QueueManager.start(dsn, config, migrate=False, retention=False)
        try:
            results["api_publish"] = await api_publish_batches(mgr, "apiq", n, batch)
            await api_publish_batches(mgr, "apis", n, batch)
            results["api_publish_single"], results["api_rows_per_batch"] = await api_publish(
                mgr, "apiq1", n, args.concurrency)
            results["api_claim_ack"] = await api_consume(mgr, "apiq", n, True, batch)
            results["api_stream_read"] = await api_consume(mgr, "apis", n, False, batch)
            results["end_to_end"] = await end_to_end(mgr, "e2e", args.e2e_rate, args.e2e_seconds, wait_confirm=True)
            # A queue of its own: a new group on "e2e" would first get that run's messages.
            results["end_to_end_fired"] = await end_to_end(mgr, "e2e-fired", args.e2e_rate, args.e2e_seconds,
                                                           wait_confirm=False)
        finally:
            await mgr.close()
    return results


UNLIMITED_QC = {"limits": {"max_depth": 0}}


def report(r: dict) -> str:
    c = r["copy_ceiling"]
    lines = [f"{r['messages']:,} messages of {r['payload_bytes']} B, batch {r['batch']}, {r['cpus']} CPUs",
             "", "| path | msgs/s | × COPY ceiling | target |", "| --- | ---: | ---: | ---: |",
             f"| COPY ceiling (same row shape) | {c:,.0f} | 1.00 | |"]
    rows = [("SQL publish (append_batch)", "sql_publish", 0.8), ("Python publish_many", "api_publish", 0.8),
            ("Python publish, one message per call (group commit)", "api_publish_single", 0.8),
            ("SQL claim + ack", "sql_claim_ack", 0.5), ("Python claim + ack", "api_claim_ack", 0.5),
            ("SQL stream read", "sql_stream_read", 2.0), ("Python stream read", "api_stream_read", 2.0)]
    for label, key, target in rows:
        lines.append(f"| {label} | {r[key]:,.0f} | {r[key] / c:.2f} | ≥ {target} |")
    lines += ["", f"Single publishes ({r['concurrency']} publishers, one in flight each) were group-committed "
              f"in batches of {r['api_rows_per_batch']:.0f} rows on average.", ""]
    for key, label in (("end_to_end", "one publisher awaiting each confirm"),
                       ("end_to_end_fired", "publishes fired at the rate without waiting")):
        e = r[key]
        lines.append(f"End to end (publish → delivery, Python API) at {e['rate']} msg/s, {label}, "
                     f"{e['messages']} messages: p50 {e['p50_ms']:.2f} ms, p99 {e['p99_ms']:.2f} ms, "
                     f"max {e['max_ms']:.2f} ms (targets: p50 ≤ 2 ms, p99 ≤ 10 ms).")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=2000, help="publishes in flight (Python API)")
    parser.add_argument("--e2e-rate", type=int, default=1000)
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = asyncio.run(main(args))
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
