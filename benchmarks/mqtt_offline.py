"""Offline messages for many persistent MQTT sessions: one row per device per message (what
fluxpg.mqtt_session_messages does) against a shared log with a cursor per session (the design
issue 16 asks to weigh).

A burst of M messages on topics that D offline devices subscribe to (every device matches every
message: the worst case for per-row storage). Measured: the time to make the burst durable (one
transaction per message, as publishers are confirmed one by one; and one transaction for the whole
burst), the table size afterwards, and the time to read back one device's backlog.

    python benchmarks/mqtt_offline.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        [--devices 1000] [--messages 200] [--payload 256]

It creates and drops a database of its own. The shared log here is the minimal correct variant: a
log row per message, a cursor row per session (advanced when the session acknowledges), and the
read side filters the log by the session's subscriptions -- no fan-out writes at publish time.
"""
from __future__ import annotations

import argparse
import asyncio
import secrets
import time

import asyncpg

DDL = """
CREATE TABLE per_row (client_id text, key bigint, topic text, payload bytea, qos smallint,
                      PRIMARY KEY (client_id, key));
CREATE TABLE shared_log (id bigserial PRIMARY KEY, topic text, payload bytea, qos smallint);
CREATE TABLE cursors (client_id text PRIMARY KEY, last_id bigint NOT NULL DEFAULT 0);
"""


async def run(dsn: str, devices: int, messages: int, payload_size: int) -> None:
    admin = await asyncpg.connect(dsn)
    name = f"fluxpg_bench_mqtt_offline_{secrets.token_hex(4)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(dsn.rsplit("/", 1)[0] + "/" + name)
        await conn.execute(DDL)
        clients = [f"dev-{i}" for i in range(devices)]
        await conn.executemany("INSERT INTO cursors (client_id) VALUES ($1)", [(c,) for c in clients])
        payload = secrets.token_bytes(payload_size)

        # (a) one row per device per message, one transaction per published message
        t0 = time.perf_counter()
        for k in range(messages):
            await conn.execute(
                "INSERT INTO per_row SELECT c, $2, 'fleet/all/cmd', $3, 1 FROM unnest($1::text[]) c",
                clients, k, payload)
        per_row_s = time.perf_counter() - t0
        per_row_size = await conn.fetchval("SELECT pg_total_relation_size('per_row')")
        t0 = time.perf_counter()
        backlog = await conn.fetch("SELECT key, topic, payload FROM per_row WHERE client_id = $1 ORDER BY key",
                                   clients[devices // 2])
        per_row_read = time.perf_counter() - t0
        assert len(backlog) == messages

        # (b) shared log: one row per message; cursors untouched until a session acknowledges
        t0 = time.perf_counter()
        for k in range(messages):
            await conn.execute("INSERT INTO shared_log (topic, payload, qos) VALUES ('fleet/all/cmd', $1, 1)",
                               payload)
        log_s = time.perf_counter() - t0
        log_size = (await conn.fetchval("SELECT pg_total_relation_size('shared_log')")
                    + await conn.fetchval("SELECT pg_total_relation_size('cursors')"))
        t0 = time.perf_counter()
        backlog = await conn.fetch(
            "SELECT l.id, l.topic, l.payload FROM shared_log l, cursors c WHERE c.client_id = $1 "
            "AND l.id > c.last_id AND l.topic LIKE 'fleet/%' ORDER BY l.id", clients[devices // 2])
        log_read = time.perf_counter() - t0
        assert len(backlog) == messages
        # acknowledging the whole backlog: one cursor update per session
        t0 = time.perf_counter()
        await conn.execute("UPDATE cursors SET last_id = (SELECT max(id) FROM shared_log)")
        log_ack_all = time.perf_counter() - t0
        t0 = time.perf_counter()
        await conn.execute("DELETE FROM per_row")
        per_row_ack_all = time.perf_counter() - t0
        await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    n = devices * messages
    print(f"{devices} offline devices x {messages} messages of {payload_size} B ({n:,} deliveries)")
    print("| design | burst durable (s) | msgs/s published | storage (MiB) | read one backlog (ms) | ack everything (s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(f"| row per device per message | {per_row_s:.2f} | {messages / per_row_s:,.0f} | {per_row_size / 2**20:.1f} "
          f"| {per_row_read * 1000:.1f} | {per_row_ack_all:.2f} |")
    print(f"| shared log + cursors | {log_s:.2f} | {messages / log_s:,.0f} | {log_size / 2**20:.1f} "
          f"| {log_read * 1000:.1f} | {log_ack_all:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--payload", type=int, default=256)
    a = ap.parse_args()
    asyncio.run(run(a.dsn, a.devices, a.messages, a.payload))


if __name__ == "__main__":
    main()
