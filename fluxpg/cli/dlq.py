"""`fluxpg dlq redrive`: dead letters back to their queue, in batches of short transactions.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any, Optional

import typer

from fluxpg.cli.app import ConfigOpt, DataDirOpt, DsnOpt, app, stderr, stdout
from fluxpg.cli.database import _query, database
from fluxpg.cli.errors import CliError, _command


dlq_app = typer.Typer(help="Dead-letter queues ($dlq/<queue>).", no_args_is_help=True, add_completion=False)
app.add_typer(dlq_app, name="dlq")

REDRIVE_BATCH = 1000    # offsets per transaction: a large move is many short transactions, not one long one


def _offsets(text: str) -> list[int]:
    """`3,5,10-12` → [3, 5, 10, 11, 12]."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a or b - a > 10_000_000:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise CliError(f"--offsets {text!r}: expected offsets and ranges like 3,5,10-12", 2) from None
    if any(o < 0 for o in out):
        raise CliError(f"--offsets {text!r}: offsets are not negative", 2)
    return sorted(set(out))


async def _redrive(conn: Any, dlq: str, offsets: list[int] | None, dry_run: bool, batch: int) -> int:
    """Redrive in batches of `batch` offsets (each its own transaction, each atomic), with a
    progress bar when it takes more than one."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from fluxpg import db

    bounds = await conn.fetch(db.queries()["queue_bounds"], dlq)
    if not bounds:
        raise CliError(f"unknown queue {dlq!r}: no messages were ever dead-lettered there (see `fluxpg queues`)")
    first, head = bounds[0]["first_seq"], bounds[0]["next_seq"]
    if offsets is not None:
        chunks = [(offsets[i:i + batch], None, None) for i in range(0, len(offsets), batch)]
        total = len(offsets)
    else:
        chunks = [(None, lo, min(lo + batch, head)) for lo in range(first, head, batch)]
        total = head - first
    moved = 0
    sql = db.queries()["redrive"]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("offsets"), TimeRemainingColumn(), console=stderr,
                        disable=len(chunks) <= 1, transient=True)
    with progress:
        task = progress.add_task(f"{'counting' if dry_run else 'redriving'} {dlq}", total=total)
        for chunk, lo, hi in chunks:
            moved += await conn.fetchval(sql, dlq, chunk, lo, hi, dry_run)
            progress.update(task, advance=len(chunk) if chunk is not None else hi - lo,
                            description=f"{'would move' if dry_run else 'moved'} {moved}")
    return moved


@dlq_app.command("redrive")
@_command
def dlq_redrive(
    queue: Annotated[str, typer.Argument(help="The queue whose dead letters go back ($dlq/<queue> is read), "
                                               "or the dead-letter queue's own name.")],
    offsets: Annotated[Optional[str], typer.Option("--offsets", help="Offsets in the dead-letter queue, "
                                                   "e.g. 3,5,10-12 (see `fluxpg tail '$dlq/QUEUE'`).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Every message in the dead-letter queue.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would move; move nothing.")] = False,
    batch: Annotated[int, typer.Option("--batch", min=1, max=100_000,
                                       help="Offsets per transaction.")] = REDRIVE_BATCH,
    dsn: DsnOpt = None, config_file: ConfigOpt = None, data_dir: DataDirOpt = None,
) -> None:
    """Move dead letters back to the queue they came from, as new messages (fluxpg.redrive).

    Each message is in exactly one of the two queues at any moment; its headers keep where it
    came from (_dlq_original_id, _redriven_from). Messages a DLQ consumer is processing stay."""
    from fluxpg.queues.admin import dlq_name

    if (offsets is None) == (not all_):
        raise CliError("say which dead letters: --offsets 3,5,10-12 or --all", 2)
    wanted = _offsets(offsets) if offsets is not None else None
    dlq = dlq_name(queue)
    with database(dsn, config_file, data_dir) as target:
        moved = asyncio.run(_query(target, lambda conn: _redrive(conn, dlq, wanted, dry_run, batch)))
    original = dlq[len("$dlq/"):]
    verb = "would move" if dry_run else "moved"
    stdout.print(f"{verb} {moved} message{'s' if moved != 1 else ''} from {dlq} to {original}",
                  markup=False, highlight=False)
