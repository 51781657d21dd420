"""Local transactions: publishes and settlements that take effect together or not at all.

AMQP 0-9-1 `tx.select/commit/rollback` and AMQP 1.0 coordinator links (declare / discharge)
both map onto this: a `Transaction` collects publishes and acks / nacks / rejects in memory and
`commit()` applies all of them in ONE PostgreSQL transaction, through the same SQL functions the
normal paths use (`fluxpg.append_batch` for publishes, `fluxpg.ack` / `nack` / `reject` through
the queue manager's settlement methods) — one truth, so a transactional publish or ack behaves
exactly like a plain one, only later. `rollback()` (or dropping the object) forgets everything;
nothing reached the database.

    tx = manager.transaction()
    tx.publish("$queue/orders/eu", b"...", {"content-type": "text/plain"})   # validated now
    tx.ack("orders", "orders", [41, 42])
    results = await tx.commit()   # [[("orders", 43)]]: per publish, its (queue, offset) list

Validation happens when an operation is added (a bad topic or a message over the queue's
`max_message_size` raises FluxError at once, as the plain publish would); errors the database
finds at commit (a full queue, a queue deleted meanwhile) fail the whole commit with nothing
applied. A Transaction is reusable after commit/rollback (AMQP 0-9-1 channels stay
transactional). Memory: the collected payloads are bounded by `max_bytes` (LimitExceeded).

A publish to a `$queue/<name>` no queue matches yet is routed at commit: the queue is created
first (queue_manager.auto_create; off: the commit fails with nothing applied), then the publish
joins the one PostgreSQL transaction like every other.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fluxpg import db
from fluxpg.errors import FluxError, InvalidArgument, LimitExceeded
from fluxpg.queues.appender import AppendRow, append_rows

if TYPE_CHECKING:
    from fluxpg.queues.manager import QueueManager

log = logging.getLogger("fluxpg.transactions")

DEFAULT_MAX_BYTES = 64 * 2 ** 20     # collected payload bytes per transaction
SETTLE_ENTRY_BYTES = 16              # what one acked offset is counted as against max_bytes

VERBS = ("ack", "nack", "reject")


@dataclass(slots=True)
class _Publish:
    topic: str
    payload: bytes
    headers: dict[str, Any] | None
    rows: list[AppendRow] | None     # None: no queue matches yet (auto-created at commit)


@dataclass(slots=True)
class _Settle:
    verb: str
    queue: str
    group: str
    seqs: list[int]
    partition: int
    reason: str | None


class Transaction:
    def __init__(self, manager: QueueManager, *, max_bytes: int | None = None):
        self.manager = manager
        self.max_bytes = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
        self._publishes: list[_Publish] = []
        self._settles: list[_Settle] = []
        self._bytes = 0

    # --- collecting ---------------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return not self._publishes and not self._settles

    @property
    def size(self) -> int:
        """Bytes counted against max_bytes so far."""
        return self._bytes

    def _account(self, n: int) -> None:
        if self.max_bytes and self._bytes + n > self.max_bytes:
            raise LimitExceeded(f"transaction holds {self._bytes} bytes; adding {n} exceeds its limit of "
                                f"{self.max_bytes} bytes (commit more often)")
        self._bytes += n

    def publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None, *,
                partition_key: str | None = None) -> None:
        """Add a publish; raises FluxError now for what the plain publish would refuse."""
        payload = bytes(payload)
        rows = self.manager.durable_rows(topic, payload, headers, partition_key)
        if rows is None:
            from fluxpg.topics import parse_queue_topic
            parse_queue_topic(topic)   # auto-creating the queue needs a queue topic
        self._account(len(payload) * max(len(rows or ()), 1))
        self._publishes.append(_Publish(topic, payload, headers, rows))

    def _settle(self, verb: str, queue: str, group: str, seqs: list[int], partition: int,
                reason: str | None) -> None:
        if not queue or not group:
            raise InvalidArgument(f"{verb}: queue and group must not be empty")
        seqs = [int(s) for s in seqs]
        if not seqs:
            return
        self._account(SETTLE_ENTRY_BYTES * len(seqs))
        last = self._settles[-1] if self._settles else None
        if last is not None and (last.verb, last.queue, last.group, last.partition, last.reason) == \
                (verb, queue, group, partition, reason):
            last.seqs.extend(seqs)   # one SQL call for a run of the same settlement
        else:
            self._settles.append(_Settle(verb, queue, group, seqs, partition, reason))

    def ack(self, queue: str, group: str, seqs: list[int], partition: int = 0) -> None:
        self._settle("ack", queue, group, seqs, partition, None)

    def nack(self, queue: str, group: str, seqs: list[int], partition: int = 0) -> None:
        self._settle("nack", queue, group, seqs, partition, None)

    def reject(self, queue: str, group: str, seqs: list[int], reason: str | None = None,
               partition: int = 0) -> None:
        self._settle("reject", queue, group, seqs, partition, reason)

    # --- ending ---------------------------------------------------------------------------------

    def rollback(self) -> None:
        """Forget everything collected; nothing was applied."""
        self._publishes, self._settles, self._bytes = [], [], 0

    async def commit(self) -> list[list[tuple[str, int]]]:
        """Apply everything in one PostgreSQL transaction: publishes first (one append_batch, in
        the order they were added), then the settlements in order. Returns, per publish, its
        (queue, offset) list. On any error nothing is applied and FluxError is raised; the
        transaction is empty afterwards either way."""
        publishes, settles = self._publishes, self._settles
        self.rollback()
        if not publishes and not settles:
            return []
        mgr = self.manager
        for p in publishes:
            if p.rows is None:
                # Before the transaction: creating a queue is a transaction of its own.
                p.rows = await mgr.rows_for_publish(p.topic, p.payload, p.headers)
        rows: list[AppendRow] = [r for p in publishes for r in p.rows]
        try:
            async with mgr.pool.acquire() as conn:
                async with conn.transaction():
                    results = await append_rows(conn, rows) if rows else []
                    for s in settles:
                        if s.verb == "ack":
                            await mgr.ack(s.queue, s.group, s.seqs, s.partition, executor=conn)
                        elif s.verb == "nack":
                            await mgr.nack(s.queue, s.group, s.seqs, s.partition, executor=conn)
                        else:
                            await mgr.reject(s.queue, s.group, s.seqs, s.reason, s.partition, executor=conn)
        except FluxError:
            raise
        except Exception as exc:  # noqa: BLE001 - every database failure is a FluxError to the caller
            raise db.translate_error(exc) from exc
        named = mgr._names(results)
        out: list[list[tuple[str, int]]] = []
        i = 0
        for p in publishes:
            out.append(named[i:i + len(p.rows)])
            i += len(p.rows)
        return out


__all__ = ["DEFAULT_MAX_BYTES", "Transaction"]
