"""`fluxpg publish` (one message through fluxpg.publish) and `fluxpg tail` (read a queue's log,
consuming nothing; --follow waits for more).
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fluxpg.cli.app import ConfigOpt, DataDirOpt, DsnOpt, app, stdout
from fluxpg.cli.database import _query, _require_queue, connect, database
from fluxpg.cli.errors import CliError, _command, describe_error
from fluxpg.cli.output import payload_text
from fluxpg.cli.serve import wait_any

WATCH_LEASE_S = 30.0   # fluxpg.watch_log lease of `tail --follow`, renewed every third of it


def _headers(items: list[str]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--header {item!r}: expected KEY=VALUE", 2)
        out[key.strip()] = value
    return out or None


@app.command()
@_command
def publish(
    topic: Annotated[str, typer.Argument(help="Topic, e.g. '$queue/orders/eu' (quote the $ in a shell).")],
    message: Annotated[Optional[str], typer.Argument(help="The payload as text.", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", metavar="FILE", dir_okay=False, show_default=False,
                    help="Read the payload from FILE ('-' for stdin).")] = None,
    header: Annotated[Optional[list[str]], typer.Option("--header", "-H", metavar="KEY=VALUE", show_default=False,
                      help="A header (repeatable).")] = None,
    dsn: DsnOpt = None, config_file: ConfigOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Publish one message with the SQL function fluxpg.publish; prints queue:offset per queue it reached."""
    if message is not None and file is not None:
        raise CliError("give MESSAGE or --file, not both", 2)
    if message is None and file is None:
        raise CliError("give the payload as MESSAGE, or --file FILE ('--file -' reads stdin)", 2)
    if file is not None:
        try:
            payload = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
        except OSError as exc:
            raise CliError(f"--file {file}: {exc.strerror or exc}", 2) from None
    else:
        payload = message.encode("utf-8")  # type: ignore[union-attr]
    headers = _headers(header or [])

    async def run(conn: Any) -> Any:
        from fluxpg import db

        return await conn.fetch(db.queries()["cli_append"], topic, payload, headers)

    with database(dsn, config_file, data_dir) as target:
        rows = asyncio.run(_query(target, run))
    for row in rows:
        stdout.print(f"{row['queue']}:{row['seq']}", markup=False, highlight=False)


async def _tail(dsn: str, queue: str, group: str | None, start: str | None, count: int, follow: bool) -> int:
    conn = await connect(dsn)
    try:
        return await _tail_on(conn, dsn, queue, group, start, count, follow)
    except CliError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise CliError(describe_error(exc, dsn)) from exc
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


async def _tail_on(conn: Any, dsn: str, queue: str, group: str | None, start: str | None, count: int,
                   follow: bool) -> int:
    q = await _require_queue(conn, queue)
    qid, partitions = q["id"], q["partitions"]
    from fluxpg import db

    heads = {r["partition"]: (r["first_seq"], r["next_seq"]) for r in await conn.fetch(db.queries()["cli_heads"], qid)}
    # Where each partition starts. Reading the log by offset claims nothing: tail never takes
    # work from a consumer group, whatever the queue's kind.
    position: dict[int, int] = {}
    if group is not None:
        rows = await conn.fetch(db.queries()["cli_group_committed"], queue, group)
        if not rows:
            raise CliError(f"queue {queue!r} has no group {group!r} (see `fluxpg groups {queue}`)")
        committed = {r["partition"]: r["committed"] for r in rows}
        position = {p: max(first, committed.get(p, first)) for p, (first, _next) in heads.items()}
    elif start in (None, ""):
        position = {p: max(first, nxt - count) if count else first for p, (first, nxt) in heads.items()}
    elif start == "first":
        position = {p: first for p, (first, _next) in heads.items()}
    elif start == "last":
        position = {p: nxt for p, (_first, nxt) in heads.items()}
    else:
        position = {p: max(first, int(start)) for p, (first, _next) in heads.items()}

    limit = 0 if follow else count  # 0: no limit
    wake = asyncio.Event()

    def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if str(qid) in payload.split(","):
            wake.set()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    watched_at = 0.0
    if follow:
        # Broker nodes NOTIFY a queue's appends only while someone watches it (fluxpg.watch_log,
        # a lease renewed below while following).
        await conn.fetchval(db.queries()["cli_watch_log"], queue, WATCH_LEASE_S)
        watched_at = loop.time()
        await conn.add_listener("fluxpg_log", on_notify)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    printed = 0
    out = sys.stdout
    try:
        while not stop.is_set():
            wake.clear()
            got = 0
            for part in sorted(position):
                want = 500 if not limit else min(500, limit - printed)
                if want <= 0:
                    break
                rows = await conn.fetch(db.queries()["cli_log_page"], qid, part, position[part], want)
                for r in rows:
                    offset = f"{r['partition']}:{r['seq']}" if partitions > 1 else str(r["seq"])
                    stamp = r["created_at"].astimezone().isoformat(timespec="milliseconds")
                    out.write(f"{offset}\t{stamp}\t{r['topic']}\t{payload_text(bytes(r['payload']))}\n")
                if rows:
                    position[part] = rows[-1]["seq"] + 1
                    printed += len(rows)
                    got += len(rows)
            out.flush()
            if limit and printed >= limit:
                break
            if got:
                continue  # more may be waiting
            if not follow:
                break
            if loop.time() - watched_at > WATCH_LEASE_S / 3:
                await conn.fetchval(db.queries()["cli_watch_log"], queue, WATCH_LEASE_S)
                watched_at = loop.time()
            # Woken by the NOTIFY of a committed append; the timeout is a safety net for a lost one.
            await wait_any(wake, stop, timeout=2.0)
    finally:
        if follow:
            with contextlib.suppress(Exception):
                await conn.fetchval(db.queries()["cli_unwatch_log"], queue)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    return 0


@app.command()
@_command
def tail(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    group: Annotated[Optional[str], typer.Option("--group", "-g", metavar="GROUP", show_default=False,
                     help="Start at this group's committed offset (what it has not processed yet).")] = None,
    start: Annotated[Optional[str], typer.Option("--from", metavar="first|last|N", show_default=False,
                     help="Start at the oldest retained message, after the newest, or at offset N "
                          "(default: the last COUNT messages).")] = None,
    count: Annotated[int, typer.Option("-n", "--count", min=0, metavar="COUNT",
                     help="How many messages to print (0: all); without --from, the last COUNT.")] = 10,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new messages until Ctrl-C.")] = False,
    dsn: DsnOpt = None, config_file: ConfigOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Print messages of a queue (offset, time, topic, payload as UTF-8 or hex:…), tab-separated.

    Reads the log by offset: nothing is claimed or acknowledged, no consumer group is changed."""
    if group is not None and start is not None:
        raise CliError("give --group or --from, not both", 2)
    if start is not None and start not in ("first", "last") and not (start.isdigit()):
        raise CliError(f"--from {start!r}: expected first, last or an offset", 2)
    with database(dsn, config_file, data_dir) as target:
        code = asyncio.run(_tail(target, queue, group, start, count, follow))
    raise typer.Exit(code)
