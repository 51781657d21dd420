"""The sequencer: appends messages that applications published inside their own transactions
(fluxpg.publish writes them into fluxpg.outbox; their commit adds a commit-order marker to
fluxpg.outbox_commits) to the log, in commit order.

While it finds work the sequencer polls (a pause in proportion to its last round): a NOTIFY from
every publishing commit would serialise the commits on PostgreSQL's notification lock. When a
round finds nothing it goes to sleep, and only then do publishing commits wake it: it takes the
advisory lock (1179669332, -1) on a connection of its own and looks once more; while it holds
that lock, the commit trigger (fluxpg._outbox_commit) of each publishing transaction NOTIFYs
fluxpg_outbox. The lock is not granted while a publishing commit is under way (they hold it
shared until their commit ends), so no commit falls between the last look and the sleep. A
message published to an idle broker used to wait for the next poll (up to 50 ms); an idle broker
polled 20 times a second. Only one node's sequencer holds the lock; the others, seeing it held
exclusively, sleep as well (every node LISTENs, so the same NOTIFY wakes them). Every node runs one;
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
POLL_MIN = 0.0005   # seconds between polls while messages keep arriving (epoll waits whole
                    # milliseconds: on a loop with nothing else to do this is 1 ms)
POLL_MAX = 0.05     # ... and when idle without the sleep lock (another node sleeps)
IDLE_POLL = 1.0     # asleep: look anyway after this long (a lost NOTIFY costs at most this)
BUSY_RATIO = (0.5, 2.0)   # while busy, pause this many times as long as the last round took:
BUSY_FULL = 16      # the first for rounds of one message, the second for rounds this full
BUSY_RATIO_MAX = 8.0    # fuller rounds: in proportion to how full, up to this
BUSY_PAUSE_MAX = 0.02   # and never longer than this
RECENT = 5.0        # seconds a queue the sequencer moved messages into stays a handoff candidate


def busy_pause(moved: int, round_seconds: float) -> float:
    """Seconds to pause after a round that moved `moved` (> 0) messages in `round_seconds`.

    In proportion to the round: when the machine is saturated a round takes longer, the pause
    grows with it and each round moves more messages, and a round's cost is mostly fixed (measured
    in PostgreSQL CPU: ~290 µs for a round of 1 message, ~10 µs more per message). On 2 loaded
    cores polling every 1 ms took a quarter of the publishers' throughput in one-message rounds.
    How many times the round depends on how full it was (issue 15): at 1,000 msg/s (~2 messages
    a round) a commit waits for the pause left plus the round it missed, so the pause there is
    about half a round (POLL_MIN at least); rounds of 16 pause twice the round, fuller ones up to
    eight times (BUSY_PAUSE_MAX at most): at 8 saturating connections that makes rounds of ~110
    messages instead of ~35, 12-14 µs of the sequencer's PostgreSQL CPU per message instead of
    ~25, while a message waits at most BUSY_PAUSE_MAX more.
    """
    low, high = BUSY_RATIO
    if moved <= BUSY_FULL:
        ratio = low + (high - low) * (max(moved, 1) - 1) / (BUSY_FULL - 1)
    else:
        ratio = min(BUSY_RATIO_MAX, high * moved / BUSY_FULL)
    return min(BUSY_PAUSE_MAX, max(POLL_MIN, ratio * round_seconds))


class Sequencer:
    def __init__(self, pool: asyncpg.Pool, handoff: Handoff | None = None, dsn: str | None = None):
        self._pool = pool
        self._handoff = handoff
        # As the appender's: tagged only when the handoff wakes this node's consumers of the queues
        # moved into (done()); without one every move NOTIFYs.
        self._notify_tag = handoff.notify_tag if handoff is not None else None
        self._dsn = dsn                  # for the sleep lock's own connection; None: never sleep
        self._lock_conn: asyncpg.Connection | None = None
        self._woken = asyncio.Event()
        self.sleeping = False            # waiting for a publishing commit's NOTIFY, not polling
        self._backoff = POLL_MIN         # the poll while the sleep lock is not granted
        self._task: asyncio.Task | None = None
        # Queue id → loop time of the last move into it: only these are planned for, so an idle
        # poll reserves no subscription of a queue that is never published to transactionally.
        self._recent: dict[int, float] = {}
        self.moved = 0
        self.rounds = 0   # statistics: sequence_claim calls
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
        self.rounds += 1
        try:
            records = await db.fetch(self._pool, "sequence_claim", BATCH, [t.queue for t in targets],
                                     [t.group for t in targets], [t.consumer for t in targets],
                                     [t.n for t in targets], self._notify_tag)
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
        if handoff is not None and (targets or moved):
            # Wakes this node's consumers of the queues moved into (the NOTIFY, tagged with this
            # node, named only queues watched elsewhere), hands the claims.
            handoff.done(set(moved), targets, claimed)
        return sum(moved.values())

    def wake(self) -> None:
        """A publishing commit saw this (or another) sequencer asleep: NOTIFY fluxpg_outbox, or
        the listener reconnected (anything may have been missed)."""
        self._woken.set()

    async def _sleep(self) -> None:
        """Idle: sleep until a publishing commit wakes us (or IDLE_POLL), holding the sleep lock,
        or without it while another node's sequencer holds it. Refused for a publishing commit
        under way (for a moment): poll, backing off from POLL_MIN to POLL_MAX."""
        self._woken.clear()
        conn = await self._sleep_lock()
        if conn is None:
            if await self._asleep_elsewhere():
                # Another node's sequencer sleeps: the commit that wakes it wakes this one too
                # (every node LISTENs). Should that node go away meanwhile, its lock goes with
                # its connection and this one looks again after IDLE_POLL.
                self.sleeping = True
                try:
                    await self._wait_woken()
                finally:
                    self.sleeping = False
                return
            await asyncio.sleep(self._backoff)
            self._backoff = min(2 * self._backoff, POLL_MAX)
            return
        self._backoff = POLL_MIN
        try:
            # Whatever committed before the lock was granted is visible now: look once more.
            if await self.run_once():
                return
            self.sleeping = True
            await self._wait_woken()
        finally:
            self.sleeping = False
            try:
                await conn.fetchval(db.queries()["sequencer_sleep_unlock"])
            except Exception:  # noqa: BLE001 - the lock went with its connection
                await self._drop_lock_conn()

    async def _wait_woken(self) -> None:
        try:
            await asyncio.wait_for(self._woken.wait(), IDLE_POLL)
        except asyncio.TimeoutError:
            pass

    async def _asleep_elsewhere(self) -> bool:
        conn = self._lock_conn
        if conn is None or conn.is_closed():
            return False
        try:
            return bool(await conn.fetchval(db.queries()["sequencer_asleep_elsewhere"]))
        except Exception:  # noqa: BLE001 - poll instead
            return False

    async def _sleep_lock(self) -> asyncpg.Connection | None:
        if self._dsn is None:
            return None
        try:
            if self._lock_conn is None or self._lock_conn.is_closed():
                self._lock_conn = await db.connect(self._dsn)
            if await self._lock_conn.fetchval(db.queries()["sequencer_sleep_lock"]):
                return self._lock_conn
        except Exception as exc:  # noqa: BLE001 - poll instead; the next idle round tries again
            log.debug("sequencer sleep lock unavailable: %s", exc)
            await self._drop_lock_conn()
        return None

    async def _drop_lock_conn(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            conn.terminate()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay: float | None = POLL_MAX
        while True:
            try:
                if delay is None:
                    await self._sleep()
                else:
                    await asyncio.sleep(delay)
                started = loop.time()
                moved = await self.run_once()
            except Exception as exc:  # noqa: BLE001 - a lost database: keep polling, say so
                log.warning("appending outbox messages failed (retrying): %s", exc)
                delay = POLL_MAX
                continue
            if moved:    # busy: look again after a pause; idle: sleep until a commit wakes us
                self._backoff = POLL_MIN
                delay = busy_pause(moved, loop.time() - started)
            else:
                delay = None

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        if self._lock_conn is not None:
            try:
                await self._lock_conn.close(timeout=5)
            except Exception:  # noqa: BLE001 - closing anyway
                await self._drop_lock_conn()
            self._lock_conn = None
