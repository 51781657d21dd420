"""Plain group names on the wire (issue 14): an MQTT client that subscribed to $queue/<q>/# with
consumer-group `mg` (internal group `mg@#`) acks with `group-id: mg`, as it configured it, when
no other `mg…` group of the queue makes that ambiguous. The rule is SQL's (fluxpg._group via
fluxpg.resolve_group), so every settle path of every protocol agrees."""
from __future__ import annotations

from fluxpg.config import QueueConfig
from tests.protocols.test_mqtt_paho import Paho, msg_props, pub_props, user_props


def pending_of(server, queue: str, group: str) -> int:
    rows = server.call(server.manager.pending_entries(queue, group))
    return len(rows)


def test_mqtt_ack_with_the_plain_group_name(threaded_broker, qname):
    server = threaded_broker(queues=[QueueConfig(name=qname)])
    port = server.port("mqtt")
    pub = Paho(port)
    for i in range(2):
        assert pub.publish(f"$queue/{qname}/x", f"m{i}".encode(), qos=1) == 0
    sub = Paho(port)
    assert sub.subscribe(f"$queue/{qname}/#", qos=1, props=user_props(consumer_group="mg"))[0] == 1
    got = [msg_props(sub.get()) for _ in range(2)]
    assert {p["group-id"] for p in got} == {"mg@#"}
    for p in got:
        assert sub.publish(f"$queue/{qname}/$ack", b"", qos=1,
                           props=pub_props(message_id=p["message-id"], group_id="mg")) == 0
    assert pending_of(server, qname, "mg@#") == 0
    pub.close()
    sub.close()
