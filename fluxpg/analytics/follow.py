"""`fluxpg analytics follow`: a stream queue's consumer group run as Spark micro-batches.

Each micro-batch reads, per queue partition, the offsets ``[committed, head)`` (at most ``--batch``
rows over all partitions) over JDBC, writes them to ``DIR/.tmp-<id>``, renames each partition's
output to ``DIR/p<partition>-<from>-<to>`` (20-digit offsets, ``to`` exclusive), and only then
commits the group in one transaction. A job killed at any point therefore resumes exactly where its
last committed batch ended:

- killed before the rename: the temporary directory is removed at the next start;
- killed after the rename but before the commit: the output is uncommitted. The next start removes
  every output whose range begins at or past the group's committed offset, then reads that range
  again (a rerun of the same range writes the same name, replacing it).

So every offset of the group's range appears in exactly one output directory. Like a broker
consumer of the group, follow skips expired messages and, for a ``group@filter`` group, messages
whose routing key does not match the filter. Outputs must be on a local (or locally mounted) file
system: the atomic rename is a POSIX rename.
"""
from __future__ import annotations

import math
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fluxpg.analytics.export import TIMESTAMP_FORMAT, shape
from fluxpg.analytics.jdbc import AnalyticsError, JdbcTarget, SeqRange, load_queues, read_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMATS = ("parquet", "json")
_BATCH_DIR = re.compile(r"^p(\d+)-(\d{20})-(\d{20})$")
PART_COLUMN = "fluxpg_partition"


def batch_dir_name(r: SeqRange) -> str:
    return f"p{r.partition}-{r.lo:020d}-{r.hi:020d}"


def parse_batch_dir(name: str) -> tuple[int, int, int] | None:
    m = _BATCH_DIR.match(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


@dataclass
class FollowResult:
    batches: int = 0
    rows: int = 0
    outputs: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)


class Follower:
    def __init__(self, spark: "SparkSession", target: JdbcTarget, conn, queue: str, group: str, out: Path, *,
                 fmt: str = "parquet", batch: int = 100_000, log: Callable[[str], None] = lambda _m: None):
        if fmt not in FORMATS:
            raise AnalyticsError(f"invalid --format {fmt!r} for follow: expected parquet or json")
        if batch < 1:
            raise AnalyticsError(f"--batch must be at least 1, got {batch}")
        self.spark, self.target, self.conn = spark, target, conn
        self.queue, self.group, self.out, self.fmt, self.batch, self.log = queue, group, out, fmt, batch, log
        info = load_queues(conn, [queue])[queue]
        if info.kind != "stream":
            raise AnalyticsError(f"queue {queue!r} is a {info.kind} queue: follow reads stream queues only "
                                 "(use `fluxpg analytics export` to archive a classic queue)")
        self.info = info
        # Creates the group on first use (at the oldest retained message) and puts its read cursor
        # back on the checkpoint, as any consumer (re)joining the group does.
        conn.execute("SELECT fluxpg.seek(%s, %s, 'resume')", (queue, group))
        regex = conn.execute("""SELECT g.filter_regex FROM fluxpg.groups g JOIN fluxpg.queues q ON q.id = g.queue_id
                                 WHERE q.name = %s AND g.name = %s""", (queue, group)).fetchone()[0]
        self.table = self._table(regex)
        self._warned_gap: set[int] = set()

    def _table(self, regex: str | None) -> str:
        from psycopg import sql

        where = "(l.expires_at IS NULL OR l.expires_at > now())"
        if regex:
            where += " AND fluxpg.routing_key(l.topic) ~ " + sql.Literal(regex).as_string(self.conn)
        return f"""(SELECT l.queue_id, q.name AS queue, l.partition, l.seq, l.topic,
        fluxpg.routing_key(l.topic) AS routing_key, octet_length(l.payload) AS size, l.payload,
        l.headers::text AS headers, l.created_at, l.expires_at
   FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id WHERE {where}) AS fluxpg_log"""

    # -- state ------------------------------------------------------------------------------------

    def committed(self) -> dict[int, tuple[int, int]]:
        """partition → (committed, cursor) of the group."""
        rows = self.conn.execute("SELECT partition, committed, cursor FROM fluxpg.group_status WHERE queue = %s AND grp = %s",
                                 (self.queue, self.group)).fetchall()
        return {p: (c, cur) for p, c, cur in rows}

    def clean(self) -> list[Path]:
        """Remove temporary directories and uncommitted outputs (range at or past the checkpoint)."""
        removed: list[Path] = []
        if not self.out.exists():
            return removed
        committed = self.committed()
        for entry in sorted(self.out.iterdir()):
            if entry.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
                continue
            parsed = parse_batch_dir(entry.name)
            if parsed is None:
                continue
            part, lo, hi = parsed
            done = committed.get(part, (0, 0))[0]
            if lo >= done:
                self.log(f"removing uncommitted output {entry.name} (group committed {done})")
                shutil.rmtree(entry)
                removed.append(entry)
            elif hi > done:
                raise AnalyticsError(f"{entry} overlaps the group's checkpoint {done} of partition {part}: "
                                     "the group was moved by another consumer; use a new --out or group")
        return removed

    def next_ranges(self) -> list[SeqRange]:
        info = load_queues(self.conn, [self.queue])[self.queue]
        heads = info.partitions
        committed = self.committed()
        lagging = []
        for p, (first, nxt) in sorted(heads.items()):
            done = committed.get(p, (first, first))[0]
            if done < first and p not in self._warned_gap:
                self.log(f"partition {p}: offsets {done}..{first - 1} were dropped by retention before this group read them")
                self._warned_gap.add(p)
            lo = max(done, first)
            if nxt > lo:
                lagging.append((p, lo, nxt))
        if not lagging:
            return []
        share = math.ceil(self.batch / len(lagging))
        return [SeqRange(self.info.id, p, lo, min(nxt, lo + share), info.row_bytes) for p, lo, nxt in lagging]

    # -- one micro-batch ---------------------------------------------------------------------------

    def run_batch(self, ranges: list[SeqRange]) -> tuple[int, list[Path]]:
        from pyspark.sql import functions as F

        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f".tmp-{uuid.uuid4().hex[:12]}"
        df = read_log(self.spark, self.target, ranges, table=self.table)
        shaped = shape(df, self.fmt).withColumn(PART_COLUMN, F.col("partition")).sortWithinPartitions("partition", "seq")
        writer = shaped.write.mode("errorifexists").partitionBy(PART_COLUMN)
        if self.fmt == "parquet":
            writer.parquet(str(tmp))
        else:
            writer.option("timestampFormat", TIMESTAMP_FORMAT).option("ignoreNullFields", False).json(str(tmp))
        rows = 0
        outputs = []
        for r in ranges:
            src = tmp / f"{PART_COLUMN}={r.partition}"
            if not src.exists():  # every message of the range was filtered out or expired
                continue
            rows += self._count(src)
            dest = self.out / batch_dir_name(r)
            if dest.exists():  # a rerun of the same range: replace, never duplicate
                trash = self.out / f".trash-{uuid.uuid4().hex[:12]}"
                dest.rename(trash)
                src.rename(dest)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                src.rename(dest)
            outputs.append(dest)
        self.commit(ranges)
        shutil.rmtree(tmp, ignore_errors=True)
        return rows, outputs

    def _count(self, path: Path) -> int:
        """Rows in a written output, from file metadata (no Spark job): Parquet footers, JSON lines
        (Spark escapes newlines inside values, so one line is one record)."""
        files = [f for f in path.iterdir() if f.name.startswith("part-")]
        if self.fmt == "json":
            total = 0
            for f in files:
                with open(f, "rb") as fh:
                    total += sum(1 for line in fh if line.strip())
            return total
        try:
            import pyarrow.parquet as pq
        except ImportError:
            return self.spark.read.parquet(str(path)).count()
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)

    def commit(self, ranges: list[SeqRange]) -> None:
        """Checkpoint every range's end in one transaction. fluxpg.commit accepts offsets up to the
        group's read cursor; follow reads over JDBC, not through fluxpg.read, so when the cursor is
        behind, fluxpg.seek to the end moves cursor and checkpoint together."""
        with self.conn.transaction():
            for r in ranges:
                cursor = self.conn.execute(
                    "SELECT cursor FROM fluxpg.group_status WHERE queue = %s AND grp = %s AND partition = %s",
                    (self.queue, self.group, r.partition)).fetchone()[0]
                if cursor < r.hi:
                    self.conn.execute("SELECT fluxpg.seek(%s, %s, %s, %s)", (self.queue, self.group, str(r.hi), r.partition))
                else:
                    self.conn.execute("SELECT fluxpg.commit(%s, %s, %s, %s)", (self.queue, self.group, r.hi, r.partition))


def follow(spark: "SparkSession", target: JdbcTarget, conn, queue: str, group: str, out: Path, *,
           fmt: str = "parquet", batch: int = 100_000, interval: float = 1.0, max_batches: int | None = None,
           drain: bool = False, log: Callable[[str], None] = lambda _m: None) -> FollowResult:
    """Run micro-batches until ``max_batches`` were written, or (``drain``) the group caught up."""
    if interval < 0:
        raise AnalyticsError(f"--interval must not be negative, got {interval}")
    f = Follower(spark, target, conn, queue, group, out, fmt=fmt, batch=batch, log=log)
    result = FollowResult(removed=f.clean())
    while max_batches is None or result.batches < max_batches:
        ranges = f.next_ranges()
        if not ranges:
            if drain:
                break
            time.sleep(interval)
            continue
        rows, outputs = f.run_batch(ranges)
        result.batches += 1
        result.rows += rows
        result.outputs += outputs
        span = ", ".join(f"p{r.partition} [{r.lo}, {r.hi})" for r in ranges)
        log(f"batch {result.batches}: {span}: {rows} rows written, committed")
    return result
