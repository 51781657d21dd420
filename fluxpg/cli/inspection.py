"""`fluxpg queues`, `fluxpg groups`, `fluxpg pending`: the views queue_stats, group_status and
pending_entries as tables or JSON.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from fluxpg.cli.app import ConfigOpt, DataDirOpt, DsnOpt, JsonOpt, app
from fluxpg.cli.database import _query, _require_queue, database
from fluxpg.cli.errors import CliError, _command
from fluxpg.cli.output import _text, human_bytes, human_interval, human_time, print_json, print_table


@app.command()
@_command
def queues(dsn: DsnOpt = None, as_json: JsonOpt = False, config_file: ConfigOpt = None,
           data_dir: DataDirOpt = None) -> None:
    """Queues with head, depth, size and segments (view fluxpg.queue_stats)."""
    from fluxpg import db

    with database(dsn, config_file, data_dir) as target:
        rows = asyncio.run(_query(target, lambda c: c.fetch(db.queries()["queue_stats"])))
    rows = [dict(r) for r in rows]
    if as_json:
        print_json(rows)
        return
    print_table("queues", [
        ("queue", "queue", _text), ("kind", "kind", _text), ("partitions", "partitions", _text),
        ("head", "head", _text), ("depth", "depth", _text), ("bytes", "size", human_bytes),
        ("segments", "segments", _text), ("groups", "groups", _text),
        ("oldest_at", "oldest message", human_time), ("topics", "topics", _text),
    ], rows)


@app.command()
@_command
def groups(queue: Annotated[str, typer.Argument(help="Queue name.")], dsn: DsnOpt = None,
           as_json: JsonOpt = False, config_file: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Consumer groups of a queue: cursor, committed, lag, pending (view fluxpg.group_status)."""
    from fluxpg import db

    async def fetch(conn: Any) -> Any:
        await _require_queue(conn, queue)
        return await conn.fetch(db.queries()["group_status"], queue)

    with database(dsn, config_file, data_dir) as target:
        rows = [dict(r) for r in asyncio.run(_query(target, fetch))]
    if as_json:
        print_json(rows)
        return
    print_table(f"groups of {queue}", [
        ("grp", "group", _text), ("mode", "mode", _text), ("partition", "partition", _text),
        ("cursor", "cursor", _text), ("committed", "committed", _text), ("lag", "lag", _text),
        ("pending", "pending", _text), ("oldest_pending_age", "oldest pending", human_interval),
        ("consumers", "consumers", _text), ("auto_commit", "auto-commit", _text),
        ("last_active_at", "last active", human_time),
    ], rows)


@app.command()
@_command
def pending(queue: Annotated[str, typer.Argument(help="Queue name.")],
            group: Annotated[str, typer.Argument(help="Group name (group or group@filter).")],
            limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Most entries to show.")] = 100,
            dsn: DsnOpt = None, as_json: JsonOpt = False, config_file: ConfigOpt = None,
            data_dir: DataDirOpt = None) -> None:
    """Delivered, unacknowledged messages of a classic group, like Redis XPENDING (view fluxpg.pending_entries)."""
    from fluxpg import db

    resolved: list[str] = []

    async def fetch(conn: Any) -> Any:
        import asyncpg

        await _require_queue(conn, queue)
        try:
            # `workers` finds `workers@#` (what a subscription to $queue/<queue>/# makes).
            resolved.append(await conn.fetchval(db.queries()["resolve_group"], queue, group))
        except asyncpg.PostgresError as exc:
            raise CliError(f"{exc} (see `fluxpg groups {queue}`)") from None
        return await conn.fetch(db.queries()["pending_entries"], queue, resolved[0], limit)

    with database(dsn, config_file, data_dir) as target:
        rows = [dict(r) for r in asyncio.run(_query(target, fetch))]
    group = resolved[0] if resolved else group
    if as_json:
        print_json(rows)
        return
    print_table(f"pending entries of {queue} / {group}", [
        ("message_id", "message id", _text), ("partition", "partition", _text), ("seq", "offset", _text),
        ("consumer", "consumer", _text), ("idle", "idle", human_interval),
        ("delivery_count", "deliveries", _text), ("visible_at", "visible again", human_time),
    ], rows)
