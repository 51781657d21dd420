"""The SQL side of topic matching agrees with the Python side: fluxpg.filter_regex (group filters
applied at delivery) and fluxpg.topic_matches (queue bindings, SQL publish) against
fluxpg.topics.routing_key_matches / topic_matches, on generated filters and topics."""
from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from fluxpg.topics import routing_key_matches, topic_matches
from tests.strategies import topic_filters, topics


@pytest.fixture(scope="module")
def pg(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(topic_filter=topic_filters(), key=topics)
def test_sql_filter_regex_agrees_with_python(pg, topic_filter, key):
    sql = pg.execute("SELECT %s ~ fluxpg.filter_regex(%s), fluxpg.topic_matches(%s, %s)",
                     (key, topic_filter, topic_filter, key)).fetchone()
    assert sql[0] == routing_key_matches(topic_filter, key)
    assert sql[1] == topic_matches(topic_filter, key)
