"""One settle path for the front-ends: the acknowledgements of one connection (MQTT) or channel
(AMQP 0-9-1) or connection (AMQP 1.0) go to the queue manager in batches.

A client settles deliveries one by one, often faster than one database transaction each would
allow. The settlements that arrive while a batch is being written are coalesced into the next
one, as one array per (verb, queue, group, partition, reason) — ack, nack, release, reject — in
the order each key first appeared; offsets of one key stay in arrival order. Exactly one batch
is in flight per Settler, so a batch is written only after the previous one committed.

Verbs are the queue manager's: `ack` (done), `nack` (retry policy, maybe dead-lettered),
`release` (back at once, first in line, no retry counted), `reject` (dead-lettered, with a
reason). A failed call leaves its entries pending: they come back after the visibility timeout.

- `submit` returns a future resolved after the call that carried the offset (its result, or its
  exception): for a client that is answered only after its acknowledgement is written (MQTT `$ack`
  with QoS 1).
- `settle` is fire-and-forget: a failure is logged here.
- `flush` waits until everything submitted so far — and whatever is submitted meanwhile — is
  written (AMQP 0-9-1 basic.recover, channel close; AMQP 1.0 connection close).
- `requeues` counts releases and nacks not yet written and `requeued` is set when there are none:
  new credit waits for them, or a claim would pass the requeued message by (AMQP 1.0).
- `linger` (seconds, default 0: off): while everything pending is an `ack` nobody waits for
  (`settle`), a batch waits that long for more before it is written (at most `linger_max`
  entries): a client that acks each message with a fire-and-forget packet (MQTT `$ack` QoS 0)
  then costs one ack call per `linger` instead of one per database round trip. Anything else
  submitted -- a future someone waits for, a nack, release or reject -- and `flush` end the wait
  at once. An ack written later is still at least once: until it is written the entry is
  pending, and comes back only after the visibility timeout.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from fluxpg.errors import FluxError, UnknownQueue

log = logging.getLogger("fluxpg.settle")

VERBS = ("ack", "nack", "release", "reject")
REQUEUES = frozenset({"release", "nack"})

_Key = tuple[str, str, str, int, "str | None"]          # verb, queue, group, partition, reason


class Settler:
    def __init__(self, manager: Any, label: str, *, linger: float = 0.0, linger_max: int = 512):
        self.manager = manager
        self.label = label                                   # who settles, for the log
        self._pending: dict[_Key, list[tuple[int, asyncio.Future | None]]] = {}
        self._task: asyncio.Task | None = None
        self.linger = linger
        self.linger_max = linger_max
        self._count = 0          # entries pending
        self._lazy = True        # every pending entry is an ack nobody waits for
        self._hurry = 0          # flushes waiting: no lingering
        self._nap: asyncio.Future | None = None
        self.requeues = 0
        self.requeued = asyncio.Event()
        self.requeued.set()

    def submit(self, verb: str, queue: str, group: str, seq: int, partition: int = 0,
               reason: str | None = None) -> asyncio.Future:
        """Settle one offset; the future resolves after the call that carried it."""
        fut = asyncio.get_running_loop().create_future()
        self._add(verb, queue, group, seq, partition, reason, fut)
        return fut

    def settle(self, verb: str, queue: str, group: str, seq: int, partition: int = 0,
               reason: str | None = None) -> None:
        """Settle one offset, nobody waiting for it (a failure is logged)."""
        self._add(verb, queue, group, seq, partition, reason, None)

    def _add(self, verb: str, queue: str, group: str, seq: int, partition: int, reason: str | None,
             fut: asyncio.Future | None) -> None:
        if verb not in VERBS:
            raise ValueError(f"unknown settlement {verb!r}")
        self._pending.setdefault((verb, queue, group, partition, reason), []).append((seq, fut))
        self._count += 1
        if fut is not None or verb != "ack":
            self._lazy = False
        if verb in REQUEUES:
            self.requeues += 1
            self.requeued.clear()
        if self._nap is not None and (not self._lazy or self._count >= self.linger_max):
            self._wake()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def _wake(self) -> None:
        nap, self._nap = self._nap, None
        if nap is not None and not nap.done():
            nap.set_result(None)

    async def flush(self) -> None:
        """Until everything submitted so far, and anything submitted meanwhile, is written."""
        self._hurry += 1
        try:
            self._wake()
            while self._pending or (self._task is not None and not self._task.done()):
                if self._task is None or self._task.done():
                    self._task = asyncio.ensure_future(self._run())
                # Shielded: a caller cancelled while waiting must not cancel a batch mid-query
                # (its settlements would be lost).
                await asyncio.shield(self._task)
        finally:
            self._hurry -= 1

    async def close(self, timeout: float) -> None:
        """Write what is left (the connection ended), giving up after `timeout` seconds."""
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except asyncio.TimeoutError:
            log.warning("%s: could not apply the last acknowledgements", self.label)
            if self._task is not None:
                self._task.cancel()

    async def _run(self) -> None:
        while self._pending:
            if self.linger and self._lazy and not self._hurry and self._count < self.linger_max:
                loop = asyncio.get_running_loop()
                nap = self._nap = loop.create_future()
                timer = loop.call_later(self.linger, self._wake)
                try:
                    await nap
                finally:
                    timer.cancel()
                    if self._nap is nap:
                        self._nap = None
            batch, self._pending = self._pending, {}
            self._count = 0
            self._lazy = True
            for (verb, queue, group, partition, reason), items in batch.items():
                seqs = [seq for seq, _ in items]
                try:
                    result = await self._call(verb, queue, group, seqs, partition, reason)
                except Exception as exc:  # noqa: BLE001 - FluxError or a bug: never stop settling
                    self._failed(verb, queue, group, seqs, items, exc)
                else:
                    for _, fut in items:
                        if fut is not None and not fut.done():
                            fut.set_result(result)
                finally:
                    if verb in REQUEUES:
                        self.requeues = max(0, self.requeues - len(seqs))
                        if not self.requeues:
                            self.requeued.set()

    def _call(self, verb: str, queue: str, group: str, seqs: list[int], partition: int, reason: str | None):
        m = self.manager
        if verb == "ack":
            return m.ack(queue, group, seqs, partition)
        if verb == "nack":
            return m.nack(queue, group, seqs, partition)
        if verb == "release":
            return m.release(queue, group, seqs, partition)
        return m.reject(queue, group, seqs, reason, partition)

    def _failed(self, verb: str, queue: str, group: str, seqs: list[int],
                items: list[tuple[int, asyncio.Future | None]], exc: Exception) -> None:
        unwatched = False
        for _, fut in items:
            if fut is None:
                unwatched = True
            elif not fut.done():
                fut.set_exception(exc)
        if not unwatched:
            return   # every caller is told and answers its client
        # The entries stay pending and come back after the visibility timeout.
        if isinstance(exc, UnknownQueue):
            # The queue was deleted meanwhile, its entries with it: nothing is left to settle
            # (RabbitMQ, too, takes a settlement for a deleted queue's delivery without a word).
            log.info("%s: %s of %s/%s %s: the queue is gone", self.label, verb, queue, group, seqs[:5])
        elif isinstance(exc, FluxError):
            log.warning("%s: %s of %s/%s %s failed: %s", self.label, verb, queue, group, seqs[:5], exc)
        else:
            log.error("%s: %s of %s/%s %s failed", self.label, verb, queue, group, seqs[:5], exc_info=exc)
