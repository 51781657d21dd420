"""Publish inside the application's own transaction: the outbox without a relay.

    async with session.begin():                     # SQLAlchemy AsyncSession (or Session, …)
        session.add(Order(id=42, total=99))
        await fluxpg.publish(session, "$queue/orders/created", b'{"id": 42}', {"source": "shop"})

The message is written with the application's rows, on the application's connection, by the SQL
function fluxpg.publish(): MQTT/AMQP consumers get it if and only if that transaction commits, in
commit order, and the transaction never holds a lock that other publishers wait for (see
sql/functions.sql, "Publishing inside the caller's transaction"). The commit is the confirmation.

`conn` may be an asyncpg connection, a psycopg 3 connection, or a SQLAlchemy Session, Connection,
AsyncSession or AsyncConnection. For the async kinds these functions return an awaitable, for the
sync kinds they run at once. They return the names of the queues the message will reach; offsets
are assigned when the transaction commits.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from fluxpg import db

Message = tuple[str, "bytes | str", "dict[str, Any] | None"]

_PLACEHOLDER = re.compile(r"\$(\d+)")


def _payload(payload: bytes | str) -> bytes:
    return payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)


def _headers(headers: dict[str, Any] | None) -> str | None:
    return None if headers is None else json.dumps(headers, separators=(",", ":"))


def _kind(conn: Any) -> str:
    """'asyncpg' | 'psycopg' | 'psycopg-async' | 'sqlalchemy' | 'sqlalchemy-async'."""
    module = type(conn).__module__
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("sqlalchemy"):
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        return "sqlalchemy-async" if isinstance(conn, (AsyncSession, AsyncConnection)) else "sqlalchemy"
    if module.startswith("psycopg"):
        import psycopg

        return "psycopg-async" if isinstance(conn, psycopg.AsyncConnection) else "psycopg"
    raise TypeError(f"fluxpg.publish needs an asyncpg or psycopg connection or a SQLAlchemy session/"
                    f"connection, not {type(conn).__name__}")


def _run(conn: Any, query: str, args: list[Any]) -> Any:
    """Run a named query ($n placeholders) on any supported connection: rows as tuples."""
    sql = db.queries()[query]
    kind = _kind(conn)
    if kind == "asyncpg":
        async def run_asyncpg() -> list[tuple]:
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        return run_asyncpg()
    if kind.startswith("psycopg"):
        psql = _PLACEHOLDER.sub("%s", sql)
        if kind == "psycopg":
            return [tuple(r) for r in conn.execute(psql, args).fetchall()]

        async def run_psycopg() -> list[tuple]:
            cur = await conn.execute(psql, args)
            return [tuple(r) for r in await cur.fetchall()]
        return run_psycopg()
    from sqlalchemy import text

    stmt = text(_PLACEHOLDER.sub(lambda m: f":p{m.group(1)}", sql))
    params = {f"p{i}": a for i, a in enumerate(args, start=1)}
    if kind == "sqlalchemy":
        return [tuple(r) for r in conn.execute(stmt, params).fetchall()]

    async def run_sqlalchemy() -> list[tuple]:
        return [tuple(r) for r in (await conn.execute(stmt, params)).fetchall()]
    return run_sqlalchemy()


def _first_column(result: Any) -> Any:
    if isinstance(result, list):
        return [r[0] for r in result]

    async def later() -> list[str]:
        return [r[0] for r in await result]
    return later()


def publish(conn: Any, topic: str, payload: bytes | str, headers: dict[str, Any] | None = None) -> Any:
    """Publish one message in `conn`'s current transaction; the queue names it will reach."""
    return _first_column(_run(conn, "outbox_publish", [topic, _payload(payload), _headers(headers)]))


def publish_batch(conn: Any, messages: Iterable[Message]) -> Any:
    """Publish many messages, in order, in `conn`'s current transaction: (ordinal, queue) pairs,
    ordinals from 1."""
    topics, payloads, headers = [], [], []
    for topic, payload, hdrs in messages:
        topics.append(topic)
        payloads.append(_payload(payload))
        headers.append(_headers(hdrs))
    return _run(conn, "outbox_publish_batch", [topics, payloads, headers])
