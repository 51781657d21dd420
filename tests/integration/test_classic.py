"""Classic (work queue) groups through the SQL API, following the FluxMQ durable-queue docs."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from tests.helpers import claim, declare, expire, pending, publish, publish_many, status

NO_BACKOFF = {"retry": {"initial_backoff": "0s", "max_backoff": "0s"}}


async def test_classic_group_progress_table(conn, qname):
    """The "Example: Classic Group Progress" table of the durable queues page, row by row."""
    await declare(conn, qname)
    await publish_many(conn, qname, 6)  # offsets 0..5

    async def row():
        s = await status(conn, qname, "g")
        return s["cursor"], s["pending"], s["committed"]

    # Group starts: the group is created on first use; create it with a claim of nothing yet.
    await conn.execute("SELECT fluxpg._group(fluxpg._queue($1), 'g')", qname)
    assert await row() == (0, 0, 0)                       # Group starts | 0 | empty | 0
    assert await claim(conn, qname, "g", "c1", 2) == [0, 1]
    assert await row() == (2, 2, 0)                       # Claims 0,1  | 2 | 2     | 0
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[0]::bigint[])", qname) == 1
    assert await row() == (2, 1, 1)                       # Acks 0      | 2 | 1     | 1
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[1]::bigint[])", qname) == 1
    assert await row() == (2, 0, 2)                       # Acks 1      | 2 | empty | 2


async def test_claim_delivers_each_message_once_then_redeliveries_first(conn, qname):
    await declare(conn, qname, settings=NO_BACKOFF)
    await publish_many(conn, qname, 5)
    assert await claim(conn, qname, "g", "a", 2) == [0, 1]
    assert await claim(conn, qname, "g", "b", 2) == [2, 3]
    assert await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[1]::bigint[])", qname) == 1
    rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'b', 2)", qname)
    assert [(r["seq"], r["delivery_count"]) for r in rows] == [(1, 2), (4, 1)]
    entries = await conn.fetch("SELECT seq, consumer, delivery_count FROM fluxpg.pending_entries "
                               "WHERE queue = $1 ORDER BY seq", qname)
    assert [tuple(r) for r in entries] == [(0, "a", 1), (1, "b", 2), (2, "b", 1), (3, "b", 1), (4, "b", 1)]


async def test_nack_redelivers_at_once_in_offset_order_by_default(conn, qname):
    await declare(conn, qname, settings={"retry": {"initial_backoff": "2s"}})
    await publish_many(conn, qname, 3)
    assert await claim(conn, qname, "g", "c", 3) == [0, 1, 2]
    assert await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[2, 0]::bigint[])", qname) == 2
    assert await conn.fetchval("SELECT fluxpg.release($1, 'g', ARRAY[1]::bigint[])", qname) == 1
    rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'c2', 5)", qname)
    assert [(r["seq"], r["delivery_count"]) for r in rows] == [(0, 2), (1, 2), (2, 2)]


async def test_nack_applies_retry_backoff(conn, qname):
    await declare(conn, qname, settings={"retry": {"initial_backoff": "2s", "multiplier": 3.0, "max_backoff": "5s",
                                                   "nack_backoff": True}})
    await publish_many(conn, qname, 1)
    await claim(conn, qname, "g", "c")
    # The nack and the look in one transaction, where now() stands still: the backoff is exact.
    async with conn.transaction():
        await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[0]::bigint[])", qname)
        wait = await conn.fetchval("SELECT visible_at - now() FROM fluxpg.pending_entries WHERE queue = $1", qname)
    assert wait == timedelta(seconds=2)                  # initial_backoff × 3^0
    assert await claim(conn, qname, "g", "c") == []      # not yet visible
    await conn.execute("UPDATE fluxpg.pending SET visible_at = now() WHERE seq = 0 AND group_id = "
                       "(SELECT id FROM fluxpg.groups WHERE name = 'g' AND queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1))", qname)
    assert await claim(conn, qname, "g", "c") == [0]
    async with conn.transaction():
        await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[0]::bigint[])", qname)
        wait = await conn.fetchval("SELECT visible_at - now() FROM fluxpg.pending_entries WHERE queue = $1", qname)
    assert wait == timedelta(seconds=5)                  # 2s × 3 = 6s, capped at max_backoff 5s


async def test_reject_dead_letters_with_headers(conn, qname):
    await declare(conn, qname)
    await publish(conn, f"$queue/{qname}/eu/orders", b"payload", {"k": "v"})
    await claim(conn, qname, "g", "c")
    assert await conn.fetchval("SELECT fluxpg.reject($1, 'g', ARRAY[0]::bigint[], 'bad input')", qname) == 1
    assert await pending(conn, qname, "g") == []
    dlq = await conn.fetchrow("SELECT * FROM fluxpg.claim($1, 'ops', 'x', 1)", f"$dlq/{qname}")
    assert dlq["payload"] == b"payload"
    assert dlq["topic"] == f"$queue/{qname}/eu/orders"
    h = dlq["headers"]
    assert h["k"] == "v"
    assert h["_dlq_original_queue"] == qname and h["_dlq_original_topic"] == f"$queue/{qname}/eu/orders"
    assert h["_dlq_original_id"] == f"{qname}:0" and h["_dlq_group"] == "g"
    assert h["_dlq_delivery_count"] == 1 and h["_dlq_reason"] == "bad input"
    assert h["_dlq_moved_at"].endswith("Z")


async def test_reject_without_dlq_discards(conn, qname):
    await declare(conn, qname, settings={"dlq": {"enabled": False}})
    await publish_many(conn, qname, 1)
    await claim(conn, qname, "g", "c")
    assert await conn.fetchval("SELECT fluxpg.reject($1, 'g', ARRAY[0]::bigint[])", qname) == 1
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.queues WHERE name = $1", f"$dlq/{qname}") == 0


async def test_dead_letter_after_one_plus_max_retries_deliveries(conn, qname):
    await declare(conn, qname, settings={"retry": {"max_retries": 2, "initial_backoff": "0s"}})
    await publish_many(conn, qname, 1)
    for attempt in range(3):                          # delivered 1 + max_retries = 3 times
        rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'c', 1)", qname)
        assert [(r["seq"], r["delivery_count"]) for r in rows] == [(0, attempt + 1)]
        await conn.fetchval("SELECT fluxpg.nack($1, 'g', ARRAY[0]::bigint[])", qname)
    assert await pending(conn, qname, "g") == []
    assert await claim(conn, qname, "g", "c") == []
    dlq = await conn.fetchrow("SELECT headers FROM fluxpg.claim($1, 'ops', 'x', 1)", f"$dlq/{qname}")
    assert dlq["headers"]["_dlq_reason"] == "max-deliveries"
    assert dlq["headers"]["_dlq_delivery_count"] == 3


async def test_visibility_timeout_redelivers_to_any_consumer_including_the_same(conn, qname):
    await declare(conn, qname, settings={"delivery": {"visibility_timeout": "1s"}})
    await publish_many(conn, qname, 2)
    assert await claim(conn, qname, "g", "only", 2) == [0, 1]
    assert await claim(conn, qname, "g", "only", 2) == []
    await asyncio.sleep(1.1)
    # FluxMQ never redelivers to the consumer that timed out; fluxpg does (it may be the only one).
    rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, 'g', 'only', 2)", qname)
    assert [(r["seq"], r["delivery_count"]) for r in rows] == [(0, 2), (1, 2)]


async def test_claim_stale_is_xautoclaim(conn, qname):
    await declare(conn, qname)
    await publish_many(conn, qname, 3)
    await claim(conn, qname, "g", "slow", 3)
    assert await conn.fetch("SELECT seq FROM fluxpg.claim_stale($1, 'g', 'idle', '1 hour', 10)", qname) == []
    await asyncio.sleep(0.2)
    rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim_stale($1, 'g', 'idle', '100 ms', 2)", qname)
    assert [(r["seq"], r["delivery_count"]) for r in rows] == [(0, 2), (1, 2)]
    owners = await conn.fetch("SELECT seq, consumer FROM fluxpg.pending_entries WHERE queue = $1 ORDER BY seq", qname)
    assert [tuple(r) for r in owners] == [(0, "idle"), (1, "idle"), (2, "slow")]
    with pytest.raises(asyncpg.PostgresError, match="has no consumer group"):
        await conn.fetch("SELECT * FROM fluxpg.claim_stale($1, 'nope', 'idle', '1 s', 1)", qname)


async def test_reclaim_returns_a_consumers_own_pending_entries(conn, qname):
    """XREADGROUP with id 0: a consumer that crashed re-reads what it had."""
    await declare(conn, qname)
    await publish_many(conn, qname, 4)
    await claim(conn, qname, "g", "a", 2)
    await claim(conn, qname, "g", "b", 2)
    rows = await conn.fetch("SELECT seq, delivery_count FROM fluxpg.reclaim($1, 'g', 'a')", qname)
    assert [(r["seq"], r["delivery_count"]) for r in rows] == [(0, 2), (1, 2)]


async def test_pending_cap_stops_new_claims(conn, qname):
    await declare(conn, qname, settings={"delivery": {"max_pending": 3}})
    await publish_many(conn, qname, 10)
    assert await claim(conn, qname, "g", "c", 5) == [0, 1, 2]
    assert await claim(conn, qname, "g", "c", 5) == []
    await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[0, 1]::bigint[])", qname)
    assert await claim(conn, qname, "g", "c", 5) == [3, 4]


async def test_ttl_expired_messages_never_enter_the_pending_list(conn, qname):
    await declare(conn, qname, settings={"limits": {"message_ttl": "1h"}})
    await publish_many(conn, qname, 2)
    await expire(conn, qname, [0, 1])
    await publish(conn, f"$queue/{qname}/fresh")
    assert await conn.fetchval("SELECT expires_at - created_at FROM fluxpg.log WHERE seq = 2 AND "
                               "queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1)", qname) == timedelta(hours=1)
    assert await claim(conn, qname, "g", "c", 10) == [2]
    assert await pending(conn, qname, "g") == [2]
    assert (await status(conn, qname, "g"))["cursor"] == 3


async def test_ttl_zero_disables_expiry(conn, qname):
    await declare(conn, qname, settings={"limits": {"message_ttl": "0"}})
    await publish_many(conn, qname, 1)
    assert await conn.fetchval("SELECT expires_at FROM fluxpg.log WHERE queue_id = "
                               "(SELECT id FROM fluxpg.queues WHERE name = $1)", qname) is None
    assert await claim(conn, qname, "g", "c") == [0]


async def test_filters_apply_to_the_routing_key_and_groups_are_independent(conn, qname):
    await declare(conn, qname)
    for key in ("eu/images/png", "us/images/png", "eu/text", "eu/images/resize/thumb"):
        await publish(conn, f"$queue/{qname}/{key}")
    assert await claim(conn, qname, "eu@eu/#", "c", 10) == [0, 2, 3]
    assert await claim(conn, qname, "img@+/images/#", "c", 10) == [0, 1, 3]
    assert await claim(conn, qname, "all", "c", 10) == [0, 1, 2, 3]
    assert await claim(conn, qname, "exact@eu/text", "c", 10) == [2]
    groups = await conn.fetch("SELECT grp, filter, cursor FROM fluxpg.group_status WHERE queue = $1 ORDER BY grp", qname)
    assert [tuple(r) for r in groups] == [("all", None, 4), ("eu@eu/#", "eu/#", 4), ("exact@eu/text", "eu/text", 4),
                                          ("img@+/images/#", "+/images/#", 4)]


async def test_acks_for_unknown_or_foreign_entries(conn, qname):
    await declare(conn, qname)
    await publish_many(conn, qname, 2)
    await claim(conn, qname, "g", "c", 1)
    # Not pending (never delivered, or already acked): a documented no-op that returns 0.
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[1, 99]::bigint[])", qname) == 0
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[0]::bigint[])", qname) == 1
    assert await conn.fetchval("SELECT fluxpg.ack($1, 'g', ARRAY[0]::bigint[])", qname) == 0
    with pytest.raises(asyncpg.PostgresError, match="has no consumer group") as info:
        await conn.fetchval("SELECT fluxpg.ack($1, 'other', ARRAY[0]::bigint[])", qname)
    assert info.value.sqlstate == "FP005"
    with pytest.raises(asyncpg.PostgresError, match="unknown queue") as info:
        await conn.fetchval("SELECT fluxpg.ack('no-such-queue', 'g', ARRAY[0]::bigint[])")
    assert info.value.sqlstate == "FP001"
    with pytest.raises(asyncpg.PostgresError, match="is a classic queue") as info:
        await conn.fetch("SELECT * FROM fluxpg.read($1, 'g', 'c', 1)", qname)
    assert info.value.sqlstate == "FP002"
    with pytest.raises(asyncpg.PostgresError, match="invalid consumer group"):
        await claim(conn, qname, "@bad", "c")
