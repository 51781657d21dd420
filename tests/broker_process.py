"""A fluxpg broker in a child process (`python -m fluxpg.cli serve`), for tests that kill -9 it,
restart it or measure its memory. Its log goes to a file, never to a pipe nobody reads (a full
pipe blocks the broker mid-start); a broker that does not come up fails the test with that log's
tail and what PostgreSQL's sessions were waiting on at the time."""
from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

START_TIMEOUT = 90.0   # a loaded 2-core CI machine: migration check, routines, listeners


def free_port() -> int:
    """A port nothing listens on now, for a child process to bind a moment later. Drawn from
    below the kernel's ephemeral range (ip_local_port_range), not by bind(0) from inside it:
    every outgoing connection (each one to PostgreSQL, say) takes its local port from that range
    and could take the port in the seconds before the child binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue   # something has it
            return port
    with socket.socket() as s:   # that whole band busy: the ephemeral range after all
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_ready(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return True
        except OSError:
            return False
    return ready


def http_ready(port: int) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False
    return ready


def database_waits(dsn: str) -> str:
    """Who waits on what in the test database: the first thing to read when a start hangs."""
    import asyncpg

    async def run() -> str:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT pid, state, wait_event_type, wait_event, pg_blocking_pids(pid) AS blocked_by,"
                "       now() - xact_start AS xact_age, left(query, 160) AS query"
                "  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
            return "\n".join(str(dict(r)) for r in rows)
        finally:
            await conn.close()
    result: list[str] = []

    def in_thread() -> None:   # callers may be inside a running event loop
        try:
            result.append(asyncio.run(run()))
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            result.append(f"(pg_stat_activity unavailable: {exc})")
    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(30)
    return result[0] if result else "(pg_stat_activity did not answer)"


class BrokerProcess:
    """`args` are the serve flags; `ready` says when it is up (default: the first TCP port in args
    or an explicit `port` accepts connections)."""

    def __init__(self, dsn: str, args: list[str], ready: Callable[[], bool], env: dict | None = None,
                 name: str = "broker"):
        self.dsn, self.args, self.ready, self.name = dsn, args, ready, name
        self.env = {**os.environ, "FLUXPG_DSN": dsn, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"fluxpg-{name}-", suffix=".log", delete=False)  # noqa: SIM115 - lives as long as the process

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log.name, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "fluxpg.cli", "serve", *self.args],
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        started = time.monotonic()
        while time.monotonic() - started < START_TIMEOUT:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start in {START_TIMEOUT:.0f} s; its log:\n{self.log_tail()}\n"
                           f"database sessions:\n{database_waits(self.dsn)}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)
