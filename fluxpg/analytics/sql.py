"""`fluxpg analytics sql "…"`: Spark SQL over the log.

Views (registered only when the statement names them, so a query over one queue reads one queue):

- ``log``: every queue's retained messages;
- ``q_<name>`` per queue (the name lower-cased, runs of other characters as ``_``: ``orders`` →
  ``q_orders``, ``$dlq/orders`` → ``q_dlq_orders``), with ``body``, the payload parsed as JSON,
  when a sample of the queue's payloads are JSON objects;
- ``queues`` (fluxpg.queue_stats) and ``groups`` (fluxpg.group_status).

Message columns: queue, partition, seq, topic, routing_key, size, payload (bytes), payload_text
(UTF-8 text, null when the payload is not valid UTF-8), headers (JSON text), created_at, expires_at.
JSON fields are reachable with ``get_json_object(payload_text, '$.x')`` on any view, or ``body.x``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fluxpg.analytics.export import infer_schema
from fluxpg.analytics.jdbc import (AnalyticsError, JdbcTarget, QueueInfo, full_ranges, load_queues, read_log,
                                   read_query, sanitize_view_name)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MESSAGE_COLUMNS = ("queue", "partition", "seq", "topic", "routing_key", "size", "payload", "payload_text",
                   "headers", "created_at", "expires_at")
META_VIEWS = {"queues": "SELECT * FROM fluxpg.queue_stats", "groups": "SELECT * FROM fluxpg.group_status"}


def view_names(queues: dict[str, QueueInfo]) -> dict[str, QueueInfo]:
    """View name → queue; two queues that sanitize alike get their id appended."""
    out: dict[str, QueueInfo] = {}
    for q in sorted(queues.values(), key=lambda q: q.id):
        name = sanitize_view_name(q.name)
        if name in out or name in ("log", *META_VIEWS):
            name = f"{name}_{q.id}"
        out[name] = q
    return out


def messages(df: "DataFrame") -> "DataFrame":
    from pyspark.sql import functions as F

    text = F.col("payload").cast("string")
    return df.withColumn("payload_text", F.when(F.is_valid_utf8(text), text)).select(*MESSAGE_COLUMNS)


@dataclass
class Views:
    registered: dict[str, str]  # view → what it shows
    available: list[str]


def register_views(spark: "SparkSession", target: JdbcTarget, conn, statement: str,
                   infer_body: bool = True) -> Views:
    from pyspark.sql import functions as F

    queues = load_queues(conn)
    per_queue = view_names(queues)
    words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", statement)}
    registered: dict[str, str] = {}
    if "log" in words:
        messages(read_log(spark, target, full_ranges(queues.values()))).createOrReplaceTempView("log")
        registered["log"] = "all queues"
    for view, sql in META_VIEWS.items():
        if view in words:
            read_query(spark, target, sql).createOrReplaceTempView(view)
            registered[view] = sql.split()[-1]
    for view, q in per_queue.items():
        if view not in words:
            continue
        ranges = full_ranges([q])
        df = messages(read_log(spark, target, ranges))
        schema = infer_schema(spark, conn, ranges) if infer_body and ranges else None
        if schema is not None:
            df = df.withColumn("body", F.from_json("payload_text", schema))
        df.createOrReplaceTempView(view)
        registered[view] = f"queue {q.name}" + (" (with body)" if schema is not None else "")
    return Views(registered, ["log", *META_VIEWS, *per_queue])


def run(spark: "SparkSession", target: JdbcTarget, conn, statement: str, limit: int = 1000,
        infer_body: bool = True) -> tuple[list[str], list[tuple[Any, ...]], bool, Views]:
    """Run one statement; returns its columns, up to ``limit`` rows, whether more existed, and the views."""
    if not statement.strip():
        raise AnalyticsError("empty SQL statement")
    from pyspark.errors import PySparkException

    views = register_views(spark, target, conn, statement, infer_body)
    try:
        df = spark.sql(statement)
        rows = df.limit(limit + 1).collect()
    except PySparkException as exc:  # AnalysisException, ParseException, … : Spark's message, one line
        msg = _first_line(str(exc))
        if "TABLE_OR_VIEW_NOT_FOUND" in str(exc):
            msg += f" (views: {', '.join(views.available)})"
        raise AnalyticsError(f"SQL error: {msg}") from None
    return df.columns, [tuple(r) for r in rows[:limit]], len(rows) > limit, views


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return text.strip()
