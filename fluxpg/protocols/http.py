"""The HTTP admin and metrics endpoint: a minimal HTTP/1.1 server, no framework.

The listener sniffs an HTTP method and hands the connection here. One request per connection
(every response says `Connection: close`), GET and HEAD only:

    GET /healthz                     200 {"status": "ok", "node": <id>} when the database answers, else 503
    GET /metrics                     Prometheus text format (queues, groups, appender, connections)
    GET /api/queues                  JSON rows of the view fluxpg.queue_stats
    GET /api/queues/<name>/groups    JSON rows of fluxpg.group_status for one queue (404 if unknown)

Anything else: 404 for an unknown path, 405 for another method, 400 for a malformed request.
Errors never leak a traceback to the client: the client gets a one-line JSON error, the log the rest.

Request parsing (`parse_request`) and response building (`response`) are pure functions over bytes;
only `handle` does I/O. `jsonable` is the JSON form of view rows shared with `fluxpg … --json`:
timestamps as ISO 8601 strings, intervals as seconds (a number).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

log = logging.getLogger("fluxpg.http")

MAX_HEAD_BYTES = 16 * 1024      # request line + headers; more is refused with 400
MAX_DISCARD_BYTES = 1 << 20     # a request body we read and drop so the client sees our answer
READ_TIMEOUT = 10.0             # seconds for the whole request head
DB_TIMEOUT = 5.0                # seconds for one database query of a request

ALLOWED_METHODS = ("GET", "HEAD")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSION = re.compile(rb"^HTTP/1\.[01]$")
_GROUPS_PATH = re.compile(r"^/api/queues/(.+)/groups/?$")

JSON_TYPE = "application/json"
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class BadRequest(ValueError):
    """The bytes are not an HTTP/1.x request we can read (answered with 400)."""


@dataclass
class Request:
    method: str
    target: str
    path: str           # percent-encoded, without the query string
    query: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)   # lower-case names; repeated ones joined by ", "

    def content_length(self) -> int:
        value = self.headers.get("content-length", "0").strip() or "0"
        if not value.isdigit():
            raise BadRequest(f"invalid Content-Length {value!r}")
        return int(value)


# --------------------------------------------------------------------------------- pure parts

def head_end(data: bytes) -> int:
    """Index just past the blank line ending the request head, or -1 when it is not there yet.

    Bare LF line endings are accepted as well as CRLF (RFC 9112 §2.2 allows a recipient to).
    """
    ends = [i + n for i, n in ((data.find(b"\r\n\r\n"), 4), (data.find(b"\n\n"), 2)) if i >= 0]
    return min(ends) if ends else -1


def parse_request(head: bytes) -> Request:
    """Parse a request head (request line and header fields, up to and including the blank line)."""
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    while lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise BadRequest("empty request")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise BadRequest("malformed request line")
    method, target, version = parts
    if not _TOKEN.match(method) or not _VERSION.match(version):
        raise BadRequest("malformed request line")
    if not target or any(b <= 0x20 or b >= 0x7F for b in target):
        raise BadRequest("malformed request target")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        # No whitespace before the colon, no obsolete line folding (RFC 9112 §5.1, §5.2).
        if not sep or not _TOKEN.match(name):
            raise BadRequest("malformed header field")
        try:
            text = value.strip(b" \t").decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            raise BadRequest("malformed header field") from None
        key = name.decode("ascii").lower()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    target_text = target.decode("ascii")
    path, _, query = target_text.partition("?")
    if not path.startswith("/"):
        # origin-form only; absolute-form ("http://host/x") is for proxies, "*" for OPTIONS.
        raise BadRequest("expected a request target starting with /")
    return Request(method.decode("ascii"), target_text, path, query, version.decode("ascii"), headers)


def response(status: int, body: bytes = b"", content_type: str = JSON_TYPE, *,
             head_only: bool = False, extra: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response; the connection is closed after it."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
             f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}",
             "Cache-Control: no-store",
             "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head_only else out + body


def jsonable(value: Any) -> Any:
    """View rows (asyncpg records/dicts) as plain JSON values: datetimes → ISO 8601 strings,
    intervals → seconds (float), Decimals → int or float, bytes → hex."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def json_body(value: Any) -> bytes:
    return (json.dumps(jsonable(value), indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _error(status: int, message: str, *, head_only: bool = False, extra: dict[str, str] | None = None) -> bytes:
    return response(status, json_body({"error": message}), head_only=head_only, extra=extra)


# --------------------------------------------------------------------------------- Prometheus

def _label_value(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, Decimal)) and value == int(value):
        return str(int(value))
    return repr(float(value))


class Metrics:
    """Accumulates metric families and renders the Prometheus text exposition format 0.0.4."""

    def __init__(self) -> None:
        self._families: list[tuple[str, str, str, list[tuple[dict[str, Any], Any]]]] = []
        self._index: dict[str, list[tuple[dict[str, Any], Any]]] = {}

    def family(self, name: str, kind: str, help_text: str) -> list[tuple[dict[str, Any], Any]]:
        samples = self._index.get(name)
        if samples is None:
            samples = self._index[name] = []
            self._families.append((name, kind, help_text, samples))
        return samples

    def add(self, name: str, kind: str, help_text: str, value: Any, **labels: Any) -> None:
        self.family(name, kind, help_text).append((labels, value))

    def render(self) -> str:
        out: list[str] = []
        for name, kind, help_text, samples in self._families:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                label_text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
                out.append(f"{name}{{{label_text}}} {_number(value)}" if label_text else f"{name} {_number(value)}")
        return "\n".join(out) + "\n"


_QUEUE_METRICS = (
    ("head", "fluxpg_queue_head", "Next offset of the queue: messages ever appended, summed over partitions "
     "(from the database; every node reports the same value)"),
    ("depth", "fluxpg_queue_depth", "Messages in the queue: classic = not yet acknowledged by the slowest group, "
     "stream = retained"),
    ("bytes", "fluxpg_queue_bytes", "Size of the queue's log segments in bytes, indexes included"),
    ("segments", "fluxpg_queue_segments", "Number of log segments (partitions of the log table) of the queue"),
)
_GROUP_METRICS = (
    ("lag", "fluxpg_group_lag", "Messages of the queue partition the group has not yet committed"),
    ("pending", "fluxpg_group_pending", "Delivered, unacknowledged messages of the group (classic pending list)"),
    ("oldest_pending_age", "fluxpg_group_oldest_pending_age_seconds",
     "Age of the group's oldest pending delivery in seconds (0 when nothing is pending)"),
)

# Not on the hot path: plain SELECTs over the public views (DESIGN §3).
QUEUE_STATS_SQL = ("SELECT queue, kind, partitions, head, depth, bytes, segments, oldest_at, topics, groups "
                   "FROM fluxpg.queue_stats")
GROUP_STATUS_SQL = ("SELECT queue, grp, mode, partition, cursor, committed, lag, pending, oldest_pending_age, "
                    "filter, auto_commit, consumers, last_active_at FROM fluxpg.group_status")


async def collect_metrics(ctx: Any) -> str:
    manager = ctx.manager
    m = Metrics()
    m.add("fluxpg_node_info", "gauge", "This broker process: node id in fluxpg.nodes, host and pid", 1,
          node=manager.node_id, host=socket.gethostname(), pid=os.getpid())
    try:
        async with manager.pool.acquire(timeout=DB_TIMEOUT) as conn:
            queues = await conn.fetch(QUEUE_STATS_SQL, timeout=DB_TIMEOUT)
            groups = await conn.fetch(GROUP_STATUS_SQL, timeout=DB_TIMEOUT)
        database_up = 1
    except Exception as exc:  # noqa: BLE001 - the node's own metrics are still worth scraping
        log.warning("metrics: database query failed: %s", exc)
        queues, groups, database_up = [], [], 0
    m.add("fluxpg_database_up", "gauge", "1 when the database answered the metrics queries, else 0", database_up)
    for column, name, help_text in _QUEUE_METRICS:
        samples = m.family(name, "gauge", help_text)
        for row in queues:
            samples.append(({"queue": row["queue"], "kind": row["kind"]}, row[column]))
    for column, name, help_text in _GROUP_METRICS:
        samples = m.family(name, "gauge", help_text)
        for row in groups:
            value = row[column]
            if column == "oldest_pending_age" and value is None:
                value = 0
            samples.append(({"queue": row["queue"], "group": row["grp"], "partition": row["partition"]}, value))
    appender = getattr(manager, "appender", None)
    m.add("fluxpg_appender_batches_total", "counter",
          "Append transactions (group commits) this node committed since it started",
          getattr(appender, "batches", 0))
    m.add("fluxpg_appender_rows_total", "counter",
          "Messages this node appended since it started (one per queue a publish reached)",
          getattr(appender, "rows", 0))
    m.add("fluxpg_connections", "gauge", "Open client connections on this node, this scrape included",
          len(ctx.connections))
    m.add("fluxpg_subscriptions", "gauge", "Active queue subscriptions (consumers) on this node",
          len(getattr(manager, "subscriptions", ())))
    return m.render()


# --------------------------------------------------------------------------------- routes

async def _healthz(ctx: Any, head_only: bool) -> bytes:
    node = ctx.manager.node_id
    try:
        async with ctx.manager.pool.acquire(timeout=DB_TIMEOUT) as conn:
            await conn.fetchval("SELECT 1", timeout=DB_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return response(503, json_body({"status": "unavailable", "node": node, "error": reason}),
                        head_only=head_only)
    return response(200, json_body({"status": "ok", "node": node}), head_only=head_only)


async def _queues(ctx: Any, head_only: bool) -> bytes:
    rows = await ctx.manager.pool.fetch(QUEUE_STATS_SQL, timeout=DB_TIMEOUT)
    return response(200, json_body([dict(r) for r in rows]), head_only=head_only)


async def _groups(ctx: Any, queue: str, head_only: bool) -> bytes:
    async with ctx.manager.pool.acquire(timeout=DB_TIMEOUT) as conn:
        exists = await conn.fetchval("SELECT true FROM fluxpg.queues WHERE name = $1", queue, timeout=DB_TIMEOUT)
        if not exists:
            return _error(404, f"unknown queue {queue!r}", head_only=head_only)
        rows = await conn.fetch(GROUP_STATUS_SQL + " WHERE queue = $1", queue, timeout=DB_TIMEOUT)
    return response(200, json_body([dict(r) for r in rows]), head_only=head_only)


async def route(request: Request, ctx: Any) -> bytes:
    """The complete response to one parsed request."""
    head_only = request.method == "HEAD"
    path = request.path
    groups = _GROUPS_PATH.match(path)
    if path not in ("/healthz", "/metrics", "/api/queues", "/api/queues/") and groups is None:
        return _error(404, f"no such resource: {unquote(path)}", head_only=head_only)
    if request.method not in ALLOWED_METHODS:
        return _error(405, f"method {request.method} not allowed; use GET",
                      extra={"Allow": ", ".join(ALLOWED_METHODS)})
    if path == "/healthz":
        return await _healthz(ctx, head_only)
    try:
        if path == "/metrics":
            return response(200, (await collect_metrics(ctx)).encode("utf-8"), PROMETHEUS_TYPE, head_only=head_only)
        if groups is not None:
            # Queue names may hold '/' ($dlq/orders): accept it raw or as %2F.
            return await _groups(ctx, unquote(groups.group(1)), head_only)
        return await _queues(ctx, head_only)
    except (OSError, asyncio.TimeoutError) as exc:
        return _error(503, f"database unavailable: {' '.join(str(exc).split()) or type(exc).__name__}",
                      head_only=head_only)
    except Exception as exc:  # noqa: BLE001 - asyncpg errors etc.: tell the client one line
        import asyncpg  # noqa: PLC0415

        if isinstance(exc, (asyncpg.PostgresError, asyncpg.InterfaceError)):
            return _error(503, f"database error: {' '.join(str(exc).split())}", head_only=head_only)
        raise


# --------------------------------------------------------------------------------- I/O

async def _read_head(reader: asyncio.StreamReader, initial: bytes) -> tuple[bytes, int] | None:
    """(the request head, how many body bytes were read along with it), or None at end of file."""
    data = bytearray(initial)
    while (end := head_end(data)) < 0:
        if len(data) > MAX_HEAD_BYTES:
            raise BadRequest("request head too large")
        chunk = await reader.read(4096)
        if not chunk:
            return None  # the client went away before finishing its request
        data += chunk
    if end > MAX_HEAD_BYTES:
        raise BadRequest("request head too large")
    return bytes(data[:end]), len(data) - end


async def _discard_body(reader: asyncio.StreamReader, request: Request, already: int) -> None:
    """Read (and drop) a small request body: closing with unread data makes the kernel send a
    reset, which can destroy our response before the client reads it."""
    try:
        remaining = request.content_length() - already
    except BadRequest:
        return
    remaining = min(remaining, MAX_DISCARD_BYTES)
    try:
        while remaining > 0:
            chunk = await asyncio.wait_for(reader.read(min(remaining, 65536)), 2.0)
            if not chunk:
                return
            remaining -= len(chunk)
    except (asyncio.TimeoutError, ConnectionError):
        return


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes, ctx: Any) -> None:
    """Serve one request on a connection the listener identified as HTTP, then return (close)."""
    try:
        got = await asyncio.wait_for(_read_head(reader, initial), READ_TIMEOUT)
        if got is None:
            return
        head, body_read = got
        request = parse_request(head)
        if request.method not in ALLOWED_METHODS:
            await _discard_body(reader, request, body_read)
    except asyncio.TimeoutError:
        return  # a client that never finishes its request gets the connection closed
    except BadRequest as exc:
        writer.write(_error(400, str(exc)))
        await writer.drain()
        return
    try:
        data = await route(request, ctx)
    except Exception:  # noqa: BLE001 - the client gets a one-line error, the log the traceback
        log.exception("HTTP %s %s failed", request.method, request.target)
        data = _error(500, "internal error; see the broker's log", head_only=request.method == "HEAD")
    writer.write(data)
    await writer.drain()
