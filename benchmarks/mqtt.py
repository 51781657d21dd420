"""MQTT benchmark: fluxpg's MQTT front-end against Mosquitto, same client (paho, MQTT 5), same
256-byte payloads, QoS 1 everywhere.

    python benchmarks/mqtt.py --dsn postgresql://postgres@127.0.0.1:5432/postgres [--messages N]

Scenarios:
  queue    publish N messages to a durable classic queue `$queue/bench/...` (PUBACK after commit),
           a consumer in group `bench` receives them and acks each with `$queue/bench/$ack`
           (QoS 0, user properties message-id/group-id); at the end group_status must show
           committed = N.
  pubsub   QoS 1 publish → QoS 1 subscriber on a plain topic, through fluxpg and through Mosquitto
           (127.0.0.1:1883 unless --mosquitto).

The fluxpg server runs in its own process (its own GIL) on free ports, on a fresh database created
on the --dsn server and dropped afterwards. Publishers keep up to --inflight QoS 1 messages
unacknowledged. Latency = subscriber receive time - publish time (both clocks in this process),
so it includes queueing behind the in-flight window.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import struct
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

PAYLOAD_SIZE = 256


# ------------------------------------------------------------------------------------ server


def _serve(dsn: str, queue: str, ports: mp.Queue, stop: mp.Event) -> None:
    from fluxpg.config import Config, QueueConfig
    from fluxpg.server import Server

    async def main():
        config = Config(queues=[QueueConfig(name=queue, limits={"max_depth": 0})])
        server = await Server.start(dsn, config, addresses={"mqtt": "127.0.0.1:0", "amqp": None,
                                                            "amqp091": None, "http": None},
                                    migrate=True, retention=False)
        ports.put(server.port("mqtt"))
        while not stop.is_set():
            await asyncio.sleep(0.2)
        if os.environ.get("FLUXPG_BENCH_STATS"):
            rows = await server.manager.group_status(queue)
            ports.put([dict(r) for r in rows])
        await server.close()

    asyncio.run(main())


# ------------------------------------------------------------------------------------ clients


def _client(port: int, name: str, host: str = "127.0.0.1", inflight: int = 100) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-{uuid.uuid4().hex[:6]}",
                    protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(inflight)
    c.max_queued_messages_set(0)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect(host, port, 60)
    c.loop_start()
    if not connected.wait(10):
        raise SystemExit(f"cannot connect to MQTT {host}:{port}")
    return c


def _payload(i: int) -> bytes:
    return struct.pack(">dI", time.perf_counter(), i).ljust(PAYLOAD_SIZE, b"x")


class Run:
    def __init__(self, n: int):
        self.n = n
        self.latencies: list[float] = []
        self.done = threading.Event()
        self.first_sent = 0.0
        self.last_received = 0.0
        self.publish_done = 0.0
        self.acked = 0
        self.lock = threading.Lock()

    def received(self, payload: bytes) -> None:
        now = time.perf_counter()
        sent, _ = struct.unpack(">dI", payload[:12])
        with self.lock:
            self.latencies.append(now - sent)
            self.last_received = now
            if len(self.latencies) >= self.n:
                self.done.set()

    def result(self) -> dict:
        lat = sorted(self.latencies)
        elapsed = self.last_received - self.first_sent
        return {
            "messages": len(lat),
            "msgs_per_s": len(lat) / elapsed if elapsed > 0 else 0.0,
            "publish_msgs_per_s": self.n / (self.publish_done - self.first_sent) if self.publish_done else 0.0,
            "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"),
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
        }


def _publish_all(pub: mqtt.Client, topic: str, run: Run) -> None:
    run.first_sent = time.perf_counter()
    infos = []
    for i in range(run.n):
        while True:
            info = pub.publish(topic, _payload(i), qos=1)
            if info.rc == mqtt.MQTT_ERR_SUCCESS:
                break
            time.sleep(0.001)   # paho's queue is full: the in-flight window is the limit
        infos.append(info)
    for info in infos:
        info.wait_for_publish(60)
    run.publish_done = time.perf_counter()


def bench_pubsub(port: int, n: int, host: str, inflight: int) -> dict:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    run = Run(n)
    sub = _client(port, "bsub", host)
    sub.on_message = lambda c, u, m: run.received(m.payload)
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe(topic, options=SubscribeOptions(qos=1))
    subscribed.wait(10)
    pub = _client(port, "bpub", host, inflight)
    _publish_all(pub, topic, run)
    run.done.wait(120)
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    return run.result()


def bench_queue(port: int, n: int, queue: str, inflight: int) -> dict:
    run = Run(n)
    sub = _client(port, "bqsub")

    def on_message(c, u, m):
        props = dict(m.properties.UserProperty)
        ack = Properties(PacketTypes.PUBLISH)
        ack.UserProperty = [("message-id", props["message-id"]), ("group-id", props["group-id"])]
        c.publish(f"$queue/{queue}/$ack", b"", qos=0, properties=ack)
        run.received(m.payload)

    sub.on_message = on_message
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sp = Properties(PacketTypes.SUBSCRIBE)
    sp.UserProperty = [("consumer-group", "bench")]
    sub.subscribe(f"$queue/{queue}/#", options=SubscribeOptions(qos=1), properties=sp)
    subscribed.wait(10)
    pub = _client(port, "bqpub", inflight=inflight)
    _publish_all(pub, f"$queue/{queue}/orders", run)
    run.done.wait(180)
    time.sleep(0.5)   # let the last QoS 0 acks commit before the group is inspected
    for c in (pub, sub):
        c.disconnect()
        c.loop_stop()
    return run.result()


# ------------------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("FLUXPG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--inflight", type=int, default=100)
    ap.add_argument("--mosquitto", default="127.0.0.1:1883")
    args = ap.parse_args()

    from fluxpg.testing import fresh_database

    queue = "bench"
    os.environ["FLUXPG_BENCH_STATS"] = "1"
    results: dict[str, dict] = {}
    with fresh_database(args.dsn) as dsn:
        ports: mp.Queue = mp.Queue()
        stop = mp.Event()
        proc = mp.Process(target=_serve, args=(dsn, queue, ports, stop), daemon=True)
        proc.start()
        port = ports.get(timeout=120)
        try:
            print(f"fluxpg MQTT on 127.0.0.1:{port}; {args.messages} messages of {PAYLOAD_SIZE} B, "
                  f"QoS 1, {args.inflight} in flight", flush=True)
            results["fluxpg queue (publish → consume + $ack)"] = bench_queue(port, args.messages, queue, args.inflight)
            print("queue done", flush=True)
            results["fluxpg pub/sub"] = bench_pubsub(port, args.messages, "127.0.0.1", args.inflight)
            print("fluxpg pub/sub done", flush=True)
        finally:
            stop.set()
            status = ports.get(timeout=60)
            proc.join(30)
        mhost, mport = args.mosquitto.rsplit(":", 1)
        results["Mosquitto pub/sub"] = bench_pubsub(int(mport), args.messages, mhost, args.inflight)
        committed = sum(r["committed"] for r in status if r["grp"].startswith("bench"))
    print()
    print(f"{'scenario':42} {'msgs/s':>9} {'publish/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, r in results.items():
        print(f"{name:42} {r['msgs_per_s']:9.0f} {r['publish_msgs_per_s']:10.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}")
    fq, fp, mq = (results[k] for k in results)
    print()
    print(f"group `bench` committed offset after the run: {committed} (expected {args.messages})")
    print(f"fluxpg pub/sub / Mosquitto throughput: {fp['msgs_per_s'] / mq['msgs_per_s']:.2f}")
    print(f"fluxpg queue / Mosquitto pub/sub throughput: {fq['msgs_per_s'] / mq['msgs_per_s']:.2f}")
    print(f"p50 latency fluxpg pub/sub / Mosquitto: {fp['p50_ms'] / mq['p50_ms']:.2f}; "
          f"fluxpg queue / Mosquitto: {fq['p50_ms'] / mq['p50_ms']:.2f}")
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    main()
