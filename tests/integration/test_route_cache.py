"""fluxpg.publish reuses a session's last single-queue route while the routing version
(fluxpg.route_changes, sql/0016_route_changes.sql) is unchanged.

Real PostgreSQL, two connections: the publishing session and another that changes the queues.
Every change another session commits — a new binding, a changed limit, a deleted queue — is
seen by the publisher's next call; a change not yet committed is not; the version only grows,
compaction keeps it; and over a random walk of changes fluxpg.publish routes exactly as
fluxpg.route does."""
from __future__ import annotations

import random

import asyncpg
import pytest

from fluxpg import db

from tests.helpers import declare

CUSTOM = {"retry": {"max_retries": 3}}


async def _publish(conn, topic: str, payload: bytes = b"x") -> list[str]:
    return sorted(r["queue"] for r in await conn.fetch("SELECT queue FROM fluxpg.publish($1, $2)", topic, payload))


async def _cached_topic(conn) -> str | None:
    return await conn.fetchval("SELECT current_setting('fluxpg.route_topic', true)")


async def _version(conn) -> int:
    return await conn.fetchval("SELECT coalesce(sum(weight), 0) FROM fluxpg.route_changes")


async def _outbox_queues(conn, topic: str) -> list[str]:
    """Where the committed outbox rows of `topic` went (the sequencer is not running here)."""
    return sorted(r[0] for r in await conn.fetch(
        "SELECT q.name FROM fluxpg.outbox o JOIN fluxpg.queues q ON q.id = o.queue_id WHERE o.topic = $1", topic))


@pytest.fixture
async def other(dsn):
    c = await db.connect(dsn)
    yield c
    await c.close()


@pytest.fixture(autouse=True)
async def _no_outbox_left(dsn, qname):
    """No broker runs here, so what these tests publish stays in the outbox; some of it could
    never be appended (published before its queue's size limit was lowered) and would keep its
    commit marker for good in the database the whole run shares. Remove this test's rows and
    markers afterwards."""
    yield
    c = await db.connect(dsn)
    try:
        async with c.transaction():
            await c.execute("""DELETE FROM fluxpg.outbox_commits m WHERE m.txid IN (
                                 SELECT o.txid FROM fluxpg.outbox o JOIN fluxpg.queues q ON q.id = o.queue_id
                                  WHERE q.name LIKE $1 || '%')""", qname)
            await c.execute("DELETE FROM fluxpg.outbox o USING fluxpg.queues q WHERE q.id = o.queue_id AND q.name LIKE $1 || '%'",
                            qname)
    finally:
        await c.close()


async def test_a_new_binding_committed_elsewhere_is_routed_to_at_once(conn, other, qname):
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    assert await _cached_topic(conn) == topic
    assert await _publish(conn, topic) == [qname]           # from the cache

    await declare(other, f"{qname}_tap", topics=[f"$queue/{qname}/#"])
    assert await _publish(conn, topic) == sorted([qname, f"{qname}_tap"])
    assert await _outbox_queues(conn, topic) == sorted([qname, qname, qname, f"{qname}_tap"])


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_a_change_counts_once_committed_and_a_rolled_back_one_never(conn, other, qname, outcome):
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    before = await _version(conn)

    tx = other.transaction()
    await tx.start()
    await declare(other, f"{qname}_tap", topics=[topic])
    assert await _version(conn) == before                   # not committed: the same version
    assert await _publish(conn, topic) == [qname]           # and the same route
    await (tx.commit() if outcome == "commit" else tx.rollback())

    if outcome == "commit":
        assert await _version(conn) == before + 1
        assert await _publish(conn, topic) == sorted([qname, f"{qname}_tap"])
    else:
        assert await _version(conn) == before
        assert await _publish(conn, topic) == [qname]


async def test_what_changes_no_route_keeps_the_version(conn, other, qname):
    """A re-declaration with the same settings (every broker start makes one per configured
    queue) and a statement that changes no row leave the version, so no cached route is dropped."""
    await declare(other, qname, settings=CUSTOM)
    before = await _version(conn)
    await declare(other, qname, settings=CUSTOM)
    await other.execute("DELETE FROM fluxpg.queues WHERE name = $1", qname + "-none")
    await other.execute("UPDATE fluxpg.queues SET topics = topics WHERE name = $1", qname)
    assert await _version(conn) == before
    await declare(other, qname, settings={"retry": {"max_retries": 4}})
    assert await _version(conn) == before + 1


async def test_a_lowered_size_limit_is_enforced_on_the_cached_route(conn, other, qname):
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic, b"x" * 100) == [qname]
    await declare(other, qname, settings={"limits": {"max_message_size": 10}})
    with pytest.raises(asyncpg.PostgresError) as info:
        await _publish(conn, topic, b"x" * 100)
    assert info.value.sqlstate == "54000"
    assert await _publish(conn, topic, b"x" * 10) == [qname]
    # Over the cached limit while the cache is current: the full way, and the same error.
    with pytest.raises(asyncpg.PostgresError) as info:
        await _publish(conn, topic, b"x" * 11)
    assert info.value.sqlstate == "54000"


async def test_a_deleted_queue_is_not_published_to(conn, other, qname):
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    await other.execute("SELECT fluxpg.delete_queue($1)", qname)
    with pytest.raises(asyncpg.PostgresError) as info:
        await _publish(conn, topic)
    assert info.value.sqlstate == "FP001"


async def test_a_rollback_forgets_the_route_it_cached(conn, qname):
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    tx = conn.transaction()
    await tx.start()
    assert await _publish(conn, topic) == [qname]
    assert await _cached_topic(conn) == topic
    await tx.rollback()
    assert await _cached_topic(conn) in (None, "")          # settings roll back with the transaction
    assert await _publish(conn, topic) == [qname]
    assert await _outbox_queues(conn, topic) == [qname]     # only the committed one


async def test_a_repeatable_read_transaction_routes_by_its_snapshot(conn, other, qname):
    """Inside REPEATABLE READ, routing (cached or not) follows the transaction's snapshot, as it
    did before the cache; the next transaction sees the change."""
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    tx = conn.transaction(isolation="repeatable_read")
    await tx.start()
    assert await _publish(conn, topic) == [qname]            # the snapshot is taken here
    await declare(other, f"{qname}_tap", topics=[topic])
    assert await _publish(conn, topic) == [qname]
    await tx.commit()
    assert await _publish(conn, topic) == sorted([qname, f"{qname}_tap"])


async def test_compaction_keeps_the_version(conn, other, qname):
    for i in range(5):
        await declare(other, f"{qname}_{i}")
    before = await _version(conn)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.route_changes") > 1
    # Two compactions at once (the second waits for the first's rows, then skips them).
    tx = other.transaction()
    await tx.start()
    await other.execute("SELECT fluxpg._compact_route_changes()")
    await declare(conn, f"{qname}_late")                     # a change meanwhile, committed first
    assert await _version(conn) == before + 1                # other's compaction is not committed yet
    await tx.commit()
    await conn.execute("SELECT fluxpg._compact_route_changes()")
    assert await _version(conn) == before + 1
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.route_changes") == 1


@pytest.mark.parametrize("who", ["node_heartbeat", "sequence_staged"])
async def test_the_heartbeat_and_the_sql_sequencer_compact(conn, other, qname, who):
    """A broker's heartbeat folds the rows; without a broker, whoever calls sequence_staged does."""
    for i in range(3):
        await declare(other, f"{qname}_{i}")
    before = await _version(conn)
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.route_changes") > 1
    if who == "node_heartbeat":
        node = await conn.fetchval("SELECT fluxpg.register_node('test', 1)")
        await conn.fetchval("SELECT fluxpg.node_heartbeat($1)", node)
        await conn.execute("DELETE FROM fluxpg.nodes WHERE id = $1", node)
    else:
        await conn.fetchval("SELECT fluxpg.sequence_staged()")
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.route_changes") == 1
    assert await _version(conn) == before


async def test_publish_routes_as_route_does_over_a_random_walk_of_changes(conn, other, qname):
    """One truth: after every committed change of the bindings (declare, re-declare with other
    topics, reserved or not, delete), fluxpg.publish on a session that keeps its cache puts the
    message exactly where fluxpg.route says."""
    rnd = random.Random(16)
    names = [f"{qname}_{i}" for i in range(4)]
    topics = [f"$queue/{qname}_0/a", f"$queue/{qname}_1/b", f"$queue/{qname}_0/a/b"]
    filters = topics + [f"$queue/{qname}_0/#", f"$queue/{qname}_0/+", f"$queue/{qname}_1/#"]
    for name in names:
        await declare(other, name, topics=[rnd.choice(filters)])
    existing = set(names)
    for step in range(120):
        roll = rnd.random()
        if roll < 0.5:
            pass                                             # publish again with nothing changed
        elif roll < 0.8 or not existing:
            name = rnd.choice(names)
            await declare(other, name, topics=rnd.sample(filters, rnd.randint(1, 2)),
                          settings={"reserved": rnd.random() < 0.2})
            existing.add(name)
        else:
            name = rnd.choice(sorted(existing))
            await other.execute("SELECT fluxpg.delete_queue($1)", name)
            existing.discard(name)
        topic = rnd.choice(topics)
        expected = sorted(r[0] for r in await other.fetch(
            "SELECT q.name FROM unnest(fluxpg.route($1)) AS r(id) JOIN fluxpg.queues q ON q.id = r.id", topic))
        if expected:
            assert await _publish(conn, topic) == expected, (step, topic)
        else:
            with pytest.raises(asyncpg.PostgresError) as info:
                await _publish(conn, topic)
            assert info.value.sqlstate == "FP001", (step, topic)
