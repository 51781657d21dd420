"""The sequencer: appends messages that applications published inside their own transactions
(fluxpg.publish writes them into fluxpg.outbox; their commit adds a commit-order marker to
fluxpg.outbox_commits) to the log, in commit order.

Publishing transactions send no NOTIFY (it would serialise their commits on PostgreSQL's
notification lock), so the sequencer polls: every POLL_MIN while it keeps finding work, backing off
to POLL_MAX when idle. The idle poll is one index probe and takes no lock. Every node runs one;
fluxpg.sequence_claim() lets one move at a time, so nodes never reorder each other's work.

Handoff, as the appender's (queues/appender.py): consumers of this node waiting on a queue the
sequencer moved messages into lately are claimed for inside the move's transaction, so a message
published in an application's transaction reaches them with the move's commit instead of after a
NOTIFY and a claim transaction of their own (issue 15: the end-to-end latency of the outbox path).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from fluxpg import db
from fluxpg.aio import cancel_and_wait
from fluxpg.queues.appender import Handoff

log = logging.getLogger("fluxpg.sequencer")

BATCH = 5000        # messages appended per transaction
POLL_MIN = 0.001    # seconds between polls while messages keep arriving
POLL_MAX = 0.05     # ... and when idle
BUSY_RATIO = 0.5    # while busy, pause this many times as long as the last round took
RECENT = 5.0        # seconds a queue the sequencer moved messages into stays a handoff candidate


class Sequencer:
    def __init__(self, pool: asyncpg.Pool, handoff: Handoff | None = None):
        self._pool = pool
        self._handoff = handoff
        self._task: asyncio.Task | None = None
        # Queue id → loop time of the last move into it: only these are planned for, so an idle
        # poll reserves no subscription of a queue that is never published to transactionally.
        self._recent: dict[int, float] = {}
        self.moved = 0
        self.handed = 0   # statistics: messages claimed inside a move's transaction

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fluxpg-sequencer")

    async def run_once(self) -> int:
        """Append everything committed so far; returns how many messages."""
        total = 0
        while True:
            n = await self._round()
            total += n
            if n < BATCH:
                break
        self.moved += total
        return total

    async def _round(self) -> int:
        loop = asyncio.get_running_loop()
        handoff = self._handoff
        targets = []
        if handoff is not None and self._recent:
            now = loop.time()
            for qid in [q for q, t in self._recent.items() if now - t > RECENT]:
                del self._recent[qid]
            targets = handoff.plan(set(self._recent))
        try:
            records = await db.fetch(self._pool, "sequence_claim", BATCH, [t.queue for t in targets],
                                     [t.group for t in targets], [t.consumer for t in targets],
                                     [t.n for t in targets])
        except BaseException:
            if targets:
                handoff.done(set(), targets, None)
            raise
        moved: dict[int, int] = {}
        claimed: list[list[Any]] = [[] for _ in targets]
        for rec in records:   # (0, -, queue id, -, count) per queue moved into, then each target's claim
            if rec[0] == 0:
                moved[rec[2]] = rec[4]
            else:
                claimed[rec[0] - 1].append(rec)
                self.handed += 1
        now = loop.time()
        for qid in moved:
            self._recent[qid] = now
        if targets:
            # Wakes the queues moved into (the NOTIFY was tagged with this node), hands the claims.
            handoff.done(set(moved), targets, claimed)
        return sum(moved.values())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = POLL_MAX
        while True:
            await asyncio.sleep(delay)
            started = loop.time()
            try:
                moved = await self.run_once()
            except Exception as exc:  # noqa: BLE001 - a lost database: keep polling, say so
                log.warning("appending outbox messages failed (retrying): %s", exc)
                delay = POLL_MAX
                continue
            # Busy: poll again soon, but pause in proportion to the last round. When the machine
            # is saturated a round takes longer, the pause grows with it and each round moves more
            # messages (a round costs about the same for 1 or 100): measured on 2 loaded cores,
            # polling every 1 ms took a quarter of the publishers' throughput in one-message
            # rounds. Half a round, not twice one (issue 15): a commit waits for the pause left
            # plus the round it missed; at 1,000 msg/s that was 2.6 ms with ratio 2 and 1.0 ms
            # with 0.5, while PostgreSQL CPU per transaction at 8 saturating connections read
            # 299 and 293 µs (5 rounds each, one run).
            delay = max(POLL_MIN, BUSY_RATIO * (loop.time() - started)) if moved else min(delay * 2, POLL_MAX)

    async def close(self) -> None:
        await cancel_and_wait([self._task])
