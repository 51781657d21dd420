"""Every failure of a command as one line on stderr and an exit code (1 runtime, 2 bad input),
the traceback only with -v: CliError, the `_command` wrapper, describe_error for driver errors.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import typer

from fluxpg.cli.app import STATE, stderr
from fluxpg.config import ConfigError
from fluxpg.embedded import EmbeddedPostgresError
from fluxpg.errors import FluxError, Unavailable
from fluxpg.protocols.listener import ListenerError


CONNECT_TIMEOUT = 10.0


class CliError(Exception):
    """A failure to report as one line (no traceback) with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fail(message: str, code: int = 1) -> None:
    for line in str(message).splitlines() or [""]:
        stderr.print(f"error: {line}", markup=False, highlight=False)
    raise typer.Exit(code)


def _command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every exception of a command into one line on stderr and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except ConfigError as exc:
            fail(str(exc), 2)
        except CliError as exc:
            _maybe_traceback()
            fail(str(exc), exc.code)
        except (ListenerError, EmbeddedPostgresError) as exc:
            _maybe_traceback()
            fail(_one_line(str(exc)), 1)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except BrokenPipeError:
            # stdout was closed early (`fluxpg tail -f q | head`): not an error. Point stdout at
            # /dev/null so the interpreter's final flush does not complain again.
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except FluxError as exc:
            _maybe_traceback()
            fail(describe_error(exc), 1)
        except Exception as exc:  # noqa: BLE001 - the user gets one line, -v the traceback
            _maybe_traceback()
            fail(describe_error(exc) + ("" if STATE.verbose else " (run with -v for details)"), 1)

    return wrapper


def _maybe_traceback() -> None:
    if STATE.verbose:
        traceback.print_exc()


def describe_error(exc: BaseException, dsn: str | None = None) -> str:
    """One line saying what went wrong, for errors of the database drivers and the engine."""
    import asyncpg

    if isinstance(exc, CliError):
        return str(exc)
    if isinstance(exc, Unavailable) and exc.__cause__ is not None:
        cause = exc.__cause__
        if dsn and isinstance(cause, (OSError, asyncio.TimeoutError, asyncpg.InvalidAuthorizationSpecificationError,
                                      asyncpg.InvalidCatalogNameError, asyncpg.CannotConnectNowError,
                                      asyncpg.TooManyConnectionsError)):
            return str(connect_error(dsn, cause))
        return describe_error(cause, dsn)
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", "") or ""
        if state in ("42P01", "3F000", "42883") and "fluxpg" in str(exc):
            return "the database has no fluxpg schema (or an old one); run `fluxpg migrate` first"
        message = _one_line(getattr(exc, "message", None) or str(exc))
        hint = getattr(exc, "hint", None)
        return f"{message} ({_one_line(hint)})" if hint else message
    if isinstance(exc, FluxError):
        return _one_line(str(exc))
    try:
        import sqlalchemy.exc

        if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
            return describe_error(exc.orig, dsn)
    except ImportError:  # pragma: no cover - SQLAlchemy is a dependency
        pass
    try:
        import psycopg

        if isinstance(exc, psycopg.OperationalError) and dsn:
            return str(connect_error(dsn, exc))
        if isinstance(exc, psycopg.Error):
            diag = getattr(exc, "diag", None)
            primary = getattr(diag, "message_primary", None)
            return _one_line(primary or str(exc))
    except ImportError:  # pragma: no cover
        pass
    return _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def dsn_location(dsn: str) -> str:
    """host:port of a DSN (a socket directory counts as the host), for messages."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - an unparsable DSN fails later with its own message
        return "the configured DSN"
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    return f"{host}:{port}"


def connect_error(dsn: str, exc: BaseException) -> CliError:
    reason = _one_line(getattr(exc, "message", None) or str(exc)) or type(exc).__name__
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        reason = f"no answer within {CONNECT_TIMEOUT:.0f} s"
    return CliError(f"cannot connect to PostgreSQL at {dsn_location(dsn)}: {reason}; set --dsn or FLUXPG_DSN")
