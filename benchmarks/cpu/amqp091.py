"""AMQP 0-9-1: CPU per message of fluxpg (broker + its PostgreSQL backends) vs RabbitMQ (beam.smp).

    python -m benchmarks.cpu amqp091 [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--messages 3000] [--rounds 3]

Same clients and payloads (256 B, delivery_mode 2) against both; a fresh durable queue per run.
Rows: aio-pika publish + confirm (100 in flight); aio-pika consume + ack of that backlog
(prefetch 100); end to end one confirmed publish at a time with a consumer running (latency
publish → delivery); pika BlockingConnection confirming each publish.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import aio_pika
import pika

from benchmarks.cpu.accounting import Meter, Sample

PAYLOAD = b"x" * 256


async def publish_confirm(url: str, queue: str, n: int, meter: Meter, window: int = 100) -> Sample:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue(queue, durable=True)
        sem = asyncio.Semaphore(window)
        lat: list[float] = []

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                await ch.default_exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), routing_key=queue)
                lat.append(time.perf_counter() - t0)

        meter.begin()
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        elapsed = time.perf_counter() - start
        return Sample(n, elapsed, meter.end(), lat)
    finally:
        await conn.close()


async def consume_ack(url: str, queue: str, n: int, meter: Meter, prefetch: int = 100) -> Sample:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=prefetch)
        q = await ch.declare_queue(queue, durable=True)
        done = asyncio.Event()
        count = 0

        async def on_message(msg) -> None:
            nonlocal count
            await msg.ack()
            count += 1
            if count >= n:
                done.set()

        meter.begin()
        start = time.perf_counter()
        tag = await q.consume(on_message)
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - start
        sample = Sample(n, elapsed, meter.end())
        await q.cancel(tag)
        return sample
    finally:
        await conn.close()


async def end_to_end(url: str, queue: str, n: int, meter: Meter) -> Sample:
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
        meter.begin()
        start = time.perf_counter()
        for _ in range(n):
            await pch.default_exchange.publish(
                aio_pika.Message(PAYLOAD, delivery_mode=2, headers={"t0": repr(time.perf_counter())}),
                routing_key=queue)
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - start
        sample = Sample(n, elapsed, meter.end(), lat)
        await q.cancel(tag)
        return sample
    finally:
        await conn.close()


def pika_confirm_each(url: str, queue: str, n: int, meter: Meter) -> Sample:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        lat = []
        meter.begin()
        start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            ch.basic_publish("", queue, PAYLOAD, props)   # returns after the confirm
            lat.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
        sample = Sample(n, elapsed, meter.end(), lat)
        ch.queue_purge(queue)
        return sample
    finally:
        conn.close()


async def _drop(url: str, queues: list[str]) -> None:
    conn = await aio_pika.connect(url)
    try:
        ch = await conn.channel()
        for q in queues:
            try:
                await ch.queue_delete(q)
            except Exception:  # noqa: BLE001 - best effort cleanup
                ch = await conn.channel()
    finally:
        await conn.close()


ROWS = {
    "publish+confirm": "AMQP 0-9-1 publish + confirm (aio-pika, 100 in flight)",
    "consume+ack": "AMQP 0-9-1 consume + ack (prefetch 100)",
    "end-to-end": "AMQP 0-9-1 end to end, one message at a time",
    "pika-confirm-each": "pika BlockingConnection, confirm each publish",
}


async def one_round(side: str, url: str, meter: Meter, args) -> dict[str, Sample]:
    tag = uuid.uuid4().hex[:8]
    qmain, qe2e, qpika = f"cpu_{tag}", f"cpu_e2e_{tag}", f"cpu_pika_{tag}"
    want = set(args.rows or KEYS)
    out = {}
    if want & {"publish+confirm", "consume+ack"}:
        # consume+ack consumes this backlog: published (and measured) either way
        out["publish+confirm"] = await publish_confirm(url, qmain, args.messages, meter)
    if "consume+ack" in want:
        out["consume+ack"] = await consume_ack(url, qmain, args.messages, meter)
    if "end-to-end" in want:
        out["end-to-end"] = await end_to_end(url, qe2e, args.e2e, meter)
    if "pika-confirm-each" in want:
        out["pika-confirm-each"] = await asyncio.to_thread(pika_confirm_each, url, qpika, args.pika, meter)
    if "publish+confirm" not in want:
        out.pop("publish+confirm", None)
    await _drop(url, [qmain, qe2e, qpika])
    return out


PEER = "RabbitMQ"
KEYS = tuple(ROWS)            # --rows takes these, comma-separated (default: all)
ROWS = {label: (key, key) for key, label in ROWS.items()}


def sides(args, stack):
    from fluxpg.testing import fresh_database
    from benchmarks.cpu.accounting import Broker, peer_meter

    dsn = stack.enter_context(fresh_database(args.dsn))
    broker = Broker(dsn, args.dsn, "queue_manager: {max_pending_per_group: 1000000}\n", ["amqp091"])
    stack.callback(broker.close)
    out = {"fluxpg": (f"amqp://guest:guest@127.0.0.1:{broker.ports['amqp091']}/", broker.meter()),
           PEER: (args.rabbitmq, peer_meter("beam.smp"))}
    if args.compare_with:
        before = Broker(stack.enter_context(fresh_database(args.dsn)), args.dsn,
                        "queue_manager: {max_pending_per_group: 1000000}\n", ["amqp091"], repo=Path(args.compare_with))
        stack.callback(before.close)
        out["fluxpg-before"] = (f"amqp://guest:guest@127.0.0.1:{before.ports['amqp091']}/", before.meter())
    return out
