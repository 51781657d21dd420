"""Vacuuming fluxpg's churned tables from the broker's housekeeping.

Every message passes through rows that are deleted soon after: a transactional publish writes an
outbox row and a commit marker that the sequencer deletes, a claim a pending entry that the ack
deletes, and the cursors, heads and member rows take a new version per claim or append. The hot
queries find their rows through indexes whose left end fills with the dead entries (the sequencer's
marker probe reads `fluxpg.outbox_commits` in key order from the oldest), and nothing but VACUUM
removes them: a B-tree cleans a page of dead entries only when an insert is about to split it, and
inserts go to the other end. Measured on this project's server, where autovacuum is off: after
three rounds of the outbox benchmark 73,000 dead markers, and the added end-to-end latency of a
transactional publish grew round by round (+1.8, +2.3, +3.6 ms). With autovacuum on (the default)
the same happens between its passes: at most once a minute per database (autovacuum_naptime), by
then 60,000 dead rows at 1,000 msg/s.

So the broker vacuums these tables itself (as PgQ's daemon vacuums its queue tables), on the
heartbeat: a table whose dead rows passed DEAD_MIN plus DEAD_SCALE of its live rows, the rule
autovacuum uses with a lower floor. VACUUM takes no lock that stops readers or writers, and
SKIP_LOCKED leaves a table another node or autovacuum is vacuuming. Dead rows that an open
transaction still sees cannot be removed; a table is vacuumed again only once that many more
have accumulated on top of what its last VACUUM had to leave (`floors`), not on every heartbeat.
The durable log's segments are never vacuumed here: they are only appended to and dropped whole.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import asyncpg

from fluxpg import db

log = logging.getLogger("fluxpg.vacuum")

# Each VACUUM reads the table's indexes whole, so vacuuming often costs per message: with 1,000
# here the pending table's VACUUMs added ~4 µs of PostgreSQL CPU per message to AMQP 0-9-1
# consume + ack (51 → 56 µs); with 10,000 nothing measurable (51 → 50), and the outbox benchmark's
# end-to-end latency stayed flat (+1.7, +1.7, +1.6 ms over three rounds).
DEAD_MIN = 10_000   # dead rows a table may hold before it is vacuumed ...
DEAD_SCALE = 0.2    # ... plus this share of its live rows (autovacuum's default scale factor)


def due(stats: Iterable[tuple[str, int, int]], floors: dict[str, int], dead_min: int = DEAD_MIN,
        dead_scale: float = DEAD_SCALE) -> list[str]:
    """The tables to vacuum, most dead rows first: (table, dead rows, live rows) per table;
    floors: the dead rows each table's last VACUUM here could not remove."""
    chosen = [(dead, table) for table, dead, live in stats
              if dead - floors.get(table, 0) > dead_min + dead_scale * max(live, 0)]
    return [table for _, table in sorted(chosen, reverse=True)]


class Vacuumer:
    def __init__(self, pool: asyncpg.Pool, dead_min: int = DEAD_MIN, dead_scale: float = DEAD_SCALE):
        self._pool = pool
        self.dead_min = dead_min
        self.dead_scale = dead_scale
        self.floors: dict[str, int] = {}
        self.vacuumed = 0   # statistics: VACUUMs run

    async def run_once(self) -> list[str]:
        """Vacuum every table that is due; returns their names."""
        stats = [(r[0], r[1], r[2]) for r in await db.fetch(self._pool, "churned_tables")]
        tables = due(stats, self.floors, self.dead_min, self.dead_scale)
        queries = db.queries()
        for table in tables:
            # VACUUM runs outside a transaction block: a pool connection in autocommit, as asyncpg's are.
            await self._pool.execute(queries["vacuum_table"].format(table=table))
            self.floors[table] = await self._pool.fetchval(queries["dead_rows"], table) or 0
            self.vacuumed += 1
        if tables:
            log.debug("vacuumed %s", ", ".join(tables))
        return tables
