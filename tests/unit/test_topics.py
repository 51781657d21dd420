"""Unit and property tests of fluxpg.topics (pure)."""
from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxpg.errors import InvalidArgument
from fluxpg.topics import (
    MAX_TOPIC_BYTES,
    QueueTopic,
    TopicTree,
    ack_verb,
    dlq_name,
    internal_group_name,
    is_queue_topic,
    parse_internal_group,
    parse_queue_topic,
    parse_shared,
    routing_key_matches,
    split_queue_subscription,
    topic_matches,
    validate_queue_name,
    validate_topic_filter,
    validate_topic_name,
)

# ----------------------------------------------------------------------------- queue addresses


def test_is_queue_topic():
    assert is_queue_topic("$queue/orders")
    assert not is_queue_topic("orders")
    assert not is_queue_topic("$queueorders")


@pytest.mark.parametrize(
    "topic, expected",
    [
        ("$queue/orders", ("orders", "")),
        ("$queue/orders/", ("orders", "")),
        ("$queue/orders/eu/images/resize", ("orders", "eu/images/resize")),
        ("$queue/$dlq/orders", ("$dlq/orders", "")),
        ("$queue/$dlq/orders/eu", ("$dlq/orders", "eu")),
        ("$queue/çå-ü.x:y/a b", ("çå-ü.x:y", "a b")),
    ],
)
def test_parse_queue_topic(topic, expected):
    parsed = parse_queue_topic(topic)
    assert parsed == QueueTopic(*expected)
    assert parsed.queue == expected[0] and parsed.routing_key == expected[1]


@pytest.mark.parametrize(
    "topic, fragment",
    [
        ("orders", "not a queue topic"),
        ("$queue/", "must not be empty"),
        ("$queue//x", "must not be empty"),
        ("$queue/or+ders", "wildcards are not allowed"),
        ("$queue/#", "wildcards are not allowed"),
        ("$queue/+/x", "wildcards are not allowed"),
        ("$queue/orders/#", "must not contain wildcards"),
        ("$queue/orders/a/+", "must not contain wildcards"),
        ("$queue/" + "x" * 201, "at most 200"),
        ("$queue/$ack", "must not start with '$'"),
        ("$queue/$dlq", "$dlq/<queue>"),
        ("$queue/a\x00b", "control characters"),
    ],
)
def test_parse_queue_topic_errors(topic, fragment):
    with pytest.raises(InvalidArgument) as exc:
        parse_queue_topic(topic)
    assert fragment in str(exc.value)


def test_validate_queue_name():
    assert validate_queue_name("x" * 200) == "x" * 200
    assert validate_queue_name("$dlq/orders", allow_dlq=True) == "$dlq/orders"
    assert dlq_name("orders") == "$dlq/orders"
    for bad in ["", "a/b", "a+", "a#", "a\x00", "$dlq/orders", "x" * 201, "$x"]:
        with pytest.raises(InvalidArgument):
            validate_queue_name(bad)
    with pytest.raises(InvalidArgument):
        validate_queue_name("$dlq/a/b", allow_dlq=True)
    with pytest.raises(InvalidArgument):
        validate_queue_name(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sub, expected",
    [
        ("$queue/orders/#", ("orders", "#")),
        ("$queue/orders", ("orders", None)),
        ("$queue/orders/+/images/#", ("orders", "+/images/#")),
        ("orders", ("orders", None)),
        ("orders/eu/#", ("orders", "eu/#")),
        ("$queue/$dlq/orders/#", ("$dlq/orders", "#")),
        ("$dlq/orders", ("$dlq/orders", None)),
    ],
)
def test_split_queue_subscription(sub, expected):
    assert split_queue_subscription(sub) == expected


@pytest.mark.parametrize(
    "sub, fragment",
    [
        ("", "non-empty"),
        ("$queue/", "must not be empty"),
        ("$queue/#", "wildcards are not allowed"),
        ("#", "wildcards are not allowed"),
        ("$queue/orders/", "empty filter"),
        ("$queue/orders/a#", "'#' must be the last level"),
        ("orders/#/a", "'#' must be the last level"),
        ("orders/a+", "'+' must be alone"),
    ],
)
def test_split_queue_subscription_errors(sub, fragment):
    with pytest.raises(InvalidArgument) as exc:
        split_queue_subscription(sub)
    assert fragment in str(exc.value)


@pytest.mark.parametrize(
    "topic, expected",
    [
        ("$queue/orders/$ack", ("orders", "ack")),
        ("$queue/orders/$nack", ("orders", "nack")),
        ("$queue/orders/$reject", ("orders", "reject")),
        ("$queue/orders/$commit", ("orders", "commit")),
        ("$queue/orders/eu/images/$ack", ("orders", "ack")),
        ("$queue/$dlq/orders/$ack", ("$dlq/orders", "ack")),
        ("$queue/orders", None),
        ("$queue/orders/ack", None),
        ("$queue/orders/$ack/x", None),
        ("$queue/$ack", None),
        ("orders/$ack", None),
        ("$queue/orders/$acknowledge", None),
    ],
)
def test_ack_verb(topic, expected):
    assert ack_verb(topic) == expected


def test_ack_verb_bad_queue_raises():
    with pytest.raises(InvalidArgument):
        ack_verb("$queue/a+b/$ack")
    with pytest.raises(InvalidArgument):
        ack_verb("$queue//$ack")


# ----------------------------------------------------------------------------- group names


def test_internal_group_names():
    assert internal_group_name("demo-workers", "orders/+") == "demo-workers@orders/+"
    assert internal_group_name("demo-workers", "#") == "demo-workers@#"
    assert internal_group_name("demo-workers", None) == "demo-workers"
    assert parse_internal_group("demo-workers@orders/+") == ("demo-workers", "orders/+")
    assert parse_internal_group("demo-events@#") == ("demo-events", "#")
    assert parse_internal_group("demo-workers") == ("demo-workers", None)
    # A filter may itself contain '@': only the first one separates.
    assert parse_internal_group("g@a/b@c") == ("g", "a/b@c")
    for bad in ["", "a@b", "a\x00"]:
        with pytest.raises(InvalidArgument):
            internal_group_name(bad, None)
    with pytest.raises(InvalidArgument):
        parse_internal_group("@x")


# Valid groups (validate_group_name: no control characters, no spaces at the edges) and filters.
_printable = st.characters(blacklist_categories=("Cc", "Cs"))
group_names = st.text(_printable, min_size=1, max_size=12).filter(lambda s: "@" not in s and s[0] != " " and s[-1] != " ")


@given(group_names, st.one_of(st.none(), st.text(_printable, max_size=20)))
def test_internal_group_round_trip(group, topic_filter):
    assert parse_internal_group(internal_group_name(group, topic_filter)) == (group, topic_filter)


# ----------------------------------------------------------------------------- MQTT validation


def test_validate_topic_name():
    assert validate_topic_name("a/b/c") == "a/b/c"
    assert validate_topic_name("/") == "/"
    assert validate_topic_name("x" * MAX_TOPIC_BYTES)
    for bad in ["", "a/+", "a/#", "a#b", "a\x00", "x" * (MAX_TOPIC_BYTES + 1), "é" * 40000, "\ud800"]:
        with pytest.raises(InvalidArgument):
            validate_topic_name(bad)


def test_validate_topic_filter():
    for good in ["#", "+", "a/#", "+/+", "a/+/b/#", "/", "a//b", "$SYS/#", "+/"]:
        assert validate_topic_filter(good) == good
    for bad in ["", "a#", "#/a", "a/#/b", "a+", "+a/b", "a/b+", "##", "a\x00", "x" * 65536]:
        with pytest.raises(InvalidArgument):
            validate_topic_filter(bad)


@pytest.mark.parametrize(
    "topic_filter, topic, expected",
    [
        ("sport/#", "sport", True),
        ("sport/#", "sport/", True),
        ("sport/#", "sport/tennis/player1", True),
        ("sport/#", "sports", False),
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "a/b", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("$queue/orders/#", "$queue/orders", True),
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
    ],
)
def test_topic_matches(topic_filter, topic, expected):
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    "topic_filter, key, expected",
    [
        (None, "anything/at/all", True),
        (None, "", True),
        ("#", "", True),
        ("#", "$ack", True),  # no `$` rule on routing keys
        ("+", "$x", True),
        ("+", "", True),
        ("images/#", "images/png", True),
        ("images/#", "images/resize/thumbnail", True),
        ("images/#", "", False),
        ("+/images/#", "eu/images/resize", True),
        ("eu/#", "eu/images/resize", True),
        ("eu/#", "us/images/resize", False),
        ("images", "images", True),
        ("images", "images/png", False),
    ],
)
def test_routing_key_matches(topic_filter, key, expected):
    assert routing_key_matches(topic_filter, key) is expected


def test_parse_shared():
    assert parse_shared("$share/g1/sensors/#") == ("g1", "sensors/#")
    assert parse_shared("sensors/#") == (None, "sensors/#")
    assert parse_shared("$share/g/+") == ("g", "+")
    for bad in ["$share//a", "$share/g", "$share/g/", "$share/g+/a", "$share/g/a#", "a/#/b"]:
        with pytest.raises(InvalidArgument):
            parse_shared(bad)


from tests.strategies import topic_filters, topics  # noqa: E402


# ----------------------------------------------------------------------------- TopicTree


def test_topic_tree_basics():
    tree: TopicTree[str] = TopicTree()
    assert tree.add("sport/#", "s1")
    assert not tree.add("sport/#", "s1")
    assert tree.add("sport/tennis/+", "s2")
    assert tree.add("#", "all")
    assert tree.add("$SYS/#", "sys")
    assert tree.add("+/+", "two")
    assert len(tree) == 5
    assert tree.match("sport") == {"s1", "all"}
    assert tree.match("sport/tennis/p1") == {"s1", "s2", "all"}
    assert tree.match("sport/x") == {"s1", "all", "two"}
    assert tree.match("$SYS/load") == {"sys"}
    assert ("sport/#", "s1") in tree
    assert ("sport/#", "nope") not in tree
    assert sorted(tree.items()) == sorted(
        [("sport/#", "s1"), ("sport/tennis/+", "s2"), ("#", "all"), ("$SYS/#", "sys"), ("+/+", "two")]
    )
    assert tree.remove("sport/tennis/+", "s2")
    assert not tree.remove("sport/tennis/+", "s2")
    assert not tree.remove("no/such", "s2")
    assert tree.match("sport/tennis/p1") == {"s1", "all"}
    # The emptied branch was pruned.
    assert "tennis" not in tree._root.children["sport"].children
    with pytest.raises(InvalidArgument):
        tree.add("a/#/b", "x")


def test_topic_tree_many_subscriptions():
    tree: TopicTree[int] = TopicTree()
    for i in range(5000):
        tree.add(f"devices/{i}/telemetry", i)
    tree.add("devices/+/telemetry", -1)
    assert tree.match("devices/1234/telemetry") == {1234, -1}
    assert tree.match("devices/x/telemetry") == {-1}


@settings(max_examples=300)
@given(
    st.lists(st.tuples(topic_filters(), st.integers(0, 5)), max_size=25),
    st.lists(topics, min_size=1, max_size=8),
    st.data(),
)
def test_topic_tree_agrees_with_brute_force(subs, probe_topics, data):
    tree: TopicTree[int] = TopicTree()
    registered: set[tuple[str, int]] = set()
    for f, v in subs:
        assert tree.add(f, v) == ((f, v) not in registered)
        registered.add((f, v))
    # Remove a random subset, checking the tree keeps agreeing after pruning.
    for item in data.draw(st.lists(st.sampled_from(sorted(registered)), unique=True)) if registered else []:
        assert tree.remove(*item)
        registered.discard(item)
    assert len(tree) == len(registered)
    assert set(tree.items()) == registered
    for topic in probe_topics:
        expected = {v for f, v in registered if topic_matches(f, topic)}
        assert tree.match(topic) == expected
