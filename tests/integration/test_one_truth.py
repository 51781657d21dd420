"""One truth of queue rules (issue 14): each rule lives in the SQL API and the broker's Python path
agrees with it, checked on generated input against both (like test_filter_regex.py).

- names: fluxpg.queue_name_error / group_name_error vs fluxpg.topics.validate_queue_name /
  validate_group_name (config files and wire input are checked in Python before any round trip);
- retry and limit settings: fluxpg.declare_queue vs the config models;
- defaults: fluxpg.default_settings(kind) vs QueueConfig().to_settings();
- dlq.topic: the dead-letter queue's name, for the config, SQL and the broker alike.
"""
from __future__ import annotations

import json
import uuid

import psycopg
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxpg.config import QueueConfig, QueueManagerConfig
from fluxpg.errors import FluxError, InvalidArgument
from fluxpg.topics import validate_group_name, validate_queue_name

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Characters at the edges of every rule: separators, wildcards, $, @, spaces, tab, DEL, non-ASCII.
name_chars = st.sampled_from(list("ab$/+#@ \t\x7f\x1fé.-_") + ["\u00a0", "\u2028"])
short_names = st.text(name_chars, min_size=0, max_size=8)
long_names = st.integers(195, 205).map(lambda n: "q" * n) | st.integers(395, 405).map(lambda n: "g" * n)
names = st.one_of(short_names, long_names, st.tuples(st.sampled_from(["$dlq/", " ", "$", ""]), short_names | long_names)
                  .map("".join))


@pytest.fixture(scope="module")
def pg(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def python_accepts(check, value) -> bool:
    try:
        check(value)
        return True
    except InvalidArgument:
        return False


@SETTINGS
@given(batch=st.lists(names, min_size=1, max_size=20))
def test_queue_name_rule_is_the_same_in_sql_and_python(pg, batch):
    sql = dict(pg.execute("SELECT n, fluxpg.queue_name_error(n) FROM unnest(%s::text[]) AS n", (batch,)).fetchall())
    for name in batch:
        assert (sql[name] is None) == python_accepts(lambda n: validate_queue_name(n, allow_dlq=True), name), \
            (name, sql[name])


@SETTINGS
@given(batch=st.lists(names, min_size=1, max_size=20))
def test_group_name_rule_is_the_same_in_sql_and_python(pg, batch):
    sql = dict(pg.execute("SELECT n, fluxpg.group_name_error(n) FROM unnest(%s::text[]) AS n", (batch,)).fetchall())
    for name in batch:
        assert (sql[name] is None) == python_accepts(validate_group_name, name), (name, sql[name])


def test_the_measured_name_disagreements_are_gone(pg):
    for name in ("$weird", " leading", "trailing ", "tab\there"):
        assert pg.execute("SELECT fluxpg.queue_name_error(%s)", (name,)).fetchone()[0] is not None, name
        with pytest.raises(pydantic.ValidationError):
            QueueConfig(name=name)
        with pytest.raises(psycopg.Error):
            pg.execute("SELECT fluxpg.declare_queue(%s, 'classic')", (name,))
    for group in (" workers", "\tworkers", "w" * 401, "@#"):
        assert pg.execute("SELECT fluxpg.group_name_error(%s)", (group,)).fetchone()[0] is not None, group
        assert not python_accepts(validate_group_name, group)


durations = st.sampled_from(["0s", "1ms", "5s", "1m", "5m", "1h"])


@SETTINGS
@given(multiplier=st.sampled_from([0.0, 0.5, 0.999, 1.0, 1.5, 2.0, 10.0]), initial=durations, maximum=durations,
       max_retries=st.integers(-1, 3), max_depth=st.integers(-1, 2), dlq_topic=st.sampled_from(
           ["", "dead", "$dlq/other", "x/y", "$weird", " sp", "SELF"]))
def test_settings_checks_are_the_same_in_sql_and_python(pg, multiplier, initial, maximum, max_retries, max_depth,
                                                        dlq_topic):
    name = f"truth_{uuid.uuid4().hex[:8]}"
    raw = {"retry": {"multiplier": multiplier, "initial_backoff": initial, "max_backoff": maximum,
                     "max_retries": max_retries},
           "limits": {"max_depth": max_depth},
           "dlq": {"topic": name if dlq_topic == "SELF" else dlq_topic}}
    try:
        QueueConfig(name=name, **raw)
        python_ok = True
    except pydantic.ValidationError:
        python_ok = False
    try:
        with pg.transaction(force_rollback=True):
            pg.execute("SELECT fluxpg.declare_queue(%s, 'classic', NULL, %s::jsonb)", (name, json.dumps(raw)))
        sql_ok = True
    except psycopg.Error as exc:
        assert exc.sqlstate == "FP004", exc
        sql_ok = False
    assert python_ok == sql_ok, raw


@pytest.mark.parametrize("kind", ["classic", "stream"])
def test_defaults_are_defined_once(pg, kind):
    """What Python sends for a queue that sets nothing is exactly SQL's default_settings(kind), and
    both declarations store the same settings."""
    python = QueueConfig(name="d", type=kind).to_settings(QueueManagerConfig())
    sql = pg.execute("SELECT fluxpg.default_settings(%s)", (kind,)).fetchone()[0]
    assert python == sql
    a, b = f"def_sql_{uuid.uuid4().hex[:6]}", f"def_py_{uuid.uuid4().hex[:6]}"
    pg.execute("SELECT fluxpg.declare_queue(%s, %s)", (a, kind))
    pg.execute("SELECT fluxpg.declare_queue(%s, %s, NULL, %s::jsonb)", (b, kind, json.dumps(python)))
    stored = dict(pg.execute("SELECT name, settings FROM fluxpg.queues WHERE name IN (%s, %s)", (a, b)).fetchall())
    assert stored[a] == stored[b]
    assert stored[a]["retention"]["max_age"] == ("168h" if kind == "stream" else "0s")


async def test_dlq_topic_names_the_dead_letter_queue_in_sql_and_in_the_broker(manager_factory, qname, pg):
    """`dlq.topic: dead` dead-letters into the queue `dead`, through SQL and through the broker,
    and `$dlq/<queue>` stays empty; the config names the same queue."""
    dead = f"{qname}_dead"
    qc = QueueConfig(name=qname, dlq={"topic": dead})
    assert qc.dlq_queue == dead
    mgr = await manager_factory([qc])
    assert pg.execute("SELECT fluxpg.dlq_name(%s)", (qname,)).fetchone()[0] == dead

    await mgr.publish(f"$queue/{qname}/a", b"via-broker")
    await mgr.publish(f"$queue/{qname}/b", b"via-sql")
    got = pg.execute("SELECT seq, convert_from(payload, 'UTF8') FROM fluxpg.claim(%s, 'g', 'c', 2)", (qname,)).fetchall()
    seqs = {payload: seq for seq, payload in got}
    assert await mgr.reject(qname, "g", [seqs["via-broker"]], "broker path") == 1
    assert pg.execute("SELECT fluxpg.reject(%s, 'g', %s, 'sql path')", (qname, [seqs["via-sql"]])).fetchone()[0] == 1

    rows = pg.execute("SELECT convert_from(payload, 'UTF8'), headers ->> '_dlq_reason' FROM fluxpg.claim(%s, 'r', 'c', 10)",
                      (dead,)).fetchall()
    assert sorted(rows) == [("via-broker", "broker path"), ("via-sql", "sql path")]
    assert pg.execute("SELECT count(*) FROM fluxpg.queues WHERE name = %s", (f"$dlq/{qname}",)).fetchone()[0] == 0


async def test_an_invalid_group_is_refused_by_the_broker_as_by_sql(manager_factory, qname, pg):
    mgr = await manager_factory([QueueConfig(name=qname)])
    for group in (" lead", "g" * 401):
        with pytest.raises(FluxError):
            await mgr.subscribe(qname, group, "c1", on_delivery=lambda d: None)
        with pytest.raises(psycopg.Error):
            pg.execute("SELECT * FROM fluxpg.claim(%s, %s, 'c', 1)", (qname, group))


def test_settling_by_the_plain_group_name_when_unambiguous(pg, qname):
    pg.execute("SELECT fluxpg.declare_queue(%s, 'classic')", (qname,))
    for _ in range(3):
        pg.execute("SELECT * FROM fluxpg.append(%s, 'm', NULL)", (f"$queue/{qname}/eu",))
    assert [r[0] for r in pg.execute("SELECT seq FROM fluxpg.claim(%s, 'mg@#', 'c', 2)", (qname,))] == [0, 1]
    assert pg.execute("SELECT fluxpg.ack(%s, 'mg', ARRAY[0]::bigint[])", (qname,)).fetchone()[0] == 1
    assert pg.execute("SELECT fluxpg.resolve_group(%s, 'mg')", (qname,)).fetchone()[0] == "mg@#"
    pg.execute("SELECT * FROM fluxpg.claim(%s, 'mg@eu', 'c', 1)", (qname,))
    with pytest.raises(psycopg.Error, match="several groups named 'mg': mg@#, mg@eu") as info:
        pg.execute("SELECT fluxpg.ack(%s, 'mg', ARRAY[1]::bigint[])", (qname,))
    assert info.value.sqlstate == "FP005"
    assert pg.execute("SELECT fluxpg.ack(%s, 'mg@#', ARRAY[1]::bigint[])", (qname,)).fetchone()[0] == 1


async def test_routing_is_the_same_in_sql_and_in_the_broker(server_dsn):
    """fluxpg.route and the broker's manager.route pick the same queues for every topic: plain
    topics bound by a filter (sensors/#), reserved catch-alls only for what nothing else takes,
    and a catch-all left by an earlier run without configured queues retired at start."""
    import random

    from fluxpg import db
    from fluxpg.config import Config
    from fluxpg.queues.manager import QueueManager
    from fluxpg.testing import fresh_database

    rnd = random.Random(14)
    levels = ["a", "b", "eu", "sensors", "$x", "orders", " "]

    def filt() -> str:
        parts = [rnd.choice(levels + ["+"]) for _ in range(rnd.randint(1, 3))]
        return "/".join(parts + (["#"] if rnd.random() < 0.4 else []))

    with fresh_database(server_dsn) as dsn:
        db.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # What a run without configured queues left behind.
            conn.execute("""SELECT fluxpg.declare_queue('mqtt', 'classic', ARRAY['$queue/#'], '{"reserved": true}')""")
        queues = [QueueConfig(name="sensors", topics=["sensors/#"]), QueueConfig(name="orders"),
                  QueueConfig(name="eu", topics=["$queue/orders/eu/#", "+/eu"]),
                  QueueConfig(name="spare", topics=["$queue/#"], reserved=True)]
        queues += [QueueConfig(name=f"r{i}", topics=[filt() for _ in range(rnd.randint(1, 3))],
                               reserved=rnd.random() < 0.2) for i in range(8)]
        mgr = await QueueManager.start(dsn, Config(queues=queues), retention=False)
        try:
            topics = ["sensors/a", "sensors", "$queue/nobody/here", "$queue/orders/eu/x", "x/eu", "$queue/mqtt/x"]
            topics += ["/".join(rnd.choice(levels) for _ in range(rnd.randint(1, 4))) for _ in range(300)]
            topics += ["$queue/" + t for t in topics[6:100]]
            with psycopg.connect(dsn, autocommit=True) as conn:
                for topic in topics:
                    sql = [r[0] for r in conn.execute(
                        "SELECT q.name FROM unnest(fluxpg.route(%s)) WITH ORDINALITY AS r(id, o) "
                        "JOIN fluxpg.queues q ON q.id = r.id ORDER BY r.o", (topic,))]
                    assert [q.name for q in mgr.route(topic)] == sql, topic
                mqtt = conn.execute("SELECT topics, settings ->> 'reserved' FROM fluxpg.queues WHERE name = 'mqtt'").fetchone()
            assert mqtt == (["$queue/mqtt/#"], "false")
            assert [q.name for q in mgr.route("sensors/a")] == ["sensors"]
            assert [q.name for q in mgr.route("$queue/nobody/here")] == ["spare"]
            assert await mgr.publish("sensors/a", b"plain topic") == [("sensors", 0)]
        finally:
            await mgr.close()
