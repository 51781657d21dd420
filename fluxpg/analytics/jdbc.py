"""Spark plumbing shared by the analytics jobs: DSN → JDBC URL, driver discovery, the session
builder, Rich progress for Spark jobs, and range-planned reads of the log.

Reads of ``fluxpg.log`` are cut into seq ranges per queue partition (bounds from ``fluxpg.heads``)
and handed to Spark's JDBC source as *predicates*: one short ``SELECT … WHERE queue_id = … AND
partition = … AND seq >= … AND seq < …`` per Spark partition. Each is an index range scan inside one
log segment or a few, so no statement (and no snapshot) lives long enough to hold back vacuum of the
broker's hot tables (heads, cursors, pending), which share the database's xmin horizon.
"""
from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:  # pyspark is imported lazily: `fluxpg --help` must work without it
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

DRIVER_CLASS = "org.postgresql.Driver"
# Debian/Ubuntu `libpostgresql-jdbc-java`; the Maven repository is not reachable everywhere.
DEFAULT_JAR_PATHS: tuple[str, ...] = ("/usr/share/java/postgresql.jar",)
JAR_ENV = "FLUXPG_JDBC_JAR"
DSN_ENV = "FLUXPG_DSN"
INSTALL_HINT = ("PostgreSQL JDBC driver not found: install it with `apt-get install libpostgresql-jdbc-java` "
                f"(gives {DEFAULT_JAR_PATHS[0]}), or point {JAR_ENV} or --jars at a postgresql-<version>.jar "
                "from https://jdbc.postgresql.org/download/")

ROWS_PER_PARTITION = 250_000
BYTES_PER_PARTITION = 256 * 1024 * 1024  # on disk, for reads that carry payloads
FETCH_SIZE = 10_000

LOG_TABLE = """(SELECT l.queue_id, q.name AS queue, l.partition, l.seq, l.topic,
        fluxpg.routing_key(l.topic) AS routing_key, octet_length(l.payload) AS size, l.payload,
        l.headers::text AS headers, l.created_at, l.expires_at
   FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id) AS fluxpg_log"""


class AnalyticsError(Exception):
    """An error for the user: printed as one line, never as a traceback."""


# ---------------------------------------------------------------------------------------------
# DSN → JDBC
# ---------------------------------------------------------------------------------------------

def resolve_dsn(dsn: str | None) -> str:
    dsn = (dsn or os.environ.get(DSN_ENV, "")).strip()
    if not dsn:
        raise AnalyticsError(f"no database: pass --dsn postgresql://user@host:port/db or set {DSN_ENV}")
    return dsn


@dataclass(frozen=True)
class JdbcTarget:
    url: str
    properties: dict[str, str]

    def options(self, **extra: Any) -> dict[str, str]:
        """Options for ``spark.read.format("jdbc")``: the URL, driver and connection properties."""
        opts = {"url": self.url, **self.properties}
        opts.update({k: str(v) for k, v in extra.items()})
        return opts


# libpq parameter → pgjdbc connection property (same meaning, pgjdbc's spelling).
_PROPERTY_MAP = {
    "sslmode": "sslmode", "sslrootcert": "sslrootcert", "sslcert": "sslcert", "sslkey": "sslkey",
    "sslpassword": "sslpassword", "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout", "options": "options", "gssencmode": "gssEncMode",
    "krbsrvname": "kerberosServerName", "channel_binding": "channelBinding",
}
_TARGET_SESSION = {"any": "any", "read-write": "primary", "primary": "primary", "read-only": "secondary",
                   "standby": "secondary", "prefer-standby": "preferSecondary"}
# Connection parameters that only matter to libpq or have no pgjdbc equivalent; dropped silently.
_IGNORED = {"hostaddr", "passfile", "client_encoding", "fallback_application_name", "keepalives",
            "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
            "requirepeer", "sslcompression", "sslcrl", "sslcrldir", "sslsni", "ssl_min_protocol_version",
            "ssl_max_protocol_version", "load_balance_hosts", "service", "replication", "gsslib",
            "require_auth", "sslcertmode"}


def jdbc_target(dsn: str, *, unix_socket_jar: bool = False) -> JdbcTarget:
    """Convert a libpq DSN (``postgresql://user:pw@host:port/db?…`` or ``host=… dbname=…``) to a JDBC URL
    and connection properties, with libpq's defaults (``PGHOST``, ``PGPORT``, ``PGUSER``, …).

    The user and password go into the properties, not the URL, so the URL can be logged.
    A unix-socket host (``host=/run/postgresql``) needs junixsocket on the classpath
    (``unix_socket_jar``); pgjdbc has no socket support of its own.
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    except Exception as exc:  # psycopg.ProgrammingError with libpq's own wording
        raise AnalyticsError(f"invalid DSN: {str(exc).strip()}") from None
    env = os.environ
    host = params.pop("host", "") or params.get("hostaddr", "") or env.get("PGHOST", "") or "localhost"
    port = params.pop("port", "") or env.get("PGPORT", "") or "5432"
    user = params.pop("user", "") or env.get("PGUSER", "") or _os_user()
    dbname = params.pop("dbname", "") or env.get("PGDATABASE", "") or user
    password = params.pop("password", "") or env.get("PGPASSWORD", "")

    hosts = host.split(",")
    ports = port.split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise AnalyticsError(f"invalid DSN: {len(hosts)} hosts but {len(ports)} ports")
    ports = [p.strip() or "5432" for p in ports]
    for p in ports:
        if not p.isdigit():
            raise AnalyticsError(f"invalid DSN: port {p!r} is not a number")

    props: dict[str, str] = {"driver": DRIVER_CLASS, "user": user}
    if password:
        props["password"] = password
    query: list[tuple[str, str]] = []
    sockets = [h for h in hosts if h.startswith("/") or h.startswith("@")]
    if sockets:
        if len(hosts) > 1:
            raise AnalyticsError("invalid DSN for JDBC: a unix-socket host cannot be mixed with other hosts")
        if not unix_socket_jar:
            raise AnalyticsError(
                f"the DSN connects through the unix socket {hosts[0]}, which the PostgreSQL JDBC driver cannot "
                "reach by itself: use a TCP address (e.g. host=127.0.0.1), or add junixsocket jars with --jars")
        # junixsocket's socket factory takes the socket file's path as its argument.
        query += [("socketFactory", "org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg"),
                  ("socketFactoryArg", f"{hosts[0].rstrip('/')}/.s.PGSQL.{ports[0]}")]
        netloc = "localhost"
    else:
        netloc = ",".join(f"{_bracket(h)}:{p}" for h, p in zip(hosts, ports))

    for key, value in params.items():
        if key in _PROPERTY_MAP:
            props[_PROPERTY_MAP[key]] = value
        elif key == "target_session_attrs":
            if value not in _TARGET_SESSION:
                raise AnalyticsError(f"invalid DSN: target_session_attrs={value!r}")
            props["targetServerType"] = _TARGET_SESSION[value]
        elif key not in _IGNORED:
            log.debug("DSN parameter %s has no JDBC equivalent; ignored", key)
    props.setdefault("ApplicationName", "fluxpg-analytics")
    url = f"jdbc:postgresql://{netloc}/{quote(dbname, safe='')}"
    if query:
        url += "?" + "&".join(f"{k}={quote(v, safe='/$.')}" for k, v in query)
    return JdbcTarget(url, props)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _os_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:
        return "postgres"


# ---------------------------------------------------------------------------------------------
# Driver discovery and the session
# ---------------------------------------------------------------------------------------------

def find_jdbc_jars(jars: Sequence[str] | None = None, search: Sequence[str] | None = None) -> list[str]:
    """The jars to put on Spark's classpath: ``--jars`` when given (comma-separated allowed), else
    ``FLUXPG_JDBC_JAR``, else the Debian jar. Raises :class:`AnalyticsError` with how to install the
    driver when none is found."""
    explicit = [j.strip() for item in (jars or []) for j in item.split(",") if j.strip()]
    if explicit:
        missing = [j for j in explicit if not Path(j).is_file()]
        if missing:
            raise AnalyticsError(f"--jars: no such file: {', '.join(missing)}")
        if not any("postgresql" in Path(j).name.lower() for j in explicit):
            # Another jar set was given; the driver may still be found the usual way.
            try:
                return explicit + find_jdbc_jars(None, search)
            except AnalyticsError:
                return explicit
        return explicit
    env = os.environ.get(JAR_ENV, "").strip()
    if env:
        if not Path(env).is_file():
            raise AnalyticsError(f"{JAR_ENV}={env}: no such file. {INSTALL_HINT}")
        return [env]
    for path in (DEFAULT_JAR_PATHS if search is None else search):
        if Path(path).is_file():
            return [str(Path(path).resolve())]
    raise AnalyticsError(INSTALL_HINT)


_QUIET_LOG4J = """\
# fluxpg analytics: Spark logs errors only (run with -v for warnings)
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@dataclass
class Session:
    spark: "SparkSession"
    owned: bool
    jars: list[str]
    log_path: Path | None = None
    workdir: Path | None = None

    @property
    def cores(self) -> int:
        return max(1, int(self.spark.sparkContext.defaultParallelism))


def _log_tail(path: Path | None, lines: int = 5) -> str:
    if path is None or not path.exists():
        return ""
    text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(text[-lines:])


@contextmanager
def spark_session(master: str | None = None, jars: Sequence[str] | None = None, verbose: bool = False,
                  app_name: str = "fluxpg-analytics", conf: dict[str, str] | None = None) -> Iterator[Session]:
    """A SparkSession for one command. An already active session (tests share one) is reused and left
    running; a session this function starts is stopped at the end.

    Quiet by default: log4j at ERROR, no console progress bar, and the JVM's own stderr (launcher
    warnings) goes to a log file whose tail is shown when start-up fails.
    """
    jar_list = find_jdbc_jars(jars)
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise AnalyticsError("pyspark is not installed: pip install 'fluxpg[spark]'") from None

    if not verbose:
        # PySpark logs every failed query (with the JVM stack) before raising it; the CLI prints the
        # error itself in one line.
        for name in ("SQLQueryContextLogger", "py4j", "pyspark"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    active = SparkSession.getActiveSession()
    if active is not None:
        _ensure_driver_loaded(active, jar_list)
        yield Session(active, owned=False, jars=jar_list)
        return

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    workdir = Path(tempfile.mkdtemp(prefix="fluxpg-spark-"))
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_QUIET_LOG4J)
    java_opts = "" if verbose else f"-Dlog4j2.configurationFile=file:{log4j}"
    cores = os.cpu_count() or 2
    settings = {
        "spark.master": master or "local[*]",
        "spark.app.name": app_name,
        "spark.jars": ",".join(jar_list),
        # JDBC drivers must be visible to the driver's system class loader as well.
        "spark.driver.extraClassPath": os.pathsep.join(jar_list),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        "spark.log.level": "WARN" if verbose else "ERROR",
    }
    if java_opts:
        settings["spark.driver.extraJavaOptions"] = java_opts
    if settings["spark.master"].startswith("local"):
        # Shuffle and spill files next to the log file, removed with it; a cluster keeps its own.
        settings["spark.local.dir"] = str(workdir)
    settings.update(conf or {})
    spark_conf = SparkConf().setAll(list(settings.items()))
    log_path = None if verbose else workdir / "spark.log"
    try:
        if not verbose:
            from pyspark.java_gateway import launch_gateway

            with open(log_path, "ab") as out:
                # The JVM inherits this file as stdout/stderr; Python's copy can be closed.
                gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": out, "stderr": out})
            SparkContext._ensure_initialized(gateway=gateway, conf=spark_conf)
        spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    except Exception as exc:
        tail = _log_tail(log_path)
        shutil.rmtree(workdir, ignore_errors=True)
        raise AnalyticsError(f"Spark did not start: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             + (f" ({tail})" if tail else "")) from None
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    session = Session(spark, owned=True, jars=jar_list, log_path=log_path, workdir=workdir)
    try:
        yield session
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _ensure_driver_loaded(spark: "SparkSession", jars: list[str]) -> None:
    """A session started elsewhere may lack the driver; addJar makes it available to executors."""
    sc = spark.sparkContext
    present = sc.getConf().get("spark.jars", "")
    for jar in jars:
        if jar not in present:
            sc.addJar(jar)  # type: ignore[attr-defined]


@contextmanager
def spark_progress(spark: "SparkSession", description: str, enabled: bool = True) -> Iterator[None]:
    """Show a Rich progress bar of Spark tasks while the body runs (when stderr is a terminal).

    Spark's own console progress bar is off; this polls the status tracker from a thread instead.
    """
    import sys

    if not enabled or not sys.stderr.isatty():
        yield
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    group = f"fluxpg-{id(stop)}"
    spark.sparkContext.setJobGroup(group, description)

    def poll(progress: Progress, task: Any) -> None:
        while not stop.wait(0.3):
            done = total = 0
            try:
                for job_id in tracker.getJobIdsForGroup(group):
                    job = tracker.getJobInfo(job_id)
                    if job is None:
                        continue
                    for stage_id in job.stageIds:
                        stage = tracker.getStageInfo(stage_id)
                        if stage is not None:
                            done += stage.numCompletedTasks
                            total += stage.numTasks
            except Exception:  # the JVM is shutting down; the bar is cosmetic
                return
            progress.update(task, completed=done, total=max(total, 1))

    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("tasks"), TimeElapsedColumn(), transient=True,
                  console=_stderr_console()) as progress:
        task = progress.add_task(description, total=None)
        thread = threading.Thread(target=poll, args=(progress, task), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


# ---------------------------------------------------------------------------------------------
# Queues, bounds and range planning
# ---------------------------------------------------------------------------------------------

@dataclass
class QueueInfo:
    id: int
    name: str
    kind: str
    partitions: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition → (first_seq, next_seq)
    bytes: int = 0  # on disk (fluxpg.queue_stats.bytes)

    @property
    def row_bytes(self) -> float:
        return self.bytes / self.rows if self.rows else 0.0

    @property
    def rows(self) -> int:
        return sum(hi - lo for lo, hi in self.partitions.values())


@dataclass(frozen=True)
class SeqRange:
    """Offsets [lo, hi) of one queue partition."""
    queue_id: int
    partition: int
    lo: int
    hi: int
    row_bytes: float = 0.0  # average on-disk bytes per row of its queue, for partition planning

    @property
    def rows(self) -> int:
        return max(0, self.hi - self.lo)

    def predicate(self) -> str:
        return (f'(queue_id = {int(self.queue_id)} AND "partition" = {int(self.partition)} '
                f"AND seq >= {int(self.lo)} AND seq < {int(self.hi)})")


def connect(dsn: str):
    """A psycopg connection in autocommit mode (every metadata query is its own short transaction)."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, application_name="fluxpg-analytics")
    except psycopg.Error as exc:
        raise AnalyticsError(f"cannot connect to the database: {str(exc).strip().splitlines()[0]}") from None


def load_queues(conn, names: Iterable[str] | None = None) -> dict[str, QueueInfo]:
    """Queues with each partition's retained offsets [first_seq, next_seq), read from fluxpg.heads.
    Unknown names raise :class:`AnalyticsError`."""
    wanted = list(names) if names else None
    rows = conn.execute(
        """SELECT q.id, q.name, q.kind, h.partition, h.first_seq, h.next_seq
             FROM fluxpg.queues q JOIN fluxpg.heads h ON h.queue_id = q.id
            WHERE %(names)s::text[] IS NULL OR q.name = ANY (%(names)s::text[])
            ORDER BY q.name, h.partition""", {"names": wanted}).fetchall()
    queues: dict[str, QueueInfo] = {}
    for qid, name, kind, part, first, nxt in rows:
        queues.setdefault(name, QueueInfo(qid, name, kind)).partitions[part] = (first, nxt)
    for name, size in conn.execute("SELECT queue, bytes FROM fluxpg.queue_stats WHERE queue = ANY (%s)", (list(queues),)):
        queues[name].bytes = int(size or 0)
    if wanted:
        missing = [n for n in wanted if n not in queues]
        if missing:
            known = ", ".join(sorted(q for (q,) in conn.execute("SELECT name FROM fluxpg.queues"))) or "none"
            raise AnalyticsError(f"unknown queue {missing[0]!r} (queues: {known})")
    return queues


def full_ranges(queues: Iterable[QueueInfo]) -> list[SeqRange]:
    return [SeqRange(q.id, p, lo, hi, q.row_bytes) for q in queues for p, (lo, hi) in sorted(q.partitions.items()) if hi > lo]


def partition_count(rows: int, cores: int, rows_per_partition: int = ROWS_PER_PARTITION, size: float = 0,
                    bytes_per_partition: int = BYTES_PER_PARTITION) -> int:
    """Spark partitions for a read of ``rows`` rows (``size`` bytes on disk): one per
    ``rows_per_partition`` rows or per ``bytes_per_partition`` bytes, whichever gives more, at least 1,
    at most 4 × cores (more only queue up as tasks; they make each query shorter, not the read faster)."""
    by_rows = math.ceil(rows / max(1, rows_per_partition))
    by_bytes = math.ceil(size / max(1, bytes_per_partition))
    return max(1, min(max(by_rows, by_bytes), 4 * max(1, cores)))


def plan_predicates(ranges: Sequence[SeqRange], num_partitions: int) -> list[str]:
    """Cut ranges into ``num_partitions`` pieces of about equal row counts; each piece becomes one
    JDBC predicate (an OR of per-partition seq ranges when a piece spans several queue partitions)."""
    ranges = [r for r in ranges if r.rows > 0]
    total = sum(r.rows for r in ranges)
    if total == 0:
        return ["1 = 0"]  # an empty read that still has the log's schema
    n = max(1, min(num_partitions, total))
    target = math.ceil(total / n)
    pieces: list[list[SeqRange]] = [[]]
    room = target
    for r in ranges:
        lo = r.lo
        while lo < r.hi:
            if room == 0:
                pieces.append([])
                room = target
            take = min(room, r.hi - lo)
            pieces[-1].append(SeqRange(r.queue_id, r.partition, lo, lo + take))
            lo += take
            room -= take
    return [" OR ".join(p.predicate() for p in piece) for piece in pieces if piece]


def read_log(spark: "SparkSession", target: JdbcTarget, ranges: Sequence[SeqRange], *,
             num_partitions: int | None = None, rows_per_partition: int = ROWS_PER_PARTITION,
             fetchsize: int = FETCH_SIZE, table: str = LOG_TABLE, payloads: bool = True) -> "DataFrame":
    """The log rows of ``ranges`` as a DataFrame with columns queue_id, queue, partition, seq, topic,
    routing_key, size, payload (binary), headers (JSON text), created_at, expires_at.

    Spark prunes unused columns into the SQL (a read of ``size`` never transfers payloads) and pushes
    simple filters down. ``payloads=False`` (such a pruned read) plans partitions by rows only."""
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    size = sum(r.rows * r.row_bytes for r in ranges) if payloads else 0
    n = num_partitions or partition_count(sum(r.rows for r in ranges), cores, rows_per_partition, size)
    predicates = plan_predicates(ranges, n)
    props = {k: v for k, v in target.properties.items()}
    props["fetchsize"] = str(fetchsize)
    return spark.read.jdbc(target.url, table, predicates=predicates, properties=props)


def read_query(spark: "SparkSession", target: JdbcTarget, sql: str) -> "DataFrame":
    """A small metadata query (group status, queue stats) as a one-partition DataFrame."""
    return spark.read.format("jdbc").options(**target.options(query=sql, fetchsize=FETCH_SIZE)).load()


# ---------------------------------------------------------------------------------------------
# Positions (offsets and times) → seq bounds
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Position:
    offset: int | None = None
    time: datetime | None = None

    def __str__(self) -> str:
        return str(self.offset) if self.offset is not None else self.time.isoformat()  # type: ignore[union-attr]


_TS = re.compile(r"^(?:timestamp|ts)=(\d{1,18})(\.\d+)?$", re.I)


def parse_position(text: str, what: str = "position") -> Position:
    """``123`` or ``offset=123`` is an offset; ``timestamp=1700000000000`` is unix ms (unix seconds when
    ≤ 1e12, as in fluxpg.seek); an ISO 8601 time (``2026-01-31T12:00:00Z``, naive = UTC) is a time."""
    s = text.strip()
    m = re.fullmatch(r"(?:offset=)?(\d{1,18})", s, re.I)
    if m:
        return Position(offset=int(m.group(1)))
    m = _TS.match(s)
    if m:
        n = float(m.group(1) + (m.group(2) or ""))
        return Position(time=datetime.fromtimestamp(n / 1000 if n > 1e12 else n, tz=timezone.utc))
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise AnalyticsError(f"invalid {what} {text!r}: expected an offset (123), timestamp=<unix ms> "
                             "or an ISO 8601 time (2026-01-31T12:00:00Z)") from None
    return Position(time=t if t.tzinfo else t.replace(tzinfo=timezone.utc))


def bounded_ranges(conn, queue: QueueInfo, start: Position | None, end: Position | None,
                   partitions: Iterable[int] | None = None) -> tuple[list[SeqRange], datetime | None, datetime | None]:
    """Seq ranges of a queue between two positions (start inclusive, end exclusive), per partition.

    A time bound becomes an exact seq bound: the lowest seq created at or after it (resp. the
    highest created before it, + 1). created_at is not strictly monotonic in seq (a transaction's
    now() is its start), so the caller also filters on created_at; returned are the times to filter
    on (None when the bound is an offset)."""
    parts = sorted(queue.partitions) if partitions is None else sorted(set(partitions))
    for p in parts:
        if p not in queue.partitions:
            raise AnalyticsError(f"queue {queue.name!r} has no partition {p} (it has {len(queue.partitions)})")
    ranges = []
    for p in parts:
        first, nxt = queue.partitions[p]
        lo, hi = first, nxt
        if start is not None and start.offset is not None:
            if start.offset > nxt and start.offset >= 10**12:
                raise AnalyticsError(f"--from {start.offset} is beyond the head {nxt} of {queue.name!r}; "
                                     f"for unix ms write timestamp={start.offset}")
            lo = max(lo, start.offset)
        elif start is not None:
            row = conn.execute("""SELECT seq FROM fluxpg.log WHERE queue_id = %s AND partition = %s
                                     AND seq >= %s AND seq < %s AND created_at >= %s ORDER BY seq LIMIT 1""",
                               (queue.id, p, first, nxt, start.time)).fetchone()
            lo = row[0] if row else nxt
        if end is not None and end.offset is not None:
            if end.offset > nxt and end.offset >= 10**12:
                raise AnalyticsError(f"--to {end.offset} is beyond the head {nxt} of {queue.name!r}; "
                                     f"for unix ms write timestamp={end.offset}")
            hi = min(hi, end.offset)
        elif end is not None:
            row = conn.execute("""SELECT seq FROM fluxpg.log WHERE queue_id = %s AND partition = %s
                                     AND seq >= %s AND seq < %s AND created_at < %s ORDER BY seq DESC LIMIT 1""",
                               (queue.id, p, first, nxt, end.time)).fetchone()
            hi = row[0] + 1 if row else first
        if hi > lo:
            ranges.append(SeqRange(queue.id, p, lo, hi, queue.row_bytes))
    return (ranges, start.time if start is not None else None, end.time if end is not None else None)


def sanitize_view_name(name: str) -> str:
    """A queue name as a Spark SQL identifier: ``orders`` → ``q_orders``, ``$dlq/orders`` → ``q_dlq_orders``."""
    return "q_" + (re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower() or "queue")


def now_ms() -> int:
    return int(time.time() * 1000)
