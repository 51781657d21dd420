"""Group commit of publishes.

Publishes that arrive while the previous batch is committing are coalesced into the next batch:
one `fluxpg.append_batch` call, one transaction, at most one NOTIFY (only for queues another node
or a SQL listener watches: this node wakes its own consumers at commit). Each publisher's future resolves only
after its batch committed (so a PUBACK / confirm / accepted disposition never runs ahead of the
database). One batch is in flight at a time, which keeps the commit order equal to the order
publishes were handed in: a connection that publishes m1 then m2 sees seq(m1) < seq(m2).

A batch that fails (a full queue, an oversized message) is retried publish by publish, so one bad
publish fails alone and the others still commit.

Handoff: when consumers of this node wait for new messages of a queue in the batch, the batch
claims for them in its own transaction (`fluxpg.append_claim`): one commit for the publish and its
delivery instead of append + NOTIFY + claim, each a transaction and round trip (issue 17: the
one-message-at-a-time path spent 3 transactions per message on it). Who waits, and what happens
with the claimed messages after the commit, is the queue manager's business (the `Handoff` hooks).
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from fluxpg.db import queries, translate_error
from fluxpg.errors import FluxError, Unavailable

log = logging.getLogger("fluxpg.appender")

# Group commit of a pipelining producer: a transaction has a fixed cost (~250 us of backend CPU
# here: the call, the heads row, NOTIFY, commit) and ~7 us per row, and a batch holds what arrived
# while the previous one committed, often ~10 messages. After a batch of at least STREAM_ROWS
# (someone publishes without waiting for each confirm), the next one waits up to LINGER seconds
# for LINGER_ROWS rows. A publisher that waits for each confirm makes batches of one: never held.
STREAM_ROWS = 8
LINGER_ROWS = 64
LINGER = 0.003


@dataclass(slots=True)
class AppendRow:
    queue_id: int
    topic: str
    payload: bytes
    headers: dict[str, Any] | None
    key: str | None = None


@dataclass(slots=True)
class ClaimTarget:
    """A consumer to claim for inside an append's transaction (fluxpg.append_claim)."""
    queue: str
    group: str
    consumer: str
    n: int
    token: Any = None        # the planner's own (which subscription, what it expects)
    # Offsets of (queue, group) the consumer's front-end acknowledged and has not written yet,
    # applied in the same transaction before the claims (fluxpg.append_claim); the planner tells
    # the front-end in done() whether they were written.
    acks: list[int] | None = None


class Handoff(Protocol):
    # `,@<node>`: the node wakes its own consumers of a committed batch's queues (done()), so its
    # appends NOTIFY only queues watched elsewhere (fluxpg._notify_log); None: every append NOTIFYs.
    # The only source of the tag: the appender and the sequencer pass it to the SQL functions
    # (append_batch, append_claim, sequence_claim), which never derive it themselves.
    notify_tag: str | None

    def plan(self, queue_ids: set[int], carry_acks: bool = False) -> list[ClaimTarget]:
        """Consumers waiting for new messages of these queues, now reserved for this batch (with
        carry_acks: and the acks their front-ends have not written yet, ClaimTarget.acks)."""

    def done(self, queue_ids: set[int], targets: list[ClaimTarget], claimed: list[list[Any]] | None) -> None:
        """After the batch: claimed[i] are the rows claimed for targets[i] (committed), or None
        for every target when the batch failed (nothing was claimed). A committed batch (claimed
        not None, targets possibly empty) wakes this node's consumers of queue_ids."""


@dataclass(slots=True)
class _Request:
    rows: list[AppendRow]
    future: asyncio.Future


async def append_rows(conn: asyncpg.Connection, rows: list[AppendRow],
                      notify_tag: str | None = None) -> list[tuple[int, int, int]]:
    """One `fluxpg.append_batch` call on `conn` (in whatever transaction it is in): the append
    the group commit and transactions (queues/transactions.py) share; notify_tag as Handoff's.
    Returns (queue_id,
    partition, seq) per row, in order."""
    records = await conn.fetch(queries()["append_batch"], *_append_args(rows), notify_tag)
    # append_batch returns rows ordered by their 1-based ordinal
    return [(rec["queue_id"], rec["partition"], rec["seq"]) for rec in records]


def _append_args(rows: list[AppendRow]) -> tuple:
    return ([r.queue_id for r in rows], [r.topic for r in rows], [r.payload for r in rows],
            # NULL instead of arrays of NULLs: nothing to encode for the common case.
            [r.headers for r in rows] if any(r.headers for r in rows) else None,
            [r.key for r in rows] if any(r.key is not None for r in rows) else None)


class Appender:
    def __init__(self, pool: asyncpg.Pool, *, max_batch_rows: int = 2000, handoff: Handoff | None = None):
        self._pool = pool
        self._handoff = handoff
        # Fixed for the appender's life: with a handoff, this node wakes its own consumers at commit.
        self._notify_tag = handoff.notify_tag if handoff is not None else None
        self._max_rows = max_batch_rows
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0            # rows of the requests in _queue
        self._lingering: asyncio.Future | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None   # start()'s: no get_running_loop() per submit
        self._closed = False
        # The pool connection the batches run on, held from one batch to the next: a pool
        # acquire + release per batch (asyncpg's release shields a task, with a timeout) cost
        # ~6 % of the broker's CPU per message when publishes come one at a time. Given back
        # after a failed batch (it may be broken; the pool replaces it) and at close().
        self._conn: asyncpg.Connection | None = None
        self.batches = 0  # statistics: transactions committed
        self.rows = 0
        self.handed = 0   # statistics: messages claimed inside an append's transaction (handoff)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="fluxpg-appender")

    async def append(self, rows: list[AppendRow]) -> list[tuple[int, int, int]]:
        """Append rows in one transaction with whatever else is waiting; returns
        (queue_id, partition, seq) per row once committed. Raises FluxError."""
        return await self.submit(rows)

    def submit(self, rows: list[AppendRow]) -> asyncio.Future:
        """append() without a coroutine: queued now (in call order), the future resolves as
        append() returns. For front-ends that publish per message without a task each."""
        if self._closed:
            raise Unavailable("the broker is shutting down")
        fut = (self._loop or asyncio.get_running_loop()).create_future()
        self._queue.append(_Request(rows, fut))
        self._queued_rows += len(rows)
        if self._lingering is not None and self._queued_rows >= LINGER_ROWS and not self._lingering.done():
            self._lingering.set_result(None)
        self._wake.set()
        return fut

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = 0   # rows of the previous batch
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                if last >= STREAM_ROWS and self._queued_rows < LINGER_ROWS and not self._closed:
                    await self._linger(loop)
                batch, n = [], 0
                while self._queue and (not batch or n + len(self._queue[0].rows) <= self._max_rows):
                    req = self._queue.popleft()
                    batch.append(req)
                    n += len(req.rows)
                self._queued_rows -= n
                last = n
                await self._commit(batch)
            last = 0   # the queue ran dry: the next publish is not held
            if self._closed:
                return

    async def _linger(self, loop: asyncio.AbstractEventLoop) -> None:
        """Until LINGER_ROWS rows wait, LINGER passed, or close()."""
        fut = self._lingering = loop.create_future()
        timer = loop.call_later(LINGER, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._lingering = None

    async def _commit(self, batch: list[_Request], handoff: bool = True) -> None:
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        try:
            results, handed = await self._execute([row for r in live for row in r.rows], handoff)
        except _HandoffFailed:
            # The claims may be what failed: the same batch again without them, then as below.
            await self._commit(batch, handoff=False)
            return
        except Exception as exc:  # noqa: BLE001 - every failure is reported to the publishers
            err = translate_error(exc)
            if len(live) > 1 and not isinstance(err, Unavailable):
                # Find the publish that broke the batch: retry each alone.
                for req in live:
                    await self._commit([req], handoff=False)
                return
            for req in live:
                if not req.future.done():
                    req.future.set_exception(err)
            return
        i = 0
        for req in live:
            k = len(req.rows)
            if not req.future.done():
                req.future.set_result(results[i:i + k])
            i += k
        if handed is not None:
            handed()   # deliveries after the confirms: both only after the commit

    async def _connection(self) -> asyncpg.Connection:
        conn = self._conn
        if conn is None or _broken(conn):
            await self._give_back()
            conn = self._conn = await self._pool.acquire()
        return conn

    async def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await self._pool.release(conn)
            except Exception:  # noqa: BLE001 - a broken connection: the pool has dropped it
                log.debug("releasing the appender's connection failed", exc_info=True)

    async def _execute(self, rows: list[AppendRow], handoff: bool = True):
        """The batch in one transaction: (queue_id, partition, seq) per row, and what to call after
        the publishers were told (the handoff's deliveries), or None."""
        queue_ids = {r.queue_id for r in rows}
        targets = self._handoff.plan(queue_ids, carry_acks=True) if handoff and self._handoff is not None else []
        if not targets:
            tag = self._notify_tag
            try:
                result = await append_rows(await self._connection(), rows, tag)
            except BaseException:
                await self._give_back()
                raise
            self.batches += 1
            self.rows += len(rows)
            if tag is None:
                return result, None
            # The NOTIFY named only queues watched elsewhere: this node wakes its own consumers.
            return result, lambda: self._handoff.done(queue_ids, [], [])
        try:
            conn = await self._connection()
            ack_targets = [i for i, t in enumerate(targets, 1) if t.acks for _ in t.acks]
            records = await conn.fetch(queries()["append_claim"], *_append_args(rows),
                                       [t.queue for t in targets], [t.group for t in targets],
                                       [t.consumer for t in targets], [t.n for t in targets],
                                       ack_targets or None,
                                       [s for t in targets if t.acks for s in t.acks] if ack_targets else None,
                                       self._notify_tag)
        except Exception as exc:  # noqa: BLE001 - retried without the handoff by _commit
            self._handoff.done(queue_ids, targets, None)
            await self._give_back()
            raise _HandoffFailed() from exc
        except BaseException:
            self._handoff.done(queue_ids, targets, None)
            await self._give_back()
            raise
        self.batches += 1
        self.rows += len(rows)
        result: list[tuple[int, int, int]] = []
        claimed: list[list[Any]] = [[] for _ in targets]
        for rec in records:   # appended rows first, in ordinal order, then each target's claim
            target = rec[0]
            if target == 0:
                result.append((rec[2], rec[3], rec[4]))
            else:
                claimed[target - 1].append(rec)
                self.handed += 1
        return result, lambda: self._handoff.done(queue_ids, targets, claimed)

    async def close(self) -> None:
        """Finish what was handed in, then stop."""
        self._closed = True
        if self._lingering is not None:
            _resolve(self._lingering)
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        for req in self._queue:
            if not req.future.done():
                req.future.set_exception(Unavailable("the broker shut down before the publish committed"))
        self._queue.clear()
        self._queued_rows = 0
        await self._give_back()


def _broken(conn) -> bool:
    """A held pool connection that was closed (asyncpg detaches its proxy when the connection is
    lost; the proxy then raises InterfaceError)."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _HandoffFailed(Exception):
    """A batch with claims failed: _commit retries it without them."""


__all__ = ["Appender", "AppendRow", "ClaimTarget", "FluxError", "Handoff"]
