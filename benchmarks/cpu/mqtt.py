"""MQTT: CPU per message of fluxpg (broker + its PostgreSQL backends) vs Mosquitto, paho-mqtt 2 (MQTT 5)
for both, 256-byte payloads, QoS 1 with 100 in flight.

Rows: QoS 1 into a durable queue `$queue/<q>/orders`, consumed in group `bench` and acked by a
QoS 0 `$queue/<q>/$ack` per message (fluxpg only: compared with Mosquitto's plain pub/sub, the
issue's target); QoS 1 plain pub/sub on both. Each row's subscriber runs in a process of its own
(the durable-queue row's since 2026-11-24: QUEUE_SUBSCRIBER_IN_PUBLISHER below). The measured
window runs from the first publish to the last delivery plus 0.3 s (so the last acks are processed
inside it), on both sides. A round in which the broker lost messages is reported and left out of
the figures (Sample.complete).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import struct
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
# The durable-queue row's subscriber ran in the publisher's process until 2026-11-24: its paho
# threads shared one GIL with the publisher's, and this subscriber does twice a plain one's work
# (five user properties to decode, an `$ack` to publish per message) -- the same pattern against
# Mosquitto ran at ~2,000 msg/s that way, ~3,500 without the properties, against Mosquitto's
# 6,000+ plain pub/sub with the subscriber in a process of its own. Set to compare with then.
QUEUE_SUBSCRIBER_IN_PUBLISHER = bool(os.environ.get("FLUXPG_BENCH_QUEUE_SUB_IN_PUBLISHER"))
# The session bound (bounds.mqtt_session_outbound_messages, 1,000 by default) is raised so that a
# subscriber falling behind its publisher -- the paho client on these loaded cores, more often the
# faster the broker -- is not disconnected with 0x97 in the middle of a run: the run measures the
# broker's work for every message. Mosquitto keeps its default max_queued_messages (1,000) and
# drops beyond it; such rounds are reported and left out (Sample.complete).
CONFIG = "queue_manager: {max_pending_per_group: 1000000}\nbounds: {mqtt_session_outbound_messages: 1000000}\n"


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


def _subscriber_main(host: str, port: int, topic: str, n: int, ready, done, stop, count, last, out,
                     queue: str | None = None) -> None:
    """The subscriber, in a process of its own (see _SubscriberProcess): of `topic`, or with
    `queue` of `$queue/<queue>/#` in group `bench`, acking each message with a QoS 0 `$ack`."""
    from benchmarks.mqtt import _client as client
    sub = client(port, "cqsub" if queue else "csub", host)
    reasons = _watch_disconnects(sub)
    latencies: list[float] = []

    def on_message(c, u, m):
        now = time.perf_counter()          # CLOCK_MONOTONIC: the publisher's clock too
        if queue is not None:
            props = dict(m.properties.UserProperty)
            ack = Properties(PacketTypes.PUBLISH)
            ack.UserProperty = [("message-id", props["message-id"]), ("group-id", props["group-id"])]
            c.publish(f"$queue/{queue}/$ack", b"", qos=0, properties=ack)
        latencies.append(now - struct.unpack(">d", m.payload[:8])[0])
        count.value = len(latencies)
        last.value = now
        if len(latencies) >= n:
            done.set()
    sub.on_message = on_message
    if queue is not None:
        sp = Properties(PacketTypes.SUBSCRIBE)
        sp.UserProperty = [("consumer-group", "bench")]
        _subscribe(sub, f"$queue/{queue}/#", sp)
    else:
        _subscribe(sub, topic)
    ready.set()
    stop.wait()
    told = list(reasons)                   # not the disconnect we are about to make
    sub.disconnect()
    sub.loop_stop()
    out.put((latencies, told))


class _SubscriberProcess:
    """A Run whose subscriber is another process. In the publisher's process the two paho
    threads share one GIL on two loaded cores, and the subscriber fell more than 1,000 messages
    behind in about half the rounds once the broker was fast -- Mosquitto then drops
    (max_queued_messages) and fluxpg disconnects (0x97), and the round measures the harness."""

    def __init__(self, host: str, port: int, topic: str, n: int, queue: str | None = None):
        ctx = mp.get_context("spawn")
        self.n = n
        self.first_sent = self.publish_done = self.last_received = 0.0
        self.latencies: list[float] = []
        self.disconnects: list[str] = []
        self.done, self._stop, ready = ctx.Event(), ctx.Event(), ctx.Event()
        self._count, self._last = ctx.Value("i", 0, lock=False), ctx.Value("d", 0.0, lock=False)
        self._out = ctx.Queue()
        self._proc = ctx.Process(target=_subscriber_main, daemon=True,
                                 args=(host, port, topic, n, ready, self.done, self._stop, self._count,
                                       self._last, self._out, queue))
        self._proc.start()
        if not ready.wait(60):
            self.close()
            raise RuntimeError("the subscriber process did not subscribe")

    def arrived(self) -> int:
        return self._count.value

    def finish(self) -> None:
        self._stop.set()
        self.latencies, self.disconnects = self._out.get(timeout=60)
        self.last_received = self._last.value

    def close(self) -> None:
        self._stop.set()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


def _measure(host: str, port: int, topic: str, run, meter: Meter, inflight: int,
             sub_disconnects: list | None = None) -> Sample:
    arrived = getattr(run, "arrived", lambda: len(run.latencies))
    pub = _client(port, "cpub", host, inflight)
    try:
        meter.begin()
        _publish_all(pub, topic, run)
        # A broker may drop QoS 1 messages for a subscriber that falls behind (Mosquitto's
        # max_queued_messages, 1,000 by default, on this loaded machine): wait until all arrived
        # or none came for 2 s, and count what arrived.
        seen = -1
        while not run.done.wait(2.0) and arrived() != seen:
            seen = arrived()
        time.sleep(SETTLE)
        cpu = meter.end()
    finally:
        pub.disconnect()
        pub.loop_stop()
    if hasattr(run, "finish"):
        run.finish()
        sub_disconnects = run.disconnects
    got = len(run.latencies)
    if got < run.n:
        # Mosquitto drops silently (max_queued_messages); fluxpg disconnects a subscriber above
        # bounds.mqtt_session_outbound_messages with 0x97 and loses what comes after (session
        # expiry 0): say which it was.
        why = f"subscriber disconnected by the broker: {', '.join(sub_disconnects or [])}" if sub_disconnects \
            else "dropped by the broker, no disconnect"
        print(f"  {run.n - got} of {run.n} messages were not delivered ({why})", file=sys.stderr)
    return Sample(got, run.last_received - run.first_sent, cpu, run.latencies, expected=run.n)


def pubsub(host: str, port: int, n: int, meter: Meter, inflight: int = 100) -> Sample:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    run = _SubscriberProcess(host, port, topic, n)
    try:
        return _measure(host, port, topic, run, meter, inflight)
    finally:
        run.close()


def queue(host: str, port: int, n: int, meter: Meter, inflight: int = 100) -> Sample:
    """The durable-queue row, its subscriber (which acks) in a process of its own as the pub/sub
    row's (same client arrangement as the peer's row; QUEUE_SUBSCRIBER_IN_PUBLISHER runs it in
    the publisher's process, as before 2026-11-24)."""
    name = f"cpu_{uuid.uuid4().hex[:8]}"
    if not QUEUE_SUBSCRIBER_IN_PUBLISHER:
        run = _SubscriberProcess(host, port, "", n, queue=name)
        try:
            return _measure(host, port, f"$queue/{name}/orders", run, meter, inflight)
        finally:
            run.close()
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
    rows = getattr(args, "rows", None) or ("queue", "pubsub")
    inflight = getattr(args, "inflight", None) or 100
    if side.startswith("fluxpg"):
        if "queue" in rows:
            out["queue"] = queue(host, port, args.messages, meter, inflight)
        if "pubsub" in rows:
            out["pubsub"] = pubsub(host, port, args.messages, meter, inflight)
    else:
        # The peer's plain pub/sub is the comparison of both rows: always run.
        out["pubsub"] = pubsub(host, port, args.messages, meter, inflight)
    return out


def sides(args, stack):
    from fluxpg.testing import fresh_database
    from benchmarks.cpu.accounting import Broker, peer_meter

    dsn = stack.enter_context(fresh_database(args.dsn))
    broker = Broker(dsn, args.dsn, CONFIG, ["mqtt"])
    stack.callback(broker.close)
    mhost, mport = args.mosquitto.rsplit(":", 1)
    out = {"fluxpg": (("127.0.0.1", broker.ports["mqtt"]), broker.meter()),
           PEER: ((mhost, int(mport)), peer_meter("mosquitto"))}
    if args.compare_with:
        before = Broker(stack.enter_context(fresh_database(args.dsn)), args.dsn,
                        CONFIG, ["mqtt"], repo=Path(args.compare_with))
        stack.callback(before.close)
        out["fluxpg-before"] = (("127.0.0.1", before.ports["mqtt"]), before.meter())
    return out
