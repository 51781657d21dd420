"""Scale-out: CPU per message with 1, 2 and 4 broker nodes on one database.

    python benchmarks/nodes.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--messages 20000] [--rounds 3] [--workers 1 2 4]

Each run starts `fluxpg serve --workers N` (N processes sharing one AMQP 0-9-1 port through
SO_REUSEPORT, so the kernel spreads the client connections over the nodes) on a fresh database,
publishes with confirms from several aio-pika connections (100 in flight each), then consumes +
acks the backlog from as many connections (prefetch 200, group `bench`).

On this 2-core machine more nodes cannot add throughput, so the measure is the cost: **CPU µs per
message** of the broker processes and of the PostgreSQL backends of the run's database
(benchmarks/cpu/accounting.py), per phase, as a ratio to one node (target ≤ 1.2 ×). Rounds
interleave the node counts (order reversed every other round); figures are medians over rounds.

Where the cost goes, per consumed message: SQL function calls and their time
(`pg_stat_user_functions`, `track_functions = pl` on the run's database, read after the broker
stopped so every backend flushed its counts) and how often a claim waited for a lock (pg_locks
sampled every 10 ms during the consume phase: claims waiting, and on what).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aio_pika  # noqa: E402

from benchmarks.cpu.accounting import Broker, children, load_note, median  # noqa: E402
from fluxpg import db  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

PAYLOAD = b"x" * 256
CONFIG = "queues:\n  - name: bench\n    limits: {max_depth: 0}\nqueue_manager: {max_pending_per_group: 1000000}\n"
FUNCTIONS = ("claim", "_window", "ack", "append_batch", "_ensure_member", "_touch_member")

WAITS = """
SELECT l.locktype, l.relation AS rel, a.query
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND a.datname = $1
"""


async def publish(url: str, count: int, queue: str, window: int) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    sem = asyncio.Semaphore(window)

    async def one():
        async with sem:
            await channel.default_exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), routing_key=queue)

    await asyncio.gather(*(one() for _ in range(count)))
    await connection.close()


async def publish_paced(url: str, count: int, queue: str, rate: float) -> None:
    """Publish `count` messages at `rate` a second, each confirmed before the next."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    nxt = time.perf_counter()
    for _ in range(count):
        delay = nxt - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await channel.default_exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), routing_key=queue)
        nxt = max(nxt + 1 / rate, time.perf_counter())
    await connection.close()


async def consume(url: str, queue: str, counter: dict, total: int, done: asyncio.Event):
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=200)
    q = await channel.get_queue(queue, ensure=False)

    async def on_message(message):
        await message.ack()
        counter["n"] += 1
        if counter["n"] >= total:
            done.set()

    await q.consume(on_message, arguments={"x-consumer-group": "bench"})
    return connection


async def sample_waits(admin_dsn: str, database: str, stop: asyncio.Event) -> tuple[int, Counter]:
    """Lock waits of the run's backends every 10 ms (asked from another database)."""
    c = await db.connect(admin_dsn)
    samples, seen = 0, Counter()
    try:
        while not stop.is_set():
            samples += 1
            for r in await c.fetch(WAITS, database):
                q = r["query"]
                kind = next((f for f in ("claim", "ack", "append_batch") if f"fluxpg.{f}(" in q), q[:30])
                seen[(kind, r["locktype"], r["rel"])] += 1
            await asyncio.sleep(0.01)
    finally:
        await c.close()
    return samples, seen


async def run(server_dsn: str, workers: int, messages: int, connections: int, repo: Path | None = None,
              live: int = 0, rate: float = 1000.0) -> dict:
    with fresh_database(server_dsn) as dsn:
        # Migrated by the broker it starts (`fluxpg serve` migrates): with --compare-with, each
        # checkout to its own head.
        admin = await db.connect(server_dsn)
        database = dsn.rsplit("/", 1)[1].split("?")[0]
        await admin.execute(f'ALTER DATABASE "{database}" SET track_functions = \'pl\'')
        broker = Broker(dsn, server_dsn, CONFIG, ["amqp091"], workers=workers, repo=repo)
        try:
            deadline = time.monotonic() + 60
            while workers > 1 and len(children(broker.proc.pid)) < workers and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            url = f"amqp://guest:guest@127.0.0.1:{broker.ports['amqp091']}/"
            result = {"workers": workers}
            if not live:
                # What the nodes cost doing nothing (polls, heartbeats), CPU ms per second.
                meter = broker.meter()
                meter.begin()
                await asyncio.sleep(3.0)
                idle = meter.end()
                result["idle"] = {"broker_ms_s": idle["broker"] / 3 * 1e3, "pg_ms_s": idle["pg"] / 3 * 1e3}
            for phase in (("live",) if live else ("publish", "consume")):
                meter = broker.meter()
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_waits(server_dsn, database, stop)) if phase != "publish" else None
                if phase == "live":
                    # Consumers first, idle; then paced publishers: every committed batch wakes them.
                    counter, done = {"n": 0}, asyncio.Event()
                    share = live // connections
                    conns = [await consume(url, "bench", counter, share * connections, done)
                             for _ in range(connections)]
                    await asyncio.sleep(1.0)
                meter.begin()
                start = time.perf_counter()
                if phase == "live":
                    await asyncio.gather(*(publish_paced(url, share, "bench", rate / connections)
                                           for _ in range(connections)))
                    await asyncio.wait_for(done.wait(), 600)
                    n = counter["n"]
                elif phase == "publish":
                    share = messages // connections
                    await asyncio.gather(*(publish(url, share, "bench", 100) for _ in range(connections)))
                    n = share * connections
                else:
                    counter, done = {"n": 0}, asyncio.Event()
                    conns = [await consume(url, "bench", counter, messages // connections * connections, done)
                             for _ in range(connections)]
                    await asyncio.wait_for(done.wait(), 600)
                    n = counter["n"]
                elapsed = time.perf_counter() - start
                cpu = meter.end()
                if sampler is not None:
                    stop.set()
                    result["wait_samples"], result["waits"] = await sampler
                if phase != "publish":
                    for c in conns:
                        await c.close()
                result[phase] = {"n": n, "msgs_per_s": n / elapsed, "seconds": elapsed,
                                 "broker_us": cpu["broker"] / n * 1e6, "pg_us": cpu["pg"] / n * 1e6}
        finally:
            broker.close()
        await asyncio.sleep(0.5)         # the broker's backends exit and flush their statistics
        c = await db.connect(dsn)
        try:
            rows = await c.fetch("SELECT funcname, calls, self_time FROM pg_stat_user_functions "
                                 "WHERE schemaname = 'fluxpg' AND funcname = ANY($1)", list(FUNCTIONS))
            # The relations waited for (their OIDs mean something in the run's database only).
            names = {oid: await c.fetchval("SELECT $1::oid::regclass::text", oid)
                     for (_, _, oid) in result["waits"] if oid is not None}
        finally:
            await c.close()
        await admin.close()
        waits = Counter()
        for (kind, locktype, oid), v in result["waits"].items():
            waits[(kind, locktype, names.get(oid, ""))] += v
        result["waits"] = waits
        result["functions"] = {r["funcname"]: (r["calls"], r["self_time"]) for r in rows}
        return result


async def main(args) -> dict[str, list[list[dict]]]:
    sides = {"this checkout": None}
    if args.compare_with:
        sides[f"{args.compare_with}"] = Path(args.compare_with)
    rounds: dict[str, list[list[dict]]] = {side: [] for side in sides}
    for i in range(args.rounds):
        order = [(w, side) for w in args.workers for side in sides]
        if i % 2:
            order.reverse()
        results: dict[str, dict] = {side: {} for side in sides}
        for workers, side in order:
            # --per-node: every node gets the same clients and messages (its load stays the same),
            # so what grows with N is the cross-node part only.
            scale = workers if args.per_node else 1
            r = await run(args.dsn, workers, args.messages * scale, args.connections * scale, sides[side])
            print(f"round {i + 1}, {side}, {workers} node(s): publish {r['publish']['broker_us']:.0f} + {r['publish']['pg_us']:.0f} µs/msg, "
                  f"consume {r['consume']['broker_us']:.0f} + {r['consume']['pg_us']:.0f} µs/msg, "
                  f"claims {r['functions'].get('claim', (0, 0))[0]}, acks {r['functions'].get('ack', (0, 0))[0]}",
                  flush=True)
            if args.live:
                lv = await run(args.dsn, workers, args.messages * scale, args.connections * scale, sides[side],
                               args.live * scale, args.rate * scale)
                r["live"], r["live_functions"] = lv["live"], lv["functions"]
                r["live_waits"] = lv["waits"]
                print(f"round {i + 1}, {side}, {workers} node(s): live {lv['live']['broker_us']:.0f} + "
                      f"{lv['live']['pg_us']:.0f} µs/msg, claims {lv['functions'].get('claim', (0, 0))[0]}", flush=True)
            results[side][workers] = r
        for side in sides:
            rounds[side].append([results[side][w] for w in args.workers])
    return rounds


def report(rounds: list[list[dict]], args) -> str:
    lines = [f"{args.messages:,} messages of {len(PAYLOAD)} B, {args.connections} client connections"
             f"{' per node (and as many messages per node)' if args.per_node else ''}, "
             f"{args.rounds} rounds (medians), {load_note()}", "",
             "| nodes | phase | msgs/s | broker µs/msg | PostgreSQL µs/msg | total µs/msg | × 1 node |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    nodes = len(rounds[0])
    for phase in ("publish", "consume") + (("live",) if "live" in rounds[0][0] else ()):
        base = None
        for k in range(nodes):
            runs = [rnd[k] for rnd in rounds]
            b = median([r[phase]["broker_us"] for r in runs])
            p = median([r[phase]["pg_us"] for r in runs])
            rate = median([r[phase]["msgs_per_s"] for r in runs])
            # Ratio: median of per-round ratios to that round's one-node run.
            ratio = median([(r[phase]["broker_us"] + r[phase]["pg_us"]) /
                            (rnd[0][phase]["broker_us"] + rnd[0][phase]["pg_us"]) for r, rnd in zip(runs, rounds)])
            base = base or b + p
            lines.append(f"| {runs[0]['workers']} | {phase} | {rate:,.0f} | {b:.0f} | {p:.0f} | {b + p:.0f} | {ratio:.2f} |")
    lines += ["", "Publish phase, per 1,000 published messages (medians): append_batch calls (one per group "
              "commit of a node) and their PostgreSQL time (ms, self time incl. waits for the queue's head row)", "",
              "| nodes | append_batch calls | msgs per call | append_batch ms | ms per call |", "| ---: | ---: | ---: | ---: | ---: |"]
    for k in range(nodes):
        runs = [rnd[k] for rnd in rounds]
        calls = median([r["functions"].get("append_batch", (0, 0))[0] / r["publish"]["n"] * 1000 for r in runs])
        ms = median([r["functions"].get("append_batch", (0, 0))[1] / r["publish"]["n"] * 1000 for r in runs])
        lines.append(f"| {runs[0]['workers']} | {calls:.1f} | {1000 / calls if calls else float('nan'):.1f} | {ms:.1f} | "
                     f"{ms / calls if calls else float('nan'):.2f} |")
    lines += ["", "Idle (3 s, no clients): CPU ms per second, broker + PostgreSQL: " + ", ".join(
        f"{rnd_k[0]['workers']} node(s) {median([r['idle']['broker_ms_s'] for r in rnd_k]):.0f} + "
        f"{median([r['idle']['pg_ms_s'] for r in rnd_k]):.0f}"
        for rnd_k in ([rnd[k] for rnd in rounds] for k in range(nodes)))]
    lines += ["", "Consume phase, per 1,000 consumed messages (medians): SQL calls and PostgreSQL time "
              "(pg_stat_user_functions self time, ms), lock waits seen (10 ms samples)", "",
              "| nodes | claim calls | msgs per claim | claim ms | _window ms | ack calls | ack ms | claim lock waits / s |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in range(nodes):
        runs = [rnd[k] for rnd in rounds]

        def per_k(name, idx):
            return median([r["functions"].get(name, (0, 0))[idx] / r["consume"]["n"] * 1000 for r in runs])

        waits = median([sum(v for (kind, _, _), v in r["waits"].items() if kind == "claim") / r["consume"]["seconds"]
                        / 100 for r in runs])   # samples are 10 ms apart: waiting claims per sample
        claims = per_k("claim", 0)
        lines.append(f"| {runs[0]['workers']} | {claims:.1f} | {1000 / claims if claims else float('nan'):.1f} | "
                     f"{per_k('claim', 1):.1f} | {per_k('_window', 1):.1f} | {per_k('ack', 0):.1f} | "
                     f"{per_k('ack', 1):.1f} | {waits:.2f} |")
    if "live" in rounds[0][0]:
        lines += ["", f"Live (consumers idle, then {args.live:,} messages published at {args.rate:g}/s in all, each "
                  "confirmed): claims per 1,000 messages (medians)", "",
                  "| nodes | claim calls | msgs per claim | claim ms | _window ms |", "| ---: | ---: | ---: | ---: | ---: |"]
        for k in range(nodes):
            runs = [rnd[k] for rnd in rounds]

            def live_k(name, idx):
                return median([r["live_functions"].get(name, (0, 0))[idx] / r["live"]["n"] * 1000 for r in runs])

            claims = live_k("claim", 0)
            lines.append(f"| {runs[0]['workers']} | {claims:.1f} | {1000 / claims if claims else float('nan'):.2f} | "
                         f"{live_k('claim', 1):.1f} | {live_k('_window', 1):.1f} |")
    lines += ["", "Lock waits seen in the consume phase (samples, all rounds):"]
    total = Counter()
    for rnd in rounds:
        for r in rnd:
            for key, v in r["waits"].items():
                total[(r["workers"],) + key] += v
    for (w, kind, locktype, rel), v in sorted(total.items(), key=lambda kv: (kv[0][0], -kv[1]))[:20]:
        lines.append(f"- {w} node(s): {kind} waiting on {locktype} {rel}: {v}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--live", type=int, default=0,
                        help="also a run per node count with consumers waiting and this many messages published at --rate")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--per-node", action="store_true",
                        help="connections, messages and --live rate per node instead of in all")
    parser.add_argument("--compare-with", help="another checkout whose broker runs in the same rounds (before/after)")
    args = parser.parse_args()
    for side, rounds in asyncio.run(main(args)).items():
        print(f"\n## {side}\n")
        print(report(rounds, args))
