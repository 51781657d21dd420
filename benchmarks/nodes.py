"""Scale-out: publish and consume throughput with 1, 2 and 4 broker nodes on one database.

    python benchmarks/nodes.py --dsn postgresql://postgres@127.0.0.1:5432/postgres [--messages 20000]

Each run starts `fluxpg serve --workers N` (N processes sharing one AMQP 0-9-1 port through
SO_REUSEPORT, so the kernel spreads the client connections over the nodes) on a fresh database,
then publishes with confirms from several aio-pika connections, then consumes + acks the backlog
from as many connections. CPU seconds are read from /proc for the broker processes, for
PostgreSQL's processes and for this (client) process: on a 2-core machine the three compete, so
the CPU columns say where the time went.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aio_pika  # noqa: E402

from fluxpg import db  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

PAYLOAD = b"x" * 256
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])      # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return total / TICKS


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


def postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


async def publish(url: str, count: int, queue: str, window: int) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    sem = asyncio.Semaphore(window)

    async def one():
        async with sem:
            await channel.default_exchange.publish(aio_pika.Message(PAYLOAD, delivery_mode=2), routing_key=queue)

    await asyncio.gather(*(one() for _ in range(count)))
    await connection.close()


async def consume(url: str, queue: str, counter: dict, total: int, done: asyncio.Event):
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=200)
    q = await channel.get_queue(queue, ensure=False)

    async def on_message(message):
        await message.ack()
        counter["n"] += 1
        if counter["n"] >= total:
            done.set()

    await q.consume(on_message, arguments={"x-consumer-group": "bench"})
    return connection


async def run(dsn: str, workers: int, messages: int, connections: int) -> dict:
    port, http = free_port(), free_port()
    config = Path(tempfile.mkdtemp()) / "fluxpg.yaml"
    config.write_text("queues:\n  - name: bench\n    limits: {max_depth: 0}\n"
                      "queue_manager: {max_pending_per_group: 1000000}\n")
    proc = subprocess.Popen([sys.executable, "-m", "fluxpg.cli", "serve", "--config", str(config), "--dsn", dsn,
                             "--workers", str(workers), "--mqtt", "off", "--amqp", "off",
                             "--amqp091", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/healthz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("broker did not start")
                time.sleep(0.2)
        while len(children(proc.pid)) < workers and time.monotonic() < deadline:
            time.sleep(0.2)
        await asyncio.sleep(1.0)
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
        broker_pids = lambda: [proc.pid] + children(proc.pid)  # noqa: E731
        result = {"workers": workers}
        for phase in ("publish", "consume"):
            b0, p0, c0 = cpu_seconds(broker_pids()), cpu_seconds(postgres_pids()), cpu_seconds([os.getpid()])
            start = time.perf_counter()
            if phase == "publish":
                share = messages // connections
                await asyncio.gather(*(publish(url, share, "bench", 100) for _ in range(connections)))
                n = share * connections
            else:
                counter, done = {"n": 0}, asyncio.Event()
                conns = [await consume(url, "bench", counter, messages // connections * connections, done)
                         for _ in range(connections)]
                await asyncio.wait_for(done.wait(), 600)
                n = counter["n"]
            elapsed = time.perf_counter() - start
            if phase == "consume":
                for c in conns:
                    await c.close()
            result[phase] = {"msgs_per_s": n / elapsed, "seconds": elapsed,
                             "broker_cpu_s": cpu_seconds(broker_pids()) - b0,
                             "postgres_cpu_s": cpu_seconds(postgres_pids()) - p0,
                             "client_cpu_s": cpu_seconds([os.getpid()]) - c0}
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def main(args) -> list[dict]:
    results = []
    for workers in args.workers:
        with fresh_database(args.dsn) as dsn:
            await asyncio.to_thread(db.migrate, dsn)
            results.append(await run(dsn, workers, args.messages, args.connections))
    return results


def report(results: list[dict], args) -> str:
    lines = [f"{args.messages:,} messages of {len(PAYLOAD)} B, {args.connections} client connections, "
             f"{os.cpu_count()} CPUs", "",
             "| nodes | phase | msgs/s | × 1 node | broker CPU s | PostgreSQL CPU s | client CPU s | wall s |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = {phase: results[0][phase]["msgs_per_s"] for phase in ("publish", "consume")}
    for r in results:
        for phase in ("publish", "consume"):
            p = r[phase]
            lines.append(f"| {r['workers']} | {phase} | {p['msgs_per_s']:,.0f} | {p['msgs_per_s'] / base[phase]:.2f} | "
                         f"{p['broker_cpu_s']:.1f} | {p['postgres_cpu_s']:.1f} | {p['client_cpu_s']:.1f} | "
                         f"{p['seconds']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print(report(asyncio.run(main(args)), args))
