"""No lost subscribe window (issue 16): a message another client publishes after the broker has
received a SUBSCRIBE but before it has sent the SUBACK is delivered.

The window is widened on purpose: the SUBSCRIBE carries a `$queue/` filter and then a plain
filter, and the queue manager's subscribe is held back (a real subscribe, behind a gate) -- so the
SUBACK cannot go out until the test opens the gate, while the publisher's message is routed."""
from __future__ import annotations

import asyncio

import pytest
from paho.mqtt.subscribeoptions import SubscribeOptions

from test_mqtt_paho import V5, V311, Paho, classic, uid, wait_until


@pytest.mark.parametrize("version", [V5, V311])
def test_publish_between_subscribe_and_suback_is_delivered(threaded_broker, qname, version):
    server = threaded_broker(queues=[classic(qname)])
    manager = server.manager
    gate = asyncio.Event()
    entered = []
    real_subscribe = manager.subscribe

    async def gated_subscribe(*args, **kwargs):
        entered.append(args[0])
        await gate.wait()
        return await real_subscribe(*args, **kwargs)

    manager.subscribe = gated_subscribe
    try:
        port = server.port("mqtt")
        topic = f"window/{uid()}"
        sub = Paho(port, version=version)
        pub = Paho(port, version=version)
        subacks = []
        sub.c.on_subscribe = lambda c, u, mid, codes, props: subacks.append([int(getattr(x, "value", x)) for x in codes])
        if version == V5:
            opts = SubscribeOptions(qos=1)
            sub.c.subscribe([(f"$queue/{qname}", SubscribeOptions(qos=1)), (topic, opts)])
        else:
            sub.c.subscribe([(f"$queue/{qname}", 1), (topic, 1)])
        wait_until(lambda: entered, 5)       # the SUBSCRIBE is being handled, no SUBACK yet
        assert subacks == []
        for i in range(3):
            pub.publish(topic, f"m{i}".encode(), qos=i % 3)
        assert subacks == []                  # still inside the window
        server.loop.call_soon_threadsafe(gate.set)
        got = [sub.get() for _ in range(3)]
        assert [m.payload for m in got] == [b"m0", b"m1", b"m2"]
        assert [m.qos for m in got] == [0, 1, 1]   # granted QoS 1 caps the QoS 2 message
        wait_until(lambda: subacks, 5)
        assert subacks == [[1, 1]]
        sub.nothing(0.3)
        pub.close()
        sub.close()
    finally:
        manager.subscribe = real_subscribe


@pytest.mark.parametrize("version", [V5, V311])
def test_dollar_topics_publishable_but_hidden_from_wildcards(threaded_broker, version):
    """As in Mosquitto (and Paho's test_dollar_topics): a `$` topic may be published to; a filter
    starting with a wildcard does not see it (§4.7.2), an exact subscription does; `$SYS/` is refused."""
    server = threaded_broker()
    port = server.port("mqtt")
    suffix = uid()
    wild = Paho(port, version=version)
    # (Not `#`: the database is shared by the test session, and `#` would get other tests' retained
    # messages.) `+/<suffix>` matches `$app/<suffix>` but for the `$` rule.
    wild.subscribe(f"+/{suffix}", qos=1)
    exact = Paho(port, version=version)
    name = f"$app/{suffix}"
    exact.subscribe(name, qos=1)
    pub = Paho(port, version=version)
    pub.publish(name, b"dollar", qos=1)
    assert exact.get().payload == b"dollar"
    wild.nothing(0.5)
    if version == V5:
        assert int(pub.publish("$SYS/x", b"no", qos=1).value) == 0x90
    for c in (wild, exact, pub):
        c.close()
