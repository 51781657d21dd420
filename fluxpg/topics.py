"""Topic names, filters and queue addresses (pure: no I/O, no database).

Everything protocol front-ends and the queue engine need to agree on:

* `$queue/<name>[/<routing key>]` addresses (DESIGN §4), including the AMQP 0-9-1 form without the
  prefix (`orders`, `orders/eu/#`) and the dead-letter queues `$dlq/<name>`;
* the ack topics `$queue/<q>/…/$ack|$nack|$reject|$commit`;
* internal consumer-group names `group` / `group@filter` (FluxMQ);
* MQTT topic-name and topic-filter validation and matching, shared subscriptions
  (`$share/<group>/<filter>`), and a trie (`TopicTree`) that finds the subscriptions matching a
  topic without scanning all of them;

Routing keys and filters: a consumer filter applies to the routing key, the part of the topic after
`$queue/<name>/`. `$queue/orders` and `$queue/orders/` both have the routing key "" (one empty
level), which `#` and `+` match and `a/#` does not; `$`-prefixed routing keys get no special
treatment (unlike MQTT topics, whose `$` rule would otherwise hide e.g. a `$ack` level).

Errors are `fluxpg.errors.InvalidArgument` with a message fit to show a client.
"""
from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

from fluxpg.errors import InvalidArgument

QUEUE_PREFIX = "$queue/"
DLQ_PREFIX = "$dlq/"
SHARE_PREFIX = "$share/"

#: MQTT limits a topic to a UTF-8 string of at most 65535 bytes (a two-byte length prefix).
MAX_TOPIC_BYTES = 65535
MAX_QUEUE_NAME_LENGTH = 200

#: The verbs of `ack_verb`, as returned (without the `$` of the topic level).
ACK_VERBS = frozenset({"ack", "nack", "reject", "commit"})
_ACK_LEVELS = {"$" + verb: verb for verb in ACK_VERBS}



# --------------------------------------------------------------------------- MQTT names/filters


def _check_common(kind: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{kind} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{kind} must not be empty")
    if "\x00" in value:
        raise InvalidArgument(f"{kind} {value!r} contains a NUL character")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{kind} {value!r} is not valid UTF-8") from None
    if size > MAX_TOPIC_BYTES:
        raise InvalidArgument(f"{kind} is {size} bytes long, more than MQTT's {MAX_TOPIC_BYTES}")
    return value


def validate_topic_name(topic: str) -> str:
    """Check an MQTT topic name (what is published to); returns it unchanged."""
    _check_common("topic name", topic)
    if "+" in topic or "#" in topic:
        raise InvalidArgument(f"topic name {topic!r} must not contain the wildcards '+' or '#'")
    return topic


def validate_topic_filter(topic_filter: str) -> str:
    """Check an MQTT topic filter (what is subscribed to); returns it unchanged.

    `#` must be the last level and alone in it; `+` must be alone in its level.
    """
    _check_common("topic filter", topic_filter)
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            raise InvalidArgument(
                f"topic filter {topic_filter!r}: '#' must be the last level and alone in it"
            )
        if "+" in level and level != "+":
            raise InvalidArgument(f"topic filter {topic_filter!r}: '+' must be alone in its level")
    return topic_filter


@lru_cache(maxsize=4096)
def _filter_levels(topic_filter: str) -> tuple[str, ...]:
    # Filters are few and reused for every message; topics are not cached.
    return tuple(topic_filter.split("/"))


def _levels_match(filter_levels: tuple[str, ...], topic_levels: list[str]) -> bool:
    n = len(topic_levels)
    for i, level in enumerate(filter_levels):
        if level == "#":
            # Also matches the parent level itself: `sport/#` matches `sport`.
            return True
        if i >= n:
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == n


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching of a topic name against a (valid) filter.

    Topics starting with `$` (`$SYS/…`, `$queue/…`) are not matched by filters whose first level is
    a wildcard (MQTT 3.1.1 §4.7.2).
    """
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    return _levels_match(_filter_levels(topic_filter), topic.split("/"))


def routing_key_matches(topic_filter: str | None, routing_key: str) -> bool:
    """Does a consumer-group filter select this routing key? `None` (no filter) selects all.

    MQTT level matching without the `$` rule; `#` matches "" too.
    """
    if topic_filter is None:
        return True
    return _levels_match(_filter_levels(topic_filter), routing_key.split("/"))


# --------------------------------------------------------------------------- shared subscriptions


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """`$share/<group>/<filter>` → (group, filter); any other filter → (None, filter).

    The filter is validated either way.
    """
    if topic_filter.startswith(SHARE_PREFIX):
        group, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
        if not group or "+" in group or "#" in group:
            raise InvalidArgument(
                f"shared subscription {topic_filter!r}: the share name must be non-empty "
                "and contain no '+', '#' or '/'"
            )
        if not sep or not inner:
            raise InvalidArgument(
                f"shared subscription {topic_filter!r}: expected $share/<group>/<filter>"
            )
        return group, validate_topic_filter(inner)
    return None, validate_topic_filter(topic_filter)


# --------------------------------------------------------------------------- queue addresses


def is_queue_topic(topic: str) -> bool:
    return topic.startswith(QUEUE_PREFIX)


def validate_queue_name(name: str, *, allow_dlq: bool = False) -> str:
    """Check a queue name; returns it unchanged.

    The rule is SQL's `fluxpg.queue_name_error` (tests/integration/test_one_truth.py checks that
    both agree): 1–200 characters without `/`, `+`, `#` or control characters, no leading or
    trailing space, not starting with `$` (reserved for the broker's own queues). With
    `allow_dlq`, `$dlq/<name>` (a dead-letter queue) is accepted.
    """
    if not isinstance(name, str):
        raise InvalidArgument(f"queue name must be a string, got {type(name).__name__}")
    if allow_dlq and name.startswith(DLQ_PREFIX):
        validate_queue_name(name[len(DLQ_PREFIX) :])
        return name
    if not name:
        raise InvalidArgument("queue name must not be empty")
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidArgument(
            f"queue name {name[:40]!r}… is {len(name)} characters, at most {MAX_QUEUE_NAME_LENGTH}"
        )
    for bad, what in (("/", "'/'"), ("+", "the wildcard '+'"), ("#", "the wildcard '#'")):
        if bad in name:
            raise InvalidArgument(f"queue name {name!r} must not contain {what}")
    if _CONTROL.search(name):
        raise InvalidArgument(f"queue name {name!r} must not contain control characters")
    if name[0] == " " or name[-1] == " ":
        raise InvalidArgument(f"queue name {name!r} must not start or end with a space")
    if name.startswith("$"):
        raise InvalidArgument(
            f"queue name {name!r} must not start with '$' (reserved, e.g. for $dlq/<queue>)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"queue name {name!r} is not valid UTF-8") from None
    return name


# C0 control characters and DEL: never part of a queue or group name (SQL: [\x01-\x1f\x7f]; NUL
# cannot reach PostgreSQL text at all).
_CONTROL = re.compile("[\x00-\x1f\x7f]")
MAX_GROUP_NAME_LENGTH = 400


def validate_group_name(name: str) -> str:
    """Check a consumer group's internal name (`group` or `group@filter`); returns it unchanged.

    SQL's `fluxpg.group_name_error` is the rule (checked against this by test_one_truth.py): at
    most 400 characters, a non-empty group part without leading or trailing spaces, no control
    characters.
    """
    if not isinstance(name, str):
        raise InvalidArgument(f"consumer group must be a string, got {type(name).__name__}")
    group = name.partition("@")[0]
    if not group:
        raise InvalidArgument(f"consumer group {name!r} must not be empty")
    if len(name) > MAX_GROUP_NAME_LENGTH:
        raise InvalidArgument(f"consumer group {name[:40]!r}… is {len(name)} characters, at most "
                              f"{MAX_GROUP_NAME_LENGTH}")
    if _CONTROL.search(name):
        raise InvalidArgument(f"consumer group {name!r} must not contain control characters")
    if group[0] == " " or group[-1] == " ":
        raise InvalidArgument(f"consumer group {name!r} must not start or end with a space")
    return name


def dlq_name(queue: str) -> str:
    """The default dead-letter queue of a queue: `$dlq/<queue>`."""
    return DLQ_PREFIX + queue


def _split_name(rest: str, original: str) -> tuple[str, str | None]:
    """`orders/eu/x` → ("orders", "eu/x"); `$dlq/orders/eu` → ("$dlq/orders", "eu")."""
    first, sep, tail = rest.partition("/")
    if first == "$dlq":
        if not sep:
            raise InvalidArgument(f"{original!r}: expected $dlq/<queue> after the prefix")
        second, sep, tail = tail.partition("/")
        first = DLQ_PREFIX + second
    if "+" in first or "#" in first:
        raise InvalidArgument(
            f"{original!r}: wildcards are not allowed in the queue name {first!r} "
            "(a filter goes after it: $queue/<name>/<filter>)"
        )
    try:
        validate_queue_name(first, allow_dlq=True)
    except InvalidArgument as e:
        raise InvalidArgument(f"{original!r}: {e}") from None
    return first, (tail if sep else None)


class QueueTopic(NamedTuple):
    queue: str
    routing_key: str


# Topics up to this length are remembered once parsed: front-ends parse the same few topics for
# every message (~11 µs each on the publish path), and the cache stays small (at most
# _PARSED_MAX entries of _CACHE_TOPIC_LEN characters) whatever clients send.
_CACHE_TOPIC_LEN = 512
_PARSED_MAX = 1024


def parse_queue_topic(topic: str) -> QueueTopic:
    """`$queue/orders/eu/images` → QueueTopic("orders", "eu/images"); `$queue/orders` → ("orders", "").

    For topics published to: the routing key must not contain wildcards.
    """
    if not isinstance(topic, str) or not topic.startswith(QUEUE_PREFIX):
        raise InvalidArgument(f"{topic!r} is not a queue topic (expected {QUEUE_PREFIX}<name>[/<routing key>])")
    if len(topic) <= _CACHE_TOPIC_LEN:
        return _parse_queue_topic_cached(topic)   # a refused topic raises and is not cached
    return _parse_queue_topic(topic)


def _parse_queue_topic(topic: str) -> QueueTopic:
    queue, routing_key = _split_name(topic[len(QUEUE_PREFIX) :], topic)
    routing_key = routing_key or ""
    if "+" in routing_key or "#" in routing_key:
        raise InvalidArgument(f"{topic!r}: a topic published to must not contain wildcards")
    if "\x00" in routing_key:
        raise InvalidArgument(f"{topic!r} contains a NUL character")
    return QueueTopic(queue, routing_key)


_parse_queue_topic_cached = lru_cache(maxsize=_PARSED_MAX)(_parse_queue_topic)


def split_queue_subscription(topic_or_name: str) -> tuple[str, str | None]:
    """A queue subscription → (queue, consumer filter or None).

    `$queue/orders/#` → ("orders", "#"); `$queue/orders` → ("orders", None). The AMQP 0-9-1 form
    without the prefix is accepted too (`orders`, `orders/eu/#`), because client libraries refuse
    `$` in queue names (FACTS.md).
    """
    if not isinstance(topic_or_name, str) or not topic_or_name:
        raise InvalidArgument("queue subscription must be a non-empty string")
    rest = topic_or_name
    if rest.startswith(QUEUE_PREFIX):
        rest = rest[len(QUEUE_PREFIX) :]
    queue, topic_filter = _split_name(rest, topic_or_name)
    if topic_filter is not None:
        if topic_filter == "":
            raise InvalidArgument(
                f"{topic_or_name!r}: empty filter after the queue name "
                f"(use {QUEUE_PREFIX}{queue} for all messages, or …/# )"
            )
        try:
            validate_topic_filter(topic_filter)
        except InvalidArgument as e:
            raise InvalidArgument(f"{topic_or_name!r}: {e}") from None
    return queue, topic_filter


def ack_verb(topic: str) -> tuple[str, str] | None:
    """`$queue/<q>/…/$ack|$nack|$reject|$commit` → (queue, "ack"|"nack"|"reject"|"commit").

    The verb is the last level, the queue the first segment after `$queue/` (two for `$dlq/<q>`).
    Returns None for topics that are not acknowledgements; raises for an ack topic whose queue
    name is invalid.
    """
    if not topic.startswith(QUEUE_PREFIX):
        return None
    head, sep, last = topic.rpartition("/")
    verb = _ACK_LEVELS.get(last)
    if verb is None or len(head) < len(QUEUE_PREFIX):
        # `$queue/$ack`: a `$ack` level but no queue before it — not an ack.
        return None
    if len(topic) <= _CACHE_TOPIC_LEN:
        # A consumer acks every message on the same topic: its queue name is checked once.
        return _ack_queue_cached(head, topic), verb   # a refused name raises and is not cached
    return _ack_queue(head, topic), verb


def _ack_queue(head: str, topic: str) -> str:
    return _split_name(head[len(QUEUE_PREFIX) :], topic)[0]


_ack_queue_cached = lru_cache(maxsize=_PARSED_MAX)(_ack_queue)


# --------------------------------------------------------------------------- consumer-group names


def internal_group_name(group: str, topic_filter: str | None) -> str:
    """`("workers", "orders/+")` → `workers@orders/+`; no filter → `workers` (FluxMQ).

    The group part may not contain `@` (the first `@` separates it from the filter, which may).
    """
    if not isinstance(group, str) or not group:
        raise InvalidArgument("consumer group must be a non-empty string")
    if "@" in group:
        raise InvalidArgument(f"consumer group {group!r} must not contain '@'")
    return validate_group_name(group if topic_filter is None else f"{group}@{topic_filter}")


def parse_internal_group(name: str) -> tuple[str, str | None]:
    """`workers@orders/+` → ("workers", "orders/+"); `workers` → ("workers", None)."""
    group, sep, topic_filter = name.partition("@")
    if not group:
        raise InvalidArgument(f"malformed internal group name {name!r}: empty group")
    return group, (topic_filter if sep else None)


# --------------------------------------------------------------------------- subscription index

V = TypeVar("V", bound=Hashable)


class _Node:
    __slots__ = ("children", "values")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.values: set = set()


class TopicTree(Generic[V]):
    """Subscriptions indexed by filter level: `match` visits only the branches a topic can reach.

    A node per filter level; `+` and `#` are ordinary child keys looked up alongside the literal
    level. Cost of a match is proportional to the topic's depth times the wildcard branches taken,
    not to the number of subscriptions. Filters are validated on `add`; topics given to `match` are
    assumed valid (they were checked when published).
    """

    __slots__ = ("_root", "_count")

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def add(self, topic_filter: str, value: V) -> bool:
        """Register `value` under `topic_filter`; False if it was already there."""
        validate_topic_filter(topic_filter)
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if value in node.values:
            return False
        node.values.add(value)
        self._count += 1
        return True

    def remove(self, topic_filter: str, value: V) -> bool:
        """Unregister; False if it was not registered. Empty branches are pruned."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if value not in node.values:
            return False
        node.values.discard(value)
        self._count -= 1
        # Prune so that a churn of short-lived subscriptions does not leave the tree growing.
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.values or child.children:
                break
            del parent.children[level]
        return True

    def match(self, topic: str) -> set[V]:
        """The values of every filter matching `topic` (MQTT rules, including the `$` rule)."""
        levels = topic.split("/")
        depth = len(levels)
        dollar = topic.startswith("$")
        out: set = set()
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            wildcards_ok = not (dollar and i == 0)
            if wildcards_ok:
                multi = children.get("#")
                if multi is not None:
                    # `#` matches the rest, including nothing: `sport/#` matches `sport`.
                    out |= multi.values
            if i == depth:
                out |= node.values
                continue
            if wildcards_ok:
                single = children.get("+")
                if single is not None:
                    stack.append((single, i + 1))
            exact = children.get(levels[i])
            if exact is not None:
                stack.append((exact, i + 1))
        return out

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (filter, value) registered, in no particular order."""
        stack: list[tuple[_Node, tuple[str, ...]]] = [
            (child, (level,)) for level, child in self._root.children.items()
        ]
        while stack:
            node, levels = stack.pop()
            filt = "/".join(levels)
            for value in node.values:
                yield filt, value
            stack.extend((child, levels + (level,)) for level, child in node.children.items())

    def __len__(self) -> int:
        return self._count

    def __contains__(self, item: tuple[str, V]) -> bool:
        topic_filter, value = item
        node = self._root
        for level in topic_filter.split("/"):
            node = node.children.get(level)
            if node is None:
                return False
        return value in node.values
