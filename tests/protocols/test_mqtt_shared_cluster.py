"""Shared subscriptions across nodes (MQTT 5 §4.8.2): two fluxpg nodes on one database, members of
one `$share/` group on both; every message reaches the group exactly once, split between the
nodes, and a member leaving hands the whole group's traffic to the remaining one. Plus the owner
rule itself: deterministic and spread."""
from __future__ import annotations

import queue as queue_mod
import time
from collections import Counter

import psycopg
import pytest

from fluxpg import db
from fluxpg.protocols.mqtt.router import _key_hash, shared_owner
from fluxpg.testing import fresh_database

from tests.protocols.test_mqtt_paho import Paho, uid

MESSAGES = 200


def shared_view(server, key: tuple[str, str]) -> tuple[int, ...]:
    """The node ids the server's router currently believes have members of `key`."""
    async def get():
        return server.server.ctx.state["mqtt.router"].shared_nodes.get(key, ())
    return server.call(get())


def wait_for_view(servers, key, expected: tuple[int, ...], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        views = [shared_view(s, key) for s in servers]
        if all(v == expected for v in views):
            return
        assert time.monotonic() < deadline, f"nodes see {views}, want {expected}"
        time.sleep(0.02)


def drain(clients: list[Paho], expected: int, timeout: float = 30.0, quiet: float = 0.5) -> list[list[bytes]]:
    """What each client received: until they have `expected` messages between them (or `timeout`
    passed), then until nothing more came for `quiet` seconds (a duplicate would show there).
    Not "until a quiet spell" alone: a PUBACK means the message is stored, and the other node's
    delivery (its NOTIFY, a read, the send) can take longer than any spell on a loaded machine."""
    outs: list[list[bytes]] = [[] for _ in clients]
    deadline = time.monotonic() + timeout
    while sum(map(len, outs)) < expected and time.monotonic() < deadline:
        for out, client in zip(outs, clients):
            try:
                out.append(client.get(0.02).payload)
            except queue_mod.Empty:
                pass
    for out, client in zip(outs, clients):
        while True:
            try:
                out.append(client.get(quiet).payload)
            except queue_mod.Empty:
                break
    return outs


def publish_all(pub: Paho, topic: str, tag: str, n: int = MESSAGES) -> set[bytes]:
    infos = [pub.publish(topic, f"{tag}-{i}".encode(), qos=1, wait=False) for i in range(n)]
    for info in infos:
        info.wait_for_publish(10)
        assert info.rc == 0
    return {f"{tag}-{i}".encode() for i in range(n)}


OBJECTS = """
SELECT 'rel', c.relname FROM pg_class c WHERE c.relnamespace = 'fluxpg'::regnamespace
UNION ALL SELECT 'fn', p.proname FROM pg_proc p WHERE p.pronamespace = 'fluxpg'::regnamespace
UNION ALL SELECT 'col', a.attrelid::regclass::text || '.' || a.attname FROM pg_attribute a
 WHERE a.attrelid = 'fluxpg.mqtt_relay'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY 1, 2
"""


def test_0004_upgrade_comments_everything_and_downgrade_removes_it(server_dsn):
    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn, "0003_auth")
        with psycopg.connect(dsn) as c:
            before = c.execute(OBJECTS).fetchall()
        db.migrate(dsn, "0004_mqtt_shared")
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT obj_description('fluxpg.mqtt_shared'::regclass, 'pg_class')").fetchone()[0]
            assert c.execute("SELECT obj_description('fluxpg.mqtt_shared_notify'::regproc, 'pg_proc')").fetchone()[0]
            uncommented = c.execute("""
                SELECT a.attrelid::regclass, a.attname FROM pg_attribute a
                 WHERE a.attrelid IN ('fluxpg.mqtt_shared'::regclass, 'fluxpg.mqtt_relay'::regclass)
                   AND a.attnum > 0 AND NOT a.attisdropped AND col_description(a.attrelid, a.attnum) IS NULL
            """).fetchall()
            assert uncommented == []
            # Rows go with their node, and joining or leaving notifies.
            # Below head no functions are installed (fluxpg.routines): insert the node row directly.
            node = c.execute("INSERT INTO fluxpg.nodes (host, pid) VALUES ('h', 1) RETURNING id").fetchone()[0]
            c.execute("LISTEN fluxpg_mqtt_shared")
            c.commit()
            c.execute("INSERT INTO fluxpg.mqtt_shared VALUES ('g', 'a/#', %s, 1)", (node,))
            c.commit()
            assert [n.payload for n in c.notifies(timeout=2, stop_after=1)] == [str(node)]
            c.execute("DELETE FROM fluxpg.nodes WHERE id = %s", (node,))
            c.commit()
            assert [n.payload for n in c.notifies(timeout=2, stop_after=1)] == [str(node)]
            assert c.execute("SELECT count(*) FROM fluxpg.mqtt_shared").fetchone()[0] == 0
        db.downgrade(dsn, "0003_auth")
        with psycopg.connect(dsn) as c:
            assert c.execute(OBJECTS).fetchall() == before
        assert db.current_revision(dsn) == "0003_auth"


def test_owner_rule_is_deterministic_and_spread():
    nodes = (3, 7, 11)
    kh = _key_hash("g", "t/#")
    owners = [shared_owner(nodes, 7, seq, kh) for seq in range(3000)]
    assert owners == [shared_owner(nodes, 7, seq, _key_hash("g", "t/#")) for seq in range(3000)]
    counts = Counter(owners)
    assert set(counts) == set(nodes) and min(counts.values()) > 800, counts
    # Another group spreads the same messages independently.
    other = [shared_owner(nodes, 7, seq, _key_hash("h", "t/#")) for seq in range(3000)]
    assert other != owners


@pytest.mark.parametrize("publisher_on", ["a", "b"])
def test_shared_group_across_two_nodes_gets_each_message_once(threaded_broker, publisher_on):
    a = threaded_broker()
    b = threaded_broker()
    nodes = tuple(sorted((a.manager.node_id, b.manager.node_id)))
    root = f"t{uid()}"                       # a group and filter of this test alone
    share, inner = "g", f"{root}/#"
    member_a = Paho(a.port("mqtt"))
    member_b = Paho(b.port("mqtt"))
    plain_a = Paho(a.port("mqtt"))              # a plain subscriber still gets everything
    assert member_a.subscribe(f"$share/{share}/{inner}", qos=1) == [1]
    assert member_b.subscribe(f"$share/{share}/{inner}", qos=1) == [1]
    plain_a.subscribe(inner, qos=1)
    wait_for_view((a, b), (share, inner), nodes)
    pub = Paho((a if publisher_on == "a" else b).port("mqtt"))

    sent = publish_all(pub, f"{root}/x", "both")
    got_a, got_b = drain([member_a, member_b], len(sent))
    assert Counter(got_a + got_b) == Counter(sent), "every message exactly once to the group"
    assert got_a and got_b, (len(got_a), len(got_b))
    assert Counter(drain([plain_a], len(sent), quiet=0.1)[0]) == Counter(sent)

    # B's member leaves: once the nodes see it, A's member gets all of them.
    member_b.close()
    wait_for_view((a, b), (share, inner), (a.manager.node_id,))
    sent = publish_all(pub, f"{root}/y", "after")
    assert Counter(drain([member_a], len(sent))[0]) == Counter(sent)
    assert member_b.messages.empty()
    for c in (member_a, plain_a, pub):
        c.close()
