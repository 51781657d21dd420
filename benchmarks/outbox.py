"""Publishing inside application transactions (fluxpg.publish, appended at commit): what it costs
the broker and the application, as ratios within one run.

    python benchmarks/outbox.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--pgmq-sql /path/to/pgmq.sql] [--rounds 3]

1. Broker publish latency (a publisher awaiting each confirm at 200 msg/s) while 10 application
   transactions each hold a published message open for 5 s, vs the same run without them
   (target: p50 and p99 within 1.2 x).
2. Throughput of transactional publishes, one message per transaction from 8 connections (in a
   process of their own, as an application's are), vs `pgmq.send` in the same kind of transaction
   on the same server (target >= 1.0 x); beside it PostgreSQL's CPU per transaction (all backends
   of the database, the sequencer's included, from /proc: only when the server runs on this host),
   which a shared machine's load moves less, split into the publishers' backends and the rest (the
   sequencer, with its messages per round); and each round's ratio, which strays far from the
   median here (README). A CHECKPOINT precedes each side's run. pgmq is installed from its
   plain-SQL file (`pgmq-extension/sql/pgmq.sql` of the pgmq project) into the benchmark's own
   database; without --pgmq-sql that row says so and is not measured.
3. End-to-end latency publish -> delivery at 1,000 msg/s: a transaction (BEGIN; fluxpg.publish;
   COMMIT) vs the broker's direct publish (target: p50 at most +2 ms).

Rounds are interleaved (A, B, A, B, ...) and medians reported. Creates and drops a database of
its own.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg  # noqa: E402
import fluxpg  # noqa: E402
from fluxpg import db  # noqa: E402
from fluxpg.config import Config, QueueConfig  # noqa: E402
from fluxpg.queues.manager import QueueManager  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

PAYLOAD = b"x" * 256
UNLIMITED = {"max_depth": 0}
MEASURES = ("latency", "throughput", "e2e")


# Polled until false after a run: the sequencer has moved every committed transaction's messages.
OUTBOX_WAITING = "SELECT EXISTS (SELECT FROM fluxpg.outbox_commits)"


async def checkpoint(conn: asyncpg.Connection) -> None:
    """A CHECKPOINT before a measured run: one that falls inside a run makes its first write to
    every page a full-page image, and would slow whichever side it happened to fall on."""
    try:
        await conn.execute("CHECKPOINT")
    except asyncpg.InsufficientPrivilegeError:
        pass   # not a superuser (nor pg_checkpoint): the runs stay comparable, only noisier


async def install_pgmq(dsn: str, sql_file: Path) -> None:
    """pgmq from its plain-SQL install file, and its queue 'bench'."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(sql_file.read_text())
        await conn.execute("SELECT pgmq.create('bench')")
    finally:
        await conn.close()


def percentile(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[max(0, min(len(values) - 1, int(round(p / 100 * len(values))) - 1))]


async def broker_publish_latency(mgr: QueueManager, dsn: str, queue: str, *, holders: int,
                                 seconds: float = 5.0, rate: int = 200) -> dict:
    """Confirm latency of broker publishes while `holders` application transactions keep a
    published message open for the whole run."""
    conns = [await db.connect(dsn) for _ in range(holders)]
    txs = []
    for i, c in enumerate(conns):
        tx = c.transaction()
        await tx.start()
        await fluxpg.publish(c, f"$queue/{queue}/held", b"held-%d" % i)
        txs.append(tx)
    latencies = []
    start = time.perf_counter()
    for i in range(int(seconds * rate)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        await mgr.publish(f"$queue/{queue}/k", PAYLOAD)
        latencies.append(time.perf_counter() - t0)
    for tx in txs:
        await tx.commit()
    for c in conns:
        await c.close()
    return {"p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * percentile(latencies, 99)}


def _cpu_seconds(pids: list[int]) -> dict[int, float] | None:
    """CPU time of each process (/proc/<pid>/schedstat, ns precision); None when PostgreSQL's
    processes cannot be read from here (another host, another user's /proc)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return None
    return out


async def _publish_loop(dsn: str, statement: str, args: tuple, connections: int, seconds: float) -> dict:
    """The application: `connections` connections, each running transactions of one statement
    (one message) for `seconds`; how many, over how long, and its backends' CPU."""
    counts = [0] * connections
    conns = [await db.connect(dsn) for _ in range(connections)]
    pids = [c.get_server_pid() for c in conns]
    before = _cpu_seconds(pids)
    started = time.perf_counter()
    stop_at = started + seconds

    async def worker(i: int) -> None:
        c = conns[i]
        while time.perf_counter() < stop_at:
            async with c.transaction():
                await c.execute(statement, *args)
            counts[i] += 1

    await asyncio.gather(*(worker(i) for i in range(connections)))
    elapsed = time.perf_counter() - started
    after = _cpu_seconds(pids)
    for c in conns:
        await c.close()
    cpu = sum(after[p] - before[p] for p in pids) if before is not None and after is not None else None
    return {"transactions": sum(counts), "seconds": elapsed, "cpu_seconds": cpu}


def _application(dsn: str, statement: str, args: tuple, connections: int, seconds: float) -> dict:
    """_publish_loop in a process of its own (ProcessPoolExecutor's entry point)."""
    return asyncio.run(_publish_loop(dsn, statement, args, connections, seconds))


async def tx_throughput(app: ProcessPoolExecutor, dsn: str, statement: str, args: tuple, *, connections: int = 8,
                        seconds: float = 5.0, drain: str | None = None,
                        mgr: QueueManager | None = None) -> dict:
    """Transactions per second, one statement (one message) each, from `connections` connections;
    and PostgreSQL's CPU per transaction, every backend of the benchmark's database (the broker's
    sequencer included: `drain` is polled until it says the last message was moved), which the
    load of other processes on a shared machine moves far less than the rate: the publishers'
    own backends and the rest (the sequencer's) apart, so the report says where the time goes.
    The publishers run in `app`, a process of their own, as an application's do: until session 12
    they shared the broker's event loop with the sequencer, whose callbacks could delay their round
    trips (a cost no deployed application pays). Measured both ways, alternating: no difference
    beyond the rounds' spread (benchmarks/README.md, session 12). A CHECKPOINT first (checkpoint())."""
    admin = await db.connect(dsn)
    await checkpoint(admin)
    # Every backend of the database but admin's and the application's (not connected yet): the broker's.
    pids = [r[0] for r in await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
    before = _cpu_seconds(pids)
    sequencer = mgr.sequencer if mgr is not None else None
    sequenced_before = (sequencer.rounds, sequencer.moved) if sequencer is not None else None
    ran = await asyncio.get_running_loop().run_in_executor(app, _application, dsn, statement, args,
                                                           connections, seconds)
    while drain and await admin.fetchval(drain):
        await asyncio.sleep(0.01)
    after = _cpu_seconds(pids)
    await admin.close()
    n = ran["transactions"]
    out = {"tx_per_s": n / ran["seconds"], "cpu_us_per_tx": None, "publishers_cpu_us_per_tx": None,
           "others_cpu_us_per_tx": None, "messages_per_round": None}
    if before is not None and after is not None and ran["cpu_seconds"] is not None:
        out["publishers_cpu_us_per_tx"] = 1e6 * ran["cpu_seconds"] / n
        out["others_cpu_us_per_tx"] = 1e6 * sum(after[p] - before[p] for p in pids) / n
        out["cpu_us_per_tx"] = out["publishers_cpu_us_per_tx"] + out["others_cpu_us_per_tx"]
    if sequenced_before is not None:
        rounds = sequencer.rounds - sequenced_before[0]
        out["messages_per_round"] = (sequencer.moved - sequenced_before[1]) / max(rounds, 1)
    return out


async def end_to_end(mgr: QueueManager, dsn: str, queue: str, *, transactional: bool, rate: int = 1000,
                     seconds: float = 3.0) -> dict:
    group = "e2e-tx" if transactional else "e2e-direct"
    sent: dict[bytes, float] = {}
    latencies: list[float] = []
    total = int(rate * seconds)
    finished = asyncio.Event()
    acks: list[int] = []

    def on_delivery(d):
        acks.append(d.seq)
        t0 = sent.get(d.payload)
        if t0 is None:          # an earlier round's message, redelivered: not this round's latency
            return
        latencies.append(time.perf_counter() - t0)
        if len(latencies) >= total:
            finished.set()

    sub = await mgr.subscribe(queue, group, "e2e", on_delivery=on_delivery, credit=None)
    app = await db.connect(dsn)
    await asyncio.sleep(0.3)
    start = time.perf_counter()
    pending = []
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        key = b"%s-%08d" % (group.encode(), i)
        sent[key] = time.perf_counter()
        if transactional:
            async with app.transaction():
                await fluxpg.publish(app, f"$queue/{queue}/k", key)
        else:
            await mgr.publish(f"$queue/{queue}/k", key)
        if len(acks) >= 100:
            batch, acks[:] = list(acks), []
            pending.append(asyncio.ensure_future(mgr.ack(queue, group, batch)))
    await asyncio.wait_for(finished.wait(), 60)
    if acks:
        pending.append(asyncio.ensure_future(mgr.ack(queue, group, list(acks))))
    await asyncio.gather(*pending)
    await sub.close()
    await app.close()
    # Each group reads the whole queue; only its own messages count.
    return {"p50_ms": 1000 * statistics.median(latencies), "p99_ms": 1000 * percentile(latencies, 99)}


async def main(args) -> dict:
    results: dict = {"rounds": args.rounds, "cpus": os.cpu_count(), "payload_bytes": len(PAYLOAD)}
    with fresh_database(args.dsn) as dsn:
        await asyncio.to_thread(db.migrate, dsn)
        pgmq = None
        if args.pgmq_sql:
            await install_pgmq(dsn, args.pgmq_sql)
            pgmq = "SELECT pgmq.send('bench', $1::jsonb)"
        queues = [QueueConfig(name=n, topics=[f"$queue/{n}/#"], limits=UNLIMITED)
                  for n in ("held", "txq", "e2e_direct", "e2e_tx")]
        mgr = await QueueManager.start(dsn, Config(queues=queues), migrate=False, retention=False)
        # The application's process, started (and its imports done) before anything is measured.
        app = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
        try:
            await asyncio.get_running_loop().run_in_executor(app, os.getpid)
            rows: dict[str, list] = {k: [] for k in ("latency_without", "latency_with", "tx_fluxpg", "tx_pgmq",
                                                   "e2e_direct", "e2e_tx")}
            body = json.dumps({"payload": PAYLOAD.decode()})
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                if "latency" in args.measure:
                    rows["latency_without"].append(await broker_publish_latency(mgr, dsn, "held", holders=0))
                    rows["latency_with"].append(await broker_publish_latency(mgr, dsn, "held", holders=10))
                if "throughput" in args.measure:
                    rows["tx_fluxpg"].append(await tx_throughput(
                        app, dsn, "SELECT fluxpg.publish('$queue/txq/k', $1)", (PAYLOAD,),
                        drain=OUTBOX_WAITING, mgr=mgr))
                    if pgmq:
                        rows["tx_pgmq"].append(await tx_throughput(app, dsn, pgmq, (body,)))
                if "e2e" in args.measure:
                    rows["e2e_direct"].append(await end_to_end(mgr, dsn, "e2e_direct", transactional=False))
                    rows["e2e_tx"].append(await end_to_end(mgr, dsn, "e2e_tx", transactional=True))
        finally:
            app.shutdown()
            await mgr.close()

    def med(key, field=None):
        values = [v[field] if field else v for v in rows[key]]
        return statistics.median(values) if values and None not in values else None

    results.update({
        "publish_p50_ms_without": med("latency_without", "p50_ms"), "publish_p99_ms_without": med("latency_without", "p99_ms"),
        "publish_p50_ms_with": med("latency_with", "p50_ms"), "publish_p99_ms_with": med("latency_with", "p99_ms"),
        "tx_per_s_fluxpg": med("tx_fluxpg", "tx_per_s"), "tx_per_s_pgmq": med("tx_pgmq", "tx_per_s"),
        "cpu_us_per_tx_fluxpg": med("tx_fluxpg", "cpu_us_per_tx"), "cpu_us_per_tx_pgmq": med("tx_pgmq", "cpu_us_per_tx"),
        "publishers_cpu_us_per_tx_fluxpg": med("tx_fluxpg", "publishers_cpu_us_per_tx"),
        "publishers_cpu_us_per_tx_pgmq": med("tx_pgmq", "publishers_cpu_us_per_tx"),
        "others_cpu_us_per_tx_fluxpg": med("tx_fluxpg", "others_cpu_us_per_tx"),
        "messages_per_round": med("tx_fluxpg", "messages_per_round"),
        "e2e_p50_ms_direct": med("e2e_direct", "p50_ms"), "e2e_p99_ms_direct": med("e2e_direct", "p99_ms"),
        "e2e_p50_ms_tx": med("e2e_tx", "p50_ms"), "e2e_p99_ms_tx": med("e2e_tx", "p99_ms"),
        "raw": rows,
    })

    # Each round measures both sides back to back under the same load: the ratio of a round's
    # pair, then the median over rounds, is steadier than the ratio of two medians.
    def each(a, b, field=None, diff=False):
        pairs = [(x[field] if field else x, y[field] if field else y) for x, y in zip(rows[a], rows[b])]
        if not pairs or any(None in p for p in pairs):
            return None
        return [(x - y) if diff else (x / y) for x, y in pairs]

    def paired(a, b, field=None, diff=False):
        values = each(a, b, field, diff)
        return statistics.median(values) if values else None

    results.update({
        "ratio_publish_p50": paired("latency_with", "latency_without", "p50_ms"),
        "ratio_publish_p99": paired("latency_with", "latency_without", "p99_ms"),
        "ratio_tx": paired("tx_fluxpg", "tx_pgmq", "tx_per_s"),
        # Round by round, to show how far one round's pair can stray from the median.
        "ratios_tx": each("tx_fluxpg", "tx_pgmq", "tx_per_s"),
        # pgmq's CPU per transaction over fluxpg's: >= 1.0 when fluxpg costs no more.
        "ratio_tx_cpu": paired("tx_pgmq", "tx_fluxpg", "cpu_us_per_tx"),
        "added_e2e_p50_ms": paired("e2e_tx", "e2e_direct", "p50_ms", diff=True),
    })
    return results


def report(r: dict) -> str:
    def fmt(x):
        return f"{x:.2f}" if x is not None else "—"

    lines = [
        f"medians of {r['rounds']} interleaved rounds, {r['cpus']} CPUs; ratio = median over rounds of each round's pair",
        "",
        "| measure | without / direct / pgmq | with / transactional / fluxpg | ratio | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    if r["publish_p50_ms_with"] is not None:
        lines += [
            f"| broker publish p50 (ms), 10 open app transactions | {r['publish_p50_ms_without']:.2f} | "
            f"{r['publish_p50_ms_with']:.2f} | {fmt(r['ratio_publish_p50'])} | ≤ 1.2 |",
            f"| broker publish p99 (ms), 10 open app transactions | {r['publish_p99_ms_without']:.2f} | "
            f"{r['publish_p99_ms_with']:.2f} | {fmt(r['ratio_publish_p99'])} | ≤ 1.2 |",
        ]
    if r["tx_per_s_fluxpg"] is not None:
        lines.append(
            f"| transactions/s, one message each, 8 connections | "
            f"{r['tx_per_s_pgmq'] and format(r['tx_per_s_pgmq'], ',.0f') or 'pgmq not installed'} | "
            f"{r['tx_per_s_fluxpg']:,.0f} | {fmt(r['ratio_tx'])} | ≥ 1.0 |")
        if r["ratios_tx"]:
            lines.append(f"| ... each round's ratio | | | {', '.join(fmt(x) for x in r['ratios_tx'])} | |")
        if r["cpu_us_per_tx_fluxpg"] is not None and r["cpu_us_per_tx_pgmq"] is not None:
            lines += [
                f"| PostgreSQL CPU per transaction (µs), all backends, the sequencer's included | "
                f"{r['cpu_us_per_tx_pgmq']:.0f} | {r['cpu_us_per_tx_fluxpg']:.0f} | "
                f"{fmt(r['ratio_tx_cpu'])} (pgmq / fluxpg) | |",
                f"| ... of it the publishers' backends | {r['publishers_cpu_us_per_tx_pgmq']:.0f} | "
                f"{r['publishers_cpu_us_per_tx_fluxpg']:.0f} | | |",
                f"| ... of it the sequencer's (messages per round: {fmt(r['messages_per_round'])}) | | "
                f"{r['others_cpu_us_per_tx_fluxpg']:.0f} | | |",
            ]
    if r["e2e_p50_ms_tx"] is not None:
        lines += [
            f"| end-to-end p50 (ms) at 1,000 msg/s | {r['e2e_p50_ms_direct']:.2f} | {r['e2e_p50_ms_tx']:.2f} | "
            f"+{r['added_e2e_p50_ms']:.2f} ms | ≤ +2 ms |",
            f"| end-to-end p99 (ms) at 1,000 msg/s | {r['e2e_p99_ms_direct']:.2f} | {r['e2e_p99_ms_tx']:.2f} | | |",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--pgmq-sql", type=Path, help="pgmq's plain-SQL install file (pgmq-extension/sql/pgmq.sql)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", nargs="+", choices=MEASURES, default=list(MEASURES),
                        help="which rows to measure (default: all)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(main(args))
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
