"""Shared fixtures: one fresh, migrated database per test run (from FLUXPG_TEST_DSN, else a
testcontainers PostgreSQL when Docker answers, else the embedded server), queue managers on it,
and unique queue names so tests never see each other's data."""
from __future__ import annotations

import itertools
import os
import uuid

import asyncpg
import pytest

from fluxpg import db
from fluxpg.config import Config, QueueConfig
from fluxpg.testing import fresh_database, test_server

_names = itertools.count()


def pytest_asyncio_loop_factories(config, item):
    """The tests' loop is the broker's (fluxpg.aio.loop_factory: uvloop's where installed), so the
    brokers the tests start in-process run on the loop `fluxpg serve` runs on."""
    from fluxpg.aio import loop_factory
    return {"broker-loop": loop_factory()}


@pytest.fixture(scope="session")
def server_dsn():
    with test_server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def dsn(server_dsn):
    """A database of this run's own, migrated to head."""
    with fresh_database(server_dsn) as database_dsn:
        db.migrate(database_dsn)
        os.environ["FLUXPG_TEST_DATABASE_DSN"] = database_dsn
        yield database_dsn


@pytest.fixture
def qname():
    """A queue name no other test uses."""
    return f"q{next(_names)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
async def conn(dsn):
    c = await db.connect(dsn)
    yield c
    await c.close()


@pytest.fixture
async def manager_factory(dsn):
    """Start queue managers on the run's database; all are closed at the end of the test."""
    from fluxpg.queues.manager import QueueManager

    started = []

    async def make(queues: list[QueueConfig] | None = None, **qm) -> QueueManager:
        config = Config(queues=queues or [], queue_manager=qm or {})
        mgr = await QueueManager.start(dsn, config, migrate=False, retention=False)
        started.append(mgr)
        return mgr

    yield make
    for mgr in reversed(started):
        await mgr.close()
