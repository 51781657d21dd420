"""MQTT: CPU per message of fluxpg (broker + its PostgreSQL backends) vs Mosquitto, paho-mqtt 2 (MQTT 5)
for both, 256-byte payloads, QoS 1 with 100 in flight.

Rows: QoS 1 into a durable queue `$queue/<q>/orders`, consumed in group `bench` and acked by a
QoS 0 `$queue/<q>/$ack` per message (fluxpg only: compared with Mosquitto's plain pub/sub, the
issue's target); QoS 1 plain pub/sub on both. The measured window runs from the first publish to
the last delivery plus 0.3 s (so the last acks are processed inside it), on both sides.
"""
from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from benchmarks.cpu.accounting import Meter, Sample
from benchmarks.mqtt import Run, _client, _publish_all

PEER = "Mosquitto"
ROWS = {
    "MQTT QoS 1 into a durable queue, consumed + `$ack` (peer: its plain pub/sub)": ("queue", "pubsub"),
    "MQTT QoS 1 plain pub/sub": ("pubsub", "pubsub"),
}
SETTLE = 0.3


def _subscribe(client, topic: str, properties=None) -> None:
    subscribed = threading.Event()
    client.on_subscribe = lambda *a: subscribed.set()
    client.subscribe(topic, options=SubscribeOptions(qos=1), properties=properties)
    if not subscribed.wait(30):
        raise RuntimeError(f"no SUBACK for {topic}")


def _watch_disconnects(client) -> list:
    """The reasons the broker gave for ending this client's connection (paho reconnects on its
    own, without the subscription, so a loss would otherwise look silent)."""
    reasons: list = []
    client.on_disconnect = lambda c, u, flags, rc, props=None: reasons.append(str(rc))
    return reasons


def _measure(host: str, port: int, topic: str, run: Run, meter: Meter, inflight: int,
             sub_disconnects: list) -> Sample:
    pub = _client(port, "cpub", host, inflight)
    try:
        meter.begin()
        _publish_all(pub, topic, run)
        # A broker may drop QoS 1 messages for a subscriber that falls behind (Mosquitto's
        # max_queued_messages, 1,000 by default, on this loaded machine): wait until all arrived
        # or none came for 2 s, and count what arrived.
        seen = -1
        while not run.done.wait(2.0) and len(run.latencies) != seen:
            seen = len(run.latencies)
        time.sleep(SETTLE)
        cpu = meter.end()
    finally:
        pub.disconnect()
        pub.loop_stop()
    got = len(run.latencies)
    if got < run.n:
        # Mosquitto drops silently (max_queued_messages); fluxpg disconnects a subscriber above
        # bounds.mqtt_session_outbound_messages with 0x97 and loses what comes after (session
        # expiry 0): say which it was.
        why = f"subscriber disconnected by the broker: {', '.join(sub_disconnects)}" if sub_disconnects \
            else "dropped by the broker, no disconnect"
        print(f"  {run.n - got} of {run.n} messages were not delivered ({why})", file=sys.stderr)
    return Sample(got, run.last_received - run.first_sent, cpu, run.latencies, expected=run.n)


def pubsub(host: str, port: int, n: int, meter: Meter, inflight: int = 100) -> Sample:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    run = Run(n)
    sub = _client(port, "csub", host)
    try:
        sub.on_message = lambda c, u, m: run.received(m.payload)
        gone = _watch_disconnects(sub)
        _subscribe(sub, topic)
        return _measure(host, port, topic, run, meter, inflight, gone)
    finally:
        sub.disconnect()
        sub.loop_stop()


def queue(host: str, port: int, n: int, meter: Meter, inflight: int = 100) -> Sample:
    name = f"cpu_{uuid.uuid4().hex[:8]}"
    run = Run(n)
    sub = _client(port, "cqsub", host)

    def on_message(c, u, m):
        props = dict(m.properties.UserProperty)
        ack = Properties(PacketTypes.PUBLISH)
        ack.UserProperty = [("message-id", props["message-id"]), ("group-id", props["group-id"])]
        c.publish(f"$queue/{name}/$ack", b"", qos=0, properties=ack)
        run.received(m.payload)

    try:
        sub.on_message = on_message
        sp = Properties(PacketTypes.SUBSCRIBE)
        sp.UserProperty = [("consumer-group", "bench")]
        gone = _watch_disconnects(sub)
        _subscribe(sub, f"$queue/{name}/#", sp)
        return _measure(host, port, f"$queue/{name}/orders", run, meter, inflight, gone)
    finally:
        sub.disconnect()
        sub.loop_stop()


def one_round(side: str, target: tuple[str, int], meter: Meter, args) -> dict[str, Sample]:
    host, port = target
    out = {}
    if side.startswith("fluxpg"):
        out["queue"] = queue(host, port, args.messages, meter)
    out["pubsub"] = pubsub(host, port, args.messages, meter)
    return out


def sides(args, stack):
    from fluxpg.testing import fresh_database
    from benchmarks.cpu.accounting import Broker, peer_meter

    dsn = stack.enter_context(fresh_database(args.dsn))
    broker = Broker(dsn, args.dsn, "queue_manager: {max_pending_per_group: 1000000}\n", ["mqtt"])
    stack.callback(broker.close)
    mhost, mport = args.mosquitto.rsplit(":", 1)
    out = {"fluxpg": (("127.0.0.1", broker.ports["mqtt"]), broker.meter()),
           PEER: ((mhost, int(mport)), peer_meter("mosquitto"))}
    if args.compare_with:
        before = Broker(stack.enter_context(fresh_database(args.dsn)), args.dsn,
                        "queue_manager: {max_pending_per_group: 1000000}\n", ["mqtt"], repo=Path(args.compare_with))
        stack.callback(before.close)
        out["fluxpg-before"] = (("127.0.0.1", before.ports["mqtt"]), before.meter())
    return out
