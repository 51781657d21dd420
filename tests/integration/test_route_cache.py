"""fluxpg.publish reuses a session's last single-queue route while the routing version
(fluxpg._route_version(), sql/0017_route_version.sql) is unchanged.

Real PostgreSQL, two connections: the publishing session and another that changes the queues.
Every change another session commits — a new binding, a changed limit, a deleted queue — is
seen by the publisher's next transaction; a change not yet committed is not; transient queues
come and go without a new version, and no route they could change is cached; concurrent changes
each get a version of their own; the version is state, kept when the functions are re-created;
and over a random walk of changes fluxpg.publish routes exactly as fluxpg.route does."""
from __future__ import annotations

import asyncio
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
    return await conn.fetchval("SELECT fluxpg._route_version()")


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
        assert await _version(conn) > before
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
    assert await _version(conn) > before


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


@pytest.fixture
async def node(other):
    """An owner node for transient queues (they go with it)."""
    node = await other.fetchval("SELECT fluxpg.register_node('test', 1)")
    yield node
    await other.execute("DELETE FROM fluxpg.nodes WHERE id = $1", node)


async def test_transient_queues_come_and_go_without_a_new_version(conn, other, node, qname):
    """Revision 0010 keeps a transient queue's creation and deletion free of DDL; a route cached for
    a durable queue's own topic stays valid meanwhile, and a route to a transient queue is never
    cached."""
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    before = await _version(conn)
    await other.fetchval("SELECT fluxpg.declare_transient($1, $2)", f"{qname}_t", node)
    assert await _version(conn) == before
    assert await _publish(conn, topic) == [qname]
    assert await _publish(conn, f"$queue/{qname}_t/k") == [f"{qname}_t"]
    assert await _cached_topic(conn) == topic                 # still the durable queue's route
    await other.fetchval("SELECT fluxpg.delete_transient($1)", f"{qname}_t")
    assert await _version(conn) == before
    with pytest.raises(asyncpg.PostgresError) as info:
        await _publish(conn, f"$queue/{qname}_t/k")
    assert info.value.sqlstate == "FP001"
    assert await _publish(conn, topic) == [qname]


@pytest.mark.parametrize("reserved", [False, True])
async def test_a_transient_queue_takes_its_topics_at_once(conn, other, node, qname, reserved):
    """A durable queue bound to another name's $queue/<name>/# routes those topics until a transient
    queue of that name appears, which brings no new version: such a route is never cached."""
    await declare(other, f"{qname}_all", topics=[f"$queue/{qname}_t/#"], settings={"reserved": reserved})
    topic = f"$queue/{qname}_t/k"
    assert await _publish(conn, topic) == [f"{qname}_all"]
    assert await _publish(conn, topic) == [f"{qname}_all"]
    assert await _cached_topic(conn) != topic
    await other.fetchval("SELECT fluxpg.declare_transient($1, $2)", f"{qname}_t", node)
    expected = [f"{qname}_t"] if reserved else sorted([f"{qname}_all", f"{qname}_t"])
    assert await _publish(conn, topic) == expected
    await other.fetchval("SELECT fluxpg.delete_transient($1)", f"{qname}_t")
    assert await _publish(conn, topic) == [f"{qname}_all"]


async def test_a_route_outside_queue_topics_is_cached_and_follows_changes(conn, other, qname):
    """A topic outside $queue/ bound by a filter: cached (no transient queue can bind it), and a
    durable change is seen by the next transaction."""
    await declare(other, qname, topics=[f"{qname}/+/temp"])
    topic = f"{qname}/room1/temp"
    assert await _publish(conn, topic) == [qname]
    assert await _cached_topic(conn) == topic
    await declare(other, f"{qname}_b", topics=[f"{qname}/#"])
    assert await _publish(conn, topic) == sorted([qname, f"{qname}_b"])


async def test_concurrent_routing_changes_each_get_a_version(conn, other, dsn, qname):
    """Two routing changes at once both commit (the second waits for the first: both replace the
    version's pg_proc row), each with a version of its own, and publishing sees both."""
    third = await db.connect(dsn)
    try:
        before = await _version(conn)
        tx = other.transaction()
        await tx.start()
        await declare(other, f"{qname}_a", topics=[f"$queue/{qname}/#"])
        second = asyncio.ensure_future(declare(third, f"{qname}_b", topics=[f"$queue/{qname}/#"]))
        await asyncio.sleep(0.3)
        assert not second.done()
        await tx.commit()
        await asyncio.wait_for(second, 30)
        assert await _version(conn) > before + 1              # two versions taken, none reused
        assert await _publish(conn, f"$queue/{qname}/k") == sorted([f"{qname}_a", f"{qname}_b"])
    finally:
        await third.close()


async def test_repeatable_read_caches_no_route(conn, qname):
    """A REPEATABLE READ snapshot can be older than the version the call sees: a route read from
    it is not kept (it could pass for a newer routing table)."""
    await declare(conn, qname)
    topic = f"$queue/{qname}/k"
    async with conn.transaction(isolation="repeatable_read"):
        assert await _publish(conn, topic) == [qname]
        assert await _cached_topic(conn) != topic
    assert await _publish(conn, topic) == [qname]
    assert await _cached_topic(conn) == topic


async def test_the_version_is_state_kept_when_functions_are_recreated(conn, other, dsn, qname):
    """fluxpg.routines re-creates every function when their source changes; the version survives
    it (the cached route stays valid), and a routing change does not make the installed
    definitions look changed (every broker start would re-create them)."""
    await declare(other, qname)
    topic = f"$queue/{qname}/k"
    assert await _publish(conn, topic) == [qname]
    version = await _version(conn)
    assert await asyncio.to_thread(db.migrate, dsn) == []
    await asyncio.to_thread(_reapply, dsn)
    assert await _version(conn) == version
    assert await _publish(conn, topic) == [qname]
    assert await _cached_topic(conn) == topic


def _reapply(dsn: str) -> None:
    """fluxpg.routines.apply, as db.migrate runs it when a source file changed."""
    import sqlalchemy

    from fluxpg import routines

    engine = sqlalchemy.create_engine(db.sqlalchemy_url(dsn))
    try:
        with engine.begin() as bind:
            routines.apply(bind)
    finally:
        engine.dispose()


async def test_publish_routes_as_route_does_over_a_random_walk_of_changes(conn, other, node, qname):
    """One truth: after every committed change of the bindings (declare, re-declare with other
    topics, reserved or not, delete; a transient queue created or deleted), fluxpg.publish on a
    session that keeps its cache puts the message exactly where fluxpg.route says."""
    rnd = random.Random(16)
    names = [f"{qname}_{i}" for i in range(4)]
    transient = f"{qname}_t"
    topics = [f"$queue/{qname}_0/a", f"$queue/{qname}_1/b", f"$queue/{qname}_0/a/b", f"$queue/{transient}/x"]
    filters = topics + [f"$queue/{qname}_0/#", f"$queue/{qname}_0/+", f"$queue/{qname}_1/#", f"$queue/{transient}/#"]
    for name in names:
        await declare(other, name, topics=[rnd.choice(filters)])
    existing = set(names)
    for step in range(160):
        roll = rnd.random()
        if roll < 0.45:
            pass                                             # publish again with nothing changed
        elif roll < 0.6:                                     # the transient queue comes or goes
            if await other.fetchval("SELECT fluxpg.delete_transient($1)", transient) is None:
                await other.fetchval("SELECT fluxpg.declare_transient($1, $2)", transient, node)
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
