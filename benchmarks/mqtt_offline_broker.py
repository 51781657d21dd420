"""Offline messages of persistent MQTT sessions through the broker: the shared offline log with a
cursor per session (what fluxpg does, migration 0012) against one row per session per message
(the design before it, still in the code as `Router.offline_log = False`).

N persistent MQTT 5 sessions (session expiry 1 h) subscribe to `fleet/<run>/#` at QoS 1 and
disconnect; one publisher sends M QoS 1 messages of --payload bytes to `fleet/<run>/cmd`, each
awaited (PUBACK comes after the rows are committed: confirmed one by one, as devices publish);
then every session reconnects and receives its M messages, acking each. Measured per design:

* burst: time to publish the M messages with all N sessions offline;
* DB bytes: pg_total_relation_size of mqtt_offline_log + mqtt_offline_cursors +
  mqtt_session_messages after the burst (what the burst wrote, indexes and TOAST included);
* rows written by the burst;
* drain: time until all N sessions got all M messages after reconnecting (N connections at once),
  and until the session store has written what that delivery changed (in-flight rows).

    python benchmarks/mqtt_offline_broker.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        [--sessions 1000] [--messages 200] [--payload 256] [--design log,rows]

The broker runs in this process (one event loop, clients included: the clients are minimal
asyncio ones on fluxpg's own sans-I/O codec, so 1,000 sessions cost no threads). Each design gets
a fresh database, created on the --dsn server and dropped afterwards.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import asyncpg  # noqa: E402

from fluxpg.config import Config  # noqa: E402
from fluxpg.protocols.mqtt.codec import (MQTT_5, Connack, Connect, Decoder, Disconnect, Properties,  # noqa: E402
                                         Puback, Publish, Suback, Subscribe, Subscription, encode)
from fluxpg.server import Server  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402


class Client:
    """Just enough MQTT 5 for the benchmark: connect, subscribe, publish QoS 1, receive QoS 1."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.decoder = Decoder(version=MQTT_5)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.session_present = False

    async def connect(self, port: int, clean: bool) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        props = Properties()
        props.session_expiry_interval = 3600
        props.receive_maximum = 1000
        self.send(Connect(self.client_id, clean_start=clean, properties=props))
        ack = await self.next()
        assert isinstance(ack, Connack) and not ack.reason_code, ack
        self.session_present = ack.session_present

    def send(self, packet) -> None:
        self.writer.write(encode(packet, MQTT_5))

    async def next(self):
        while True:
            pkt = self.decoder.next_packet()
            if pkt is not None:
                return pkt
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError(f"{self.client_id}: connection closed")
            self.decoder.feed(data)

    async def subscribe(self, topic_filter: str) -> None:
        self.send(Subscribe(1, [Subscription(topic_filter, 1)]))
        ack = await self.next()
        assert isinstance(ack, Suback), ack

    async def receive(self, n: int) -> None:
        got = 0
        while got < n:
            pkt = await self.next()
            if isinstance(pkt, Publish):
                got += 1
                if pkt.qos:
                    self.send(Puback(pkt.packet_id))

    async def disconnect(self) -> None:
        self.send(Disconnect())
        await self.writer.drain()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


async def offline_sessions_for(router, ids: list[str]) -> None:
    """Until the broker has seen every session go (DISCONNECT is handled asynchronously)."""
    while any((s := router.sessions.get(c)) is None or s.conn is not None for c in ids):
        await asyncio.sleep(0.02)


async def run_design(dsn: str, design: str, sessions: int, messages: int, payload_size: int) -> dict:
    server = await Server.start(dsn, Config(bounds={"mqtt_session_outbound_messages": max(1000, messages),
                                                # a mass reconnect's CONNACKs wait for the session
                                                # store's backlog: measured here, not refused
                                                "handshake_timeout": "600s"}),
                                addresses={"mqtt": "127.0.0.1:0", "amqp": None, "amqp091": None, "http": None},
                                migrate=True, retention=False)
    try:
        port = server.port("mqtt")
        run = uuid.uuid4().hex[:8]
        ids = [f"dev-{run}-{i}" for i in range(sessions)]
        for i in range(0, sessions, 100):           # 100 at a time: the accept backlog
            chunk = [Client(c) for c in ids[i:i + 100]]
            await asyncio.gather(*(c.connect(port, clean=True) for c in chunk))
            await asyncio.gather(*(c.subscribe(f"fleet/{run}/#") for c in chunk))
            await asyncio.gather(*(c.disconnect() for c in chunk))
        router = server.ctx.state["mqtt.router"]
        router.offline_log = design == "log"
        await offline_sessions_for(router, ids)
        await router.store.flush()

        pub = Client(f"pub-{run}")
        await pub.connect(port, clean=True)
        body = os.urandom(payload_size)
        t0 = time.perf_counter()
        for k in range(messages):
            pub.send(Publish(f"fleet/{run}/cmd", body, 1, packet_id=k % 65535 + 1))
            ack = await pub.next()
            assert isinstance(ack, Puback) and not ack.reason_code, ack
        burst = time.perf_counter() - t0
        await router.store.flush()

        conn = await asyncpg.connect(dsn)
        try:
            size = await conn.fetchval(
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(ARRAY['fluxpg.mqtt_offline_log',"
                " 'fluxpg.mqtt_offline_cursors', 'fluxpg.mqtt_session_messages']::regclass[]) c")
            rows = await conn.fetchval(
                "SELECT (SELECT count(*) FROM fluxpg.mqtt_offline_log) + (SELECT count(*) FROM fluxpg.mqtt_session_messages)")
        finally:
            await conn.close()

        t0 = time.perf_counter()
        again = [Client(c) for c in ids]
        connecting = asyncio.Semaphore(100)         # the accept backlog

        async def resume(c: Client) -> None:
            async with connecting:
                await c.connect(port, clean=False)
            assert c.session_present
            await c.receive(messages)
        await asyncio.gather(*(resume(c) for c in again))
        received = time.perf_counter() - t0
        # The in-flight bookkeeping (a row per sent message, deleted by its PUBACK) trails behind
        # the deliveries (sql write-through, fluxpg/queues/mqtt_sessions.py): drained = written.
        await router.store.flush()
        drain = time.perf_counter() - t0
        await asyncio.gather(*(c.disconnect() for c in again + [pub]))
        return {"burst": burst, "bytes": size, "rows": rows, "received": received, "drain": drain}
    finally:
        await server.close()


async def main_async(args) -> None:
    results = {}
    for design in args.design.split(","):
        with fresh_database(args.dsn) as db_dsn:
            results[design] = await run_design(db_dsn, design, args.sessions, args.messages, args.payload)
    print(f"{args.sessions} offline sessions x {args.messages} messages of {args.payload} B "
          f"({args.sessions * args.messages:,} deliveries), QoS 1, through the broker")
    print("| design | burst confirmed (s) | msgs/s | rows written | DB bytes (MiB) | all received after reconnect (s) | ... and their rows written (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = {"log": "shared log + cursors", "rows": "row per session per message"}
    for design, r in results.items():
        print(f"| {names[design]} | {r['burst']:.2f} | {args.messages / r['burst']:,.0f} | {r['rows']:,} "
              f"| {r['bytes'] / 2**20:.2f} | {r['received']:.2f} | {r['drain']:.2f} |")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--payload", type=int, default=256)
    ap.add_argument("--design", default="log,rows", help="log, rows or both (comma-separated)")
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
