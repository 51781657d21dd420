"""`fluxpg analytics report`: throughput per queue and time bucket, traffic per routing key, and the
state of every consumer group (head, committed, lag, pending, redeliveries, dead-lettered)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fluxpg.analytics.jdbc import (AnalyticsError, JdbcTarget, Position, QueueInfo, SeqRange, bounded_ranges,
                                   full_ranges, load_queues, read_log, read_query)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BUCKETS = {"1m": "minute", "1h": "hour", "1d": "day"}

# Per group, summed over its partitions. head = committed + lag (group_status has no head column).
GROUPS_SQL = """
SELECT gs.queue, gs.grp AS "group", gs.mode, count(*)::int AS partitions,
       sum(gs.committed + gs.lag)::bigint AS head, sum(gs.committed)::bigint AS committed,
       sum(gs.lag)::bigint AS lag, sum(gs.pending)::bigint AS pending,
       (SELECT count(*) FROM fluxpg.pending p WHERE p.group_id = g.id AND p.delivery_count > 1)::bigint AS redeliveries
  FROM fluxpg.group_status gs
  JOIN fluxpg.queues q ON q.name = gs.queue
  JOIN fluxpg.groups g ON g.queue_id = q.id AND g.name = gs.grp
 GROUP BY gs.queue, gs.grp, gs.mode, g.id
"""


@dataclass
class Report:
    throughput: "DataFrame"   # queue, bucket, messages, bytes
    routing_keys: "DataFrame"  # queue, routing_key, messages, bytes, first_at, last_at
    groups: "DataFrame"       # queue, group, mode, partitions, head, committed, lag, pending, redeliveries, dead_lettered
    cached: "DataFrame | None" = None

    def close(self) -> None:
        """Release the cached log columns (a shared session lives on after the report)."""
        if self.cached is not None:
            self.cached.unpersist()

    def frames(self) -> dict[str, "DataFrame"]:
        return {"throughput": self.throughput, "routing_keys": self.routing_keys, "groups": self.groups}


def dlq_queue_names(conn, queues: dict[str, QueueInfo]) -> list[str]:
    """Queues that receive dead letters: every `$dlq/<queue>` and every queue a `dlq.topic` names."""
    named = conn.execute("SELECT DISTINCT fluxpg.dlq_name(name) FROM fluxpg.queues").fetchall()
    return sorted({n for n in queues if n.startswith("$dlq/")} | {n for (n,) in named if n in queues})


def build(spark: "SparkSession", target: JdbcTarget, conn, *, bucket: str = "1h",
          queues: list[str] | None = None, since: Position | None = None, until: Position | None = None,
          num_partitions: int | None = None) -> Report:
    from pyspark.sql import functions as F

    if bucket not in BUCKETS:
        raise AnalyticsError(f"invalid --bucket {bucket!r}: expected one of {', '.join(BUCKETS)}")
    all_queues = load_queues(conn)
    selected = load_queues(conn, queues) if queues else all_queues

    ranges: list[SeqRange] = []
    t_from = t_to = None
    for q in selected.values():
        if since is None and until is None:
            ranges += full_ranges([q])
        else:
            r, t_from, t_to = bounded_ranges(conn, q, since, until)
            ranges += r
    log = read_log(spark, target, ranges, num_partitions=num_partitions, payloads=False).select(
        "queue", "created_at", "size", "routing_key")
    if t_from is not None:
        log = log.where(F.col("created_at") >= F.lit(t_from))
    if t_to is not None:
        log = log.where(F.col("created_at") < F.lit(t_to))
    log = log.persist()  # read once over JDBC, aggregated twice

    unit = BUCKETS[bucket]
    throughput = (log.groupBy("queue", F.date_trunc(unit, "created_at").alias("bucket"))
                  .agg(F.count(F.lit(1)).alias("messages"), F.coalesce(F.sum("size"), F.lit(0)).cast("long").alias("bytes"))
                  .orderBy("queue", "bucket"))
    routing = (log.groupBy("queue", "routing_key")
               .agg(F.count(F.lit(1)).alias("messages"), F.coalesce(F.sum("size"), F.lit(0)).cast("long").alias("bytes"),
                    F.min("created_at").alias("first_at"), F.max("created_at").alias("last_at"))
               .orderBy("queue", F.desc("messages"), "routing_key"))

    # Dead letters: rows of the DLQ queues whose headers name the group that gave up on them.
    dlq_names = dlq_queue_names(conn, all_queues)
    dlq_ranges = full_ranges(all_queues[n] for n in dlq_names)
    dead = (read_log(spark, target, dlq_ranges, payloads=False).select("headers")
            .where(F.col("headers").contains('"_dlq_group"'))
            .select(F.get_json_object("headers", "$._dlq_original_queue").alias("queue"),
                    F.get_json_object("headers", "$._dlq_group").alias("group"))
            .groupBy("queue", "group").agg(F.count(F.lit(1)).alias("dead_lettered")))

    groups = read_query(spark, target, GROUPS_SQL)
    if queues:
        groups = groups.where(F.col("queue").isin(list(selected)))
    groups = (groups.join(dead, ["queue", "group"], "left")
              .withColumn("dead_lettered", F.coalesce("dead_lettered", F.lit(0)).cast("long"))
              .orderBy("queue", "group"))
    return Report(throughput, routing, groups, cached=log)


def write(report: Report, out: Path, fmt: str) -> list[Path]:
    """Each table as a Spark output directory under ``out`` (overwritten); CSV as one file with a header."""
    if fmt not in ("parquet", "csv"):
        raise AnalyticsError(f"invalid --format {fmt!r} for report: expected parquet or csv")
    written = []
    for name, df in report.frames().items():
        path = out / name
        writer = (df.coalesce(1) if fmt == "csv" else df).write.mode("overwrite")
        if fmt == "csv":
            writer.option("header", True).option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").csv(str(path))
        else:
            writer.parquet(str(path))
        written.append(path)
    return written


def collect(report: Report) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    out = {}
    for name, df in report.frames().items():
        out[name] = (df.columns, [tuple(r) for r in df.collect()])
    return out
