"""Browsing a big queue from the console costs what browsing a small one does (keyset pages).

    python benchmarks/console_browse.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--messages 2000000] [--repeat 20]

Creates a database of its own, fills one queue with --messages messages (server-side
append_batch in chunks) and one with 10, starts a broker with its HTTP listener, and times over
--repeat rounds: the console's queue page (GET /queue?name=…, 50 messages rendered) at the first,
middle and last offsets and at a time in the middle (binary search, fluxpg.offset_at), and the
same pages of the 10-message queue. Prints medians and p95 in milliseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import datetime, timezone
from urllib.parse import quote

import aiohttp

from fluxpg import db
from fluxpg.config import Config, QueueConfig
from fluxpg.server import Server
from fluxpg.testing import fresh_database

CHUNK = 100_000


async def fill(dsn: str, queue: str, n: int) -> float:
    conn = await db.connect(dsn)
    started = time.perf_counter()
    try:
        qid = await conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", queue)
        done = 0
        while done < n:
            k = min(CHUNK, n - done)
            await conn.execute("""
                SELECT count(*) FROM fluxpg.append_batch(
                    array_fill($1::int, ARRAY[$2::int]), array_fill($3::text, ARRAY[$2::int]),
                    ARRAY(SELECT convert_to('{"n": ' || (i + $4) || ', "pad": "' || repeat('x', 64) || '"}', 'UTF8')
                            FROM generate_series(1, $2::int) i), NULL)""",
                               qid, k, f"$queue/{queue}/bench", done)
            done += k
            print(f"\r  {queue}: {done:,} / {n:,}", end="", flush=True)
        print()
    finally:
        await conn.close()
    return time.perf_counter() - started


async def timed(http: aiohttp.ClientSession, url: str, repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        async with http.get(url) as r:
            body = await r.text()
            assert r.status == 200, (r.status, body[:300])
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.95))]


async def main(args) -> None:
    with fresh_database(args.dsn) as dsn:
        db.migrate(dsn)
        big, small = "browse_big", "browse_small"
        config = Config(queues=[QueueConfig(name=big, limits={"max_depth": 0}), QueueConfig(name=small)])
        server = await Server.start(dsn, config, addresses={"mqtt": None, "amqp": None, "amqp091": None,
                                                            "http": "127.0.0.1:0"}, migrate=False, retention=False)
        try:
            print(f"filling {args.messages:,} messages …")
            took = await fill(dsn, big, args.messages)
            print(f"  {args.messages / took:,.0f} msgs/s")
            await fill(dsn, small, 10)
            conn = await db.connect(dsn)
            try:
                await conn.execute("ANALYZE")
                mid_time = await conn.fetchval(
                    "SELECT created_at FROM fluxpg.log WHERE queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1) "
                    "AND partition = 0 AND seq = $2", big, args.messages // 2)
                size = await conn.fetchval("SELECT pg_size_pretty(sum(bytes)) FROM fluxpg.queue_stats")
            finally:
                await conn.close()
            base = f"http://127.0.0.1:{server.port('http')}/queue?name="
            at = quote(mid_time.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds"))
            cases = [
                ("10-message queue, first page", f"{base}{small}&from=0"),
                ("10-message queue, by time", f"{base}{small}&at={quote(datetime.now(timezone.utc).isoformat())}"),
                (f"{args.messages:,}-message queue, first page", f"{base}{big}&from=0"),
                (f"{args.messages:,}-message queue, middle page", f"{base}{big}&from={args.messages // 2}"),
                (f"{args.messages:,}-message queue, last page", f"{base}{big}&from={args.messages - 50}"),
                (f"{args.messages:,}-message queue, by time (middle)", f"{base}{big}&at={at}"),
                (f"{args.messages:,}-message queue, JSON view, middle", f"{base}{big}&from={args.messages // 2}&format=json"),
            ]
            print(f"log size {size}; {args.repeat} rounds per page, 50 messages per page, whole HTTP round trip")
            print(f"| page | median ms | p95 ms |\n| --- | ---: | ---: |")
            async with aiohttp.ClientSession() as http:
                for label, url in cases:
                    await timed(http, url, 2)            # warm the plan cache and the connection
                    median, p95 = await timed(http, url, args.repeat)
                    print(f"| {label} | {median:.1f} | {p95:.1f} |")
        finally:
            await server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
