"""The broker vacuums fluxpg's churned tables itself (fluxpg.queues.vacuum): dead commit markers
and outbox rows left by the sequencer are removed, and rows an open transaction still sees are
not vacuumed for again on every heartbeat."""
from __future__ import annotations

import asyncpg
import pytest

import fluxpg
from fluxpg import db
from fluxpg.queues.vacuum import Vacuumer
from tests.helpers import declare

TABLES = ("fluxpg.outbox", "fluxpg.outbox_commits")


@pytest.fixture
async def pool(dsn):
    p = await db.create_pool(dsn, min_size=1, max_size=2)
    # Autovacuum (on for the embedded server) must not remove the rows first: the test is about
    # the broker's own VACUUM.
    for t in TABLES:
        await p.execute(f"ALTER TABLE {t} SET (autovacuum_enabled = false)")
    yield p
    for t in TABLES:
        await p.execute(f"ALTER TABLE {t} RESET (autovacuum_enabled)")
    await p.close()


async def _publish_and_move(dsn, conn, qname, n):
    """n transactional publishes, moved into the log: n dead outbox rows and n dead markers."""
    app = await asyncpg.connect(dsn)
    try:
        async with app.transaction():
            for i in range(n):
                await fluxpg.publish(app, f"$queue/{qname}/k", b"%d" % i)
    finally:
        await app.close()
    moved = 0
    while k := await conn.fetchval("SELECT fluxpg.sequence_staged()"):
        moved += k
    assert moved == n
    # Statistics reach the shared counters at most once a second unless forced.
    await conn.execute("SELECT pg_stat_force_next_flush()")
    await conn.execute("SELECT 1")


async def _dead(pool, table):
    return await pool.fetchval("SELECT pg_stat_get_dead_tuples($1::regclass)", table)


async def test_dead_outbox_rows_and_markers_are_vacuumed(dsn, conn, pool, qname):
    await declare(conn, qname)
    await _publish_and_move(dsn, conn, qname, 300)
    vacuumer = Vacuumer(pool, dead_min=200)
    assert {await _dead(pool, t) >= 300 for t in TABLES} == {True}
    before = {t: await pool.fetchval("SELECT pg_stat_get_vacuum_count($1::regclass)", t) for t in TABLES}
    done = await vacuumer.run_once()
    assert set(TABLES) <= set(done)
    for t in TABLES:
        assert await pool.fetchval("SELECT pg_stat_get_vacuum_count($1::regclass)", t) == before[t] + 1
        assert await _dead(pool, t) < 200
    assert not set(TABLES) & set(await vacuumer.run_once())     # nothing new: not again


async def test_rows_an_open_transaction_sees_are_not_vacuumed_for_on_every_heartbeat(dsn, conn, pool, qname):
    await declare(conn, qname)
    holder = await asyncpg.connect(dsn)
    try:
        tx = holder.transaction(isolation="repeatable_read")
        await tx.start()
        await holder.fetchval("SELECT count(*) FROM fluxpg.queues")     # its snapshot keeps them
        await _publish_and_move(dsn, conn, qname, 300)
        vacuumer = Vacuumer(pool, dead_min=200)
        assert "fluxpg.outbox_commits" in await vacuumer.run_once()
        assert vacuumer.floors["fluxpg.outbox_commits"] >= 300          # could not remove them
        assert "fluxpg.outbox_commits" not in await vacuumer.run_once()
        await tx.commit()
        await _publish_and_move(dsn, conn, qname, 300)                  # as many again on top
        assert "fluxpg.outbox_commits" in await vacuumer.run_once()
        assert await _dead(pool, "fluxpg.outbox_commits") < 200
    finally:
        await holder.close()


async def test_a_role_that_does_not_own_the_tables_leaves_them_to_autovacuum(conn):
    """VACUUM by a non-owner is skipped with a warning: such a broker does not try every heartbeat."""
    owned = await conn.fetch(db.queries()["churned_tables"])
    assert "fluxpg.outbox_commits" in {r[0] for r in owned}
    await conn.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'fluxpg_test_not_owner') "
                       "THEN CREATE ROLE fluxpg_test_not_owner; END IF; END $$")
    async with conn.transaction():
        await conn.execute("SET LOCAL ROLE fluxpg_test_not_owner")
        assert await conn.fetch(db.queries()["churned_tables"]) == []
