"""Retention under load: dropping 1M messages while publishers keep publishing (issue 17).

    python benchmarks/retention.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--messages 1000000] [--segment-size 10000] [--reference 5] [--paths sql broker]

On a database of its own (created and dropped), two stream queues are filled with `--messages`
messages each (server-side `fluxpg.append_batch`, 1,000 rows per call, several connections), in
segments of `--segment-size` (100 segments for 1M). Then, one path after the other:

- `sql`: SQL publishers (`fluxpg.append_batch` of 10 rows and single `fluxpg.append`, paced) run a
  reference window with nothing due, then the queue's retention is set to keep the newest
  segment's worth (`max_length_messages`), so ~99 % of it is due, and a driver connection calls
  `SELECT fluxpg.enforce_retention()` until nothing of the queue is due any more.
- `broker`: `fluxpg serve` (subprocess, free ports, `retention_interval` 1 s) with aio-pika
  publishers confirming each publish and the same SQL publishers; the same reference window,
  then the same settings change, and the broker's retention loop (`DETACH … CONCURRENTLY`) drops it.

Every publish is timed (call → result / confirm). A publish belongs to the drop window if it
overlaps it (from the first `DETACH` seen in pg_stat_activity or the first segment gone, whichever
comes first, to the last segment gone), to the reference window if it lies inside it. Reported per
path: publisher errors (must be 0), publishes, p50 / p99 / max in both windows and their ratios
(same run), segments and messages dropped, the drop's duration, and the lock waits a monitor saw
(pg_locks, not granted, sampled every 10 ms: waiter, lock, blocker, longest wait seen). After each
path the queue is checked: no gap in what it keeps, and nothing retention should keep is gone.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aio_pika  # noqa: E402
import asyncpg  # noqa: E402

from benchmarks.cpu.accounting import Broker  # noqa: E402
from fluxpg import db  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

PAYLOAD = b"x" * 100


@dataclass
class Timing:
    kind: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Publishers:
    timings: list[Timing] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def paced(rate: float, stop: asyncio.Event, call, kind: str, pubs: Publishers) -> None:
    """Call `call()` `rate` times a second (no catching up after a slow call) and time each."""
    period = 1.0 / rate
    nxt = time.perf_counter()
    while not stop.is_set():
        delay = nxt - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = time.perf_counter()
        try:
            await call()
        except Exception as exc:  # noqa: BLE001 - counted: the target is zero
            pubs.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
        else:
            pubs.timings.append(Timing(kind, t0, time.perf_counter()))
        nxt = max(nxt + period, time.perf_counter())


async def sql_publishers(dsn: str, qid: int, topic: str, pubs: Publishers, rate: float) -> list[asyncio.Task]:
    conns = [await db.connect(dsn) for _ in range(4)]
    ids, topics, payloads = [qid] * 10, [topic] * 10, [PAYLOAD] * 10

    def batch(c):
        return lambda: c.fetchval("SELECT count(*) FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[])",
                                  ids, topics, payloads)

    def single(c):
        return lambda: c.fetchval("SELECT count(*) FROM fluxpg.append($1, $2)", topic, PAYLOAD)

    async def run(c, call, kind):
        try:
            await paced(rate, pubs.stop, call, kind, pubs)
        finally:
            await c.close()

    return [asyncio.create_task(run(conns[0], batch(conns[0]), "sql append_batch(10)")),
            asyncio.create_task(run(conns[1], batch(conns[1]), "sql append_batch(10)")),
            asyncio.create_task(run(conns[2], single(conns[2]), "sql append")),
            asyncio.create_task(run(conns[3], single(conns[3]), "sql append"))]


async def amqp_publishers(url: str, queue: str, pubs: Publishers, rate: float, n: int = 4) -> list[asyncio.Task]:
    async def run():
        conn = await aio_pika.connect(url)
        try:
            ch = await conn.channel(publisher_confirms=True)

            async def one():
                await ch.default_exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), routing_key=queue)

            await paced(rate, pubs.stop, one, "amqp publish + confirm", pubs)
        finally:
            await conn.close()

    return [asyncio.create_task(run()) for _ in range(n)]


async def fill(dsn: str, qid: int, topic: str, n: int, conns: int = 3, batch: int = 1000) -> float:
    start = time.perf_counter()
    todo = list(range(0, n, batch))

    async def worker():
        c = await db.connect(dsn)
        try:
            while todo:
                k = min(batch, n - todo.pop())
                await c.execute("SELECT count(*) FROM fluxpg.append_batch($1::int[], $2::text[], $3::bytea[])",
                                [qid] * k, [topic] * k, [PAYLOAD] * k)
        finally:
            await c.close()

    await asyncio.gather(*(worker() for _ in range(conns)))
    return n / (time.perf_counter() - start)


LOCK_WAITS = """
SELECT w.pid, left(regexp_replace(w.query, '\\s+', ' ', 'g'), 70) AS waiter,
       l.locktype, l.mode, coalesce(l.relation::regclass::text, l.transactionid::text, l.virtualxid) AS object,
       extract(epoch FROM now() - l.waitstart) AS waited,
       (SELECT left(regexp_replace(b.query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity b
         WHERE b.pid = (pg_blocking_pids(w.pid))[1] LIMIT 1) AS blocker
  FROM pg_locks l JOIN pg_stat_activity w ON w.pid = l.pid
 WHERE NOT l.granted AND w.datname = current_database()
"""


class Monitor:
    """Samples, every 10 ms: segments left of the queue, a DETACH running, lock waits."""

    def __init__(self, dsn: str, qid: int):
        self.dsn, self.qid = dsn, qid
        self.first_detach: float | None = None
        self.counts: list[tuple[float, int]] = []
        self.waits: dict[tuple, float] = {}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        c = await db.connect(self.dsn)
        try:
            while not self.stop.is_set():
                now = time.perf_counter()
                n = await c.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass "
                                     "AND NOT inhdetachpending", f"fluxpg.log_{self.qid}")
                self.counts.append((now, n))
                if self.first_detach is None and await c.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                        "AND (query ILIKE '%DETACH PARTITION%' OR query ILIKE '%enforce_retention%') "
                        "AND state = 'active' AND pid <> pg_backend_pid())"):
                    self.first_detach = now
                try:
                    waits = await c.fetch(LOCK_WAITS)
                except asyncpg.PostgresError:   # a catalog race of the sample itself: skip it
                    waits = []
                for r in waits:
                    key = (r["waiter"], r["locktype"], r["mode"], r["object"], r["blocker"])
                    self.waits[key] = max(self.waits.get(key, 0.0), float(r["waited"] or 0))
                await asyncio.sleep(0.01)
        finally:
            await c.close()

    def window(self, before: int, after: int) -> tuple[float, float] | None:
        """From the first DETACH (or the first segment gone) to the last segment gone."""
        gone = [t for t, n in self.counts if n < before]
        done = [t for t, n in self.counts if n <= after]
        if not gone or not done:
            return None
        start = min(gone[0], self.first_detach or gone[0])
        return start, done[0]


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] * 1e3


def stats(timings: list[Timing]) -> dict:
    s = [t.seconds for t in timings]
    return {"n": len(s), "p50": pct(s, 50), "p99": pct(s, 99), "max": max(s) * 1e3 if s else float("nan"),
            "mean": statistics.fmean(s) * 1e3 if s else float("nan")}


async def settle(conn, quiet_ms: float = 20.0, limit: float = 120.0) -> float:
    """Wait until 20 one-row commits in a row each take under quiet_ms: after the fill this
    machine's disk kept commits stalling for seconds (a reference window with nothing due read a
    759 ms publish), which is the disk's and not retention's. Returns the seconds waited."""
    await conn.execute("CREATE TABLE IF NOT EXISTS settle_probe (x int)")   # logged: its commits flush WAL (the database is the benchmark's own)
    start = time.perf_counter()
    steady = 0
    while steady < 20 and time.perf_counter() - start < limit:
        t0 = time.perf_counter()
        await conn.execute("INSERT INTO settle_probe VALUES (1)")   # a commit that flushes WAL
        steady = steady + 1 if (time.perf_counter() - t0) * 1e3 < quiet_ms else 0
        await asyncio.sleep(0.05)
    return time.perf_counter() - start


async def segments(conn, qid: int) -> int:
    return await conn.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass "
                               "AND NOT inhdetachpending", f"fluxpg.log_{qid}")


async def due_count(conn, qid: int) -> int:
    return await conn.fetchval("SELECT count(*) FROM fluxpg.due_segments() WHERE queue_id = $1", qid)


async def check_queue(conn, qid: int, keep: int) -> dict:
    """No gap in what the queue keeps, and retention kept at least `keep` newest messages."""
    head = await conn.fetchrow("SELECT first_seq, next_seq FROM fluxpg.heads WHERE queue_id = $1 AND partition = 0", qid)
    rows, lo, hi = await conn.fetchrow("SELECT count(*), min(seq), max(seq) FROM fluxpg.log WHERE queue_id = $1", qid)
    ok = (rows == hi - lo + 1 == head["next_seq"] - head["first_seq"] and head["next_seq"] - lo >= keep)
    return {"first_seq": head["first_seq"], "next_seq": head["next_seq"], "rows": rows, "ok": ok}


async def run_path(path: str, dsn: str, admin_dsn: str, qname: str, qid: int, args) -> dict:
    conn = await db.connect(dsn)
    pubs = Publishers()
    broker = None
    tasks: list[asyncio.Task] = []
    try:
        if path == "broker":
            broker = Broker(dsn, admin_dsn, "queue_manager: {retention_interval: 1s}\n", ["amqp091"])
            url = f"amqp://guest:guest@127.0.0.1:{broker.ports['amqp091']}/"
            tasks += await amqp_publishers(url, qname, pubs, args.rate)
        topic = f"$queue/{qname}/k"
        tasks += await sql_publishers(dsn, qid, topic, pubs, args.rate)
        await asyncio.sleep(1.0)      # connections up, first plans made
        ref_start = time.perf_counter()
        await asyncio.sleep(args.reference)
        ref_end = time.perf_counter()
        before = await segments(conn, qid)
        first_before = await conn.fetchval("SELECT first_seq FROM fluxpg.heads WHERE queue_id = $1", qid)
        monitor = Monitor(dsn, qid)
        mon = asyncio.create_task(monitor.run())
        await asyncio.sleep(0.1)
        await conn.execute("SELECT fluxpg.declare_queue($1, 'stream', ARRAY[$2], $3::jsonb)", qname,
                           f"$queue/{qname}/#", {"segment_size": args.segment_size,
                                                     "retention": {"max_length_messages": args.segment_size}})
        due = await due_count(conn, qid)
        t_due = time.perf_counter()
        calls = 0
        # Done when the due segments are gone, seen in pg_inherits (cheap: due_segments() itself
        # reads every segment, which would load the machine while it is measured).
        driver = await db.connect(dsn)
        try:
            while await segments(driver, qid) > before - due and time.perf_counter() - t_due < 600:
                if path == "sql":
                    await driver.fetchval("SELECT fluxpg.enforce_retention()")
                    calls += 1
                else:
                    await asyncio.sleep(0.05)
        finally:
            await driver.close()
        t_done = time.perf_counter()
        await asyncio.sleep(0.3)
        monitor.stop.set()
        await mon
        after = await segments(conn, qid)
        window = monitor.window(before, after) or (t_due, t_done)
        await asyncio.sleep(1.0)      # a tail after the drop
        pubs.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks = []
        first_after = await conn.fetchval("SELECT first_seq FROM fluxpg.heads WHERE queue_id = $1", qid)
        check = await check_queue(conn, qid, args.segment_size)
        ref = [t for t in pubs.timings if t.start >= ref_start and t.end <= ref_end]
        drop = [t for t in pubs.timings if t.end > window[0] and t.start < window[1]]
        kinds = sorted({t.kind for t in pubs.timings})
        return {"path": path, "errors": pubs.errors, "due": due, "segments": before - after,
                "messages": first_after - first_before, "drop_s": window[1] - window[0],
                "calls": calls, "check": check,
                "ref": stats(ref), "drop": stats(drop),
                "by_kind": {k: (stats([t for t in ref if t.kind == k]), stats([t for t in drop if t.kind == k]))
                            for k in kinds},
                "waits": sorted(monitor.waits.items(), key=lambda kv: -kv[1])[:8]}
    finally:
        pubs.stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await conn.close()
        if broker is not None:
            broker.close()


async def main(args) -> list[dict]:
    results = []
    with fresh_database(args.dsn) as dsn:
        await asyncio.to_thread(db.migrate, dsn)
        conn = await db.connect(dsn)
        try:
            queues = {}
            for path in args.paths:
                name = f"ret_{path}"
                qid = await conn.fetchval("SELECT fluxpg.declare_queue($1, 'stream', ARRAY[$2], $3::jsonb)", name,
                                          f"$queue/{name}/#", {"segment_size": args.segment_size})
                rate = await fill(dsn, qid, f"$queue/{name}/k", args.messages)
                print(f"filled {name}: {args.messages:,} messages at {rate:,.0f} msgs/s", flush=True)
                queues[path] = (name, qid)
            await conn.execute("VACUUM ANALYZE")
            # The fill wrote ~1 GB of WAL and as many dirty pages: without a checkpoint here the
            # server's own (by max_wal_size) fell into the measured windows and stalled every
            # commit for ~300 ms, the reference window's included (2026-11-29: max 285 ms before
            # anything was due).
            await conn.execute("CHECKPOINT")
            print(f"commits steady after {await settle(conn):.1f} s", flush=True)
        finally:
            await conn.close()
        for path in args.paths:
            name, qid = queues[path]
            results.append(await run_path(path, dsn, args.dsn, name, qid, args))
            print(report([results[-1]], args), flush=True)
    return results


def fmt(x: float) -> str:
    return "–" if x != x else f"{x:,.1f}"


def report(results: list[dict], args) -> str:
    lines = [f"{args.messages:,} messages per queue, segments of {args.segment_size:,}; publishers paced at "
             f"{args.rate:g}/s each; load average {os.getloadavg()[0]:.1f}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| path | errors | segments (messages) dropped | drop s | publishes ref / drop | p50 ms ref → drop | "
             "p99 ms ref → drop | max ms ref → drop | max ratio | check |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        a, b = r["ref"], r["drop"]
        lines.append(f"| {r['path']} | {len(r['errors'])} | {r['segments']} ({r['messages']:,}) | {r['drop_s']:.2f} | "
                     f"{a['n']:,} / {b['n']:,} | {fmt(a['p50'])} → {fmt(b['p50'])} | {fmt(a['p99'])} → {fmt(b['p99'])} | "
                     f"{fmt(a['max'])} → {fmt(b['max'])} | {b['max'] / a['max']:.1f} | "
                     f"{'ok' if r['check']['ok'] else 'FAILED ' + str(r['check'])} |")
    for r in results:
        lines.append("")
        lines.append(f"{r['path']}: {r['due']} segments due, {r['calls'] or '–'} enforce_retention() calls")
        for kind, (a, b) in r["by_kind"].items():
            lines.append(f"  {kind:24} ref n={a['n']:5} p50 {fmt(a['p50'])} p99 {fmt(a['p99'])} max {fmt(a['max'])}"
                         f" | drop n={b['n']:5} p50 {fmt(b['p50'])} p99 {fmt(b['p99'])} max {fmt(b['max'])} ms")
        for e in r["errors"][:5]:
            lines.append(f"  ERROR {e}")
        for (waiter, locktype, mode, obj, blocker), waited in r["waits"]:
            lines.append(f"  lock wait ≥ {waited * 1e3:6.1f} ms: {waiter!r} wants {mode} on {locktype} {obj}, "
                         f"blocked by {blocker!r}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--segment-size", type=int, default=10_000)
    parser.add_argument("--reference", type=float, default=5.0, help="seconds of publishing with nothing due")
    parser.add_argument("--rate", type=float, default=50.0, help="publishes per second per publisher")
    parser.add_argument("--paths", nargs="+", choices=["sql", "broker"], default=["sql", "broker"])
    args = parser.parse_args()
    results = asyncio.run(main(args))
    print()
    print(report(results, args))
    sys.exit(1 if any(r["errors"] or not r["check"]["ok"] for r in results) else 0)
