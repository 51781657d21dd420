"""The HTTP admin/metrics endpoint (fluxpg/protocols/http.py, aiohttp) on a real Server and database,
with raw HTTP/1.1 over real sockets."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from fluxpg.config import Config, QueueConfig
from fluxpg.protocols.http import Metrics, jsonable
from fluxpg.server import Server

ONLY_HTTP = {"mqtt": None, "amqp": None, "amqp091": None, "http": "127.0.0.1:0"}


@pytest.fixture
async def admin(dsn, qname):
    """A Server with only the HTTP listener and one classic queue named `qname`."""
    config = Config(queues=[QueueConfig(name=qname)])
    server = await Server.start(dsn, config, addresses=dict(ONLY_HTTP), migrate=False, retention=False)
    yield server
    await server.close()


async def request(port: int, raw: bytes, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if not head:  # a HEAD response announces the length of the body it leaves out
        assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return status, headers, body


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return await request(port, f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode(),
                         head=method == "HEAD")


def samples(text: str) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value}; checks every sample line is well-formed."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r'([a-z_]+(?:\{[^}]*\})?) (\S+)', line)
        assert m, f"malformed sample line {line!r}"
        out[m.group(1)] = float(m.group(2))
    return out


async def test_healthz_reports_the_node(admin):
    status, headers, body = await get(admin.port("http"), "/healthz")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"status": "ok", "node": admin.manager.node_id}


async def test_healthz_is_503_when_the_database_does_not_answer(admin):
    pool = admin.manager.pool

    class BrokenPool:
        def acquire(self, timeout=None):
            raise OSError("connection refused")

        async def fetchval(self, *args, **kwargs):
            raise OSError("connection refused")

        fetch = fetchval

    admin.manager.pool = BrokenPool()
    try:
        status, _headers, body = await get(admin.port("http"), "/healthz")
    finally:
        admin.manager.pool = pool
    assert status == 503
    reply = json.loads(body)
    assert reply["status"] == "unavailable" and reply["node"] == admin.manager.node_id
    assert "connection refused" in reply["error"]


async def test_metrics_after_a_publish(admin, qname, conn):
    await admin.manager.publish(f"$queue/{qname}/a", b"x" * 10)
    await admin.manager.publish(f"$queue/{qname}/b", b"y")
    # A group with one pending delivery and lag, claimed through the SQL API.
    claimed = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'workers', 'c1', 1)", qname)
    assert [r["seq"] for r in claimed] == [0]

    status, headers, body = await get(admin.port("http"), "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert "# TYPE fluxpg_queue_head gauge" in text
    assert "# TYPE fluxpg_appender_rows_total counter" in text
    got = samples(text)
    q = f'queue="{qname}",kind="classic"'
    assert got[f"fluxpg_queue_head{{{q}}}"] == 2
    assert got[f"fluxpg_queue_depth{{{q}}}"] == 2
    assert got[f"fluxpg_queue_segments{{{q}}}"] >= 1
    assert got[f"fluxpg_queue_bytes{{{q}}}"] > 0
    g = f'queue="{qname}",group="workers",partition="0"'
    assert got[f"fluxpg_group_lag{{{g}}}"] == 2
    assert got[f"fluxpg_group_pending{{{g}}}"] == 1
    assert got[f"fluxpg_group_oldest_pending_age_seconds{{{g}}}"] >= 0
    assert got["fluxpg_appender_rows_total"] >= 2
    assert got["fluxpg_appender_batches_total"] >= 1
    assert got["fluxpg_connections"] >= 1      # this scrape
    assert got["fluxpg_database_up"] == 1


async def test_api_queues_and_groups(admin, qname, conn):
    await admin.manager.publish(f"$queue/{qname}/a", b"hello")
    await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'workers', 'c1', 1)", qname)

    status, _h, body = await get(admin.port("http"), "/api/queues")
    assert status == 200
    rows = {r["queue"]: r for r in json.loads(body)}
    assert rows[qname]["kind"] == "classic" and rows[qname]["head"] == 1 and rows[qname]["depth"] == 1
    assert rows[qname]["oldest_at"].endswith("+00:00")  # ISO 8601 with offset

    status, _h, body = await get(admin.port("http"), f"/api/queues/{qname}/groups")
    assert status == 200
    (group,) = json.loads(body)
    assert group["grp"] == "workers" and group["pending"] == 1 and group["lag"] == 1
    assert isinstance(group["oldest_pending_age"], float)  # an interval, in seconds

    status, _h, body = await get(admin.port("http"), "/api/queues/no-such-queue/groups")
    assert status == 404
    assert json.loads(body) == {"error": "unknown queue 'no-such-queue'"}


async def test_queue_names_with_a_slash_are_reachable(admin, qname, conn):
    dlq = f"$dlq/{qname}"
    await conn.fetchval("SELECT fluxpg.declare_queue($1, 'classic', NULL, '{}')", dlq)
    for path in (f"/api/queues/$dlq/{qname}/groups", f"/api/queues/%24dlq%2F{qname}/groups"):
        status, _h, body = await get(admin.port("http"), path)
        assert status == 200, path
        assert json.loads(body) == []


async def test_not_found_method_not_allowed_and_head(admin):
    port = admin.port("http")
    status, _h, body = await get(port, "/api/nope")
    assert status == 404 and json.loads(body) == {"error": "no such resource: /api/nope"}
    status, _h, body = await get(port, "/nope")     # outside the API: the console's 404
    assert status == 404
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        status, headers, _b = await get(port, "/metrics", method)
        assert status == 405, method
        assert headers["allow"] == "GET, HEAD"
    # A POST with a body: the body is read and dropped, the client still gets its 405.
    status, _h, _b = await request(port, b"POST /api/queues HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nabcde")
    assert status == 405
    status, headers, body = await get(port, "/healthz", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


@pytest.mark.parametrize("raw", [
    b"GET /healthz\r\n\r\n",                                # no version
    b"GET  /healthz HTTP/1.1\r\n\r\n",                       # two spaces
    b"GET /healthz HTTP/2.0\r\n\r\n",                        # not HTTP/1.x
    b"GET healthz HTTP/1.1\r\n\r\n",                         # not origin-form
    b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n",              # header without a colon
    b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n",            # space before the colon
    b"GET /healthz HTTP/1.1\r\n folded\r\n\r\n",             # obsolete line folding
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",          # head too large
])
async def test_malformed_requests_are_refused_and_the_connection_closed(admin, raw):
    """aiohttp's parser answers these (400, or 505 for another HTTP version) and closes; nothing
    reaches a route, nothing leaks a traceback."""
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.port("http"))
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)   # EOF: the server closed
    finally:
        writer.close()
    status = int(data.split(b" ", 2)[1])
    assert status in (400, 404, 414, 431, 505), data[:200]
    assert b"Traceback" not in data
    if raw.startswith(b"GET healthz"):
        assert status in (400, 404)   # no such route at least: never the health answer
    else:
        assert b'"status": "ok"' not in data


async def test_a_failing_route_is_500_without_a_traceback(admin, monkeypatch):
    import fluxpg.protocols.http as http

    async def boom(ctx):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(http, "collect_metrics", boom)
    status, _h, body = await get(admin.port("http"), "/metrics")
    assert status == 500
    assert b"secret" not in body and b"Traceback" not in body


# -- the pure parts ------------------------------------------------------------------------------

def test_prometheus_rendering_escapes_labels():
    m = Metrics()
    m.add("x_total", "counter", "help", 3, queue='a"b\\c\nd')
    m.add("x_total", "counter", "help", 1.5, queue="e")
    m.add("y", "gauge", "none", None)
    assert m.render() == (
        "# HELP x_total help\n# TYPE x_total counter\n"
        'x_total{queue="a\\"b\\\\c\\nd"} 3\nx_total{queue="e"} 1.5\n'
        "# HELP y none\n# TYPE y gauge\ny NaN\n")


def test_jsonable():
    from datetime import datetime, timedelta, timezone
    from decimal import Decimal

    row = {"t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "i": timedelta(seconds=1.5),
           "d": Decimal("7"), "f": Decimal("0.5"), "b": b"\x01", "l": [Decimal("1")]}
    assert jsonable(row) == {"t": "2026-01-02T03:04:05+00:00", "i": 1.5, "d": 7, "f": 0.5, "b": "01", "l": [1]}
