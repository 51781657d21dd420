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
