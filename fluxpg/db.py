"""Database access: schema migrations (Alembic), the asyncpg pool, named queries from sql/, and the
LISTEN/NOTIFY listener.

SQL lives in files under sql/ (shipped in the wheel as fluxpg/_data/sql); Python calls the SQL
API functions and named queries, never builds SQL of its own on the hot path.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import asyncpg

from fluxpg.errors import SQLSTATE_ERRORS, FluxError, Unavailable

log = logging.getLogger("fluxpg.db")

_PACKAGE_DIR = Path(__file__).resolve().parent
MIGRATION_LOCK = 0x666C7570  # 'flup': serialises concurrent `migrate` runs of several nodes


def resource_dir(name: str) -> Path:
    """sql/ or migrations/: inside the installed wheel, else at the top of a checkout."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"fluxpg is installed without its {name}/ directory")


def read_sql(name: str) -> str:
    return (resource_dir("sql") / name).read_text(encoding="utf-8")


def run_sql(bind: Any, sql: str) -> None:
    """Execute SQL on an Alembic/SQLAlchemy connection, in its transaction.

    Goes to the psycopg connection underneath with no parameters, so '%' and ':name' in the SQL
    are literal and it may hold many statements.
    """
    raw = bind.connection.dbapi_connection
    with raw.cursor() as cur:
        cur.execute(sql)


def run_sql_file(bind: Any, name: str) -> None:
    """run_sql of a whole sql/ file."""
    run_sql(bind, read_sql(name))


# --------------------------------------------------------------------------------------------
# Migrations
# --------------------------------------------------------------------------------------------

def sqlalchemy_url(dsn: str) -> str:
    """A libpq DSN/URL as an SQLAlchemy URL using psycopg 3."""
    if "://" not in dsn:
        # key=value form: psycopg accepts it through the `dsn` query argument
        from urllib.parse import quote
        return "postgresql+psycopg:///?dsn=" + quote(dsn)
    scheme, rest = dsn.split("://", 1)
    if scheme in ("postgres", "postgresql"):
        return "postgresql+psycopg://" + rest
    return dsn


def _alembic(dsn: str):
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(resource_dir("migrations")))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return cfg


def _migration_sql(name: str):
    """A named query of sql/migration_queries.sql as SQLAlchemy text (binds written :name)."""
    from sqlalchemy import text

    return text(queries("migration_queries.sql")[name])


def _with_lock(dsn: str, fn: Callable[[Any], None]) -> None:
    from sqlalchemy import create_engine, pool

    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(_migration_sql("migration_lock"), {"k": MIGRATION_LOCK})
            conn.commit()
            try:
                fn(conn)
            finally:
                conn.rollback()  # after a failure the transaction is aborted; the unlock needs a fresh one
                conn.execute(_migration_sql("migration_unlock"), {"k": MIGRATION_LOCK})
                conn.commit()
    finally:
        engine.dispose()


def migrate(dsn: str, revision: str = "head") -> list[str]:
    """Upgrade the schema to `revision`; a no-op when it is there already and the functions and
    views are current (fluxpg.routines). Returns what made functions and views be re-created
    (changed source files, "installed", "revision"), empty when they were not."""
    from alembic import command

    from fluxpg import routines

    changed: list[str] = []

    def run(conn):
        cfg = _alembic(dsn)
        cfg.attributes["connection"] = conn
        before = _revision_on(conn)
        target = _resolve(revision)
        if before != target:
            # Views may depend on columns a step changes; they come back below, at head.
            routines.drop(conn)
        command.upgrade(cfg, revision)
        after = _revision_on(conn)
        if after == head_revision() and before == after:
            changed.extend(routines.ensure(conn))
        elif after == head_revision():
            routines.apply(conn)
            changed.append("revision")
        elif before != after:
            routines.drop(conn)  # a step may have created some; below head none are installed
        conn.commit()

    _with_lock(dsn, run)
    return changed


def downgrade(dsn: str, revision: str = "base") -> None:
    """Downgrade; at base nothing of fluxpg is left (its schema and version table are dropped).
    Below head no functions or views are installed (fluxpg.routines says why)."""
    from alembic import command

    from fluxpg import routines

    def run(conn):
        cfg = _alembic(dsn)
        cfg.attributes["connection"] = conn
        before = _revision_on(conn)
        if before is not None and before != _resolve(revision):
            routines.drop(conn)
        command.downgrade(cfg, revision)
        conn.commit()
        if revision == "base":
            conn.execute(_migration_sql("drop_version_table"))
            if conn.execute(_migration_sql("schema_relations")).scalar() == 0:
                conn.execute(_migration_sql("drop_schema"))
            conn.commit()

    _with_lock(dsn, run)


def _revision_on(conn: Any) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn, opts={"version_table_schema": "fluxpg"}).get_current_revision()


def _resolve(revision: str) -> str | None:
    """A revision argument as a revision id (None for base); unknown forms (relative steps) give
    "?" so that callers treat them as a change."""
    from alembic.script import ScriptDirectory

    if revision == "base":
        return None
    try:
        script = ScriptDirectory.from_config(_alembic("postgresql://localhost/x"))
        if revision in ("head", "heads"):
            return script.get_current_head()
        rev = script.get_revision(revision)
        return rev.revision if rev is not None else None
    except Exception:  # noqa: BLE001 - "+1", "-1", partial ids: let Alembic judge them
        return "?"


def current_revision(dsn: str) -> str | None:
    from sqlalchemy import create_engine, pool

    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            if not conn.execute(_migration_sql("version_table_exists")).scalar():
                return None
            return conn.execute(_migration_sql("current_version")).scalar()
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic("postgresql://localhost/x")).get_current_head()


# --------------------------------------------------------------------------------------------
# Named queries
# --------------------------------------------------------------------------------------------

_NAME = re.compile(r"^--\s*name:\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", re.M)


@lru_cache(maxsize=None)
def queries(file: str = "queries.sql") -> dict[str, str]:
    """Named queries of sql/queries.sql (or another sql/ file): sections starting with `-- name: <name>`."""
    text = read_sql(file)
    parts = _NAME.split(text)
    named = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        named[name] = body.strip().rstrip(";")
    return named


# --------------------------------------------------------------------------------------------
# Pool and errors
# --------------------------------------------------------------------------------------------

# json.dumps(value) for the json/jsonb parameters (every published message's headers): the same
# text, without json.dumps' per-call work (a JSONEncoder.encode → iterencode → a C encoder built per
# call: ~2.9 us for 3 headers, ~0.8 us this way). No cycle check in the fast call; a cyclic value
# recurses until RecursionError, and then — as for anything else it refuses — json.dumps is called
# and gives its own result or error.
try:
    from json.encoder import c_make_encoder as _c_make_encoder, encode_basestring_ascii as _ascii
except ImportError:  # pragma: no cover - CPython has the C accelerator
    _c_make_encoder = None


def _not_serializable(o: Any) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


_C_ENCODE = (_c_make_encoder(None, _not_serializable, _ascii, None, ": ", ", ", False, False, True)
             if _c_make_encoder is not None else None)


def json_dumps(value: Any) -> str:
    """json.dumps(value), the same text or the same error."""
    t = type(value)
    if _C_ENCODE is not None and (t is dict or t is list):
        try:
            return "".join(_C_ENCODE(value, 0))
        except Exception:  # noqa: BLE001 - json.dumps decides (its error, or a cycle's)
            pass
    return json.dumps(value)


# json.loads(text) for json/jsonb columns (every delivered message's headers): the C scanner
# json.loads ends in, called directly (~1.6 -> ~0.6 us for 3 headers). Text it does not take whole
# from position 0 (leading or trailing whitespace, a BOM, an error) goes to json.loads, which gives
# its own result or error.
try:
    from json.scanner import c_make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - CPython has the C accelerator
    _c_make_scanner = None
_C_SCAN = _c_make_scanner(json.JSONDecoder()) if _c_make_scanner is not None else None


def json_loads(text: str) -> Any:
    """json.loads(text), the same value or the same error."""
    if _C_SCAN is not None and type(text) is str:
        try:
            value, end = _C_SCAN(text, 0)
        except Exception:  # noqa: BLE001 - json.loads decides
            return json.loads(text)
        if end == len(text):
            return value
    return json.loads(text)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json_dumps, decoder=json_loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json_dumps, decoder=json_loads, schema="pg_catalog")


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Run when a connection goes back to the pool. fluxpg never leaves session state on pool
    connections (no SET, LISTEN, session advisory locks or cursors; SQL functions use
    transaction-local settings), so asyncpg's default reset — one more round trip with RESET ALL
    on every release, measured at a third of a single publish's latency — is not needed; only a
    transaction left open by an error is rolled back."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 10,
                      node_id: int | None = None, transient_max_bytes: int | None = None) -> asyncpg.Pool:
    async def init(conn):
        await _init_connection(conn)

    # The node id goes in the startup packet: asyncpg's pool runs RESET ALL when a connection is
    # released, which would drop a SET but restores startup settings.
    # fluxpg.transient_max_bytes: the broker-wide bound of transient queues, read by the SQL
    # append (fluxpg._transient_charge).
    settings = {"fluxpg.node_id": str(node_id)} if node_id is not None else {}
    if transient_max_bytes is not None:
        settings["fluxpg.transient_max_bytes"] = str(transient_max_bytes)
    settings = settings or None
    try:
        return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=init,
                                         command_timeout=60, max_inactive_connection_lifetime=300,
                                         server_settings=settings, reset=_reset_connection)
    except (OSError, asyncpg.PostgresError) as exc:
        raise Unavailable(f"cannot connect to PostgreSQL: {exc}") from exc


async def connect(dsn: str) -> asyncpg.Connection:
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        raise Unavailable(f"cannot connect to PostgreSQL: {exc}") from exc
    await _init_connection(conn)
    return conn


async def fetch(pool: asyncpg.Pool, name: str, *args: Any, file: str = "queries.sql") -> list[asyncpg.Record]:
    """Run the named query `name` of sql/queries.sql (or `file`); database errors come out as
    FluxError."""
    try:
        return await pool.fetch(queries(file)[name], *args)
    except Exception as exc:  # noqa: BLE001 - reported as a FluxError
        raise translate_error(exc) from exc


async def fetchval(pool: asyncpg.Pool, name: str, *args: Any, file: str = "queries.sql") -> Any:
    """Like fetch, for a named query with one value."""
    try:
        return await pool.fetchval(queries(file)[name], *args)
    except Exception as exc:  # noqa: BLE001
        raise translate_error(exc) from exc


def translate_error(exc: BaseException) -> FluxError:
    """A database exception as the FluxError a client is told about."""
    if isinstance(exc, FluxError):
        return exc
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        cls = SQLSTATE_ERRORS.get(state)
        message = getattr(exc, "message", None) or str(exc)
        if cls is not None:
            return cls(message, sqlstate=state)
        return Unavailable(f"database error {state}: {message}", sqlstate=state)
    if isinstance(exc, (OSError, asyncio.TimeoutError, asyncpg.InterfaceError)):
        return Unavailable(f"database unavailable: {exc}")
    return Unavailable(f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------------------------
# LISTEN / NOTIFY
# --------------------------------------------------------------------------------------------

class Listener:
    """One dedicated connection LISTENing on channels; reconnects with backoff when it drops.

    A node has one (the queue manager's): PostgreSQL signals every backend that LISTENs in a
    database on every NOTIFY sent in it, whatever the channel, so each extra LISTEN connection of a
    node cost its own wake-up per committed publish (~20 µs of backend CPU measured, issue 17).
    Other parts of the node add their channels with listen() and take them back with unlisten().

    After a reconnect every callback is called with payload None: notifications sent while we
    were away are lost, so consumers must re-check the database.
    """

    def __init__(self, dsn: str, callbacks: dict[str, Callable[[str | None], Awaitable[None] | None]]):
        self._dsn = dsn
        self._callbacks = dict(callbacks)
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task | None = None
        self._lost = asyncio.Event()
        self._closed = False
        # Held while the connection is (re)made and while channels are added or taken back, so a
        # channel added during a reconnect is LISTENed on the new connection too.
        self._changing = asyncio.Lock()
        self.connected = asyncio.Event()

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._watch(), name="fluxpg-listener")

    async def listen(self, callbacks: dict[str, Callable[[str | None], Awaitable[None] | None]]) -> None:
        """LISTEN on more channels of this connection (each channel has one callback)."""
        async with self._changing:
            taken = set(callbacks) & set(self._callbacks)
            if taken:
                raise ValueError(f"channels already listened to: {sorted(taken)}")
            self._callbacks.update(callbacks)
            conn = self._conn
            if conn is not None and not conn.is_closed():
                for channel in callbacks:
                    await conn.add_listener(channel, self._on_notify)

    async def unlisten(self, channels: Iterable[str]) -> None:
        """Stop listening on channels added with listen() (no-op once the listener is closed)."""
        async with self._changing:
            conn = self._conn
            for channel in channels:
                if self._callbacks.pop(channel, None) is None or self._closed:
                    continue
                if conn is not None and not conn.is_closed():
                    try:
                        await conn.remove_listener(channel, self._on_notify)
                    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                        log.debug("UNLISTEN %s failed: %s", channel, exc)   # a lost connection: reconnect will not LISTEN it

    async def _connect(self) -> None:
        async with self._changing:
            conn = await asyncpg.connect(self._dsn)
            self._lost.clear()
            conn.add_termination_listener(lambda _c: self._lost.set())
            try:
                for channel in list(self._callbacks):
                    await conn.add_listener(channel, self._on_notify)
            except BaseException:
                conn.terminate()
                raise
            self._conn = conn
            self.connected.set()

    def _on_notify(self, _conn, _pid, channel: str, payload: str) -> None:
        self._dispatch(channel, payload)

    def _dispatch(self, channel: str, payload: str | None) -> None:
        callback = self._callbacks.get(channel)
        if callback is None:
            return   # taken back with unlisten() while the notification was on its way
        result = callback(payload)
        if asyncio.iscoroutine(result):
            asyncio.ensure_future(result)

    async def _watch(self) -> None:
        delay = 0.1
        while not self._closed:
            await self._lost.wait()
            self.connected.clear()
            if self._closed:
                return
            log.warning("LISTEN connection lost; reconnecting")
            while not self._closed:
                try:
                    await self._connect()
                    delay = 0.1
                    for channel in list(self._callbacks):
                        self._dispatch(channel, None)
                    break
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.debug("reconnect failed: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        self._closed = True
        self._lost.set()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()


class Channels:
    """Some channels of a node's Listener, for a part of the node that starts and stops on its own
    (connection sync, the MQTT router): start() LISTENs on them, close() takes them back."""

    def __init__(self, listener: Listener, callbacks: dict[str, Callable[[str | None], Awaitable[None] | None]]):
        self._listener = listener
        self._callbacks = callbacks
        self._started = False

    async def start(self) -> None:
        await self._listener.listen(self._callbacks)
        self._started = True

    async def close(self) -> None:
        if self._started:
            self._started = False
            await self._listener.unlisten(self._callbacks)
