"""Pages and actions of the console.

Pages (GET, the `monitoring` right):
    /                     overview: nodes, connections per protocol, rates chart, totals, warnings
    /queues               every queue: kind, depth, rates, consumers, bytes, segments, retention
    /queue?name=Q         groups, browse messages (by offset or time; text, JSON or hex), publish;
                          for a dead-letter queue ($dlq/…) the dead letters with redrive
    /pending?queue=Q&group=G   pending entries of a group (XPENDING)
    /dead-letters         every dead-letter queue with its count
    /connections          every node's client connections (fluxpg.connections; this node's live)
    /login                log-in form (auth on)

Actions (POST /action/<name>, the `manage` right and the session's CSRF token): publish,
reset_group, claim_stale, delete_group, redrive, close_connection. Each redirects back with a
one-line result.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from fluxpg import connections as live_connections
from fluxpg.console.rates import Rates, svg_chart
from fluxpg.console.sessions import COOKIE, Session, Sessions
from fluxpg.errors import FluxError, InvalidArgument, UnknownQueue
from fluxpg.protocols.http_auth import PRINCIPAL, has_right
from fluxpg.queues.admin import MAX_PAGE, Admin, dlq_name

log = logging.getLogger("fluxpg.console")

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
REDRIVE_BATCH = 1000           # offsets per transaction when redriving everything
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


class Console:
    def __init__(self, ctx: Any):
        self.ctx = ctx
        self.admin = Admin(ctx.manager)
        cfg = ctx.config.console
        self.config = cfg
        self.sessions = Sessions(cfg.secret, cfg.session_ttl.total_seconds())
        self.rates = Rates(self.admin, cfg.rate_interval.total_seconds())
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")),
                                      autoescape=True, undefined=jinja2.StrictUndefined)
        self.env.filters.update(human_bytes=human_bytes, ago=ago, seconds=seconds, rate=rate, qs=qs_quote)

    @property
    def auth_on(self) -> bool:
        auth = self.ctx.auth
        return auth is not None and getattr(auth, "enabled", False)


CONSOLE = web.AppKey("console", Console)
SESSION = web.RequestKey("console_session", object)
NEW_COOKIE = web.RequestKey("console_new_cookie", object)


# --------------------------------------------------------------------------------- formatting

def human_bytes(n: Any) -> str:
    if n is None:
        return "–"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def seconds(value: Any) -> str:
    if value is None:
        return "–"
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def ago(value: datetime | None) -> str:
    if value is None:
        return "–"
    return seconds(datetime.now(timezone.utc) - value) + " ago"


def rate(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"


def qs_quote(value: Any) -> str:
    return quote(str(value), safe="")


def payload_view(payload: bytes, fmt: str) -> tuple[str, str]:
    """(format actually used, text) of a payload shown as text, pretty JSON or hex."""
    if fmt == "hex":
        lines = []
        for i in range(0, len(payload), 16):
            chunk = payload[i:i + 16]
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
            lines.append(f"{i:08x}  {chunk.hex(' '):<47}  {text}")
        return "hex", "\n".join(lines)
    if fmt == "json":
        try:
            return "json", json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            return "text", payload.decode("utf-8", "replace") + "\n(not JSON: shown as text)"
    return "text", payload.decode("utf-8", "replace")


# --------------------------------------------------------------------------------- access

def _is_private(address: str | None) -> bool:
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local


class Refused(web.HTTPForbidden):
    pass


def gate(request: web.Request, right: str) -> Session:
    """The session a console request runs with, or an HTTP exception (redirect to the log-in page,
    403 without the right). With auth off only private addresses may use the console."""
    console = request.app[CONSOLE]
    session = console.sessions.decode(request.cookies.get(COOKIE))
    if not console.auth_on:
        if not _is_private(request.remote):
            raise page_error(request, 403, "Authentication is off, so the console answers only private "
                                           "addresses. Configure auth: users to use it from here.")
        if session is None or session.user is not None:
            session = console.sessions.new(None, {"monitoring", "manage"})
            request[NEW_COOKIE] = session
    else:
        principal = request.get(PRINCIPAL)
        if principal is not None:    # Basic or bearer credentials on this request: no cookie, no CSRF token
            rights = {r for r in ("monitoring", "manage") if has_right(principal, r)}
            session = Session(principal.username, frozenset(rights), "", time.time() + 60)
        elif session is None or session.user is None:
            target = request.path_qs if request.method == "GET" else "/"
            raise web.HTTPSeeOther("/login?" + urlencode({"next": target}))
    request[SESSION] = session
    info = live_connections.current()
    if info is not None and session.user:     # the console's list of connections names its users too
        info.user = session.user
    if not session.can(right):
        raise page_error(request, 403, f"{session.user or 'This user'} lacks the {right} right "
                                       f"for this {'action' if right == 'manage' else 'page'}.")
    return session


def _cookie(response: web.StreamResponse, request: web.Request, session: Session) -> None:
    console = request.app[CONSOLE]
    response.set_cookie(COOKIE, console.sessions.encode(session), httponly=True, samesite="Strict",
                        secure=request.secure, path="/", max_age=int(console.sessions.ttl))


def render(request: web.Request, template: str, status: int = 200, **values: Any) -> web.Response:
    console = request.app[CONSOLE]
    session = request.get(SESSION)
    html = console.env.get_template(template).render(
        session=session, auth_on=console.auth_on, node=console.ctx.manager.node_id,
        host=socket.gethostname(), path=request.path, msg=request.query.get("msg"),
        err=request.query.get("err"), can_manage=bool(session and session.can("manage")), **values)
    response = web.Response(text=html, status=status, content_type="text/html")
    response.headers.update({"Cache-Control": "no-store", "Content-Security-Policy": CSP,
                             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"})
    new = request.get(NEW_COOKIE)
    if new is not None:
        _cookie(response, request, new)
    return response


def page_error(request: web.Request, status: int, message: str) -> web.HTTPException:
    cls = {403: web.HTTPForbidden, 404: web.HTTPNotFound, 400: web.HTTPBadRequest}.get(status, web.HTTPBadRequest)
    response = render(request, "error.html", status=status, message=message)
    return cls(text=response.text, content_type="text/html", headers={"Content-Security-Policy": CSP})


def back(location: str, msg: str | None = None, err: str | None = None) -> web.HTTPSeeOther:
    sep = "&" if "?" in location else "?"
    params = {k: v for k, v in (("msg", msg), ("err", err)) if v}
    return web.HTTPSeeOther(location + (sep + urlencode(params) if params else ""))


def _int(value: str | None, name: str, default: int | None = None, *, minimum: int = 0) -> int | None:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, got {value!r}") from None
    if n < minimum:
        raise InvalidArgument(f"{name} must be at least {minimum}, got {n}")
    return n


def _time(value: str) -> datetime:
    """An ISO 8601 date-time from a form (datetime-local inputs have no zone: UTC)."""
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgument(f"time {value!r}: expected YYYY-MM-DDTHH:MM[:SS] (UTC)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


# --------------------------------------------------------------------------------- log-in

async def login_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    if not console.auth_on:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", next=request.query.get("next", "/"), error=None)


async def login(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    if not console.auth_on:
        raise web.HTTPSeeOther("/")
    form = await request.post()
    user, password = str(form.get("username", "")), str(form.get("password", ""))
    target = str(form.get("next") or "/")
    if not target.startswith("/") or target.startswith("//"):
        target = "/"        # only our own pages: no open redirect
    from fluxpg.auth import AuthError  # noqa: PLC0415

    peername = request.transport.get_extra_info("peername") if request.transport else None
    peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else None   # failure delays count per host
    try:
        principal = await console.ctx.auth.authenticate(user or None, password, protocol="http", peer=peer)
    except AuthError:
        return render(request, "login.html", status=401, next=target, error="Wrong user name or password.")
    rights = {r for r in ("monitoring", "manage") if has_right(principal, r)}
    if "monitoring" not in rights:
        return render(request, "login.html", status=403, next=target,
                      error=f"{user} may not use the console (needs the monitoring or manage right).")
    response = web.HTTPSeeOther(target)
    _cookie(response, request, console.sessions.new(principal.username, rights))
    raise response


async def logout(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    form = await request.post()
    session = console.sessions.decode(request.cookies.get(COOKIE))
    if not Sessions.csrf_ok(session, form.get("_csrf")):
        raise web.HTTPForbidden(text="missing or wrong CSRF token")
    response = web.HTTPSeeOther("/login" if console.auth_on else "/")
    response.del_cookie(COOKIE, path="/")
    raise response


# --------------------------------------------------------------------------------- pages

async def overview(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    console = request.app[CONSOLE]
    admin = console.admin
    console.rates.start()
    nodes, stats, groups = await asyncio.gather(admin.nodes(), admin.queue_stats(), admin.all_group_status())
    timeout = console.ctx.manager.qm.heartbeat_timeout
    now = datetime.now(timezone.utc)
    for n in nodes:
        n["alive"] = now - n["last_seen_at"] <= timeout
        n["here"] = n["id"] == console.ctx.manager.node_id
    cfg = console.config
    warnings = []
    for g in groups:
        if cfg.lag_warning and g["lag"] is not None and g["lag"] > cfg.lag_warning:
            warnings.append(f"group {g['grp']} of {g['queue']} (partition {g['partition']}) lags "
                            f"{g['lag']} messages (warning above {cfg.lag_warning})")
        age = g["oldest_pending_age"]
        if age is not None and cfg.pending_age_warning.total_seconds() > 0 and age > cfg.pending_age_warning:
            warnings.append(f"group {g['grp']} of {g['queue']}: oldest pending delivery {seconds(age)} old "
                            f"(warning above {seconds(cfg.pending_age_warning)})")
    totals = {
        "queues": len(stats),
        "dead_letter_queues": sum(1 for s in stats if s["queue"].startswith("$dlq/")),
        "messages": sum(s["depth"] or 0 for s in stats),
        "appended": sum(s["head"] or 0 for s in stats),
        "bytes": sum(s["bytes"] or 0 for s in stats),
        "groups": len({(g["queue"], g["grp"]) for g in groups}),
        "pending": sum(g["pending"] or 0 for g in groups),
    }
    per_node: dict[int, dict[str, int]] = {}
    for c in await admin.all_connections():
        counts = per_node.setdefault(c["node_id"], {})
        counts[c["protocol"]] = counts.get(c["protocol"], 0) + 1
    per_node[console.ctx.manager.node_id] = console.ctx.registry.counts()    # this node: live
    for n in nodes:
        n["counts"] = per_node.get(n["id"], {})
    return render(request, "overview.html", nodes=nodes,
                  chart=svg_chart(list(console.rates.points)), totals=totals, warnings=warnings,
                  interval=console.rates.interval)


def _retention(settings: dict[str, Any]) -> str:
    r = settings.get("retention") or {}
    parts = [f"{k.replace('max_', '')} {v}" for k, v in r.items() if v not in (None, 0, "0", "", False)]
    return ", ".join(parts) or "–"


async def queues(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    console = request.app[CONSOLE]
    console.rates.start()
    stats, rows = await asyncio.gather(console.admin.queue_stats(), console.admin.queue_rows())
    by_name = {r["name"]: r for r in rows}
    out = []
    for s in stats:
        r = by_name.get(s["queue"], {})
        settings = r.get("settings") or {}
        rates = console.rates.per_queue.get(s["queue"])
        out.append({**s, "consumers": r.get("consumers", 0), "retention": _retention(settings),
                    "rate_in": rates[0] if rates else None, "rate_out": rates[1] if rates else None})
    return render(request, "queues.html", queues=out, interval=console.rates.interval)


async def queue_page(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    console = request.app[CONSOLE]
    admin = console.admin
    name = request.query.get("name", "")
    fmt = request.query.get("format", "text")
    try:
        bounds = await admin.bounds(name)
        partition = _int(request.query.get("partition"), "partition", 0)
        limit = min(_int(request.query.get("limit"), "limit", PAGE_SIZE, minimum=1), MAX_PAGE)
        part_bounds = {p: (f, n) for p, f, n in bounds}
        if partition not in part_bounds:
            raise InvalidArgument(f"queue {name!r} has no partition {partition}")
        first, head = part_bounds[partition]
        started = time.perf_counter()
        if request.query.get("at"):
            start = await admin.offset_at(name, partition, _time(request.query["at"]))
        else:
            start = _int(request.query.get("from"), "from", first)
        messages = await admin.browse(name, partition=partition, from_offset=start, limit=limit)
        took = time.perf_counter() - started
        groups = await admin.group_status(name)
    except UnknownQueue:
        raise page_error(request, 404, f"There is no queue {name!r}.") from None
    except InvalidArgument as exc:
        raise back(f"/queue?name={qs_quote(name)}", err=str(exc)) from None
    shown = []
    for m in messages:
        used, text = payload_view(m.payload, fmt)
        shown.append({"m": m, "format": used, "text": text,
                      "headers": json.dumps(m.headers, indent=1, ensure_ascii=False, default=str)})
    info = console.ctx.manager.queue_info(name) if hasattr(console.ctx.manager, "queue_info") else None
    is_dlq = name.startswith("$dlq/")
    return render(request, "queue.html", name=name, is_dlq=is_dlq, kind=getattr(info, "kind", None),
                  messages=shown, groups=groups, partitions=[p for p, _, _ in bounds], partition=partition,
                  first=first, head=head, start=start, limit=limit, fmt=fmt, took_ms=took * 1000,
                  next_from=(messages[-1].seq + 1) if len(messages) == limit else None,
                  last_page=max(first, head - limit), default_topic=f"$queue/{name}/console-test")


async def pending_page(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    admin = request.app[CONSOLE].admin
    queue, group = request.query.get("queue", ""), request.query.get("group", "")
    try:
        partition = _int(request.query.get("partition"), "partition", 0)
        start = _int(request.query.get("from"), "from", 0)
        entries = await admin.pending(queue, group, partition=partition, from_offset=start, limit=PAGE_SIZE)
    except InvalidArgument as exc:
        raise back(f"/queue?name={qs_quote(queue)}", err=str(exc)) from None
    return render(request, "pending.html", queue=queue, group=group, entries=entries, partition=partition,
                  next_from=(entries[-1]["seq"] + 1) if len(entries) == PAGE_SIZE else None)


async def dead_letters(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    stats = await request.app[CONSOLE].admin.queue_stats()
    return render(request, "dead_letters.html", queues=[s for s in stats if s["queue"].startswith("$dlq/")])


async def connections(request: web.Request) -> web.Response:
    gate(request, "monitoring")
    console = request.app[CONSOLE]
    here = console.ctx.manager.node_id
    rows = [{"node": here, "id": c.id, "protocol": c.protocol, "client_id": c.client_id, "user": c.user,
             "peer": c.peer, "listener": c.listener, "since": c.since} for c in console.ctx.registry.all()]
    rows += [{"node": c["node_id"], "id": c["id"], "protocol": c["protocol"], "client_id": c["client_id"],
              "user": c["username"], "peer": c["peer"], "listener": c["listener"], "since": c["since"]}
             for c in await console.admin.all_connections() if c["node_id"] != here]
    rows.sort(key=lambda r: (r["node"], r["id"]))
    return render(request, "connections.html", connections=rows, nodes=await console.admin.nodes())


# --------------------------------------------------------------------------------- actions

async def action(request: web.Request) -> web.Response:
    """Every state-changing request: the manage right and the session's CSRF token first."""
    console = request.app[CONSOLE]
    form = await request.post()
    session = gate(request, "manage")
    if not Sessions.csrf_ok(session, form.get("_csrf")):
        raise page_error(request, 403, "This action was refused: missing or wrong CSRF token "
                                       "(reload the page and try again).")
    name = request.match_info["name"]
    handler = ACTIONS.get(name)
    if handler is None:
        raise page_error(request, 404, f"There is no action {name!r}.")
    where = str(form.get("back") or "/")
    if not where.startswith("/") or where.startswith("//"):
        where = "/"
    try:
        message = await handler(console, form)
    except FluxError as exc:
        raise back(where, err=str(exc)) from None
    log.info("console: %s by %s: %s", name, session.user or "(auth off)", message)
    raise back(where, msg=message)


def _field(form: Any, key: str) -> str:
    value = str(form.get(key, "")).strip()
    if not value:
        raise InvalidArgument(f"{key} is required")
    return value


async def act_publish(console: Console, form: Any) -> str:
    topic = _field(form, "topic")
    payload = str(form.get("payload", "")).encode("utf-8")
    headers_text = str(form.get("headers", "")).strip()
    headers = None
    if headers_text:
        try:
            headers = json.loads(headers_text)
        except ValueError as exc:
            raise InvalidArgument(f"headers: not JSON ({exc})") from None
        if not isinstance(headers, dict):
            raise InvalidArgument("headers: expected a JSON object")
    result = await console.admin.publish(topic, payload, headers)
    return f"published {len(payload)} bytes to {topic}" + (f" ({result})" if result else "")


async def act_reset_group(console: Console, form: Any) -> str:
    queue, group, where = _field(form, "queue"), _field(form, "group"), _field(form, "position")
    if where == "offset":
        position = str(_int(_field(form, "offset"), "offset"))
    elif where == "time":
        position = f"timestamp={_time(_field(form, 'time')).timestamp():.3f}"
    elif where in ("first", "last"):
        position = where
    else:
        raise InvalidArgument(f"position {where!r}: first, last, offset or time")
    offset = await console.admin.reset_group(queue, group, position)
    return f"group {group} of {queue} now at offset {offset}"


async def act_claim_stale(console: Console, form: Any) -> str:
    queue, group, consumer = _field(form, "queue"), _field(form, "group"), _field(form, "consumer")
    idle = _int(str(form.get("min_idle", "60")), "min_idle", 60)
    count = _int(str(form.get("count", "100")), "count", 100, minimum=1)
    got = await console.admin.claim_stale(queue, group, consumer, timedelta(seconds=idle), min(count, 10_000))
    return f"{len(got)} entr{'y' if len(got) == 1 else 'ies'} idle for {idle} s or more now pending for {consumer}"


async def act_delete_group(console: Console, form: Any) -> str:
    queue, group = _field(form, "queue"), _field(form, "group")
    if not await console.admin.delete_group(queue, group):
        raise InvalidArgument(f"queue {queue!r} has no group {group!r}")
    return f"deleted group {group} of {queue}"


async def act_redrive(console: Console, form: Any) -> str:
    dlq = dlq_name(_field(form, "queue"))
    admin = console.admin
    if form.get("all"):
        (_p, first, head), *_ = await admin.bounds(dlq)
        moved = 0
        for lo in range(first, head, REDRIVE_BATCH):     # short transactions, each atomic
            moved += await admin.redrive(dlq, from_offset=lo, to_offset=min(lo + REDRIVE_BATCH, head))
    else:
        offsets = sorted({_int(v, "offset") for v in form.getall("offset", [])})
        if not offsets:
            raise InvalidArgument("select the dead letters to redrive (or use Redrive all)")
        moved = await admin.redrive(dlq, offsets=offsets)
    return f"moved {moved} message{'s' if moved != 1 else ''} from {dlq} back to {dlq[len('$dlq/'):]}"


async def act_close_connection(console: Console, form: Any) -> str:
    conn_id = _int(_field(form, "id"), "id")
    node = _int(str(form.get("node", "")), "node", console.ctx.manager.node_id)
    if node != console.ctx.manager.node_id:
        await console.admin.request_close(node, conn_id)       # that node closes it (NOTIFY)
        return f"asked node {node} to close connection {conn_id}"
    info = console.ctx.registry.get(conn_id)
    if info is None or not info.close():
        raise InvalidArgument(f"connection {conn_id} is not open on this node")
    return f"closed connection {conn_id} ({info.protocol} {info.client_id or info.peer})"


ACTIONS = {
    "publish": act_publish,
    "reset_group": act_reset_group,
    "claim_stale": act_claim_stale,
    "delete_group": act_delete_group,
    "redrive": act_redrive,
    "close_connection": act_close_connection,
}


# --------------------------------------------------------------------------------- wiring

async def _not_found(request: web.Request) -> web.Response:
    raise page_error(request, 404, f"There is no page {request.path}.")


def install(app: web.Application, ctx: Any) -> None:
    console = Console(ctx)
    app[CONSOLE] = console

    async def stop(_app: web.Application) -> None:
        await console.rates.close()

    app.on_cleanup.append(stop)
    app.router.add_get("/", overview)
    app.router.add_get("/queues", queues)
    app.router.add_get("/queue", queue_page)
    app.router.add_get("/pending", pending_page)
    app.router.add_get("/dead-letters", dead_letters)
    app.router.add_get("/connections", connections)
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_post("/action/{name}", action)
    app.router.add_static("/static/", HERE / "static", append_version=True)
