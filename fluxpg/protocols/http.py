"""The HTTP listener: admin API, Prometheus metrics and the browser console, served by aiohttp.

Every listener sniffs the first bytes of a connection (protocols/listener.py); an HTTP method hands
it here, and `handle` gives the socket (TLS included) to an aiohttp request handler, with the bytes
already read. aiohttp parses HTTP/1.1 (keep-alive, chunked bodies, WebSocket upgrades); this module
only says what each path answers:

    GET /healthz                     200 {"status": "ok", "node": <id>} when the database answers, else 503
    GET /metrics                     Prometheus text format (queues, groups, appender, connections)
    GET /api/queues                  JSON rows of the view fluxpg.queue_stats
    GET /api/queues/<name>/groups    JSON rows of fluxpg.group_status for one queue (404 if unknown)
    GET /mqtt (WebSocket upgrade)    MQTT over WebSocket, subprotocol "mqtt" (protocols/websocket.py)
    /  (and below)                   the console (fluxpg/console/), when it is installed

Errors of the API paths are one-line JSON objects (`{"error": …}`): 404 unknown path, 405 another
method, 503 database unavailable, 500 anything else (the traceback goes to the log only).

With an `auth:` section /api/*, /metrics and the console need a user with the `monitoring` right
(HTTP Basic — only over TLS when the listener has TLS — or a bearer token of `auth.tokens`);
/healthz stays open for load balancers (fluxpg/protocols/http_auth.py).

`jsonable` is the JSON form of view rows shared with `fluxpg … --json`: timestamps as ISO 8601
strings, intervals as seconds (a number).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

from aiohttp import web

from fluxpg import connections
from fluxpg.bounds import broker_inbound
from fluxpg.queues.admin import Admin
from fluxpg.errors import FluxError, Unavailable, UnknownQueue

log = logging.getLogger("fluxpg.http")

DB_TIMEOUT = 5.0                # seconds for the database work of one API request
MAX_REQUEST_BODY = 1 << 20      # console forms and test publishes; more is refused with 413
KEEPALIVE_TIMEOUT = 30.0        # an idle keep-alive connection is closed after this

JSON_TYPE = "application/json"
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
API_METHODS = ("GET", "HEAD")

APP_KEY = "fluxpg.http.app"     # ctx.state key of the running aiohttp application
CTX = web.AppKey("ctx", object)
ADMIN = web.AppKey("admin", Admin)


# --------------------------------------------------------------------------------- JSON values

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


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json_body(value), status=status, content_type=JSON_TYPE,
                        headers={"Cache-Control": "no-store", **(headers or {})})


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response({"error": message}, status, headers)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


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


async def collect_metrics(ctx: Any) -> str:
    manager = ctx.manager
    admin = Admin(manager)
    m = Metrics()
    m.add("fluxpg_node_info", "gauge", "This broker process: node id in fluxpg.nodes, host and pid", 1,
          node=manager.node_id, host=socket.gethostname(), pid=os.getpid())
    try:
        queues, groups = await asyncio.wait_for(admin.stats_for_metrics(), DB_TIMEOUT)
        database_up = 1
    except (FluxError, OSError, asyncio.TimeoutError) as exc:  # the node's own metrics are still worth scraping
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
    inbound = broker_inbound(ctx)   # bounds.broker_inbound_bytes (fluxpg/bounds.py)
    m.add("fluxpg_inbound_bytes", "gauge",
          "Bytes of client messages this node holds before they are stored (partly received or "
          "waiting for their commit), all connections", inbound.used if inbound is not None else 0)
    m.add("fluxpg_inbound_bytes_peak", "gauge", "Highest fluxpg_inbound_bytes since this node started",
          inbound.peak if inbound is not None else 0)
    router = ctx.state.get("mqtt.router")
    if router is not None:      # MQTT outbound bounds (fluxpg/protocols/mqtt/session.py Session.enqueue)
        m.add("fluxpg_mqtt_sessions", "gauge", "MQTT sessions on this node (connected or persistent)",
              len(router.sessions))
        m.add("fluxpg_mqtt_qos0_dropped_total", "counter",
              "QoS 0 messages not sent because the subscriber's connection had too many unsent bytes",
              router.qos0_dropped)
        m.add("fluxpg_mqtt_offline_dropped_total", "counter",
              "Messages of offline persistent sessions dropped (oldest first) above the session bound",
              router.offline_dropped)
        m.add("fluxpg_mqtt_offline_logged_total", "counter",
              "Messages appended to the shared offline log (fluxpg.mqtt_offline_log), once each however"
              " many offline persistent sessions they were for",
              getattr(router, "offline_logged", 0))
        m.add("fluxpg_mqtt_slow_subscriber_disconnects_total", "counter",
              "MQTT connections closed (0x97) because their session's outbound queue exceeded the bound",
              router.slow_disconnects)
    return m.render()


# --------------------------------------------------------------------------------- API routes

async def healthz(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    node = ctx.manager.node_id
    try:
        await asyncio.wait_for(request.app[ADMIN].ping(), DB_TIMEOUT)
    except (FluxError, OSError, asyncio.TimeoutError) as exc:  # any failure means "not healthy"
        return json_response({"status": "unavailable", "node": node, "error": one_line(exc)}, 503)
    return json_response({"status": "ok", "node": node})


async def metrics(request: web.Request) -> web.Response:
    text = await collect_metrics(request.app[CTX])
    return web.Response(body=text.encode("utf-8"), headers={"Content-Type": PROMETHEUS_TYPE,
                                                            "Cache-Control": "no-store"})


async def api_queues(request: web.Request) -> web.Response:
    rows = await asyncio.wait_for(request.app[ADMIN].queue_stats(), DB_TIMEOUT)
    return json_response(rows)


async def api_groups(request: web.Request) -> web.Response:
    # Queue names may hold '/' ($dlq/orders): accept it raw or as %2F.
    queue = unquote(request.match_info["queue"])
    admin = request.app[ADMIN]
    try:
        rows = await asyncio.wait_for(admin.group_status(queue), DB_TIMEOUT)
    except UnknownQueue:
        return json_error(404, f"unknown queue {queue!r}")
    return json_response(rows)


def _is_api(path: str) -> bool:
    return path in ("/healthz", "/metrics") or path.startswith("/api/")


@web.middleware
async def errors_middleware(request: web.Request, handler):
    """API paths answer errors as one-line JSON; nothing ever shows a traceback."""
    if request.path != "/mqtt":
        # The request's headers are complete: the listener's handshake deadline is met (MQTT
        # over WebSocket meets it at CONNACK instead).
        connections.logged_in()
    if request.version not in ((1, 0), (1, 1)):
        # aiohttp's parser lets "HTTP/2.0" in text and version-less (0.9) request lines through.
        return json_error(505, "HTTP/1.0 or HTTP/1.1 only", {"Connection": "close"})
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if not _is_api(request.path) or exc.status < 400:
            raise
        if isinstance(exc, web.HTTPMethodNotAllowed):
            return json_error(405, f"method {request.method} not allowed; use GET",
                              {"Allow": ", ".join(API_METHODS)})
        if isinstance(exc, web.HTTPNotFound):
            return json_error(404, f"no such resource: {request.path}")
        return json_error(exc.status, exc.text or exc.reason, {k: v for k, v in exc.headers.items()
                                                               if k.lower() in ("www-authenticate", "allow")})
    except (Unavailable, OSError, asyncio.TimeoutError) as exc:
        return json_error(503, f"database unavailable: {one_line(exc)}")
    except FluxError as exc:
        return json_error(400, one_line(exc))
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the client gets a one-line error, the log the traceback
        log.exception("HTTP %s %s failed", request.method, request.path_qs)
        if _is_api(request.path):
            return json_error(500, "internal error; see the broker's log")
        return web.Response(status=500, text="internal error; see the broker's log\n")


def make_app(ctx: Any) -> web.Application:
    """The aiohttp application of one broker process (one per BrokerContext)."""
    from fluxpg.protocols.http_auth import auth_middleware  # noqa: PLC0415 - it imports this module

    app = web.Application(middlewares=[errors_middleware, auth_middleware], client_max_size=MAX_REQUEST_BODY)
    app[CTX] = ctx
    app[ADMIN] = Admin(ctx.manager)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/queues", api_queues)
    app.router.add_get("/api/queues/", api_queues)
    app.router.add_get(r"/api/queues/{queue:.+}/groups", api_groups)
    app.router.add_get(r"/api/queues/{queue:.+}/groups/", api_groups)
    from fluxpg.protocols.websocket import mqtt_over_websocket  # noqa: PLC0415

    app.router.add_get("/mqtt", mqtt_over_websocket)          # MQTT over WebSocket
    try:
        from fluxpg.console import setup as setup_console  # noqa: PLC0415
    except ModuleNotFoundError as exc:  # pragma: no cover - installed without the console
        log.info("console not available: %s", exc)
    else:
        setup_console(app, ctx)
    return app


async def _runner(ctx: Any) -> web.AppRunner:
    """The process's aiohttp runner, made on the first HTTP connection and cleaned up with the
    server (ctx.state "closers")."""
    runner = ctx.state.get(APP_KEY)
    if runner is None:
        runner = web.AppRunner(make_app(ctx), handle_signals=False, access_log=None,
                               keepalive_timeout=KEEPALIVE_TIMEOUT)
        ctx.state[APP_KEY] = runner
        await runner.setup()
        ctx.state.setdefault("closers", []).append(runner.cleanup)
    elif runner.server is None:   # setup still running in another connection
        while runner.server is None:
            await asyncio.sleep(0.01)
    return runner


class _Handoff(asyncio.Protocol):
    """Sits between the transport and aiohttp's request handler so the listener's connection task
    knows when the connection ends (aiohttp's handler allows no attributes of ours)."""

    def __init__(self, inner: asyncio.Protocol, done: asyncio.Future):
        self.inner = inner
        self.done = done

    def connection_made(self, transport):
        self.inner.connection_made(transport)

    def data_received(self, data):
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()

    def connection_lost(self, exc):
        try:
            self.inner.connection_lost(exc)
        finally:
            if not self.done.done():
                self.done.set_result(None)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes, ctx: Any) -> None:
    """Serve a connection the listener identified as HTTP until it closes."""
    runner = await _runner(ctx)
    transport = writer.transport
    # Bytes the listener's StreamReader received past the sniffed header belong to aiohttp now.
    # (StreamReader has no public way to take its buffer without waiting for more.)
    buffered = bytes(reader._buffer)  # noqa: SLF001
    reader._buffer.clear()  # noqa: SLF001
    done = asyncio.get_running_loop().create_future()
    handoff = _Handoff(runner.server(), done)
    transport.set_protocol(handoff)
    handoff.connection_made(transport)
    handoff.data_received(initial + buffered)
    if reader.at_eof():
        handoff.eof_received()
    try:
        transport.resume_reading()   # the StreamReader may have paused it
    except (AttributeError, RuntimeError):
        pass
    await done
