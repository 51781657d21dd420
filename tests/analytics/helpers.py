"""Helpers of the Spark tests: fill queues quickly with fluxpg.append_batch."""
from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg


def declare(pg: psycopg.Connection, name: str, kind: str = "classic", settings: dict | None = None) -> int:
    return pg.execute("SELECT fluxpg.declare_queue(%s, %s, NULL, %s::jsonb)",
                      (name, kind, json.dumps(settings or {}))).fetchone()[0]


def append(pg: psycopg.Connection, queue_id: int, topics: Sequence[str], payloads: Sequence[bytes],
           headers: Sequence[dict | None] | None = None) -> list[tuple[int, int]]:
    """Append in one statement; returns (partition, seq) per message."""
    hs = [json.dumps(h) if h is not None else None for h in headers] if headers is not None else None
    rows = pg.execute("SELECT partition, seq FROM fluxpg.append_batch(%s, %s, %s, %s::jsonb[]) ORDER BY ord",
                      ([queue_id] * len(payloads), list(topics), list(payloads), hs)).fetchall()
    return [(p, s) for p, s in rows]
