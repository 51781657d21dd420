"""PostgreSQL servers and throwaway databases for fluxpg's tests (and anyone testing against fluxpg).

``test_server()`` finds a server, in this order (DESIGN §5):

1. ``FLUXPG_TEST_DSN`` — an existing server (CI and this machine: the local PostgreSQL);
2. a testcontainers ``postgres:16`` when a Docker engine answers — testcontainers raises
   ``DockerException`` from the constructor within milliseconds when none does;
3. an :class:`~fluxpg.embedded.EmbeddedPostgres` in a temporary directory, removed afterwards.

``fresh_database(server_dsn)`` then creates ``fluxpg_test_<time>_<random>`` on that server, yields its
DSN and drops it (``WITH (FORCE)``) afterwards, so tests never touch anyone's data.

Typical conftest::

    @pytest.fixture(scope="session")
    def pg_server():
        with test_server() as dsn:
            yield dsn

    @pytest.fixture
    def database(pg_server):
        with fresh_database(pg_server) as dsn:
            yield dsn
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from fluxpg.db import queries

__all__ = ["test_server", "fresh_database", "dsn_with_database", "drop_stale_test_databases",
           "TEST_DATABASE_PREFIX", "DOCKER_IMAGE"]

log = logging.getLogger(__name__)

TEST_DATABASE_PREFIX = "fluxpg_test_"
TESTING_QUERIES = "testing_queries.sql"
DOCKER_IMAGE = "postgres:16"
# Databases of killed test runs are dropped by later runs once they are this old.
STALE_AFTER_S = 24 * 3600


@contextmanager
def test_server() -> Iterator[str]:
    """Yield the DSN of a PostgreSQL server on which the caller may create and drop databases."""
    dsn = os.environ.get("FLUXPG_TEST_DSN", "").strip()
    if dsn:
        log.info("test server: FLUXPG_TEST_DSN")
        yield dsn
        return

    container = _docker_postgres()
    if container is not None:
        try:
            container.start()
        except Exception as exc:  # engine answers but cannot run the image (offline pull, …)
            warnings.warn(f"Docker answers but {DOCKER_IMAGE} did not start ({exc}); "
                          "using the embedded PostgreSQL", RuntimeWarning, stacklevel=3)
            container = None
    if container is not None:
        log.info("test server: testcontainers %s", DOCKER_IMAGE)
        try:
            yield container.get_connection_url(driver=None)
        finally:
            container.stop()
        return

    from fluxpg.embedded import EmbeddedPostgres

    tmp = Path(tempfile.mkdtemp(prefix="fluxpg-test-"))
    try:
        # durable=False: no fsync; the directory is deleted afterwards anyway.
        with EmbeddedPostgres(tmp / "pgdata", durable=False, tcp=True) as pg:
            log.info("test server: embedded PostgreSQL in %s", tmp)
            yield pg.dsn
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# A function named test_* would be collected by pytest wherever it is imported into a test module.
test_server.__test__ = False  # type: ignore[attr-defined]


def _docker_postgres():
    """A not yet started PostgresContainer, or None when testcontainers or a Docker engine is missing."""
    try:
        from docker.errors import DockerException
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        return None
    try:
        return PostgresContainer(DOCKER_IMAGE, driver=None)
    except DockerException as exc:
        log.debug("no Docker engine: %s", exc)
        return None


def dsn_with_database(dsn: str, database: str) -> str:
    """``dsn`` (a ``postgresql://`` URI) pointing at ``database`` instead; query parameters kept."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"expected a postgresql:// DSN, got {dsn.split(':', 1)[0]!r}...")
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


@contextmanager
def fresh_database(server_dsn: str) -> Iterator[str]:
    """Create an empty database on ``server_dsn``'s server, yield its DSN, drop it afterwards."""
    import psycopg
    from psycopg import sql

    name = f"{TEST_DATABASE_PREFIX}{int(time.time())}_{secrets.token_hex(4)}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        _drop_stale(conn)
        conn.execute(_sql("create_database").format(sql.Identifier(name)))
    try:
        yield dsn_with_database(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(_sql("drop_database_force").format(sql.Identifier(name)))


def drop_stale_test_databases(server_dsn: str, older_than_s: float = STALE_AFTER_S) -> list[str]:
    """Drop test databases left by killed runs (older than ``older_than_s``, nobody connected)."""
    import psycopg

    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return _drop_stale(conn, older_than_s)


def _sql(name: str):
    """A named statement of sql/testing_queries.sql, its {} to be filled with an identifier."""
    from psycopg import sql

    return sql.SQL(queries(TESTING_QUERIES)[name])


def _drop_stale(conn, older_than_s: float = STALE_AFTER_S) -> list[str]:
    import psycopg
    from psycopg import sql

    rows = conn.execute(queries(TESTING_QUERIES)["test_databases"],
                        (TEST_DATABASE_PREFIX.replace("_", r"\_") + "%",)).fetchall()
    dropped = []
    now = time.time()
    for (name,) in rows:
        try:
            created = int(name[len(TEST_DATABASE_PREFIX):].split("_", 1)[0])
        except ValueError:
            continue
        if now - created < older_than_s:
            continue
        try:
            conn.execute(_sql("drop_database").format(sql.Identifier(name)))
            dropped.append(name)
        except psycopg.Error:  # in use, or not ours to drop (owner, privileges)
            continue
    if dropped:
        log.info("dropped stale test databases: %s", ", ".join(dropped))
    return dropped
