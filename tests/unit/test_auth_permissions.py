"""Permission patterns (queue names or topic filters) against queues, topics and subscriptions."""
import pytest

from fluxpg.auth import Principal, pattern_allows


@pytest.mark.parametrize("pattern, name, expected", [
    # a queue name covers all of that queue, in every spelling
    ("orders", "orders", True),
    ("orders", "$queue/orders", True),
    ("orders", "$queue/orders/eu/de", True),
    ("orders", "$queue/orders/eu/#", True),
    ("orders", "orders/eu/#", True),
    ("orders", "$queue/orders2/x", False),
    ("orders", "invoices", False),
    # a topic filter covers the topics it matches ...
    ("$queue/orders/#", "$queue/orders/eu/de", True),
    ("$queue/orders/#", "$queue/orders", True),
    ("$queue/orders/eu/#", "$queue/orders/us/ny", False),
    ("$queue/+/audit", "$queue/orders/audit", True),
    ("$queue/+/audit", "$queue/orders/other", False),
    # ... and the subscriptions whose every topic it matches
    ("$queue/orders/#", "orders", True),
    ("$queue/orders/#", "$queue/orders/eu/+", True),
    ("$queue/orders/eu/#", "orders", False),
    ("$queue/orders/eu/#", "$queue/orders/#", False),
    ("$queue/orders/eu/+", "$queue/orders/eu/#", False),
    ("$queue/orders/+/x", "$queue/orders/+/x", True),
    # plain MQTT topics
    ("sensors/#", "sensors/kitchen/temp", True),
    ("sensors/+", "sensors/kitchen/temp", False),
    ("#", "$queue/anything/at/all", True),
    # nothing matches the empty pattern, nothing is matched by an empty name
    ("", "orders", False),
    ("orders", "", False),
])
def test_pattern_allows(pattern, name, expected):
    assert pattern_allows(pattern, name) is expected


def test_principal_actions():
    p = Principal("bob", permissions=(("publish", "$queue/orders/#"), ("consume", "orders"), ("all", "audit")))
    assert p.allowed("publish", "$queue/orders/eu")
    assert not p.allowed("consume", "$queue/invoices/x")
    assert p.allowed("consume", "orders")
    assert not p.allowed("publish", "$queue/invoices/x")
    assert p.allowed("publish", "$queue/audit/x") and p.allowed("consume", "audit")
    assert Principal("root").allowed("publish", "$queue/anything")          # None = everything
    assert not Principal("nobody", permissions=()).allowed("consume", "orders")  # [] = nothing


def test_authorize_grants_table():
    from fluxpg.auth import authorize
    p = Principal("u", permissions=(("consume", "orders"), ("configure", "newq"), ("manage", "#"),
                                    ("read", "audit"), ("publish", "$queue/#")))
    # consume grants settling and reading the queue
    for action in ("consume", "ack", "nack", "reject", "commit", "read"):
        assert authorize(p, action, "orders"), action
    assert not authorize(p, "configure", "orders")
    # configure grants read; read grants nothing else
    assert authorize(p, "configure", "newq") and authorize(p, "read", "newq")
    assert authorize(p, "read", "audit") and not authorize(p, "consume", "audit")
    # manage on everything grants monitoring, broker-wide (resource None) and per queue
    assert authorize(p, "monitoring") and authorize(p, "manage") and authorize(p, "monitoring", "x")
    # unknown actions are refused, even for principals with every permission
    assert not authorize(Principal("root"), "frobnicate", "orders")
    assert authorize(None, "publish", "$queue/x")   # no login step: auth is off


def test_control_publish_needs_consume_on_the_whole_queue():
    from fluxpg.auth import authorize
    publisher = Principal("p", permissions=(("publish", "$queue/#"),))
    assert authorize(publisher, "publish", "$queue/sec/x")
    for verb in ("ack", "nack", "reject", "commit"):
        assert not authorize(publisher, "publish", f"$queue/sec/${verb}")
    filtered = Principal("f", permissions=(("consume", "$queue/sec/eu/#"),))
    assert authorize(filtered, "consume", "$queue/sec/eu/#")
    assert not authorize(filtered, "ack", "sec")   # another consumer's entries may lie outside eu/#
    keeper = Principal("k", permissions=(("consume", "sec"),))
    assert authorize(keeper, "publish", "$queue/sec/$ack") and authorize(keeper, "reject", "sec")


def test_consume_groups():
    from fluxpg.auth import Permission, authorize
    p = Principal("g", permissions=(Permission("consume", "jobs", ("workers-*", "audit")),))
    assert authorize(p, "consume", "jobs", group="workers-1")
    assert authorize(p, "consume", "jobs", group="workers-1@eu/#")   # a filtered group's internal name
    assert authorize(p, "ack", "jobs", group="audit")
    assert not authorize(p, "consume", "jobs", group="spy")
    assert not authorize(p, "commit", "jobs", group="spy")


def test_subscription_names_are_the_same_on_every_protocol():
    from fluxpg.auth import authorize, subscription
    p = Principal("eu", permissions=(("consume", "$queue/orders/eu/#"),))
    assert subscription("orders", None) == "orders" and subscription("orders", "#") == "orders"
    assert authorize(p, "consume", subscription("orders", "eu/#"))
    assert authorize(p, "consume", subscription("orders", "eu/de"))
    assert not authorize(p, "consume", subscription("orders", None))
    assert not authorize(p, "consume", subscription("orders", "+/de"))


def test_config_permissions_round_trip():
    from fluxpg.auth_config import permissions_tuple
    from fluxpg.config import AuthConfig
    cfg = AuthConfig(users=[{"username": "a", "password": "x", "permissions": [
        {"action": "monitoring"}, {"action": "consume", "pattern": "jobs", "groups": ["w-*"]}]}])
    perms = permissions_tuple(cfg.users[0].permissions)
    assert perms == (("monitoring", "#", None), ("consume", "jobs", ("w-*",)))
    # the fluxpg.users table's JSON: unknown actions grant nothing, old entries keep their meaning
    assert permissions_tuple('[{"action": "publish", "pattern": "q"}, {"action": "root"}]') == (("publish", "q", None),)
