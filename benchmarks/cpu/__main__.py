"""CPU per message, fluxpg (broker + its PostgreSQL backends) against a peer, one command per protocol:

    python -m benchmarks.cpu amqp091 [--rounds 3] [--messages 3000] [--rows consume+ack]   # vs RabbitMQ
    python -m benchmarks.cpu mqtt    [--rounds 3] [--messages 3000] [--rows queue]   # vs Mosquitto
    python -m benchmarks.cpu sql     [--rounds 3] [--pgmq-sql pgmq.sql] # vs pgmq (PostgreSQL CPU only)

Run from the repository root. fluxpg runs as `fluxpg serve` in a subprocess on free ports against a
fresh database of its own on --dsn's server (dropped afterwards). Rounds interleave the two sides
(fluxpg first in even rounds, the peer first in odd ones); every figure is the median over rounds.
CPU is what counts on a shared machine: see benchmarks/cpu/accounting.py for what is measured.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import sys

from benchmarks.cpu.accounting import Sample, fmt, load_note, median, ratio

PROTOCOLS = ("amqp091", "mqtt", "sql")


async def run(args) -> dict:
    mod = importlib.import_module(f"benchmarks.cpu.{args.protocol}")
    samples: dict[str, list[dict[str, Sample]]] = {}
    with contextlib.ExitStack() as stack:
        sides = mod.sides(args, stack)        # {"fluxpg": (target, meter), mod.PEER: (target, meter)}
        names = list(sides)
        for r in range(args.rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                target, meter = sides[name]
                if asyncio.iscoroutinefunction(mod.one_round):
                    res = await mod.one_round(name, target, meter, args)
                else:
                    res = await asyncio.to_thread(mod.one_round, name, target, meter, args)
                samples.setdefault(name, []).append(res)
                print(f"round {r + 1} {name}: " + ", ".join(
                    f"{k} {s.us_per_msg():.0f} µs/msg {s.rate:,.0f}/s" for k, s in res.items()), file=sys.stderr, flush=True)
    rows = mod.ROWS
    if args.rows:
        # Only the rows whose fluxpg side ran (--rows); the peer's side of each still runs.
        rows = {label: keys for label, keys in rows.items() if keys[0] in args.rows}
    return {"samples": samples, "peer": mod.PEER, "rows": rows, "note": load_note()}


def summarize(result: dict) -> list[dict]:
    samples, peer = result["samples"], result["peer"]
    rows = []
    for label, (fkey, pkey) in result["rows"].items():
        # Rounds in which either side lost messages (Sample.complete) are left out of the figures
        # and the ratios, and counted: per-message CPU over fewer delivered messages than were
        # handled is not comparable.
        fl_all = [s.get(fkey) for s in samples["fluxpg"]]
        pl_all = [s.get(pkey) for s in samples.get(peer, [])] if pkey else []
        bl_all = [s.get(fkey) for s in samples.get("fluxpg-before", [])]
        dropped = {"fluxpg": sum(1 for s in fl_all if s is not None and not s.complete),
                   peer: sum(1 for s in pl_all if s is not None and not s.complete),
                   "fluxpg-before": sum(1 for s in bl_all if s is not None and not s.complete)}
        fl = [s for s in fl_all if s is not None and s.complete]
        pl = [s for s in pl_all if s is not None and s.complete]
        groups = sorted({g for s in fl for g in s.cpu})
        row = {"row": label,
               "fluxpg_us": median([s.us_per_msg() for s in fl]),
               "fluxpg_parts": {g: median([s.us_per_msg(g) for s in fl]) for g in groups},
               "peer_us": median([s.us_per_msg() for s in pl]),
               "fluxpg_rate": median([s.rate for s in fl]), "peer_rate": median([s.rate for s in pl]),
               "fluxpg_p50": median([s.pct(50) for s in fl]), "peer_p50": median([s.pct(50) for s in pl]),
               "fluxpg_p99": median([s.pct(99) for s in fl]), "peer_p99": median([s.pct(99) for s in pl]),
               "rounds": len(fl)}
        # The ratio of medians and the median of per-round ratios agree when the runs are steady;
        # per-round ratios are the interleaved comparison, so that is the one reported.
        pairs = [(a, b) for a, b in zip(fl_all, pl_all) if a is not None and b is not None and a.complete and b.complete]
        row["cpu_ratio"] = median([a.us_per_msg() / b.us_per_msg() for a, b in pairs if b.us_per_msg()])
        row["rate_ratio"] = median([a.rate / b.rate for a, b in pairs if b.rate])
        # When losses leave few rounds complete on both sides, the ratio of the two medians
        # (each over its side's complete rounds) is the comparison that remains.
        row["cpu_ratio_of_medians"] = row["fluxpg_us"] / row["peer_us"] if row["peer_us"] else float("nan")
        row["rate_ratio_of_medians"] = row["fluxpg_rate"] / row["peer_rate"] if row["peer_rate"] else float("nan")
        row["pairs"] = len(pairs)
        row["incomplete"] = {k: v for k, v in dropped.items() if v}
        bl = [s for s in bl_all if s is not None and s.complete]
        if bl:
            bpairs = [(a, b) for a, b in zip(bl_all, pl_all)
                      if a is not None and b is not None and a.complete and b.complete]
            row["before_us"] = median([s.us_per_msg() for s in bl])
            row["before_parts"] = {g: median([s.us_per_msg(g) for s in bl]) for g in groups}
            row["before_cpu_ratio"] = median([a.us_per_msg() / b.us_per_msg() for a, b in bpairs if b.us_per_msg()])
            row["before_rate_ratio"] = median([a.rate / b.rate for a, b in bpairs if b.rate])
            row["before_p50"] = median([s.pct(50) for s in bl])
        rows.append(row)
    return rows


def report(result: dict, rows: list[dict]) -> str:
    peer = result["peer"]
    lines = [f"{result['note']}; medians of {rows[0]['rounds'] if rows else 0} interleaved rounds", "",
             f"| path | fluxpg CPU µs/msg (broker + PG) | {peer} µs/msg | CPU ratio | fluxpg msg/s | {peer} msg/s "
             f"| throughput ratio | p50 ms fluxpg / {peer} |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        parts = " + ".join(fmt(v) for v in r["fluxpg_parts"].values())
        lines.append(f"| {r['row']} | {fmt(r['fluxpg_us'])} ({parts}) | {fmt(r['peer_us'])} | "
                     f"{fmt(r['cpu_ratio'], 2)} × | {fmt(r['fluxpg_rate'])} | {fmt(r['peer_rate'])} | "
                     f"{fmt(r['rate_ratio'], 2)} | {fmt(r['fluxpg_p50'], 2)} / {fmt(r['peer_p50'], 2)} |")
    for r in rows:
        if r.get("pairs", r["rounds"]) < r["rounds"] or r.get("incomplete"):
            lines.append(f"\n{r['row']}: rounds complete on both sides {r.get('pairs')}; ratio of the medians: "
                         f"CPU {fmt(r['cpu_ratio_of_medians'], 2)} ×, throughput {fmt(r['rate_ratio_of_medians'], 2)}")
        if r.get("incomplete"):
            lines.append(f"\n{r['row']}: rounds left out because messages were lost (per side): "
                         + ", ".join(f"{k} {v}" for k, v in r["incomplete"].items()))
    if any("before_us" in r for r in rows):
        lines += ["", "Before (--compare-with) and after, same rounds:", "",
                  f"| path | before µs/msg (broker + PG) | after µs/msg (broker + PG) | CPU ratio to {peer} before → after "
                  "| throughput ratio before → after | p50 ms before → after |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in rows:
            if "before_us" not in r:
                continue
            bparts = " + ".join(fmt(v) for v in r["before_parts"].values())
            parts = " + ".join(fmt(v) for v in r["fluxpg_parts"].values())
            lines.append(f"| {r['row']} | {fmt(r['before_us'])} ({bparts}) | {fmt(r['fluxpg_us'])} ({parts}) | "
                         f"{fmt(r['before_cpu_ratio'], 2)} → {fmt(r['cpu_ratio'], 2)} | "
                         f"{fmt(r['before_rate_ratio'], 2)} → {fmt(r['rate_ratio'], 2)} | "
                         f"{fmt(r.get('before_p50', float('nan')), 2)} → {fmt(r['fluxpg_p50'], 2)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("protocol", choices=PROTOCOLS)
    ap.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
                    help="a PostgreSQL server on which the benchmark may create and drop databases")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, help="messages per throughput run (default: amqp091 3,000, mqtt "
                    "5,000, sql 20,000: enough clock ticks of CPU time for a 2 %% reading, a few seconds per run)")
    ap.add_argument("--e2e", type=int, default=300, help="amqp091: messages of the one-at-a-time run")
    ap.add_argument("--pika", type=int, default=300, help="amqp091: messages of the pika confirm-each run")
    ap.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--mosquitto", default="127.0.0.1:1883")
    ap.add_argument("--inflight", type=int, default=100,
                    help="mqtt: the publisher's in-flight window (fewer: fewer packets per read, as on a quiet machine)")
    ap.add_argument("--batch", type=int, default=100, help="sql: messages per call")
    ap.add_argument("--clients", type=int, default=4, help="sql: concurrent producers / consumers")
    ap.add_argument("--pgmq-sql", default=os.environ.get("PGMQ_SQL"),
                    help="sql: pgmq's plain-SQL install file (pgmq-extension/sql/pgmq.sql); without it pgmq rows are skipped")
    ap.add_argument("--compare-with", metavar="CHECKOUT",
                    help="amqp091/mqtt: also run the fluxpg of another checkout (e.g. `git worktree add /tmp/before "
                    "<commit>`), interleaved in the same rounds: before/after on one machine state")
    ap.add_argument("--rows", type=lambda v: tuple(x.strip() for x in v.split(",") if x.strip()),
                    help="mqtt: run only these fluxpg rows, comma-separated (queue, pubsub); the peer's "
                    "pub/sub always runs (it is the comparison of both). amqp091: only these rows on every side "
                    "(publish+confirm, consume+ack, end-to-end, pika-confirm-each; consume+ack publishes its "
                    "backlog first either way)")
    ap.add_argument("--json", help="also write the summary rows to this file")
    args = ap.parse_args()
    if args.messages is None:
        args.messages = {"amqp091": 3000, "mqtt": 5000, "sql": 20000}[args.protocol]
    result = asyncio.run(run(args))
    rows = summarize(result)
    print(report(result, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"note": result["note"], "peer": result["peer"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
