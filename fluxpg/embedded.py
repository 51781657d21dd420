"""A private PostgreSQL for ``fluxpg serve`` when no DSN is configured.

The server binaries (PostgreSQL 16) come from the ``pgserver`` package (extra ``fluxpg[embedded]``).
We use its binaries and its helpers for running as root, but not its ``PostgresServer`` lifecycle,
because that lifecycle does not give the guarantees a broker needs (read from pgserver 0.1.4):

* ``PostgresServer`` shares one server among processes by reference counting: each process appends
  its pid to ``<pgdata>/.handle_pids.json`` and the last one to leave stops the server. A process that
  dies without cleaning up (SIGKILL, OOM) leaves its pid in that list forever, so no later process
  ever stops the server again.
* Its cleanup runs from ``atexit``, which Python does not run when the process dies of SIGTERM or
  SIGKILL: the server outlives the broker. (pg_ctl puts the postmaster in its own session, so a
  Ctrl-C in the terminal does not reach it either; someone has to stop it.)
* Errors surface as a bare ``CalledProcessError``; the reason is only in pgserver's log.

So here one data directory belongs to one fluxpg process at a time (an exclusive ``flock`` on
``<data_dir>.lock``, which the kernel releases however the process ends), the server is started and
stopped with ``pg_ctl`` directly, and a small watchdog process stops the server if the owning process
disappears without calling :meth:`EmbeddedPostgres.stop` — SIGTERM with no handler, SIGKILL, a crash.
A server left running by a watchdog that was itself killed is adopted by the next start (we hold the
lock, so it cannot belong to anyone else) and stopped normally afterwards.

The server listens on a unix socket only (no TCP port to collide with), trust authentication, user
``postgres``. As root, PostgreSQL refuses to run as the superuser, so (like pgserver) the server runs
as a system user ``pgserver`` created on first use, and the data directory's parents are made
traversable (g+rx, o+rx) for that user.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import fcntl
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PGSERVER_MISSING",
    "default_data_dir",
    "postgres_processes",
]

log = logging.getLogger(__name__)

PGSERVER_MISSING = "embedded PostgreSQL needs `pip install 'fluxpg[embedded]'` or pass --dsn"

# System user the server runs as when we are root (the name pgserver uses, so both tools agree).
_ROOT_SYSTEM_USER = "pgserver"
_LOG_NAME = "fluxpg-postgres.log"
_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 30
# How long a start waits for the lock when its recorded owner is already dead (its watchdog is
# still stopping the server it left behind).
_LOCK_WAIT_S = _STOP_TIMEOUT_S + 10
_WATCHDOG_DONE = b"stopped\n"


class EmbeddedPostgresError(RuntimeError):
    """A one-line, user-facing reason why the embedded server could not start or stop."""


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/fluxpg/pgdata``, else ``~/.local/share/fluxpg/pgdata``."""
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if base.strip() else Path.home() / ".local" / "share"
    return root / "fluxpg" / "pgdata"


def postgres_processes(data_dir: Path | str) -> list[int]:
    """PIDs of ``postgres`` processes whose command line names ``data_dir`` (tests, diagnostics)."""
    import psutil  # a dependency of pgserver

    target = str(Path(data_dir).expanduser().resolve())
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("name") == "postgres" and target in cmdline:
            found.append(proc.pid)
    return found


def _runtime_dir() -> Path:
    """``$XDG_RUNTIME_DIR/fluxpg``, else ``<tmp>/fluxpg-<uid>`` (short paths: they hold sockets)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "fluxpg"
    return Path(tempfile.gettempdir()) / f"fluxpg-{os.getuid()}"


def _pgserver_bin() -> Path:
    """Directory of pgserver's PostgreSQL binaries; the one-line error when pgserver is missing."""
    try:
        # Importing pgserver evaluates platformdirs.user_runtime_path(), which warns when
        # XDG_RUNTIME_DIR is unset (containers, CI); we do not use that path.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError:
        raise EmbeddedPostgresError(PGSERVER_MISSING) from None
    return Path(POSTGRES_BIN_PATH)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_postmaster_pid(data_dir: Path) -> tuple[int, Path | None] | None:
    """(pid, socket dir) from ``postmaster.pid`` when it names a live postgres for this directory."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    if not _pid_alive(pid):
        return None
    try:
        import psutil

        proc = psutil.Process(pid)
        # A stale pid file whose pid now belongs to an unrelated process must not be adopted.
        if proc.name() != "postgres":
            return None
    except Exception:  # psutil missing or the process vanished meanwhile
        return None
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None
    return pid, socket_dir


def _read_postmaster_port(data_dir: Path) -> int | None:
    """The port line of ``postmaster.pid`` (its 4th line), None when it cannot be read."""
    try:
        return int((data_dir / "postmaster.pid").read_text().splitlines()[3])
    except (OSError, ValueError, IndexError):
        return None


def _run(cmd: list[str], *, user: str | None, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    # Output goes to temporary files, not pipes: the postmaster started by pg_ctl would inherit a
    # pipe and keep it open, and reading it would then never end (pgserver notes the same hang).
    # The cwd must be readable by the server's user; the data directory may be gone (deleted while
    # an orphaned server still runs), and "/" always works.
    cwd = cwd if cwd.is_dir() else Path("/")
    with tempfile.TemporaryFile() as out:
        kwargs = {"user": user} if user else {}
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=cwd, timeout=timeout, check=False, **kwargs,
        )
        out.seek(0)
        proc.stdout = out.read().decode(errors="replace")
    return proc


def _stop_server(bin_dir: Path, data_dir: Path, user: str | None, pid: int | None) -> bool:
    """Stop the server of ``data_dir``; True when no postmaster is left. Escalates fast → immediate → kill."""
    if pid is None:
        found = _read_postmaster_pid(data_dir)
        if found is None:
            return True
        pid = found[0]
    try:
        # fast: roll back open transactions and disconnect clients, then a clean checkpoint.
        _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "stop", "-m", "fast", "-w",
              "-t", str(_STOP_TIMEOUT_S)], user=user, cwd=data_dir, timeout=_STOP_TIMEOUT_S + 5)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("pg_ctl stop failed for %s: %s", data_dir, exc)
    for sig, wait_s in ((None, 1.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                log.warning("embedded PostgreSQL (pid %d) still running, sending %s", pid, sig.name)
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _pid_alive(pid) or _is_zombie(pid):
                return True
            time.sleep(0.05)
    return not _pid_alive(pid)


def _is_zombie(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:
        return False


class EmbeddedPostgres:
    """A private PostgreSQL 16 on a unix socket, with its data in ``data_dir`` (kept across runs).

    ``with EmbeddedPostgres() as pg: connect(pg.dsn)``; from asyncio ``async with`` runs start and
    stop in a thread. :meth:`stop` is idempotent and safe to call from ``finally`` blocks and signal
    handling; a watchdog process stops the server anyway if this process dies without calling it.

    ``durable=False`` turns off fsync and synchronous commit: for throwaway test servers only.
    """

    def __init__(self, data_dir: Path | str | None = None, *, durable: bool = True, tcp: bool = False) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
        self.durable = durable
        # tcp=True also listens on 127.0.0.1 (a free port): JDBC (Spark) cannot use a unix socket.
        self.tcp = tcp
        self._port = 5432
        # Reentrant: stop() may run from a signal handler that interrupted start() in this thread.
        self._state_lock = threading.RLock()
        self._lock_fd: int | None = None
        self._watchdog: subprocess.Popen | None = None
        self._watchdog_pipe: int | None = None
        self._pid: int | None = None
        self._socket_dir: Path | None = None
        self._user: str | None = None
        self._bin: Path | None = None
        self.adopted = False  # True when start() took over a server left running by a dead owner

    # -- public API -----------------------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".lock")

    @property
    def running(self) -> bool:
        return self._pid is not None

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def socket_dir(self) -> Path:
        if self._socket_dir is None:
            raise EmbeddedPostgresError("embedded PostgreSQL is not running")
        return self._socket_dir

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@/postgres?host=<socket dir>&port=5432`` (asyncpg, psycopg, SQLAlchemy)."""
        return self.dsn_for("postgres")

    def dsn_for(self, database: str) -> str:
        if self.tcp:
            self.socket_dir  # raises when not running
            return f"postgresql://postgres@127.0.0.1:{self._port}/{quote(database, safe='')}"
        # The port names the socket file (.s.PGSQL.5432); given explicitly so PGPORT cannot change it.
        host = quote(str(self.socket_dir), safe="/")
        return f"postgresql://postgres@/{quote(database, safe='')}?host={host}&port={self._port}"

    def start(self) -> "EmbeddedPostgres":
        with self._state_lock:
            if self._pid is not None:
                return self
            self._bin = _pgserver_bin()
            self._acquire_lock()
            try:
                self._prepare_data_dir()
                self._start_or_adopt()
                self._start_watchdog()
            except OSError as exc:  # permissions, disk full, …: one line, not a traceback
                self._stop_locked()
                where = f" ({exc.filename})" if exc.filename else ""
                raise EmbeddedPostgresError(
                    f"embedded PostgreSQL at {self.data_dir}: {exc.strerror or exc}{where}") from exc
            except BaseException:
                self._stop_locked()
                raise
            atexit.register(self.stop)
            log.info("embedded PostgreSQL %s (pid %d) at %s", "adopted" if self.adopted else "started",
                     self._pid, self.data_dir)
            return self

    def stop(self) -> None:
        """Stop the server and release the data directory. Idempotent."""
        with self._state_lock:
            self._stop_locked()

    async def astart(self) -> "EmbeddedPostgres":
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> "EmbeddedPostgres":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> "EmbeddedPostgres":
        return await self.astart()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.astop()

    def __repr__(self) -> str:
        state = f"pid {self._pid}" if self._pid else "stopped"
        return f"EmbeddedPostgres({str(self.data_dir)!r}, {state})"

    # -- lock ---------------------------------------------------------------------------------------

    def _acquire_lock(self) -> None:
        try:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise EmbeddedPostgresError(
                f"cannot use data directory {self.data_dir}: {exc.strerror}") from None
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise EmbeddedPostgresError(f"cannot lock {self.lock_path}: {exc.strerror}") from None
            owner = self._lock_owner(fd)
            if owner is not None and owner != os.getpid() and not _pid_alive(owner) \
                    and time.monotonic() < deadline:
                # The owner died; its watchdog holds the lock until it has stopped the server.
                time.sleep(0.1)
                continue
            os.close(fd)
            if owner is not None and owner != os.getpid() and not _pid_alive(owner):
                raise EmbeddedPostgresError(
                    f"data directory {self.data_dir} is still locked: its previous owner (pid {owner}) "
                    f"exited and the server it left is still being stopped; see {self.lock_path}")
            who = "this process" if owner == os.getpid() else f"pid {owner}" if owner else "another process"
            raise EmbeddedPostgresError(
                f"data directory {self.data_dir} is in use by another fluxpg ({who}); "
                "stop it, or pass --dsn or another data directory")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    @staticmethod
    def _lock_owner(fd: int) -> int | None:
        try:
            return int(os.pread(fd, 32, 0).decode().strip() or "x")
        except (OSError, ValueError):
            return None

    # -- start --------------------------------------------------------------------------------------

    def _prepare_data_dir(self) -> None:
        assert self._bin is not None
        data_dir = self.data_dir
        if data_dir.exists() and not data_dir.is_dir():
            raise EmbeddedPostgresError(f"data directory {data_dir} exists and is not a directory")
        data_dir.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            self._prepare_for_root()
        version_file = data_dir / "PG_VERSION"
        binary_major = self._binary_major()
        if version_file.exists():
            have = version_file.read_text().strip()
            if have != binary_major:
                raise EmbeddedPostgresError(
                    f"data directory {data_dir} holds PostgreSQL {have} data but the embedded server is "
                    f"PostgreSQL {binary_major}; use another data directory or pass --dsn")
            return
        if any(data_dir.iterdir()):
            raise EmbeddedPostgresError(
                f"data directory {data_dir} is not empty and is not a PostgreSQL data directory")
        # --no-locale: the same collation everywhere, independent of the host's installed locales.
        cmd = [str(self._bin / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust",
               "--encoding=UTF8", "--no-locale"]
        if not self.durable:
            cmd.append("--no-sync")
        proc = _run(cmd, user=self._user, cwd=data_dir, timeout=120)
        if proc.returncode != 0:
            reason = proc.stdout.strip().splitlines()[-1:] or ["no output"]
            raise EmbeddedPostgresError(f"initdb failed for {data_dir}: {reason[0]}")

    def _prepare_for_root(self) -> None:
        # PostgreSQL refuses to run as root. Same steps as pgserver's PostgresServer as root.
        import stat

        from pgserver.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        assert self._bin is not None
        try:
            entry = ensure_user_exists(_ROOT_SYSTEM_USER)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise EmbeddedPostgresError(
                f"running as root: cannot create the system user {_ROOT_SYSTEM_USER!r} for PostgreSQL "
                f"({exc}); run fluxpg as an ordinary user or pass --dsn") from None
        assert entry is not None
        self._user = _ROOT_SYSTEM_USER
        ensure_prefix_permissions(self.data_dir)
        ensure_prefix_permissions(self._bin)
        read = stat.S_IRGRP | stat.S_IROTH
        ensure_folder_permissions(self._bin, read | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(self._bin.parent / "lib", read)
        if self.data_dir.stat().st_uid != entry.pw_uid:
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def _binary_major(self) -> str:
        assert self._bin is not None
        out = subprocess.run([str(self._bin / "postgres"), "--version"], capture_output=True,
                             text=True, check=False).stdout
        # "postgres (PostgreSQL) 16.2" → "16"
        try:
            return out.split()[-1].split(".")[0]
        except IndexError:
            raise EmbeddedPostgresError(f"cannot run {self._bin / 'postgres'}") from None

    def _start_or_adopt(self) -> None:
        assert self._bin is not None
        found = _read_postmaster_pid(self.data_dir)
        if found is not None and found[1] is not None and found[1].is_dir():
            # We hold the lock, so this server belongs to a fluxpg that died (and whose watchdog
            # died too). Take it over: it is stopped like one we started.
            self._pid, self._socket_dir = found
            # The port it listens on (socket file name, TCP) is the dead owner's choice, not ours.
            port = _read_postmaster_port(self.data_dir)
            if port is not None:
                self._port = port
            self.adopted = True
            return
        if found is not None:
            _stop_server(self._bin, self.data_dir, self._user, found[0])

        from pgserver.utils import ensure_prefix_permissions, find_suitable_socket_dir

        # The socket goes into the data directory unless that path is too long for a unix socket
        # (~107 bytes); then into a per-directory folder of the user's runtime directory.
        socket_dir = find_suitable_socket_dir(self.data_dir, _runtime_dir())
        if self._user is not None and socket_dir != self.data_dir:
            ensure_prefix_permissions(socket_dir)
            socket_dir.chmod(0o777)
        if self.tcp and self._port == 5432:   # chosen once: a restart keeps the DSN valid
            import socket as _socket

            with _socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self._port = probe.getsockname()[1]
        listen = "127.0.0.1" if self.tcp else "''"
        options = f"-h {listen} -k {shlex.quote(str(socket_dir))} -p {self._port}"
        if not self.durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        log_file = self.data_dir / _LOG_NAME
        cmd = [str(self._bin / "pg_ctl"), "-D", str(self.data_dir), "-o", options, "-l", str(log_file),
               "-w", "-t", str(_START_TIMEOUT_S), "start"]
        try:
            proc = _run(cmd, user=self._user, cwd=self.data_dir, timeout=_START_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            raise EmbeddedPostgresError(
                f"embedded PostgreSQL did not start within {_START_TIMEOUT_S} s; see {log_file}") from None
        found = _read_postmaster_pid(self.data_dir)
        if proc.returncode != 0 or found is None:
            detail = _tail(log_file) or proc.stdout.strip().replace("\n", " | ")
            raise EmbeddedPostgresError(f"embedded PostgreSQL failed to start: {detail} (log: {log_file})")
        self._pid, self._socket_dir = found[0], socket_dir

    def _start_watchdog(self) -> None:
        assert self._bin is not None and self._lock_fd is not None
        # The watchdog inherits the lock (same open file description), so the data directory stays
        # locked until the server is really down, even when we die first. It lives in its own
        # session so a terminal Ctrl-C reaches only us; we stop the server in our own finally.
        read_end, write_end = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", "from fluxpg.embedded import _watchdog_main; _watchdog_main()",
                 str(self._bin), str(self.data_dir), self._user or "", str(self._pid), str(self._lock_fd)],
                stdin=read_end, stdout=subprocess.DEVNULL, stderr=None,
                pass_fds=(self._lock_fd,), start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                    str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))},
            )
        finally:
            os.close(read_end)
        self._watchdog_pipe = write_end

    # -- stop ---------------------------------------------------------------------------------------

    def _stop_locked(self) -> None:
        try:
            if self._pid is not None and self._bin is not None:
                if not _stop_server(self._bin, self.data_dir, self._user, self._pid):
                    log.error("could not stop embedded PostgreSQL (pid %d) at %s", self._pid, self.data_dir)
                else:
                    log.info("embedded PostgreSQL stopped (%s)", self.data_dir)
        finally:
            self._pid = None
            self._socket_dir = None
            self._release_watchdog()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)

    def _release_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        pipe, self._watchdog_pipe = self._watchdog_pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                os.write(pipe, _WATCHDOG_DONE)
            os.close(pipe)
        if watchdog is not None:
            try:
                watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()


def _watchdog_main() -> None:
    """Entry of the watchdog process: wait for the owner to go away, then stop its server.

    argv: bin_dir data_dir user pid lock_fd. stdin is a pipe from the owner: ``stopped`` means the
    owner stopped the server itself; end of file without it means the owner died.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    bin_dir, data_dir, user, pid, _lock_fd = sys.argv[1:6]
    received = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        received += chunk
    if _WATCHDOG_DONE in received:
        return
    logging.basicConfig(level=logging.INFO, format="fluxpg embedded watchdog: %(message)s")
    log.warning("owner process died; stopping embedded PostgreSQL at %s", data_dir)
    _stop_server(Path(bin_dir), Path(data_dir), user or None, int(pid))
    # The lock is released when this process exits (it holds the inherited descriptor).
