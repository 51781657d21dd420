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
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Optional
from urllib.parse import quote, urlsplit, urlunsplit

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from fluxpg import __version__
from fluxpg.config import Config, ConfigError, load_config, parse_address
from fluxpg.embedded import EmbeddedPostgres, EmbeddedPostgresError, default_data_dir
from fluxpg.protocols.listener import ListenerError
from fluxpg.errors import FluxError, Unavailable

log = logging.getLogger("fluxpg.cli")

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

LISTENERS = ("mqtt", "amqp", "amqp091", "http", "ws")
LISTENER_TITLES = {"mqtt": "MQTT", "amqp": "AMQP 1.0", "amqp091": "AMQP 0-9-1", "http": "HTTP admin", "ws": "MQTT over WebSocket"}
CONNECT_TIMEOUT = 10.0
# How long a starting worker may take to report ready; one that does not, or exits first, failed to start.
WORKER_READY_TIMEOUT = 120.0
WORKER_STOP_TIMEOUT = 30.0
READY_LINE = b"fluxpg-worker-ready\n"


class CliError(Exception):
    """A failure to report as one line (no traceback) with an exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class _State:
    verbose = False


STATE = _State()


# --------------------------------------------------------------------------------------------
# error reporting
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# DSNs
# --------------------------------------------------------------------------------------------

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


def redact_dsn(dsn: str) -> str:
    """The DSN without its password (URI or key=value form)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, hostinfo = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}@{hostinfo}"
        query = "&".join(p for p in parts.query.split("&") if p and not p.lower().startswith("password="))
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(dsn)
        params.pop("password", None)
        return make_conninfo(**params)
    except Exception:  # noqa: BLE001
        return "<unparsable DSN>"


def connect_error(dsn: str, exc: BaseException) -> CliError:
    reason = _one_line(getattr(exc, "message", None) or str(exc)) or type(exc).__name__
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        reason = f"no answer within {CONNECT_TIMEOUT:.0f} s"
    return CliError(f"cannot connect to PostgreSQL at {dsn_location(dsn)}: {reason}; set --dsn or FLUXPG_DSN")


async def connect(dsn: str):
    """An asyncpg connection with fluxpg's codecs, or a CliError saying why not."""
    from fluxpg import db

    try:
        return await asyncio.wait_for(db.connect(dsn), CONNECT_TIMEOUT)
    except Unavailable as exc:
        raise connect_error(dsn, exc.__cause__ or exc) from exc
    except (OSError, asyncio.TimeoutError) as exc:
        raise connect_error(dsn, exc) from exc
    except Exception as exc:  # noqa: BLE001 - bad DSN syntax and the like
        raise connect_error(dsn, exc) from exc


def check_connection(dsn: str) -> None:
    """Fail early with one line when the database cannot be reached (before Alembic, whose
    driver errors span several lines)."""

    async def probe() -> None:
        conn = await connect(dsn)
        await conn.close()

    asyncio.run(probe())


def _running_embedded_dsn(data_dir: Path) -> str | None:
    """The DSN of an embedded server some `fluxpg serve` runs on `data_dir`, if one does."""
    from fluxpg.embedded import _read_postmaster_pid  # the same check the embedded module trusts

    found = _read_postmaster_pid(data_dir)
    if found is None or found[1] is None:
        return None
    host = quote(str(found[1]), safe="/")
    return f"postgresql://postgres@/postgres?host={host}&port=5432"


def _is_pgdata(path: Path) -> bool:
    return (path / "PG_VERSION").is_file()


def _load_config(config_file: Path | None) -> Config:
    return load_config(config_file)


@contextlib.contextmanager
def database(dsn: str | None, config_file: Path | None, data_dir: Path | None, *,
             create: bool = False) -> Iterator[str]:
    """The DSN a command works on: --dsn, FLUXPG_DSN, the config's database.dsn, else the
    embedded server (the one `fluxpg serve` runs, or started for this command and stopped after).

    create=False refuses to initialise a new embedded data directory (inspection commands have
    nothing to look at in an empty one)."""
    if dsn:
        yield dsn
        return
    env = os.environ.get("FLUXPG_DSN", "").strip()
    if env:
        yield env
        return
    config = _load_config(config_file)
    if config.database.dsn:
        yield config.database.dsn
        return
    directory = Path(data_dir or config.database.data_dir or default_data_dir()).expanduser().resolve()
    if not create and not _is_pgdata(directory):
        raise CliError(f"no database: no --dsn, FLUXPG_DSN or database.dsn, and no embedded PostgreSQL "
                       f"in {directory} yet (run `fluxpg serve` or `fluxpg migrate` first)")
    pg = EmbeddedPostgres(directory)
    running = None
    try:
        pg.start()
    except EmbeddedPostgresError:
        # Locked: a `fluxpg serve` owns this data directory; talk to its server instead.
        running = _running_embedded_dsn(directory)
        if running is None:
            raise
    if running is not None:
        log.debug("using the embedded PostgreSQL of the running fluxpg at %s", directory)
        yield running
        return
    try:
        yield pg.dsn
    finally:
        pg.stop()


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------

def human_bytes(n: Any) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def human_interval(td: timedelta | None) -> str:
    if td is None:
        return "-"
    seconds = td.total_seconds()
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d{hours:02d}h"


def human_time(ts: datetime | None) -> str:
    if ts is None:
        return "-"
    return ts.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def print_json(rows: Any) -> None:
    from fluxpg.protocols.http import jsonable

    sys.stdout.write(json.dumps(jsonable(rows), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def print_table(title: str, columns: list[tuple[str, str, Callable[[Any], str]]], rows: list[dict]) -> None:
    """columns: (key, header, formatter); numbers right-aligned."""
    table = Table(title=title, title_justify="left", show_lines=False)
    for key, header, _fmt in columns:
        numeric = key in {"partitions", "head", "depth", "bytes", "segments", "groups", "partition", "cursor",
                          "committed", "lag", "pending", "consumers", "seq", "delivery_count", "idle",
                          "oldest_pending_age"}
        table.add_column(header, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for key, _h, fmt in columns))
    if not rows:
        stdout.print(f"{title}: none", markup=False, highlight=False)
        return
    stdout.print(table)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def payload_text(payload: bytes) -> str:
    """UTF-8 text (control characters escaped, so one message stays one line), else hex:…"""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + payload.hex()
    if text.isprintable():
        return text
    escapes = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
    return "".join(escapes.get(c, c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256
                               else f"\\u{ord(c):04x}") for c in text)


# --------------------------------------------------------------------------------------------
# options shared by the commands
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------------

def _address_overrides(**flags: str | None) -> dict[str, str | None]:
    """--mqtt HOST:PORT etc.; "off" disables a listener. Bad values exit 2 naming the flag."""
    out: dict[str, str | None] = {}
    for name, value in flags.items():
        if value is None:
            continue
        if value.strip().lower() in ("off", "none", "disabled"):
            out[name] = None
            continue
        try:
            parse_address(value)
        except ValueError as exc:
            raise CliError(f"--{name}: {exc}", 2) from None
        out[name] = value
    return out


def _effective_listeners(config: Config, overrides: dict[str, str | None]) -> dict[str, str]:
    wanted = {name: getattr(config.listeners, name) for name in LISTENERS}
    wanted.update(overrides)
    return {name: address for name, address in wanted.items() if address}


def listen_conflicts(listeners: dict[str, str]) -> list[str]:
    """`--http 0.0.0.0:8082 (Address already in use)` for each listener address that cannot be
    bound now (probed like asyncio binds: SO_REUSEADDR; the probe is closed at once). Two
    listeners of ours on one address conflict too."""
    import socket

    problems: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for name, address in listeners.items():
        host, port = parse_address(address)
        if port != 0 and (host, port) in seen:
            problems.append(f"--{name} {address} (also given to --{seen[host, port]})")
            continue
        seen[host, port] = name
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, kind, proto, _, sockaddr = infos[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(sockaddr)
        except OSError as exc:
            problems.append(f"--{name} {address} ({exc.strerror or exc})")
    return problems


def _log_banner(config: Config, dsn: str, embedded: EmbeddedPostgres | None,
                listeners: dict[str, str], workers: int) -> None:
    where = f" (embedded PostgreSQL in {embedded.data_dir})" if embedded is not None else ""
    log.info("fluxpg %s: database %s%s", __version__, redact_dsn(dsn), where)
    if listeners and workers > 1:
        # Each worker logs its own "ready" line with the ports; say once what they share.
        log.info("%d worker processes sharing (SO_REUSEPORT) %s", workers,
                 ", ".join(f"{LISTENER_TITLES[n]} {a}" for n, a in listeners.items()))
    elif not listeners:
        log.warning("no listener is enabled: clients cannot connect")
    if getattr(config, "auth", None) is None:
        log.warning("no auth section in the config: the broker is open to everyone "
                    "(any client may connect, publish and consume)")
    for warning in config.warnings():
        log.warning("%s", warning)


@app.command()
@_command
def serve(
    config_file: ConfigOpt = None,
    dsn: DsnOpt = None,
    mqtt: Annotated[Optional[str], typer.Option("--mqtt", metavar="HOST:PORT", show_default=False,
                    help="MQTT listener (default listeners.mqtt, 0.0.0.0:1883); 'off' disables it.")] = None,
    amqp: Annotated[Optional[str], typer.Option("--amqp", metavar="HOST:PORT", show_default=False,
                    help="AMQP 1.0 listener (default 0.0.0.0:5672); 'off' disables it.")] = None,
    amqp091: Annotated[Optional[str], typer.Option("--amqp091", metavar="HOST:PORT", show_default=False,
                       help="AMQP 0-9-1 listener (default 0.0.0.0:5682); 'off' disables it.")] = None,
    http: Annotated[Optional[str], typer.Option("--http", metavar="HOST:PORT", show_default=False,
                    help="HTTP admin/metrics listener (default 0.0.0.0:8082); 'off' disables it.")] = None,
    ws: Annotated[Optional[str], typer.Option("--ws", metavar="HOST:PORT", show_default=False,
                  help="MQTT over WebSocket listener (default listeners.ws, off).")] = None,
    data_dir: DataDirOpt = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, metavar="N",
                       help="Broker processes sharing the ports (SO_REUSEPORT); the parent supervises them.")] = 1,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging; tracebacks on errors.")] = False,
    worker: Annotated[Optional[int], typer.Option("--worker", hidden=True)] = None,
    parent_pid: Annotated[Optional[int], typer.Option("--parent-pid", hidden=True)] = None,
) -> None:
    """Run the broker until SIGINT (Ctrl-C) or SIGTERM."""
    STATE.verbose = STATE.verbose or verbose
    setup_logging(STATE.verbose, worker)
    config = _load_config(config_file)
    overrides = _address_overrides(mqtt=mqtt, amqp=amqp, amqp091=amqp091, http=http, ws=ws)
    listeners = _effective_listeners(config, overrides)
    dsn = dsn or config.database.dsn  # load_config already put FLUXPG_DSN there
    if worker is not None:
        if not dsn:
            raise CliError("a worker needs the parent's DSN", 2)
        code = asyncio.run(_run_worker(dsn, config, overrides, worker, parent_pid))
    else:
        if workers > 1:
            zero = [f"--{n}" for n, a in listeners.items() if parse_address(a)[1] == 0]
            if zero:
                raise CliError(f"--workers needs fixed ports; {', '.join(zero)} asks for port 0 "
                               "(each worker would get a different one)", 2)
        # Before anything starts (the embedded PostgreSQL takes seconds): every address that
        # cannot be listened on, all in one message.
        conflicts = listen_conflicts(listeners)
        if conflicts:
            raise CliError("cannot listen on " + "; ".join(conflicts)
                           + " — stop what uses them, or pick other addresses (--mqtt/--amqp/--amqp091/--http/--ws, "
                           "'off' disables one)", 1)
        directory = None
        if not dsn:
            directory = Path(data_dir or config.database.data_dir or default_data_dir()).expanduser()
        code = asyncio.run(_serve_main(config, dsn, directory, overrides, listeners, workers, config_file))
    raise typer.Exit(code)


class _Signals:
    """SIGINT/SIGTERM handlers in the running loop: the first asks for a clean stop."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.received: list[str] = []
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        name = signal.Signals(sig).name
        if self.stop.is_set():
            log.info("%s: already stopping", name)
        else:
            log.info("%s: stopping", name)
        self.received.append(name)
        self.stop.set()

    def close(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(sig)


async def _serve_main(config: Config, dsn: str | None, data_dir: Path | None, overrides: dict[str, str | None],
                      listeners: dict[str, str], workers: int, config_file: Path | None) -> int:
    """Own the embedded server (if any) and run the broker in this process or in workers.

    Everything runs inside the loop with its signal handlers installed first, so a SIGTERM at any
    point (even while PostgreSQL starts) ends in the `finally` that stops the embedded server."""
    signals = _Signals()
    embedded: EmbeddedPostgres | None = None
    try:
        if dsn is None:
            embedded = EmbeddedPostgres(data_dir)
            # Starting takes a thread; a signal meanwhile is honoured as soon as it is up.
            await embedded.astart()
            dsn = embedded.dsn
            if signals.stop.is_set():
                return 0
        await asyncio.wait_for(_probe(dsn), CONNECT_TIMEOUT + 1)
        _log_banner(config, dsn, embedded, listeners, workers)
        if workers > 1:
            return await _supervise(workers, dsn, config, overrides, config_file, signals)
        return await _serve_here(dsn, config, overrides, signals)
    finally:
        signals.close()
        if embedded is not None:
            # Signals are back to their defaults now; a second Ctrl-C here would interrupt the stop,
            # so ignore them (the watchdog would stop the server anyway if we were killed).
            previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                await embedded.astop()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Until one of the events is set (or the timeout passes)."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiters:
            task.cancel()


async def _probe(dsn: str) -> None:
    conn = await connect(dsn)
    await conn.close()


async def _serve_here(dsn: str, config: Config, overrides: dict[str, str | None], signals: _Signals, *,
                      reuse_port: bool = False, migrate: bool = True,
                      on_ready: Callable[[Any], None] | None = None,
                      parent_pid: int | None = None) -> int:
    from fluxpg.server import Server

    start = asyncio.ensure_future(Server.start(dsn, config, addresses=overrides, migrate=migrate,
                                               reuse_port=reuse_port))
    try:
        server = await start
    except (ListenerError, CliError):
        raise
    except Exception as exc:  # noqa: BLE001
        if STATE.verbose:
            traceback.print_exc()
        raise CliError(describe_error(exc, dsn)) from exc
    try:
        ports = ", ".join(f"{LISTENER_TITLES.get(name, name)} {listener.host}:{listener.port} (--{name})"
                          for name, listener in server.listeners.items())
        log.info("ready: node %s (pid %d), %s", server.manager.node_id, os.getpid(), ports or "no listeners")
        http = server.listeners.get("http")
        if http is not None and config.console.enabled:
            scheme = "https" if http.ssl is not None else "http"
            host = "127.0.0.1" if http.host in ("0.0.0.0", "", "::") else http.host
            log.info("console: %s://%s:%d/%s", scheme, host if ":" not in host else f"[{host}]", http.port,
                     "" if config.auth is not None else " (auth off: private addresses only)")
        if on_ready is not None:
            on_ready(server)
        waiters = [asyncio.ensure_future(signals.stop.wait())]
        if parent_pid is not None:
            waiters.append(asyncio.ensure_future(_parent_gone(parent_pid)))
        done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
    finally:
        await server.close()
        log.info("stopped")
    return 0


async def _parent_gone(parent_pid: int) -> None:
    """A worker whose supervisor vanished (SIGKILL) must not go on serving alone."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    log.warning("the supervising process %d is gone; stopping", parent_pid)


async def _run_worker(dsn: str, config: Config, overrides: dict[str, str | None], worker: int,
                      parent_pid: int | None) -> int:
    signals = _Signals()
    try:
        def ready(_server: Any) -> None:
            # The supervisor reads this from our stdout: the worker is listening.
            sys.stdout.buffer.write(READY_LINE)
            sys.stdout.buffer.flush()

        return await _serve_here(dsn, config, overrides, signals, reuse_port=True, migrate=False,
                                 on_ready=ready, parent_pid=parent_pid)
    finally:
        signals.close()


async def _supervise(n: int, dsn: str, config: Config, overrides: dict[str, str | None],
                     config_file: Path | None, signals: _Signals) -> int:
    """Run n worker processes on the same ports; restart crashed ones; stop them on a signal.

    Workers are fresh interpreters (`python -m fluxpg.cli serve --worker i`), not forks: forking a
    process with a running event loop and threads is unsafe. The DSN goes through the environment
    (not argv, where `ps` would show its password). A worker that fails before it reports ready
    on the first launch (port in use, bad database) fails the whole command."""
    from fluxpg import db

    # Migrate once here; the workers start with migrate=False.
    await asyncio.to_thread(db.migrate, dsn)
    env = {**os.environ, "FLUXPG_DSN": dsn}
    if config_file is not None:
        env["FLUXPG_CONFIG"] = str(Path(config_file).resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                      os.environ.get("PYTHONPATH")]))
    flags: list[str] = []
    for name, address in overrides.items():
        flags += [f"--{name}", address or "off"]
    if STATE.verbose:
        flags.append("-v")
    procs: dict[int, asyncio.subprocess.Process] = {}
    first_failure: list[int] = []

    def command(i: int) -> list[str]:
        return [sys.executable, "-m", "fluxpg.cli", "serve", "--worker", str(i), "--parent-pid", str(os.getpid()),
                *flags]

    async def wait_ready(proc: asyncio.subprocess.Process) -> bool:
        assert proc.stdout is not None
        try:
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), WORKER_READY_TIMEOUT)
                if not line:
                    return False
                if line == READY_LINE:
                    return True
                sys.stdout.buffer.write(line)
        except asyncio.TimeoutError:
            return False

    async def forward(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    first_ready = asyncio.Event()

    async def run(i: int) -> None:
        launched = 0
        delay = 0.5
        if i > 1:
            # Worker 1 starts alone and declares the configured queues; the others start once it
            # is up. Concurrent first declarations of one queue collide in fluxpg.declare_queue
            # (unique violation on queues.name), so starting all at once on a fresh database fails.
            await wait_any(first_ready, signals.stop)
        while not signals.stop.is_set():
            launched += 1
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(*command(i), env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE)
            procs[i] = proc
            if signals.stop.is_set():
                # The stop came while this worker was being launched, after the others were told.
                proc.send_signal(signal.SIGTERM)
            ready = await wait_ready(proc)
            if ready:
                first_ready.set()
                await forward(proc)
            code = await proc.wait()
            if signals.stop.is_set():
                return
            if not ready and launched == 1:
                log.error("worker %d did not start (exit code %s); stopping", i, code)
                first_failure.append(code or 1)
                signals.stop.set()
                return
            # A worker that ran for a while gets restarted at once; one that keeps dying backs off.
            delay = 0.5 if time.monotonic() - started > 30 else min(delay * 2, 30.0)
            log.warning("worker %d (pid %d) exited with code %s; restarting in %.1f s", i, proc.pid, code, delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(signals.stop.wait(), delay)

    runners = [asyncio.ensure_future(run(i)) for i in range(1, n + 1)]
    await signals.stop.wait()
    # Forward the stop to every worker (a terminal Ctrl-C reaches them too; SIGTERM does not).
    for proc in procs.values():
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    waits = [asyncio.ensure_future(p.wait()) for p in procs.values() if p.returncode is None]
    if waits:
        _done, pending = await asyncio.wait(waits, timeout=WORKER_STOP_TIMEOUT)
        if pending:
            log.warning("%d workers did not stop within %.0f s; killing them", len(pending), WORKER_STOP_TIMEOUT)
            for proc in procs.values():
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.wait(waits, timeout=5)
    await asyncio.wait(runners, timeout=5)
    for task in runners:
        task.cancel()
    return first_failure[0] if first_failure else 0


# --------------------------------------------------------------------------------------------
# migrate
# --------------------------------------------------------------------------------------------

@app.command()
@_command
def migrate(
    dsn: DsnOpt = None,
    revision: Annotated[str, typer.Option("--revision", metavar="REV", help="Upgrade to this revision.")] = "head",
    downgrade: Annotated[Optional[str], typer.Option("--downgrade", metavar="REV", show_default=False,
                         help="Downgrade to this revision instead ('base' removes everything fluxpg created).")] = None,
    config_file: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Upgrade the database schema to the newest revision (or --revision / --downgrade). Idempotent."""
    from fluxpg import db

    if downgrade is not None and revision != "head":
        raise CliError("give either --revision or --downgrade, not both", 2)
    with database(dsn, config_file, data_dir, create=True) as target:
        check_connection(target)
        before = db.current_revision(target)
        recreated: list[str] = []
        if downgrade is not None:
            db.downgrade(target, downgrade)
        else:
            recreated = db.migrate(target, revision)
        after = db.current_revision(target)
    stdout.print(f"database:  {redact_dsn(target)}", markup=False, highlight=False)
    stdout.print(f"before:    {before or 'none (no fluxpg schema)'}", markup=False, highlight=False)
    stdout.print(f"after:     {after or 'none (no fluxpg schema)'}"
                 + ("  (unchanged)" if before == after else ""), markup=False, highlight=False)
    if after is not None and after == db.head_revision():
        why = {"revision": "new revision", "installed": "installed definitions differed"}
        state = ("re-created (" + ", ".join(why.get(r, f"{r} changed") for r in recreated) + ")"
                 if recreated else "current")
    else:
        state = "not installed below the head revision"
    stdout.print(f"functions and views: {state}", markup=False, highlight=False)


# --------------------------------------------------------------------------------------------
# inspection
# --------------------------------------------------------------------------------------------

async def _query(dsn: str, fn: Callable[[Any], Any]) -> Any:
    conn = await connect(dsn)
    try:
        return await fn(conn)
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, CliError):
            raise
        raise CliError(describe_error(exc, dsn)) from exc
    finally:
        await conn.close()


async def _require_queue(conn: Any, queue: str) -> Any:
    from fluxpg import db

    row = await conn.fetchrow(db.queries()["cli_queue"], queue)
    if row is None:
        raise CliError(f"unknown queue {queue!r} (see `fluxpg queues`)")
    return row


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


# --------------------------------------------------------------------------------------------
# dlq redrive
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# publish / tail
# --------------------------------------------------------------------------------------------

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
    if follow:
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
            # Woken by the NOTIFY of a committed append; the timeout is a safety net for a lost one.
            await wait_any(wake, stop, timeout=2.0)
    finally:
        if follow:
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


# --------------------------------------------------------------------------------------------
# commands of other parts of fluxpg
# --------------------------------------------------------------------------------------------

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


if __name__ == "__main__":
    main()
