"""Where a transactional publish's cost goes: a ladder of one-message transactions, each row adding
one part of the outbox path, with `pgmq.send` beside them (issue 15's throughput target).

    python benchmarks/outbox_costs.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--pgmq-sql /path/to/pgmq.sql] [--rounds 3] [--seconds 6] [--clients 8]

Each row is `BEGIN; <statement>; COMMIT;` run by pgbench (C, prepared statements, `--clients`
connections), so the client's own cost is small and the same for every row:

1. a bare INSERT of the 256-byte payload into a plain table (what any transaction that writes a
   row pays: the statement, the WAL, the commit);
2. the same row inserted into fluxpg.outbox without `marks`: no commit-time marker, never moved to
   the log (the rows are deleted after the run, outside the measurement);
3. the row with `marks`: its commit adds the marker (the deferred trigger fluxpg._outbox_commit)
   and the broker's sequencer moves it to the log;
4. `fluxpg.publish(topic, payload)`: row 3 plus routing (a cached route and its version check),
   the shared advisory lock queue_stats counts, and the function call;
5. `pgmq.send(queue, jsonb)`, from pgmq's plain-SQL install file (`--pgmq-sql`; skipped without).

Reported per row: transactions per second and the machine's CPU per transaction (every process:
PostgreSQL's backends, walwriter and autovacuum, the broker's sequencer, pgbench), from
/proc/stat over the run and until the sequencer has moved the run's last message; beside it the
broker process's own CPU (the sequencer's Python). Run it on a machine nothing else uses: the
CPU of other processes counts. Rounds interleave the rows; medians. Needs `pgbench` on PATH and
a PostgreSQL on this host (for /proc). Creates and drops a database of its own.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg  # noqa: E402
from fluxpg import db  # noqa: E402
from fluxpg.config import Config, QueueConfig  # noqa: E402
from fluxpg.queues.manager import QueueManager  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

from benchmarks.outbox import OUTBOX_WAITING, PAYLOAD, checkpoint, install_pgmq  # noqa: E402

TOPIC = "$queue/txq/k"


def ladder(queue_id: int, pgmq: bool) -> list[tuple[str, str]]:
    payload = f"'\\x{PAYLOAD.hex()}'::bytea"
    outbox = ("INSERT INTO fluxpg.outbox (queue_id, topic, payload, headers, part_key, marks) "
              f"VALUES ({queue_id}, '{TOPIC}', {payload}, NULL, NULL, {{marks}})")
    rows = [
        ("bare INSERT into a plain table", f"INSERT INTO bench_plain (payload) VALUES ({payload})"),
        ("fluxpg.outbox row, no marker", outbox.format(marks="false")),
        ("... with its commit marker and the sequencer's move", outbox.format(marks="true")),
        ("fluxpg.publish", f"SELECT fluxpg.publish('{TOPIC}', {payload})"),
    ]
    if pgmq:
        rows.append(("pgmq.send", "SELECT pgmq.send('bench', '{\"payload\": \"%s\"}'::jsonb)" % PAYLOAD.decode()))
    return rows


def machine_cpu_seconds() -> float:
    """Busy CPU time of the whole machine (user, nice, system, irq, softirq, steal)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


async def run_row(admin: asyncpg.Connection, dsn: str, script: Path, *, clients: int, seconds: float) -> dict:
    await checkpoint(admin)
    machine0, broker0 = machine_cpu_seconds(), process_cpu_seconds()
    proc = await asyncio.create_subprocess_exec(
        "pgbench", "--no-vacuum", "--protocol=prepared", f"--client={clients}", f"--jobs={min(clients, 2)}",
        f"--time={seconds:g}", f"--file={script}", dsn,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    done = re.search(rb"number of transactions actually processed: (\d+)", out)
    if proc.returncode != 0 or done is None:
        raise RuntimeError(f"pgbench failed ({proc.returncode}): {err.decode(errors='replace').strip()}")
    n = int(done.group(1))
    # The sequencer's share belongs to this row: wait until it has moved the last marker.
    while await admin.fetchval(OUTBOX_WAITING):
        await asyncio.sleep(0.01)
    machine, broker = machine_cpu_seconds() - machine0, process_cpu_seconds() - broker0
    # Rows inserted without a marker are never moved: cleared outside the measurement.
    if await admin.execute("DELETE FROM fluxpg.outbox WHERE NOT marks") != "DELETE 0":
        await admin.execute("VACUUM fluxpg.outbox")
    return {"tx_per_s": n / seconds, "cpu_us_per_tx": 1e6 * machine / max(n, 1),
            "broker_us_per_tx": 1e6 * broker / max(n, 1)}


async def main(args) -> list[dict]:
    with fresh_database(args.dsn) as dsn, tempfile.TemporaryDirectory() as tmp:
        await asyncio.to_thread(db.migrate, dsn)
        admin = await db.connect(dsn)
        await admin.execute("CREATE TABLE bench_plain (id bigserial PRIMARY KEY, payload bytea NOT NULL, "
                            "created_at timestamptz NOT NULL DEFAULT now())")
        if args.pgmq_sql:
            await install_pgmq(dsn, args.pgmq_sql)
        config = Config(queues=[QueueConfig(name="txq", topics=["$queue/txq/#"], limits={"max_depth": 0})])
        mgr = await QueueManager.start(dsn, config, migrate=False, retention=False)
        try:
            queue_id = await admin.fetchval("SELECT id FROM fluxpg.queues WHERE name = 'txq'")
            rows = ladder(queue_id, bool(args.pgmq_sql))
            scripts = []
            for i, (_, statement) in enumerate(rows):
                script = Path(tmp) / f"row{i}.sql"
                script.write_text(f"BEGIN;\n{statement};\nCOMMIT;\n")
                scripts.append(script)
            results: list[list[dict]] = [[] for _ in rows]
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                order = range(len(rows)) if r % 2 == 0 else reversed(range(len(rows)))
                for i in order:
                    results[i].append(await run_row(admin, dsn, scripts[i], clients=args.clients,
                                                    seconds=args.seconds))
        finally:
            await admin.close()
            await mgr.close()
    return [{"row": name, **{k: statistics.median(m[k] for m in measured) for k in measured[0]}}
            for (name, _), measured in zip(rows, results)]


def report(rows: list[dict], args) -> str:
    lines = [f"medians of {args.rounds} rounds, {args.clients} pgbench connections, {os.cpu_count()} CPUs",
             "", "| one-message transaction | tx/s | machine CPU µs/tx | step | of it the broker process |",
             "| --- | ---: | ---: | ---: | ---: |"]
    previous = None
    for row in rows:
        step = "" if previous is None or row["row"] == "pgmq.send" else f"{row['cpu_us_per_tx'] - previous:+.0f}"
        lines.append(f"| {row['row']} | {row['tx_per_s']:,.0f} | {row['cpu_us_per_tx']:.0f} | {step} | "
                     f"{row['broker_us_per_tx']:.1f} |")
        if row["row"] != "pgmq.send":
            previous = row["cpu_us_per_tx"]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--pgmq-sql", type=Path, help="pgmq's plain-SQL install file (pgmq-extension/sql/pgmq.sql)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    if subprocess.run(["pgbench", "--version"], capture_output=True).returncode != 0:
        sys.exit("pgbench is not on PATH (Debian: postgresql-client or the server package)")
    print(report(asyncio.run(main(args)), args))
