"""The Typer app of `fluxpg`, its global options (-v, --version), the consoles, the options the
commands share and logging setup.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.logging import RichHandler

from fluxpg import __version__


app = typer.Typer(
    name="fluxpg",
    help="fluxpg: a message broker (MQTT, AMQP 0-9-1, AMQP 1.0) whose log is PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # errors are reported by _command, one line each
)

# soft_wrap: a long error line stays one line (Rich would otherwise wrap it at the terminal width).
# Piped output is not cut to 80 columns: tables keep whole values, one row per line.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
stderr = Console(stderr=True, soft_wrap=True)


class _State:
    verbose = False


STATE = _State()


DsnOpt = Annotated[Optional[str], typer.Option(
    "--dsn", metavar="DSN", show_default=False,
    help="PostgreSQL DSN (default: FLUXPG_DSN, the config's database.dsn, else the embedded server).")]
ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", metavar="FILE", show_default=False, dir_okay=False,
    help="YAML config file (default: FLUXPG_CONFIG, else built-in defaults).")]
DataDirOpt = Annotated[Optional[Path], typer.Option(
    "--data-dir", metavar="DIR", show_default=False, file_okay=False,
    help="Data directory of the embedded PostgreSQL (default: database.data_dir, else "
         "$XDG_DATA_HOME/fluxpg/pgdata).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON for scripts: raw numbers, ISO 8601 times, "
                                                      "intervals in seconds.")]


def _version(value: bool) -> None:
    if value:
        stdout.print(f"fluxpg {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging; tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """fluxpg: a message broker (MQTT, AMQP 0-9-1, AMQP 1.0) whose log is PostgreSQL."""
    STATE.verbose = STATE.verbose or verbose
    # Commands other than serve log only warnings: their output is what they print.
    setup_logging(STATE.verbose, level=logging.WARNING)


def setup_logging(verbose: bool, worker: int | None = None, level: int = logging.INFO) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_fluxpg", False):
            root.removeHandler(handler)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
    handler = RichHandler(console=console, show_path=verbose, markup=False, rich_tracebacks=verbose,
                          log_time_format="[%X]", omit_repeated_times=False)
    fmt = f"worker {worker}: %(message)s" if worker is not None else "%(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    handler._fluxpg = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else level)
    # Alembic says "Context impl PostgresqlImpl" etc. on every run; we print revisions ourselves.
    # asyncpg logs at DEBUG only. Quiet them unless asked.
    for noisy in ("alembic", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
