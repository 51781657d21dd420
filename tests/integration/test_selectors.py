"""JMS message selectors compiled to jsonpath (fluxpg.selectors) and evaluated by PostgreSQL, the
only evaluator: JMS's three-valued logic (a missing property makes a comparison unknown, NOT of
unknown is unknown, an unknown selector does not select), LIKE/IN/BETWEEN/IS NULL, arithmetic,
the JMS fields an AMQP 1.0 message carries; bad selectors refused with a reason; and claims with
a selector leaving the other messages to the group's other consumers, in offset order."""
from __future__ import annotations

import json

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxpg.config import QueueConfig
from fluxpg.queues import manager as manager_module
from fluxpg.selectors import MAX_DEPTH, SelectorError, selector_jsonpath
from tests.helpers import Inbox, declare, publish

@pytest.fixture(scope="module")
def pg(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


SELECTED = [
    # selector, headers, selected?
    ("colour = 'green'", {"colour": "green"}, True),
    ("colour = 'green'", {"colour": "red"}, False),
    ("colour = 'green'", {}, False),
    ("colour <> 'green'", {}, False),                 # unknown, not true
    ("NOT colour = 'green'", {}, False),              # NOT unknown is unknown
    ("NOT colour = 'green'", {"colour": "red"}, True),
    ("colour IS NULL", {}, True),
    ("colour IS NULL", {"colour": None}, True),
    ("colour IS NOT NULL", {"colour": "x"}, True),
    ("NOT colour IS NULL", {"colour": "x"}, True),
    ("a > 3 AND NOT b IN ('x', 'y')", {"a": 4, "b": "z"}, True),
    ("a > 3 AND NOT b IN ('x', 'y')", {"a": 4, "b": "x"}, False),
    ("a NOT IN ('x', 'y')", {}, False),
    ("NOT (a = 1 AND b = 2)", {"a": 2}, True),       # false AND unknown = false
    ("NOT (a = 1 OR b = 2)", {"a": 2}, False),       # false OR unknown = unknown
    ("NOT (a = 1 OR b = 2)", {"a": 2, "b": 3}, True),
    ("name LIKE 'fo\\_%' ESCAPE '\\'", {"name": "fo_bar"}, True),
    ("name LIKE 'fo\\_%' ESCAPE '\\'", {"name": "fooo"}, False),
    ("name LIKE 'a.c'", {"name": "abc"}, False),      # '.' is no wildcard
    ("name LIKE 'a_c'", {"name": "abc"}, True),
    ("name LIKE '%'", {"name": "multi\nline"}, True),
    ("name NOT LIKE 'a%'", {"name": "abc"}, False),
    ("name NOT LIKE 'a%'", {"name": "bc"}, True),
    ("name NOT LIKE 'a%'", {}, False),
    ("p BETWEEN 1 AND 5.5e1", {"p": 10}, True),
    ("p NOT BETWEEN 1 AND 5", {"p": 10}, True),
    ("p NOT BETWEEN 1 AND 5", {}, False),
    ("flag", {"flag": True}, True),
    ("NOT flag", {"flag": False}, True),
    ("NOT flag", {}, False),
    ("(x + 2) * -y <= -10", {"x": 3, "y": 2}, True),
    ("x + 2 * -y >= 10", {"x": 20, "y": 3}, True),
    ("x / 0 > 1", {"x": 1}, False),
    ("a = 'x' AND a = 1", {"a": "x"}, False),         # different types compare false (JMS)
    ("NOT (a = 'x' AND a = 1)", {"a": "x"}, True),
    ("JMSPriority > 4", {"x-amqp": {"header": {"priority": 9}}}, True),
    ("JMSCorrelationID = 'c1'", {"x-amqp": {"properties": {"correlation-id": "c1"}}}, True),
    ("s = 'it''s'", {"s": "it's"}, True),
    ("s = 'a\"b\\c'", {"s": "a\"b\\c"}, True),
    ("TRUE", {}, True),
    ("FALSE OR x = 1", {"x": 1}, True),
    ("a = 1 OR b = 2", {"b": 2}, True),
    ("((a = 1))", {"a": 1}, True),
    ("(a + 1) = 2", {"a": 1}, True),
    ("été = 'ü'", {"été": "ü"}, True),
    ("colour = 'green' and size >= 2", {"colour": "green", "size": 2}, True),  # keywords in any case
]


def matches(pg, selector: str, headers: dict | None) -> bool:
    return pg.execute("SELECT (coalesce(%s::jsonb, '{}') @@ %s::jsonpath) IS TRUE",
                      (None if headers is None else json.dumps(headers), selector_jsonpath(selector))).fetchone()[0]


@pytest.mark.parametrize(("selector", "headers", "selected"), SELECTED)
def test_selector_semantics(pg, selector, headers, selected):
    assert matches(pg, selector, headers) is selected


def test_a_message_without_headers(pg):
    assert matches(pg, "colour IS NULL", None) is True
    assert matches(pg, "colour = 'x'", None) is False


@pytest.mark.parametrize(("selector", "reason"), [
    ("", "empty"),
    ("colour = ", "expected a value"),
    ("colour = 'green", "unexpected"),
    ("colour == 'green'", "expected a value"),
    ("a IN (1, 2)", "expected a string"),
    ("a LIKE 'x' ESCAPE 'ab'", "exactly one character"),
    ("JMSExpiration > 0", "not supported"),
    ("a = 1 b", "unexpected"),
    ("a = 1; DROP TABLE fluxpg.log", "unexpected"),
    ("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1), "nested deeper"),
    ("a = '" + "x" * 5000 + "'", "longer than"),
])
def test_bad_selectors_are_refused_with_a_reason(selector, reason):
    with pytest.raises(SelectorError, match=reason):
        selector_jsonpath(selector)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
def test_any_text_compiles_or_is_refused_cleanly(pg, text):
    """Fuzzing the compiler: either SelectorError, or a jsonpath PostgreSQL accepts."""
    try:
        path = selector_jsonpath(text)
    except SelectorError:
        return
    pg.execute("SELECT '{}'::jsonb @@ %s::jsonpath", (path,)).fetchone()


# Pending entries of group 'g' of one queue (the test database is shared by every test).
GROUP_PENDING = ("SELECT p.seq, p.consumer, p.delivery_count FROM fluxpg.pending p "
                 "JOIN fluxpg.groups g ON g.id = p.group_id JOIN fluxpg.queues q ON q.id = g.queue_id "
                 "WHERE q.name = $1 AND g.name = 'g' ")


async def test_claims_with_a_selector_leave_the_rest_to_the_group(conn, qname):
    """The proton selected_recv scenario in SQL: a selector consumer takes the greens; the reds
    stay for a plain consumer of the same group, in offset order, delivered once each."""
    await declare(conn, qname)
    for i in range(20):
        await publish(conn, f"$queue/{qname}/c", b"m%d" % i, {"colour": "green" if i % 2 == 0 else "red"})
    green = selector_jsonpath("colour = 'green'")
    got = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'picky', 4, $2::jsonpath)", qname, green)]
    assert got == [0, 2, 4, 6]
    # The reds passed over are due at once for anyone else, with no delivery counted.
    left = await conn.fetch(GROUP_PENDING + "AND p.consumer = '' ORDER BY seq", qname)
    assert [(r["seq"], r["delivery_count"]) for r in left] == [(1, 0), (3, 0), (5, 0)]
    more = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'picky', 100, $2::jsonpath)", qname, green)]
    assert more == [8, 10, 12, 14, 16, 18]
    plain = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'plain', 100)", qname)]
    assert plain == list(range(1, 20, 2))
    # Nothing left for anyone; every message was handed out exactly once.
    assert await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'plain', 100)", qname) == []
    assert await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'picky', 100, $2::jsonpath)", qname, green) == []
    consumers = [r["consumer"] for r in await conn.fetch(GROUP_PENDING + "ORDER BY seq", qname)]
    assert sorted(consumers) == ["picky"] * 10 + ["plain"] * 10


@pytest.mark.parametrize("how", ["topic filter", "selector"])
async def test_a_filtered_consumer_drains_a_large_backlog_without_waiting_for_polls(manager_factory, conn, qname,
                                                                                     monkeypatch, how):
    """10,000 messages of which only the last matches: a filtered claim scans a window of a few
    thousand offsets and comes back short long before the head. The consumer claims on while its
    cursor moves (polls raised to a minute here: one window per poll would take three minutes)."""
    monkeypatch.setattr(manager_module, "CLASSIC_POLL", 60.0)
    mgr = await manager_factory([QueueConfig(name=qname)])
    qid = mgr.queues[qname].id
    n = 10_000
    await conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3, $4)", [qid] * n,
                     [f"$queue/{qname}/other"] * (n - 1) + [f"$queue/{qname}/match"],
                     [b"x"] * (n - 1) + [b"it"], [None] * (n - 1) + [{"kind": "match"}])
    inbox = Inbox()
    if how == "topic filter":
        await mgr.subscribe(qname, "g", "c", filter="match", on_delivery=inbox, credit=10)
    else:
        await mgr.subscribe(qname, "g", "c", selector="kind = 'match'", on_delivery=inbox, credit=10)
    [d] = await inbox.wait_for(1, timeout=20)
    assert (d.seq, d.payload) == (n - 1, b"it")
