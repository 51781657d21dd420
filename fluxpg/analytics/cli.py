"""`fluxpg analytics …`: Spark jobs over the log (report, export, sql, follow).

pyspark is imported inside the commands only, so `fluxpg --help` stays fast and works without it.
Run standalone as ``python -m fluxpg.analytics.cli``.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

app = typer.Typer(name="analytics", no_args_is_help=True, add_completion=False,
                  help="PySpark analytics over the log, read over JDBC in short seq-range queries "
                       "(local mode unless --master).")

out_console = Console()
err_console = Console(stderr=True)

Dsn = Annotated[Optional[str], typer.Option("--dsn", envvar="FLUXPG_DSN", show_envvar=True,
                                            help="PostgreSQL DSN (postgresql://user@host:port/db or key=value).")]
Master = Annotated[Optional[str], typer.Option("--master", help="Spark master URL (default: local[*]).")]
Jars = Annotated[Optional[list[str]], typer.Option("--jars", help="Extra jars (comma-separated or repeated); "
                                                   "a postgresql*.jar here replaces the driver search.")]
Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="Show Spark's own warnings and output.")]
Partitions = Annotated[Optional[int], typer.Option("--partitions", min=1,
                                                   help="Spark partitions for the log read (default: one per "
                                                        "250k rows, at most 4 × cores).")]


def _spark_error(exc: BaseException) -> str | None:
    """One line for an error raised by Spark or the JVM (e.g. the JDBC driver), None for others."""
    module = type(exc).__module__ or ""
    if not (module.startswith("pyspark") or module.startswith("py4j")):
        return None
    text = str(exc)
    for marker in ("PSQLException: ", "SQLException: "):
        if marker in text:
            return text.split(marker, 1)[1].strip().splitlines()[0]
    for line in text.strip().splitlines():
        line = line.strip()
        if line and not line.startswith(("An error occurred while calling", "JVM stacktrace")):
            return line
    return type(exc).__name__


@contextmanager
def _errors() -> Iterator[None]:
    from fluxpg.analytics.jdbc import AnalyticsError

    try:
        yield
    except AnalyticsError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:
        msg = _spark_error(exc)
        if msg is None:
            import psycopg

            if isinstance(exc, psycopg.Error):
                msg = str(exc).strip().splitlines()[0]
        if msg is None:
            raise
        err_console.print(f"[red]error:[/] {msg}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@contextmanager
def _context(dsn: str | None, master: str | None, jars: list[str] | None, verbose: bool) -> Iterator[tuple[Any, Any, Any]]:
    """(Session, JdbcTarget, psycopg connection) for one command."""
    from fluxpg.analytics.jdbc import connect, find_jdbc_jars, jdbc_target, resolve_dsn, spark_session

    find_jdbc_jars(jars)  # fail fast, before connecting anywhere
    dsn = resolve_dsn(dsn)
    target = jdbc_target(dsn, unix_socket_jar=any("junixsocket" in j for j in (jars or [])))
    conn = connect(dsn)
    try:
        with spark_session(master, jars, verbose) as session:
            yield session, target, conn
    finally:
        conn.close()


def _position(text: str | None, what: str):
    from fluxpg.analytics.jdbc import parse_position

    return parse_position(text, what) if text is not None else None


@app.command()
def report(
    dsn: Dsn = None, master: Master = None, jars: Jars = None, verbose: Verbose = False, partitions: Partitions = None,
    bucket: Annotated[str, typer.Option("--bucket", help="Time bucket: 1m, 1h or 1d.")] = "1h",
    queue: Annotated[Optional[list[str]], typer.Option("--queue", "-q", help="Only these queues (repeatable).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="From this offset/time (ISO 8601 or timestamp=<ms>).")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Before this offset/time.")] = None,
    chart: Annotated[Optional[Path], typer.Option("--chart", help="Write a PNG chart (throughput, lag per group).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Also write the tables under this directory.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="parquet or csv (with --out).")] = "parquet",
    rows: Annotated[int, typer.Option("--rows", min=1, help="Rows shown per table (the most recent buckets).")] = 30,
) -> None:
    """Throughput per queue and time bucket, traffic per routing key, state of every group.

    Messages and bytes per queue and --bucket, and per routing key; per consumer group head,
    committed, lag, pending, redeliveries and dead-lettered. Tables on the terminal, --chart PNG,
    --out DIR as Parquet or CSV.
    """
    with _errors():
        from fluxpg.analytics import render
        from fluxpg.analytics import report as rep
        from fluxpg.analytics.jdbc import AnalyticsError, spark_progress

        if bucket not in rep.BUCKETS:
            raise AnalyticsError(f"invalid --bucket {bucket!r}: expected 1m, 1h or 1d")
        if out is not None and fmt not in ("parquet", "csv"):
            raise AnalyticsError(f"invalid --format {fmt!r}: expected parquet or csv")
        with _context(dsn, master, jars, verbose) as (session, target, conn):
            with spark_progress(session.spark, "reading the log"):
                r = rep.build(session.spark, target, conn, bucket=bucket, queues=queue,
                              since=_position(since, "--since"), until=_position(until, "--until"),
                              num_partitions=partitions)
                try:
                    data = rep.collect(r)
                    if out is not None:
                        rep.write(r, out, fmt)
                finally:
                    r.close()
            cols, tp = data["throughput"]
            render.table(out_console, f"Throughput per {bucket}", cols, tp, limit=rows, numeric=("messages", "bytes"))
            cols, rk = data["routing_keys"]
            render.table(out_console, "Routing keys", cols, rk[:rows] if len(rk) > rows else rk,
                         numeric=("messages", "bytes"))
            if len(rk) > rows:
                out_console.print(f"({len(rk) - rows} more routing keys)")
            cols, gr = data["groups"]
            render.table(out_console, "Consumer groups", cols, gr,
                         numeric=("partitions", "head", "committed", "lag", "pending", "redeliveries", "dead_lettered"))
            if chart is not None:
                ig = {c: i for i, c in enumerate(cols)}
                render.chart(chart, tp, [(g[ig["queue"]], g[ig["group"]], g[ig["lag"]]) for g in gr], bucket)
                err_console.print(f"chart written to {chart}")
            if out is not None:
                err_console.print(f"tables written under {out} ({fmt}): throughput, routing_keys, groups")


@app.command()
def export(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (Spark writes part files into it).")],
    dsn: Dsn = None, master: Master = None, jars: Jars = None, verbose: Verbose = False, partitions: Partitions = None,
    start: Annotated[Optional[str], typer.Option("--from", help="First offset (inclusive), or a time: ISO 8601 or "
                                                 "timestamp=<unix ms>. Default: oldest retained.")] = None,
    end: Annotated[Optional[str], typer.Option("--to", help="End offset (exclusive) or time. Default: the head.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="parquet, json (lines) or csv.")] = "parquet",
    decode: Annotated[Optional[str], typer.Option("--decode", help="utf8 or json: decode payloads (lossless: "
                                                  "payloads that do not decode stay raw).")] = None,
    json_schema: Annotated[Optional[Path], typer.Option("--json-schema", help="Schema of JSON payloads: JSON "
                                                        "Schema, Spark schema JSON or DDL (implies --decode json).")] = None,
    partition: Annotated[Optional[list[int]], typer.Option("--partition", help="Only these queue partitions.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output.")] = False,
) -> None:
    """Archive a range of a queue's log (before retention drops it).

    Raw payloads are a binary column in Parquet and base64 text in JSON and CSV; --decode utf8|json
    adds payload_text (and body), keeping the bytes of payloads that do not decode.
    """
    with _errors():
        from fluxpg.analytics import export as exp
        from fluxpg.analytics.jdbc import spark_progress

        with _context(dsn, master, jars, verbose) as (session, target, conn):
            with spark_progress(session.spark, f"exporting {queue}"):
                res = exp.export(session.spark, target, conn, queue, out, start=_position(start, "--from"),
                                 end=_position(end, "--to"), fmt=fmt, decode=decode, json_schema=json_schema,
                                 partitions=partition, overwrite=overwrite, num_partitions=partitions)
            span = ", ".join(f"p{r.partition} [{r.lo}, {r.hi})" for r in res.ranges) or "empty range"
            out_console.print(f"exported {res.rows} messages of {queue} ({span}) to {res.path} ({fmt})")
            if res.expected is not None and res.rows < res.expected:
                err_console.print(f"[yellow]warning:[/] {res.expected - res.rows} offsets of the range were not "
                                  "found (dropped by retention during the export?)")


@app.command("sql")
def sql_command(
    statement: Annotated[str, typer.Argument(help="Spark SQL. Views: log, q_<queue>, queues, groups.")],
    dsn: Dsn = None, master: Master = None, jars: Jars = None, verbose: Verbose = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows shown at most.")] = 1000,
    no_body: Annotated[bool, typer.Option("--no-body", help="Do not infer a JSON `body` for q_ views.")] = False,
) -> None:
    """Spark SQL over the log, printed as a table.

    Views: log (all queues), q_<queue> per queue (with body, the parsed JSON payload, when the
    payloads are JSON objects), queues, groups. JSON fields: get_json_object(payload_text, '$.x').
    """
    with _errors():
        from fluxpg.analytics import render
        from fluxpg.analytics import sql as sq
        from fluxpg.analytics.jdbc import spark_progress

        with _context(dsn, master, jars, verbose) as (session, target, conn):
            with spark_progress(session.spark, "running SQL"):
                cols, rows, more, views = sq.run(session.spark, target, conn, statement, limit, infer_body=not no_body)
            render.table(out_console, "", cols, rows)
            if more:
                err_console.print(f"(first {limit} rows; raise --limit for more)")


@app.command()
def follow(
    queue: Annotated[str, typer.Argument(help="Stream queue name.")],
    group: Annotated[str, typer.Option("--group", "-g", help="Consumer group (created at the oldest message).")],
    out: Annotated[Path, typer.Option("--out", help="Output directory: one p<part>-<from>-<to> directory per batch.")],
    dsn: Dsn = None, master: Master = None, jars: Jars = None, verbose: Verbose = False,
    fmt: Annotated[str, typer.Option("--format", help="parquet or json.")] = "parquet",
    batch: Annotated[int, typer.Option("--batch", min=1, help="Messages per micro-batch at most.")] = 100_000,
    interval: Annotated[float, typer.Option("--interval", min=0, help="Seconds between polls when caught up.")] = 1.0,
    max_batches: Annotated[Optional[int], typer.Option("--max-batches", min=1, help="Stop after this many batches.")] = None,
    drain: Annotated[bool, typer.Option("--drain", help="Stop once the group has caught up with the head.")] = False,
) -> None:
    """Consume a stream queue as a consumer group in Spark micro-batches.

    Each batch is written under --out, named by its offset range, and committed only after that, so
    a killed job resumes exactly where its last batch ended (no gap, no duplicate).
    """
    with _errors():
        from fluxpg.analytics import follow as fol

        def say(msg: str) -> None:
            err_console.print(msg, highlight=False)

        with _context(dsn, master, jars, verbose) as (session, target, conn):
            res = fol.follow(session.spark, target, conn, queue, group, out, fmt=fmt, batch=batch, interval=interval,
                             max_batches=max_batches, drain=drain, log=say)
            out_console.print(f"{res.batches} batches, {res.rows} messages written under {out}")


def main(argv: list[str] | None = None) -> Any:
    return app(args=argv, prog_name="fluxpg analytics")


if __name__ == "__main__":
    sys.exit(main())
