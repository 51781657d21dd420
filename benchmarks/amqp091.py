"""AMQP 0-9-1 benchmark: fluxpg vs RabbitMQ with the same client (aio-pika) and payloads.

    python benchmarks/amqp091.py --dsn postgresql://postgres@127.0.0.1:5432/postgres [--messages N]

Starts its own fluxpg Server (on free loopback ports, schema migrated on the DSN) and uses the
RabbitMQ at 127.0.0.1:5672 (guest/guest) as the peer, each with a durable classic queue. Three runs
per broker, 256-byte persistent messages:

1. publish with confirms, `--window` publishes in flight: msgs/s and publish→confirm latency;
2. consume + ack of that backlog with prefetch `--prefetch`: msgs/s and the time between a
   delivery's arrival and the next (p50/p99);
3. end to end at a steady trickle (one confirmed publish at a time, a consumer running):
   publish→delivery latency p50/p99.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aio_pika  # noqa: E402

from fluxpg.config import Config, QueueConfig  # noqa: E402
from fluxpg.server import Server  # noqa: E402

PAYLOAD = os.urandom(256)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def publish_run(url: str, queue: str, n: int, window: int) -> dict:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(queue, durable=True)
        sem = asyncio.Semaphore(window)
        lat: list[float] = []

        async def one(i: int) -> None:
            async with sem:
                t0 = time.perf_counter()
                await ch.default_exchange.publish(
                    aio_pika.Message(PAYLOAD, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue)
                lat.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - start
        return {"rate": n / elapsed, "p50": pct(lat, 50) * 1e3, "p99": pct(lat, 99) * 1e3}
    finally:
        await conn.close()


async def consume_run(url: str, queue: str, n: int, prefetch: int) -> dict:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=prefetch)
        q = await ch.declare_queue(queue, durable=True)
        gaps: list[float] = []
        done = asyncio.Event()
        count = 0
        last = None

        async def on_message(msg) -> None:
            nonlocal count, last
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
            await msg.ack()
            count += 1
            if count >= n:
                done.set()

        start = time.perf_counter()
        tag = await q.consume(on_message)
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.perf_counter() - start
        await q.cancel(tag)
        return {"rate": n / elapsed, "p50": pct(gaps, 50) * 1e3, "p99": pct(gaps, 99) * 1e3}
    finally:
        await conn.close()


async def e2e_run(url: str, queue: str, n: int) -> dict:
    conn = await aio_pika.connect(url)
    try:
        pch = await conn.channel()
        cch = await conn.channel()
        await cch.set_qos(prefetch_count=100)
        q = await cch.declare_queue(queue, durable=True)
        lat: list[float] = []
        done = asyncio.Event()

        async def on_message(msg) -> None:
            lat.append(time.perf_counter() - float(msg.headers["t0"]))
            await msg.ack()
            if len(lat) >= n:
                done.set()

        tag = await q.consume(on_message)
        for _ in range(n):
            await pch.default_exchange.publish(
                aio_pika.Message(PAYLOAD, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                 headers={"t0": repr(time.perf_counter())}), routing_key=queue)
        await asyncio.wait_for(done.wait(), 120)
        await q.cancel(tag)
        return {"rate": float("nan"), "p50": pct(lat, 50) * 1e3, "p99": pct(lat, 99) * 1e3}
    finally:
        await conn.close()


async def bench(url: str, queue: str, args) -> dict[str, dict]:
    return {
        "publish+confirm": await publish_run(url, queue, args.messages, args.window),
        "consume+ack": await consume_run(url, queue, args.messages, args.prefetch),
        "end-to-end": await e2e_run(url, queue, args.e2e),
    }


async def main(args) -> None:
    logging.basicConfig(level=logging.WARNING)
    queue = f"bench_{uuid.uuid4().hex[:8]}"
    server = await Server.start(args.dsn, Config(queues=[QueueConfig(name=queue)]),
                                addresses={"mqtt": None, "amqp": None, "http": None, "amqp091": "127.0.0.1:0"},
                                migrate=True, retention=False)
    try:
        flux = await bench(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/", queue, args)
    finally:
        await server.close()
    rabbit = await bench(args.rabbitmq, queue, args)
    try:   # leave RabbitMQ as we found it
        conn = await aio_pika.connect(args.rabbitmq)
        await (await conn.channel()).queue_delete(queue)
        await conn.close()
    except Exception:  # noqa: BLE001
        pass
    print(f"AMQP 0-9-1, aio-pika, {args.messages} x 256 B persistent messages, window {args.window}, "
          f"prefetch {args.prefetch}, end-to-end {args.e2e} messages")
    print(f"| run | fluxpg msg/s | fluxpg p50 / p99 ms | RabbitMQ msg/s | RabbitMQ p50 / p99 ms | fluxpg/RabbitMQ |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in flux:
        f, r = flux[name], rabbit[name]
        ratio = f["rate"] / r["rate"] if r["rate"] == r["rate"] and r["rate"] else float("nan")
        rate = lambda x: "–" if x != x else f"{x:,.0f}"  # noqa: E731
        print(f"| {name} | {rate(f['rate'])} | {f['p50']:.2f} / {f['p99']:.2f} | {rate(r['rate'])} | "
              f"{r['p50']:.2f} / {r['p99']:.2f} | {'–' if ratio != ratio else f'{ratio:.2f}'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True, help="PostgreSQL DSN for fluxpg (its schema is migrated)")
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--window", type=int, default=100, help="publishes in flight awaiting confirms")
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--e2e", type=int, default=500, help="messages for the end-to-end latency run")
    parser.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5672/")
    asyncio.run(main(parser.parse_args()))
