"""The `fluxpg` command line (Typer + Rich).

    fluxpg serve      run the broker (a private PostgreSQL when no DSN is configured)
    fluxpg migrate    upgrade or downgrade the schema
    fluxpg queues     queue statistics            (view fluxpg.queue_stats)
    fluxpg groups     consumer groups of a queue  (view fluxpg.group_status)
    fluxpg pending    unacknowledged deliveries   (view fluxpg.pending_entries, like XPENDING)
    fluxpg publish    publish one message         (SQL function fluxpg.publish)
    fluxpg tail       print messages of a queue   (reads fluxpg.log; consumes nothing)

Which database: `--dsn`, else `FLUXPG_DSN`, else `database.dsn` of the config (`--config` /
`FLUXPG_CONFIG`), else the embedded PostgreSQL in `--data-dir` / `database.data_dir` / the user's
data directory. While `fluxpg serve` owns the embedded server, the other commands connect to it
through its socket.

Every failure is one line on stderr (a config file may give one line per problem) and an exit code:
1 for runtime errors (database unreachable, unknown queue, port in use), 2 for bad input (options,
config file). A traceback only with `-v`.

One module per command family: app.py (the Typer app, global options), errors.py (error
rendering), database.py (which database), output.py (formatting), serve.py (serve and the worker
supervisor), migrate.py, inspection.py (queues, groups, pending), dlq.py, messages.py (publish,
tail). Importing them registers their commands, in the order `fluxpg --help` lists them.
"""
from __future__ import annotations

import typer

# Importing a command module registers its commands: in this order `fluxpg --help` lists them.
from fluxpg.cli import serve
from fluxpg.cli import migrate
from fluxpg.cli import inspection
from fluxpg.cli import messages
from fluxpg.cli import dlq
from fluxpg.cli.app import STATE, app, setup_logging, stderr, stdout
from fluxpg.cli.database import connect, database, redact_dsn
from fluxpg.cli.errors import CliError, describe_error, dsn_location, fail
from fluxpg.cli.output import human_bytes, human_interval, human_time, payload_text


COMMAND_MODULES = (serve, migrate, inspection, messages, dlq)

__all__ = ["app", "main", "CliError", "STATE", "connect", "database", "describe_error", "dsn_location", "fail",
           "human_bytes", "human_interval", "human_time", "payload_text", "redact_dsn", "setup_logging",
           "stderr", "stdout"]


def _optional_app(module_name: str) -> typer.Typer | None:
    """`module_name:app` when that module exists. Only its own absence is tolerated: an import
    error inside it (a bug, a missing dependency it imports eagerly) must surface."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name) and (
                exc.name == module_name or module_name[len(exc.name)] == "."):
            return None
        raise
    return getattr(module, "app", None)


# `fluxpg analytics …`: the Spark jobs (fluxpg/analytics/cli.py, present with that part).
_analytics_app = _optional_app("fluxpg.analytics.cli")
if _analytics_app is not None:
    app.add_typer(_analytics_app, name="analytics")

# Authentication commands (`fluxpg passwd` …) from fluxpg/auth_cli.py are mounted at the top level.
_auth_app = _optional_app("fluxpg.auth_cli")
if _auth_app is not None:
    app.add_typer(_auth_app)


def main() -> None:
    app(prog_name="fluxpg")
