"""The SQL API of DESIGN §3 against a real PostgreSQL: declare, publish, routing, errors."""
from __future__ import annotations

import asyncio

import asyncpg
import pytest

from fluxpg import db
from tests.helpers import claim, declare, publish, publish_many


async def test_declare_creates_queue_with_first_segment_and_defaults(conn, qname):
    qid = await declare(conn, qname)
    row = await conn.fetchrow("SELECT * FROM fluxpg.queues WHERE id = $1", qid)
    assert row["kind"] == "classic"
    assert list(row["topics"]) == [f"$queue/{qname}/#"]
    s = row["settings"]
    assert s["limits"] == {"max_message_size": 10485760, "max_depth": 100000, "message_ttl": "168h",
                           "overflow": "reject-publish"}
    assert (s["retry"]["nack_backoff"], s["dlq"]["expired"]) == (False, False)
    assert s["retry"]["max_retries"] == 10 and s["dlq"]["enabled"] is True
    segs = await conn.fetch("SELECT * FROM fluxpg.segments WHERE queue = $1", qname)
    assert [(r["from_seq"], r["to_seq"]) for r in segs] == [(0, 100000)]
    head = await conn.fetchrow("SELECT * FROM fluxpg.heads WHERE queue_id = $1", qid)
    assert (head["next_seq"], head["first_seq"]) == (0, 0)


async def test_redeclare_updates_settings_and_keeps_id(conn, qname):
    qid = await declare(conn, qname, settings={"limits": {"max_depth": 5}})
    again = await declare(conn, qname, settings={"limits": {"max_depth": 7}, "retry": {"max_retries": 1}},
                          topics=[f"$queue/{qname}/#", "$queue/all/#"])
    assert again == qid
    row = await conn.fetchrow("SELECT topics, settings FROM fluxpg.queues WHERE id = $1", qid)
    assert row["settings"]["limits"]["max_depth"] == 7
    assert row["settings"]["limits"]["max_message_size"] == 10485760  # defaults kept
    assert row["settings"]["retry"]["max_retries"] == 1
    assert list(row["topics"]) == [f"$queue/{qname}/#", "$queue/all/#"]


@pytest.mark.parametrize("name, kind, message", [
    ("bad/name", "classic", "invalid queue name"),
    ("", "classic", "invalid queue name"),
    ("a+b", "classic", "invalid queue name"),
    ("good", "fifo", "invalid queue kind"),
])
async def test_declare_rejects_bad_input(conn, name, kind, message):
    with pytest.raises(asyncpg.PostgresError, match=message) as info:
        await declare(conn, name, kind)
    assert info.value.sqlstate == "FP004"


async def test_declare_with_other_kind_is_refused(conn, qname):
    await declare(conn, qname, "classic")
    with pytest.raises(asyncpg.PostgresError, match="already exists as a classic queue") as info:
        await declare(conn, qname, "stream")
    assert info.value.sqlstate == "FP002"


async def test_declare_rejects_bad_settings(conn, qname):
    with pytest.raises(asyncpg.PostgresError, match="invalid duration"):
        await declare(conn, qname, settings={"limits": {"message_ttl": "soon"}})
    with pytest.raises(asyncpg.PostgresError, match="partitions > 1 needs a stream queue"):
        await declare(conn, qname, settings={"partitions": 3})


async def test_publish_assigns_seqs_from_zero_in_order(conn, qname):
    await declare(conn, qname)
    seqs = [await publish(conn, f"$queue/{qname}/a", b"%d" % i) for i in range(5)]
    assert seqs == [[(qname, i)] for i in range(5)]
    rows = await conn.fetch("SELECT seq, payload, topic FROM fluxpg.log WHERE queue_id = "
                            "(SELECT id FROM fluxpg.queues WHERE name = $1) ORDER BY seq", qname)
    assert [(r["seq"], r["payload"]) for r in rows] == [(i, b"%d" % i) for i in range(5)]


async def test_publish_fans_out_to_every_matching_queue_in_one_transaction(conn, qname):
    a, b, c = f"{qname}a", f"{qname}b", f"{qname}c"
    await declare(conn, a, topics=[f"$queue/{qname}/orders/#"])
    await declare(conn, b, topics=[f"$queue/{qname}/+/eu"])
    await declare(conn, c, topics=[f"$queue/{qname}/other"])
    assert sorted(await publish(conn, f"$queue/{qname}/orders/eu")) == [(a, 0), (b, 0)]
    assert await publish(conn, f"$queue/{qname}/orders") == [(a, 1)]
    assert await publish(conn, f"$queue/{qname}/x/eu") == [(b, 1)]
    # One transaction: when one target refuses (too large for b), nothing is appended anywhere.
    await declare(conn, b, topics=[f"$queue/{qname}/+/eu"], settings={"limits": {"max_message_size": 3}})
    with pytest.raises(asyncpg.PostgresError, match="exceeds limits.max_message_size") as info:
        await publish(conn, f"$queue/{qname}/orders/eu", b"too big")
    assert info.value.sqlstate == "54000"
    heads = await conn.fetch("SELECT q.name, h.next_seq FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id "
                             "WHERE q.name = ANY($1) ORDER BY 1", [a, b])
    assert [tuple(r) for r in heads] == [(a, 2), (b, 2)]


async def test_publish_errors_are_clear(conn, qname):
    with pytest.raises(asyncpg.PostgresError, match="no queue is bound") as info:
        await publish(conn, f"nothing/{qname}/x")
    assert info.value.sqlstate == "FP001"
    with pytest.raises(asyncpg.PostgresError, match="wildcards") as info:
        await publish(conn, f"$queue/{qname}/#")
    assert info.value.sqlstate == "FP004"


async def test_max_depth_refuses_publish_when_full(conn, qname):
    await declare(conn, qname, settings={"limits": {"max_depth": 3}})
    await publish_many(conn, qname, 3)
    with pytest.raises(asyncpg.PostgresError, match="is full") as info:
        await publish(conn, f"$queue/{qname}/x")
    assert info.value.sqlstate == "FP003"


async def test_max_depth_counts_unacked_messages(conn, qname):
    await declare(conn, qname, settings={"limits": {"max_depth": 3}})
    await publish_many(conn, qname, 3)
    seqs = await claim(conn, qname, "g", "c", 2)
    with pytest.raises(asyncpg.PostgresError, match="is full"):
        await publish(conn, f"$queue/{qname}/x")
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', $2)", qname, seqs)
    assert await publish(conn, f"$queue/{qname}/x") == [(qname, 3)]
    assert await publish(conn, f"$queue/{qname}/x") == [(qname, 4)]
    with pytest.raises(asyncpg.PostgresError, match="is full"):
        await publish(conn, f"$queue/{qname}/x")


async def test_append_creates_missing_segments_for_a_large_batch(conn, qname):
    await declare(conn, qname, settings={"segment_size": 100})
    await publish_many(conn, qname, 450)
    segs = await conn.fetch("SELECT from_seq, to_seq, rows FROM fluxpg.segments WHERE queue = $1", qname)
    assert [(r["from_seq"], r["to_seq"]) for r in segs] == [(i, i + 100) for i in range(0, 600, 100)]
    assert sum(r["rows"] for r in segs) == 450
    # Pre-created ahead: the head (450) passed half of [400, 500), so [500, 600) exists already.


async def test_concurrent_appends_commit_in_seq_order(dsn, qname):
    """Appends to one partition hold the head row lock until commit, so a reader never sees a
    higher seq committed before a lower one."""
    c1, c2 = await db.connect(dsn), await db.connect(dsn)
    try:
        await declare(c1, qname)
        tx = c1.transaction()
        await tx.start()
        first = await c1.fetchval("SELECT seq FROM fluxpg.append($1, 'a')", f"$queue/{qname}/x")
        second = asyncio.create_task(c2.fetchval("SELECT seq FROM fluxpg.append($1, 'b')", f"$queue/{qname}/x"))
        await asyncio.sleep(0.2)
        assert not second.done()  # waits for the head lock
        await tx.commit()
        assert (first, await second) == (0, 1)
    finally:
        await c1.close()
        await c2.close()


async def test_routing_key_and_filter_regex_functions(conn):
    assert await conn.fetchval("SELECT fluxpg.routing_key('$queue/orders/eu/images')") == "eu/images"
    assert await conn.fetchval("SELECT fluxpg.routing_key('$queue/orders')") == ""
    cases = [("#", "", True), ("images/#", "images", True), ("images/#", "images/png/x", True),
             ("+/images/#", "eu/images/resize", True), ("+", "a/b", False), ("a.b", "axb", False),
             ("eu/#", "us/eu", False)]
    for flt, key, expected in cases:
        assert await conn.fetchval("SELECT $2 ~ fluxpg.filter_regex($1)", flt, key) is expected, (flt, key)
    assert await conn.fetchval("SELECT fluxpg.topic_matches('#', '$queue/x')") is False
    assert await conn.fetchval("SELECT fluxpg.topic_matches('$queue/#', '$queue/x')") is True
