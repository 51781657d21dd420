"""Spark JDBC read throughput of the log: rows/s at 1, 2 and 4 Spark partitions (seq-range
predicates, as every analytics command reads), against ``COPY (SELECT …) TO STDOUT`` of the same
rows through psycopg as the ceiling.

    python benchmarks/analytics.py --dsn postgresql://postgres@127.0.0.1/postgres [--rows 1000000]

Creates (and drops) a database of its own on that server, fills one queue with ``--rows`` messages
of ``--payload`` bytes through fluxpg.append_batch, then times:

- ``COPY (SELECT <log columns> FROM fluxpg.log WHERE queue_id = …) TO STDOUT (FORMAT binary)``;
- a Spark read of every column of every row (``write.format("noop")`` forces the whole read) with
  1, 2 and 4 partitions;
- a report-style read (``size`` and ``created_at`` only, so payloads never leave Postgres) with the
  default partition count.

Prints a Markdown table; --json FILE writes the numbers too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from fluxpg import db  # noqa: E402
from fluxpg.analytics.jdbc import full_ranges, jdbc_target, load_queues, read_log, spark_session  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

COLUMNS = ("queue_id, partition, seq, topic, fluxpg.routing_key(topic) AS routing_key, octet_length(payload) AS size, "
           "payload, headers::text AS headers, created_at, expires_at")


def fill(dsn: str, rows: int, payload: int, batch: int = 20_000) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        qid = conn.execute("SELECT fluxpg.declare_queue('bench', 'stream', NULL, %s::jsonb)",
                           (json.dumps({"segment_size": 250_000}),)).fetchone()[0]
        body = os.urandom(payload)
        start = time.perf_counter()
        for first in range(0, rows, batch):
            k = min(batch, rows - first)
            conn.execute("SELECT count(*) FROM fluxpg.append_batch(%s, %s, %s)",
                         ([qid] * k, [f"$queue/bench/k{first % 7}"] * k, [body] * k))
        elapsed = time.perf_counter() - start
        conn.execute("VACUUM ANALYZE fluxpg.log")  # set hint bits once, as a long-lived log has them
        return rows / elapsed


def copy_ceiling(dsn: str, rows: int) -> tuple[float, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        qid = conn.execute("SELECT id FROM fluxpg.queues WHERE name = 'bench'").fetchone()[0]
        start = time.perf_counter()
        size = 0
        with conn.cursor().copy(f"COPY (SELECT {COLUMNS} FROM fluxpg.log WHERE queue_id = {qid}) "
                                "TO STDOUT (FORMAT binary)") as copy:
            for block in copy:
                size += len(block)
        return rows / (time.perf_counter() - start), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
                    help="a server on which a database can be created")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--payload", type=int, default=256, help="payload bytes per message")
    ap.add_argument("--partitions", default="1,2,4", help="Spark partition counts to time")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args()

    results: dict[str, object] = {"rows": args.rows, "payload": args.payload, "cores": os.cpu_count()}
    with fresh_database(args.dsn) as dsn:
        db.migrate(dsn)
        results["fill_rows_per_s"] = fill(dsn, args.rows, args.payload)
        print(f"filled {args.rows:,} rows at {results['fill_rows_per_s']:,.0f} rows/s", file=sys.stderr)
        copy_rate, copy_bytes = copy_ceiling(dsn, args.rows)
        results["copy_rows_per_s"] = copy_rate
        results["copy_bytes"] = copy_bytes
        target = jdbc_target(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn, spark_session(app_name="fluxpg-bench") as session:
            spark = session.spark
            ranges = full_ranges(load_queues(conn, ["bench"]).values())
            # JIT warm-up: a small read, so the first timed run does not pay for class loading.
            warm = [r.__class__(r.queue_id, r.partition, r.lo, min(r.hi, r.lo + 20_000)) for r in ranges]
            read_log(spark, target, warm, num_partitions=1).write.format("noop").mode("overwrite").save()
            spark_runs = {}
            for n in (int(x) for x in args.partitions.split(",")):
                start = time.perf_counter()
                read_log(spark, target, ranges, num_partitions=n).write.format("noop").mode("overwrite").save()
                spark_runs[n] = args.rows / (time.perf_counter() - start)
                print(f"spark {n} partitions: {spark_runs[n]:,.0f} rows/s", file=sys.stderr)
            results["spark_rows_per_s"] = spark_runs
            start = time.perf_counter()
            df = read_log(spark, target, ranges).select("size", "created_at")
            n_default = df.rdd.getNumPartitions()
            df.groupBy().sum("size").collect()
            results["report_read"] = {"partitions": n_default, "rows_per_s": args.rows / (time.perf_counter() - start)}

    print(f"\n{args.rows:,} messages of {args.payload} B, {os.cpu_count()} cores\n")
    print("| read | partitions | rows/s | × COPY |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| COPY (SELECT …) TO STDOUT, binary, psycopg | 1 | {copy_rate:,.0f} | 1.00 |")
    for n, r in results["spark_rows_per_s"].items():  # type: ignore[union-attr]
        print(f"| Spark JDBC, all columns | {n} | {r:,.0f} | {r / copy_rate:.2f} |")
    rr = results["report_read"]
    print(f"| Spark JDBC, size + created_at only | {rr['partitions']} | {rr['rows_per_s']:,.0f} | "  # type: ignore[index]
          f"{rr['rows_per_s'] / copy_rate:.2f} |")  # type: ignore[index]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
