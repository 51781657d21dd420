"""The embedded PostgreSQL (fluxpg.embedded) and the test-server chain (fluxpg.testing), run for real."""

from __future__ import annotations

import contextlib

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import asyncpg
import psutil
import psycopg
import pytest

from fluxpg import embedded
from fluxpg.embedded import PGSERVER_MISSING, EmbeddedPostgres, EmbeddedPostgresError, postgres_processes
from fluxpg.testing import (
    _docker_postgres,
    drop_stale_test_databases,
    dsn_with_database,
    fresh_database,
    test_server,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tmp_path():
    """A private temporary directory outside pytest's basetemp.

    As root the server runs as the `pgserver` user, which must traverse the data directory's
    parents; fluxpg opens them (o+rx), but every pytest session starting meanwhile resets
    /tmp/pytest-of-<user> to 0700, which made starts under pytest's tmp_path flaky when other
    pytest sessions run in parallel.
    """
    path = Path(tempfile.mkdtemp(prefix="fluxpg-embedded-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def select_one(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select 1").fetchone()[0]


# -- embedded --------------------------------------------------------------------------------------


def test_default_data_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert embedded.default_data_dir() == tmp_path / "fluxpg" / "pgdata"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert embedded.default_data_dir() == Path.home() / ".local" / "share" / "fluxpg" / "pgdata"
    assert EmbeddedPostgres().data_dir == Path.home() / ".local" / "share" / "fluxpg" / "pgdata"


def test_missing_pgserver_is_one_clear_line(monkeypatch, tmp_path):
    # None in sys.modules makes the import raise ImportError, as if pgserver were not installed.
    monkeypatch.setitem(sys.modules, "pgserver", None)
    monkeypatch.setitem(sys.modules, "pgserver._commands", None)
    with pytest.raises(EmbeddedPostgresError) as err:
        EmbeddedPostgres(tmp_path / "pgdata").start()
    assert str(err.value) == PGSERVER_MISSING
    assert "\n" not in str(err.value)
    assert not (tmp_path / "pgdata").exists()


def test_start_connect_stop_leaves_no_server(tmp_path):
    data_dir = tmp_path / "pgdata"
    pg = EmbeddedPostgres(data_dir)
    with pytest.raises(EmbeddedPostgresError, match="not running"):
        pg.dsn
    with pg:
        assert pg.running and pg.pid in postgres_processes(data_dir)
        assert pg.dsn.startswith("postgresql://postgres@/postgres?host=")
        assert select_one(pg.dsn) == 1
    assert not pg.running
    assert postgres_processes(data_dir) == []
    pg.stop()  # idempotent
    assert postgres_processes(data_dir) == []


async def test_dsn_works_with_asyncpg_and_sqlalchemy(tmp_path):
    import sqlalchemy

    async with EmbeddedPostgres(tmp_path / "pgdata", durable=False) as pg:
        conn = await asyncpg.connect(pg.dsn)
        try:
            assert await conn.fetchval("select current_user") == "postgres"
        finally:
            await conn.close()
        engine = sqlalchemy.create_engine(pg.dsn.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.text("select 2")).scalar() == 2
        finally:
            engine.dispose()
        other = pg.dsn_for("template1")
        assert select_one(other) == 1
    assert postgres_processes(tmp_path / "pgdata") == []


def test_data_persists_across_restarts(tmp_path):
    data_dir = tmp_path / "pgdata"
    with EmbeddedPostgres(data_dir) as pg:
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("create table kept (id int primary key, note text)")
            conn.execute("insert into kept values (1, 'survives a restart')")
    assert postgres_processes(data_dir) == []
    with EmbeddedPostgres(data_dir) as pg:
        assert not pg.adopted
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("select note from kept where id = 1").fetchone() == ("survives a restart",)


def test_second_owner_of_a_data_dir_gets_a_clear_error(tmp_path):
    data_dir = tmp_path / "pgdata"
    with EmbeddedPostgres(data_dir) as first:
        with pytest.raises(EmbeddedPostgresError, match="is in use by another fluxpg"):
            EmbeddedPostgres(data_dir).start()
        # The refused start must not have disturbed the running server.
        assert select_one(first.dsn) == 1


def test_foreign_directory_is_refused(tmp_path):
    data_dir = tmp_path / "pgdata"
    data_dir.mkdir()
    (data_dir / "notes.txt").write_text("not a database")
    with pytest.raises(EmbeddedPostgresError, match="not empty and is not a PostgreSQL data directory"):
        EmbeddedPostgres(data_dir).start()
    assert (data_dir / "notes.txt").read_text() == "not a database"
    # The failed start released the lock: a fixed directory starts.
    (data_dir / "notes.txt").unlink()
    with EmbeddedPostgres(data_dir) as pg:
        assert select_one(pg.dsn) == 1


OWNER = textwrap.dedent("""
    import sys, time
    from fluxpg.embedded import EmbeddedPostgres
    pg = EmbeddedPostgres(sys.argv[1], tcp=sys.argv[2] == "tcp").start()
    print(pg.pid, flush=True)
    time.sleep(120)
""")


def start_owner(data_dir: Path, *, tcp: bool = False) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(data_dir), "tcp" if tcp else ""],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"owner did not start a server (exit {proc.poll()})"
    return proc, int(line)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_server_stops_when_its_owner_dies(tmp_path, sig):
    data_dir = tmp_path / "pgdata"
    owner, pid = start_owner(data_dir)
    try:
        assert pid in postgres_processes(data_dir)
        owner.send_signal(sig)
        owner.wait(timeout=10)
        wait_until(lambda: postgres_processes(data_dir) == [], what="the watchdog to stop the server")
        # …and the data directory is free again once the watchdog is done.
        wait_until(lambda: _can_start(data_dir), what="the data directory lock to be released")
    finally:
        owner.kill()
        owner.wait()


def _can_start(data_dir: Path) -> bool:
    try:
        with EmbeddedPostgres(data_dir) as pg:
            return select_one(pg.dsn) == 1
    except EmbeddedPostgresError:
        return False


def test_orphaned_server_is_adopted_and_stopped(tmp_path):
    data_dir = tmp_path / "pgdata"
    owner, pid = start_owner(data_dir, tcp=True)
    # Kill the watchdog first, then the owner: the server is left running with nobody to stop it.
    watchdogs: list[psutil.Process] = []

    def find_watchdog() -> bool:
        # Waited for, not assumed: under load the child list and its command line may lag.
        with contextlib.suppress(psutil.Error):
            watchdogs[:] = [p for p in psutil.Process(owner.pid).children()
                            if "_watchdog_main" in " ".join(p.cmdline())]
        return len(watchdogs) == 1

    wait_until(find_watchdog, what="the owner's watchdog")
    watchdog = watchdogs[0]
    watchdog.kill()
    # Our child's child: it stays a zombie until the owner reaps it, so wait for either state.
    wait_until(lambda: not watchdog.is_running() or watchdog.status() == psutil.STATUS_ZOMBIE,
               what="the watchdog to die")
    owner.kill()
    owner.wait()
    assert postgres_processes(data_dir), "the orphan should still be running"
    owner_port = int((data_dir / "postmaster.pid").read_text().splitlines()[3])

    with EmbeddedPostgres(data_dir, tcp=True) as pg:
        assert pg.adopted and pg.pid == pid
        # The adopter reaches it on the port the dead owner chose (a free port, not 5432).
        assert pg.dsn.endswith(f":{owner_port}/postgres") and select_one(pg.dsn) == 1
    # stop() returns once the postmaster is gone; the process table may show it a moment longer.
    wait_until(lambda: postgres_processes(data_dir) == [], what="the adopted server to stop")


# -- testing: the server chain and fresh databases ---------------------------------------------------


def test_env_dsn_comes_first(monkeypatch):
    monkeypatch.setenv("FLUXPG_TEST_DSN", "postgresql://someone@db.example:6543/x")
    with test_server() as dsn:
        assert dsn == "postgresql://someone@db.example:6543/x"


def test_without_docker_the_chain_falls_back_fast_to_embedded(monkeypatch):
    monkeypatch.delenv("FLUXPG_TEST_DSN", raising=False)
    # Make sure no engine answers, even on a machine that has one.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    # Imported first: on a loaded machine the first import of testcontainers and docker alone took
    # over a second. What is timed is the fallback, which must not wait on the Docker client's
    # connection timeout (60 s by default).
    with contextlib.suppress(ImportError):   # without them the fallback is immediate anyway
        import docker.errors  # noqa: F401
        import testcontainers.community.postgres  # noqa: F401
    started = time.monotonic()
    assert _docker_postgres() is None
    assert time.monotonic() - started < 5.0

    started = time.monotonic()
    with test_server() as dsn:
        assert time.monotonic() - started < 15.0
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            data_dir = Path(conn.execute("show data_directory").fetchone()[0])
        assert postgres_processes(data_dir)
    assert postgres_processes(data_dir) == []
    assert not data_dir.exists(), "the temporary directory is removed"


def test_chain_survives_missing_testcontainers(monkeypatch):
    monkeypatch.setitem(sys.modules, "testcontainers.community.postgres", None)
    assert _docker_postgres() is None


def test_dsn_with_database_keeps_host_and_query():
    assert dsn_with_database("postgresql://postgres@/postgres?host=/tmp/s&port=5432", "db_1") == \
        "postgresql://postgres@/db_1?host=/tmp/s&port=5432"
    assert dsn_with_database("postgres://u:p@h:5/a", "b") == "postgres://u:p@h:5/b"
    with pytest.raises(ValueError, match="postgresql://"):
        dsn_with_database("host=localhost dbname=x", "y")


@pytest.fixture(scope="module")
def server_dsn():
    with test_server() as dsn:
        yield dsn


def database_exists(server_dsn: str, name: str) -> bool:
    with psycopg.connect(server_dsn) as conn:
        return conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone() is not None


async def test_fresh_database_is_created_and_dropped(server_dsn):
    with fresh_database(server_dsn) as dsn:
        name = dsn.split("?")[0].rsplit("/", 1)[1]
        assert name.startswith("fluxpg_test_")
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select current_database()").fetchone() == (name,)
            conn.execute("create table t (x int)")
        # A connection left open does not stop the drop (WITH (FORCE)).
        lingering = await asyncpg.connect(dsn)
        assert await lingering.fetchval("select count(*) from t") == 0
    assert not database_exists(server_dsn, name)
    assert lingering.is_closed() or not await _alive(lingering)


async def _alive(conn) -> bool:
    try:
        await conn.fetchval("select 1")
        return True
    except Exception:
        return False


def test_stale_test_databases_are_dropped(server_dsn):
    stale = f"fluxpg_test_{int(time.time()) - 3 * 86400}_dead"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{stale}"')
    with fresh_database(server_dsn) as dsn:
        current = dsn.split("?")[0].rsplit("/", 1)[1]
        assert not database_exists(server_dsn, stale)
        # A young database (another run's) is left alone.
        assert current not in drop_stale_test_databases(server_dsn)
        assert database_exists(server_dsn, current)
