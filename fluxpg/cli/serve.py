"""`fluxpg serve`: the broker, one process or `--workers N` under a supervisor that restarts
crashed workers; listener checks, the start banner, signals.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fluxpg import __version__, aio
from fluxpg.cli.app import ConfigOpt, DataDirOpt, DsnOpt, STATE, app, setup_logging
from fluxpg.cli.database import _load_config, connect, redact_dsn
from fluxpg.cli.errors import CONNECT_TIMEOUT, CliError, _command, describe_error
from fluxpg.config import Config, parse_address
from fluxpg.embedded import EmbeddedPostgres, default_data_dir
from fluxpg.protocols.listener import ListenerError

log = logging.getLogger("fluxpg.cli")

LISTENERS = ("mqtt", "amqp", "amqp091", "http", "ws")
LISTENER_TITLES = {"mqtt": "MQTT", "amqp": "AMQP 1.0", "amqp091": "AMQP 0-9-1", "http": "HTTP admin", "ws": "MQTT over WebSocket"}
# How long a starting worker may take to report ready; one that does not, or exits first, failed to start.
WORKER_READY_TIMEOUT = 120.0
WORKER_STOP_TIMEOUT = 30.0
READY_LINE = b"fluxpg-worker-ready\n"


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
        code = aio.run(_run_worker(dsn, config, overrides, worker, parent_pid))
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
        code = aio.run(_serve_main(config, dsn, directory, overrides, listeners, workers, config_file))
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
        # What the start left alive (modules, config, pools: alive as long as the process) leaves
        # the collector's generations: under load every full collection walked all of it again,
        # ~50 ms each -- ~10 % of the broker's CPU in the MQTT durable-queue benchmark (gc
        # callbacks: 2 full collections per 10,000 messages, 103 ms; 2.4 ms after this).
        gc.collect()
        gc.freeze()
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
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
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
            # is up. (Concurrent declarations of one queue would only wait for each other on
            # declare_queue's per-name lock; staggered, the others find the queues made.)
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
