"""Which database a command works on (--dsn, FLUXPG_DSN, database.dsn, else the embedded server,
the running `fluxpg serve`'s if it owns the data directory), connecting to it, redacting DSNs.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from fluxpg.cli.errors import CONNECT_TIMEOUT, CliError, connect_error, describe_error
from fluxpg.config import Config, load_config
from fluxpg.embedded import EmbeddedPostgres, EmbeddedPostgresError, default_data_dir
from fluxpg.errors import Unavailable

log = logging.getLogger("fluxpg.cli")


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
