"""Partitioned streams and group membership (OCI Streaming consumer groups, issue 8)."""
from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict

import asyncpg
import pytest

from fluxpg import db
from tests.helpers import declare


def settings(partitions=6, **delivery):
    return {"partitions": partitions, "delivery": {"member_timeout": "30s", **delivery}}


async def fill(conn, qname, n, keys=None):
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    return await conn.fetch("SELECT ord, partition, seq FROM fluxpg.append_batch($1, $2, $3, NULL, $4)",
                            [qid] * n, [f"$queue/{qname}"] * n, [b"%d" % i for i in range(n)], keys)


async def read(conn, qname, member, n=100, group="g"):
    rows = await conn.fetch("SELECT partition, seq FROM fluxpg.read($1, $2, $3, $4)", qname, group, member, n)
    return [(r["partition"], r["seq"]) for r in rows]


async def owners(conn, qname, group="g"):
    rows = await conn.fetch("SELECT c.partition, c.owner FROM fluxpg.cursors c JOIN fluxpg.groups g ON g.id = c.group_id "
                            "WHERE g.queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1) AND g.name = $2 "
                            "ORDER BY 1", qname, group)
    return {r["partition"]: r["owner"] for r in rows}


async def test_partition_choice_by_key_routing_key_or_round_robin(conn, qname):
    await declare(conn, qname, "stream", settings(4))
    by_key = await fill(conn, qname, 20, ["customer-7"] * 10 + ["customer-9"] * 10)
    assert len({r["partition"] for r in by_key[:10]}) == 1 and len({r["partition"] for r in by_key[10:]}) == 1
    # no key, no routing key ($queue/<name> root): round robin over all partitions
    spread = Counter(r["partition"] for r in await fill(conn, qname, 40))
    assert sorted(spread) == [0, 1, 2, 3] and set(spread.values()) == {10}
    # the routing key when there is no explicit key
    rows = await conn.fetch("SELECT queue, seq FROM fluxpg.append($1, 'x')", f"$queue/{qname}/device-1")
    again = await conn.fetch("SELECT queue, seq FROM fluxpg.append($1, 'x')", f"$queue/{qname}/device-1")
    parts = await conn.fetch("SELECT DISTINCT partition FROM fluxpg.log WHERE queue_id = "
                             "(SELECT id FROM fluxpg.queues WHERE name = $1) AND topic = $2", qname, f"$queue/{qname}/device-1")
    assert rows and again and len(parts) == 1
    # offsets are per partition, each starting at 0
    heads = await conn.fetch("SELECT partition, next_seq FROM fluxpg.heads WHERE queue_id = "
                             "(SELECT id FROM fluxpg.queues WHERE name = $1) ORDER BY 1", qname)
    assert sum(h["next_seq"] for h in heads) == 62


async def test_a_batch_of_one_key_goes_where_the_mixed_path_puts_that_key(conn, qname):
    """A batch whose rows all carry one partition key takes append_batch's one-partition path; it
    must choose the partition the general path chooses for that key, and keep offsets dense."""
    await declare(conn, qname, "stream", settings(5))
    rnd = random.Random(17)
    keys = [f"key-{rnd.randrange(10**9)}" for _ in range(40)]
    expected_next: Counter = Counter()
    for key in keys:
        whole = await fill(conn, qname, 3, [key] * 3)                 # one key: the one-partition path
        mixed = await fill(conn, qname, 2, [key, key + "-other"])    # two keys: the general path
        assert len({r["partition"] for r in whole}) == 1
        assert whole[0]["partition"] == mixed[0]["partition"], key
        p = whole[0]["partition"]
        assert [r["seq"] for r in whole] == [expected_next[p] + i for i in range(3)]
        assert mixed[0]["seq"] == expected_next[p] + 3
        expected_next[p] += 4
        expected_next[mixed[1]["partition"]] += 1
    heads = await conn.fetch("SELECT partition, next_seq FROM fluxpg.heads WHERE queue_id = "
                             "(SELECT id FROM fluxpg.queues WHERE name = $1)", qname)
    assert {h["partition"]: h["next_seq"] for h in heads if h["next_seq"]} == dict(expected_next)
    # Without keys, one routing key for the whole batch: the same choice as in a mixed batch.
    qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", qname)
    for device in ("dev-1", "dev-2", "dev-3", "dev-4", "dev-5", "dev-6"):
        topic = f"$queue/{qname}/{device}"
        whole = await conn.fetch("SELECT partition FROM fluxpg.append_batch($1, $2, $3)", [qid] * 2, [topic] * 2, [b"a", b"b"])
        mixed = await conn.fetch("SELECT partition FROM fluxpg.append_batch($1, $2, $3) ORDER BY ord",
                                 [qid] * 2, [topic, topic + "x"], [b"a", b"b"])
        assert whole[0]["partition"] == whole[1]["partition"] == mixed[0]["partition"], device


async def test_members_share_partitions_plus_minus_one(conn, qname):
    await declare(conn, qname, "stream", settings(6))
    for members in (1, 2, 4, 8):
        names = [f"m{i}" for i in range(members)]
        for _round in range(2):                 # join, then a round where releases are taken up
            for name in names:
                await read(conn, qname, name, 1, group=f"g{members}")
        share = Counter((await owners(conn, qname, f"g{members}")).values())
        assert sum(share.values()) == 6
        expected = sorted([6 // members + (1 if i < 6 % members else 0) for i in range(min(members, 6))], reverse=True)
        assert sorted(share.values(), reverse=True) == expected
        assert len(share) == min(members, 6)    # members beyond the partition count stay idle


async def test_join_rebalances_and_hand_over_is_clean(conn, qname):
    await declare(conn, qname, "stream", settings(4))
    await fill(conn, qname, 40)
    first = await read(conn, qname, "a", 8)
    assert set((await owners(conn, qname)).values()) == {"a"}
    await read(conn, qname, "b", 100)             # b joins: nothing free yet
    await read(conn, qname, "a", 100)             # a releases b's share (checkpointed: commit-on-get)
    got_b = await read(conn, qname, "b", 100)     # b takes it from the checkpoint
    o = await owners(conn, qname)
    assert Counter(o.values()) == Counter({"a": 2, "b": 2})
    assert {p for p, _ in got_b} == {p for p, who in o.items() if who == "b"}
    # Nothing delivered twice and nothing lost: every offset exactly once over a, b.
    rest = await read(conn, qname, "a", 100) + await read(conn, qname, "b", 100)
    seen = Counter(first + got_b + rest)
    a_second = await read(conn, qname, "a", 100)
    assert a_second == []
    everything = Counter(first) + Counter(got_b) + Counter(rest)
    assert sum(everything.values()) <= 40 + 0 and max(seen.values()) == 1


async def test_silent_member_is_removed_and_its_partitions_reassigned(conn, qname):
    await declare(conn, qname, "stream", settings(2, member_timeout="1s"))
    await fill(conn, qname, 10)
    await read(conn, qname, "a", 1)
    await read(conn, qname, "b", 1)                         # joins; a still owns both
    await read(conn, qname, "a", 1)                         # a hands one partition over
    b_got = await read(conn, qname, "b", 1)                 # b takes it and reads one message
    assert Counter((await owners(conn, qname)).values()) == Counter({"a": 1, "b": 1})
    assert len(b_got) == 1
    await asyncio.sleep(1.3)                                # b goes silent
    got = await read(conn, qname, "a", 100)
    assert set((await owners(conn, qname)).values()) == {"a"}
    # b's partition restarts at its checkpoint: what b read but never committed comes again.
    assert b_got[0] in got
    assert await conn.fetchval("SELECT count(*) FROM fluxpg.members m JOIN fluxpg.groups g ON g.id = m.group_id "
                               "WHERE g.name = 'g' AND g.queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1)",
                               qname) == 1


async def test_start_position_only_for_a_new_group_and_reset_moves_everyone(conn, qname):
    await declare(conn, qname, "stream", settings(2))
    await fill(conn, qname, 10)
    assert await conn.fetchval("SELECT fluxpg.join_group($1, 'g', 'last')", qname) is True
    assert await read(conn, qname, "a", 100) == []
    await fill(conn, qname, 4)
    assert len(await read(conn, qname, "a", 100)) == 4
    assert await conn.fetchval("SELECT fluxpg.join_group($1, 'g', 'first')", qname) is False  # ignored
    assert await read(conn, qname, "a", 100) == []
    await conn.fetchval("SELECT fluxpg.seek($1, 'g', 'first')", qname)                   # group reset
    assert len(await read(conn, qname, "a", 100)) == 14


async def test_max_groups_per_stream(conn, qname):
    await declare(conn, qname, "stream", settings(1, max_groups=2))
    await read(conn, qname, "m", 1, group="one")
    await read(conn, qname, "m", 1, group="two")
    with pytest.raises(asyncpg.PostgresError, match="consumer groups already") as info:
        await read(conn, qname, "m", 1, group="three")
    assert info.value.sqlstate == "FP006"


async def test_unused_groups_expire_after_the_retention_period(conn, qname):
    await declare(conn, qname, "stream", {"retention": {"max_age": "1h"}})
    await read(conn, qname, "m", 1, group="old")
    await read(conn, qname, "m", 1, group="fresh")
    await conn.execute("UPDATE fluxpg.groups SET last_active_at = now() - interval '2 hours' WHERE name = 'old' "
                       "AND queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1)", qname)
    await conn.execute("UPDATE fluxpg.members SET last_seen_at = now() - interval '2 hours' WHERE group_id = "
                       "(SELECT id FROM fluxpg.groups WHERE name = 'old' AND queue_id = "
                       "(SELECT id FROM fluxpg.queues WHERE name = $1))", qname)
    assert await conn.fetchval("SELECT fluxpg.expire_groups()") >= 1
    names = [r["grp"] for r in await conn.fetch("SELECT DISTINCT grp FROM fluxpg.group_status WHERE queue = $1", qname)]
    assert names == ["fresh"]


async def test_order_and_exclusivity_with_members_joining_and_leaving(dsn, qname):
    """Several members on their own connections read while others join, leave and go silent.
    Per partition, offsets are seen in order; each batch of a partition comes from its owner of
    the moment (reads of one partition never overlap), and every message is delivered."""
    setup = await db.connect(dsn)
    await declare(setup, qname, "stream", settings(5, member_timeout="1s"))
    await fill(setup, qname, 1500)
    log: list[tuple[str, int, list[int]]] = []     # (member, partition, seqs) in completion order
    stop = asyncio.Event()

    async def member(name, lifetime, leave_cleanly):
        conn = await db.connect(dsn)
        try:
            loop = asyncio.get_running_loop()
            end = loop.time() + lifetime
            while loop.time() < end and not stop.is_set():
                rows = await conn.fetch("SELECT partition, seq FROM fluxpg.read($1, 'g', $2, 7)", qname, name)
                by_part = defaultdict(list)
                for r in rows:
                    by_part[r["partition"]].append(r["seq"])
                for part, seqs in by_part.items():
                    log.append((name, part, seqs))
                await asyncio.sleep(random.uniform(0, 0.02))
            if leave_cleanly:
                await conn.execute("SELECT fluxpg.leave($1, 'g', $2)", qname, name)
        finally:
            await conn.close()

    random.seed(7)
    tasks = [asyncio.create_task(member("steady", 8, True))]
    for i in range(6):
        await asyncio.sleep(0.3)
        tasks.append(asyncio.create_task(member(f"m{i}", random.uniform(0.5, 2.5), leave_cleanly=i % 2 == 0)))
    await asyncio.gather(*tasks)
    stop.set()

    seen: dict[int, list[int]] = defaultdict(list)
    for _name, part, seqs in log:
        assert seqs == sorted(seqs)
        seen[part].extend(seqs)
    heads = {r["partition"]: r["next_seq"] for r in await setup.fetch(
        "SELECT partition, next_seq FROM fluxpg.heads WHERE queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1)",
        qname)}
    for part, offsets in seen.items():
        # In order: an offset is only seen again after a rewind to the checkpoint (a member that
        # went silent lost its uncommitted batch), never out of order within a batch.
        first_seen = list(dict.fromkeys(offsets))
        assert first_seen == sorted(first_seen)
        assert set(offsets) == set(range(heads[part])), f"partition {part} incomplete"
    await setup.close()


async def test_python_subscriptions_share_a_partitioned_stream(manager_factory, qname):
    """Two members through the queue manager split the partitions; when one leaves, the other
    takes its partitions from the checkpoint: every message arrives, in order per partition."""
    from fluxpg.config import QueueConfig

    mgr = await manager_factory([QueueConfig(name=qname, type="stream", partitions=4)])
    for i in range(40):
        await mgr.publish(f"$queue/{qname}/k", b"%d" % i, {"x-partition-key": f"key-{i % 8}"})
    got: dict[str, list] = {"a": [], "b": []}
    done = asyncio.Event()

    def inbox(name):
        def on_delivery(d):
            got[name].append((d.partition, d.seq, d.properties()["x-stream-partition"]))
            if len({(p, s) for p, s, _ in got["a"] + got["b"]}) >= 40:
                done.set()
        return on_delivery

    a = await mgr.subscribe(qname, "g", "a", on_delivery=inbox("a"), credit=3)
    b = await mgr.subscribe(qname, "g", "b", on_delivery=inbox("b"), credit=3)
    await asyncio.sleep(1.0)
    for sub in (a, b):
        sub.set_credit(None)
    await asyncio.sleep(0.5)
    await a.close()                       # a leaves: b takes a's partitions
    await asyncio.wait_for(done.wait(), 20)
    everything = got["a"] + got["b"]
    assert all(str(p) == prop for p, _, prop in everything)
    per_partition: dict[int, list[int]] = defaultdict(list)
    for p, s, _ in everything:
        per_partition[p].append(s)
    for offsets in per_partition.values():
        first_seen = list(dict.fromkeys(offsets))
        assert first_seen == sorted(first_seen) == list(range(len(first_seen)))
    assert sum(len(set(v)) for v in per_partition.values()) == 40
    assert got["b"], "b never got a partition"
    await b.close()
