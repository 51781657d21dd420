"""CPU accounting shared by the per-protocol CPU benchmarks (benchmarks/cpu/).

On a 2-core machine shared with other people's work, wall-clock throughput moves ±30 % between
runs; CPU time spent *by the server side* per message does not depend much on who else runs. So
each measured window snapshots utime+stime (/proc/<pid>/stat) of:

- fluxpg: the broker process (and its worker children) plus every PostgreSQL backend connected to
  the broker's own database (pg_stat_activity.datname; the benchmark's own bookkeeping connection
  goes to another database so it is not counted);
- the peer: its server process (RabbitMQ's `beam.smp`, `mosquitto`).

Not counted on either side: the client (same library for both), PostgreSQL's shared auxiliary
processes (walwriter, checkpointer: shared with everyone on the server), and a backend that
disconnected inside the window (the broker's pool keeps its connections, so this is rare).
"""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import urlsplit

import psycopg

TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[2]


def proc_ticks(pid: int) -> int | None:
    """utime + stime of one process in clock ticks (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def pids_named(comm: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == comm:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def backend_pids(admin_dsn: str, database: str) -> list[int]:
    """PostgreSQL backends connected to `database` (asked over a connection to another database)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,))]


class Meter:
    """CPU seconds of named groups of processes over a window: begin() ... end().

    A process that appears during the window (a new pool connection) counts from zero."""

    def __init__(self, groups: dict[str, Callable[[], Iterable[int]]]):
        self.groups = groups
        self._t0: dict[str, dict[int, int]] = {}

    def _snap(self) -> dict[str, dict[int, int]]:
        snap = {}
        for name, fn in self.groups.items():
            ticks = {}
            for pid in fn():
                t = proc_ticks(pid)
                if t is not None:
                    ticks[pid] = t
            snap[name] = ticks
        return snap

    def begin(self) -> None:
        self._t0 = self._snap()

    def end(self) -> dict[str, float]:
        t1 = self._snap()
        return {name: sum(t - self._t0.get(name, {}).get(pid, 0) for pid, t in ticks.items()) / TICKS
                for name, ticks in t1.items()}


@dataclass
class Sample:
    """One measured run: messages, wall seconds, CPU seconds per group, latencies (s)."""
    messages: int
    seconds: float
    cpu: dict[str, float]
    latencies: list[float] = field(default_factory=list)
    expected: int = 0          # messages sent; 0 = every message sent is counted in `messages`

    @property
    def complete(self) -> bool:
        """Every message sent arrived. A run in which the broker dropped some (Mosquitto's
        max_queued_messages, fluxpg's 0x97 for a subscriber past the session bound) did the
        work of `expected` messages but counts fewer: its figures per message are not comparable."""
        return not self.expected or self.messages >= self.expected

    def us_per_msg(self, *groups: str) -> float:
        return sum(self.cpu[g] for g in (groups or self.cpu)) / max(self.messages, 1) * 1e6

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("nan")

    def pct(self, p: float) -> float:
        if not self.latencies:
            return float("nan")
        v = sorted(self.latencies)
        return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] * 1e3


def median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dsn_database(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


class Broker:
    """`fluxpg serve` as a subprocess on free ports against `dsn` (a database of its own), and a
    Meter over it: groups `broker` (its process tree) and `pg` (backends of its database)."""

    def __init__(self, dsn: str, admin_dsn: str, config_yaml: str, listeners: Iterable[str], workers: int = 1,
                 repo: Path | None = None):
        # repo: run the fluxpg of another checkout (`python -m fluxpg.cli` from its directory),
        # to compare two versions in one interleaved run.
        self.dsn, self.admin_dsn = dsn, admin_dsn
        self.ports = {name: free_port() for name in listeners}
        self.http = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fluxpg-cpu-"))
        config = self.dir / "fluxpg.yaml"
        config.write_text(config_yaml)
        args = [sys.executable, "-m", "fluxpg.cli", "serve", "--config", str(config), "--dsn", dsn,
                "--http", f"127.0.0.1:{self.http}"]
        for name in ("mqtt", "amqp", "amqp091"):
            args += [f"--{name}", f"127.0.0.1:{self.ports[name]}" if name in self.ports else "off"]
        if workers > 1:
            args += ["--workers", str(workers)]
        self.log = self.dir / "broker.log"
        self.proc = subprocess.Popen(args, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=repo or REPO)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"broker did not start: {self.log.read_text()[-2000:]}")
                time.sleep(0.2)
        self.database = dsn_database(dsn)

    def pids(self) -> list[int]:
        return [self.proc.pid] + children(self.proc.pid)

    def meter(self) -> Meter:
        return Meter({"broker": self.pids, "pg": lambda: backend_pids(self.admin_dsn, self.database)})

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def peer_meter(comm: str) -> Meter:
    return Meter({comm: lambda: pids_named(comm)})


def load_note() -> str:
    return f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"


def fmt(x: float, digits: int = 0) -> str:
    return "–" if x != x else f"{x:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    return "–" if a != a or b != b or not b else f"{a / b:.2f}"
