"""The queue manager: routing, fan-out, auto-created and transient queues, delivery scheduling
and wake-ups.

Every protocol front-end talks to one QueueManager per process:

    mgr = await QueueManager.start(dsn, config)
    await mgr.publish("$queue/orders/eu", b"...", {"content-type": "text/plain"})
    sub = await mgr.subscribe("orders", "workers", "worker-1", filter="eu/#",
                              on_delivery=callback, credit=10)
    ...  # callback(delivery) is called in offset order; sub.grant(n) adds flow credit
    await mgr.ack("orders", sub.group, [delivery.seq])

Publishes are group-committed (appender.py); deliveries are pulled from PostgreSQL by one task per
subscription, woken at commit by this node's own appends and by LISTEN/NOTIFY for other nodes'
(fluxpg._notify_log: queues this node watches, fluxpg.log_watchers) and, as a safety net
for visibility timeouts and retry backoffs, by a short poll. A subscription of this node that waits
for new messages of a queue being published to is claimed for inside the publish's transaction
instead (LocalHandoff: one commit, no NOTIFY → claim round trip).

A `$queue/<name>/…` topic no configured queue matches reaches the queue `<name>`, created on first
use as `queue_manager.auto_create` says: durable (the default: a classic queue in PostgreSQL),
transient (transient.py), or not at all (UnknownQueue). Nothing is ever held only in memory:
every confirmed publish is a row of fluxpg.log.
"""
from __future__ import annotations

import asyncio
import functools
from collections import deque
import json
import logging
import os
import socket
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from fluxpg import db
from fluxpg.aio import cancel_and_wait
from fluxpg.config import Config, QueueConfig, QueueManagerConfig
from fluxpg.queues import classic, stream, transient
from fluxpg.queues.appender import Appender, AppendRow, ClaimTarget
from fluxpg.queues.sequencer import Sequencer
from fluxpg.queues.vacuum import Vacuumer
from fluxpg.selectors import selector_jsonpath
from fluxpg.delivery import Delivery
from fluxpg.errors import (FluxError, InvalidArgument, PayloadTooLarge, PreconditionFailed, Unavailable,
                           UnknownQueue, WrongQueueKind)
from fluxpg.topics import (TopicTree, internal_group_name, is_queue_topic, parse_queue_topic, validate_group_name,
                           validate_topic_filter, validate_topic_name)

UNLISTED_SHOWN = 10   # how many names in the start-up line about queues the config does not list
log = logging.getLogger("fluxpg.manager")

DeliveryCallback = Callable[[Delivery], Awaitable[None] | None]
ErrorCallback = Callable[[FluxError], Awaitable[None] | None]

CLASSIC_POLL = 1.0   # seconds: catches visibility timeouts and retry backoffs
STREAM_POLL = 5.0    # seconds: only a safety net, NOTIFY wakes stream readers
ROUTE_CACHE_SIZE = 10_000


@dataclass(slots=True)
class QueueInfo:
    id: int
    name: str
    kind: str
    topics: list[str]
    partitions: int
    settings: dict[str, Any]
    durability: str = "durable"     # durable | transient
    owner: str | None = None        # transient: the connection an exclusive queue belongs to
    auto_delete: bool = False       # transient: deleted when its last consumer leaves
    owner_node: int | None = None   # transient: the node it goes with
    max_message_size: int = 0   # from settings, kept apart: the publish path checks it per message

    def __post_init__(self) -> None:
        self.max_message_size = int(self.settings.get("limits", {}).get("max_message_size", 0) or 0)

    @property
    def transient(self) -> bool:
        return self.durability == "transient"

    @property
    def display_kind(self) -> str:
        """classic | stream | transient, as fluxpg.queue_stats reports it."""
        return "transient" if self.transient else self.kind

    @classmethod
    def from_row(cls, r: Any) -> QueueInfo:
        return cls(r["id"], r["name"], r["kind"], list(r["topics"]), r["partitions"], r["settings"],
                   r["durability"], r["owner"], r["auto_delete"], r["owner_node"])

    @property
    def primary_group(self) -> str:
        return self.settings.get("primary_group") or ""


class ClaimSlot:
    """What a node's classic consumers of one (queue, group, selector) share: one claim in flight
    at a time, and the wake-up state (QueueManager._wake_state) at which a claim last came back
    short (nothing more to claim then)."""

    __slots__ = ("lock", "drained_at", "__weakref__")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.drained_at: tuple[int, int] | None = None

    def claimed(self, asked: int, state: tuple[int, int], fetch: asyncio.Future) -> None:
        """A claim ended: note whether it came back short, then let the next one run (in this
        order, from the claim's own callback: the next consumer must see the note)."""
        if not fetch.cancelled() and fetch.exception() is None and len(fetch.result()) < asked:
            self.drained_at = state
        self.lock.release()


class Subscription:
    """One consumer of one queue: delivers in order, within its credit (flow window)."""

    def __init__(self, manager: QueueManager, queue: str, kind: str, group: str, consumer: str,
                 topic_filter: str | None, on_delivery: DeliveryCallback, credit: int | None,
                 on_error: ErrorCallback | None = None, queue_id: int | None = None,
                 auto_commit: bool = True, partitions: int = 1, handed_by_caller: bool = False,
                 selector: str | None = None):
        self.manager = manager
        self.selector = selector      # jsonpath (fluxpg.selectors) or None
        self.queue = queue
        self.kind = kind
        self.group = group            # internal name: group or group@filter
        self.group_base = group.split("@", 1)[0]
        self.consumer = consumer
        self.filter = topic_filter
        self.queue_id = queue_id
        self.auto_commit = auto_commit
        self.partitions = partitions
        self._on_delivery = on_delivery
        self._on_error = on_error
        self._credit = credit           # None: unlimited
        self._credit_event = asyncio.Event()
        if credit is None or credit > 0:
            self._credit_event.set()
        self._closed = False
        self._task: asyncio.Task | None = None
        # Stream auto-commit goes up to what the application got: a delivery callback that sends to
        # the network hands each message over; one that only buffers (the embedding API's
        # prefetch) says so with handed_by_caller and reports each message it gives out (handed()).
        self.handed_by_caller = handed_by_caller
        self._delivered_max: dict[int, int] = {}   # stream: partition → highest handed-over offset
        self._committed_max: dict[int, int] = {}
        self.delivered = 0
        self._claimed: deque[Delivery] = deque()   # classic: claimed, not yet handed to on_delivery
        # Set while the appender claims for this subscription in a publish's transaction
        # (LocalHandoff); resolves to its deliveries, or None (claim yourself).
        self._handoff: asyncio.Future | None = None
        self._slot: ClaimSlot | None = None     # classic: shared with this node's consumers of the group
        self._must_claim = True                 # claim even if the slot says the group is drained
        self._behind_at: int | None = None      # the cursor a filtered claim last went on from
        # Classic, no selector: called before each claim; may return (offsets to ack, done) — the
        # front-end's acknowledgements of this queue and group not yet written, carried in the
        # claim's transaction (fluxpg.ack_claim). done(None) after it committed, done(exc) when
        # it failed (nothing was acked: the front-end writes them again on its own).
        self.carry_acks: Callable[[], tuple[list[int], Callable[[BaseException | None], None]] | None] | None = None

    # --- flow control -------------------------------------------------------------------------

    @property
    def credit(self) -> int | None:
        return self._credit

    def grant(self, n: int = 1) -> None:
        """Allow n more deliveries (an ack freed a slot of the window)."""
        if self._credit is None or n <= 0:
            return
        self._credit += n
        self._credit_event.set()

    def set_credit(self, n: int | None) -> None:
        self._credit = n
        if n is None or n > 0:
            self._credit_event.set()
        else:
            self._credit_event.clear()

    def _take_credit(self) -> None:
        if self._credit is not None:
            self._credit -= 1
            if self._credit <= 0:
                self._credit_event.clear()

    def handed(self, d: Delivery) -> None:
        """`d` reached the application: stream auto-commit may now checkpoint past it."""
        if self.kind == "stream":
            self._delivered_max[d.partition] = max(self._delivered_max.get(d.partition, -1), d.seq)

    # --- pull loop ----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"fluxpg-sub-{self.queue}-{self.consumer}")

    async def _fetch(self, n: int) -> list[Delivery]:
        pool = self.manager.pool
        if self.kind == "classic":
            carried = self.carry_acks() if self.carry_acks is not None and self.selector is None else None
            if carried is None:
                return await classic.claim(pool, self.queue, self.group, self.consumer, n, self.selector)
            seqs, done = carried
            try:
                deliveries = await classic.ack_claim(pool, self.queue, self.group, seqs, self.consumer, n)
            except BaseException as exc:
                done(exc)
                raise
            done(None)
            return deliveries
        return await stream.read(pool, self.queue, self.group, self.consumer, n)

    async def _deliver(self, deliveries: list[Delivery]) -> None:
        if self.kind == "stream":
            await self.manager._add_work_properties(self.queue, deliveries)
        if self.kind == "classic":
            # Claimed but not handed out yet: if the consumer goes away now, close() releases
            # them at once instead of leaving them to the visibility timeout.
            self._claimed = deque(deliveries)
        for d in deliveries:
            if self._closed:
                return  # classic: the rest is in self._claimed, released by close()
            if self.kind == "classic":
                self._claimed.popleft()
            self._take_credit()
            self.delivered += 1
            if self.kind == "stream" and not self.handed_by_caller:
                self.handed(d)
            try:
                result = self._on_delivery(d)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
                log.exception("delivery callback of %s/%s failed for %s", self.queue, self.consumer, d.message_id)

    async def _run(self) -> None:
        batch = self.manager.qm.delivery_batch
        poll = CLASSIC_POLL if self.kind == "classic" else STREAM_POLL
        backoff = 0.05
        commit_every = self.manager.qm.auto_commit_interval.total_seconds()
        loop = asyncio.get_running_loop()
        next_commit = loop.time() + commit_every
        try:
            if self.kind == "classic":
                # Entries this consumer had when it went away (crash, reconnect) come back first.
                # Paged by offset: a consumer may hold more than one batch.
                after = None
                while not self._closed:
                    own = await classic.reclaim(self.manager.pool, self.queue, self.group, self.consumer, batch, after)
                    await self._deliver(own)
                    if len(own) < batch or (self._credit is not None and self._credit <= 0):
                        break
                    after = own[-1].seq
            # Claim even if the slot says the group was drained: at start, and after a poll
            # timeout (redeliveries that become due by time send no NOTIFY).
            self._must_claim = True
            self._slot = self.manager._claim_slot(self.queue_id, self.group, self.selector) if self.kind == "classic" else None
            while not self._closed:
                if self._credit is not None and self._credit <= 0:
                    if self.kind == "stream" and self.partitions > 1:
                        # A member that is busy (no credit) still heart-beats, or the group
                        # would hand its partitions to others after delivery.member_timeout.
                        try:
                            await asyncio.wait_for(self._credit_event.wait(), poll)
                        except asyncio.TimeoutError:
                            await self._heartbeat()
                    else:
                        await self._credit_event.wait()
                    continue
                waker = self.manager._waker(self.queue_id)
                n = batch if self._credit is None else min(self._credit, batch)
                slot = self._slot
                if slot is not None:
                    # One claim of this group at a time on this node: claims of a group serialise
                    # on its cursor row in PostgreSQL anyway, so a second one in flight only waits
                    # there (holding a pool connection). Waiting here instead, the credit that
                    # acks free meanwhile goes into this consumer's claim: fewer, larger claims.
                    await slot.lock.acquire()
                    if self._closed or (self._credit is not None and self._credit <= 0):
                        slot.lock.release()
                        continue
                    n = batch if self._credit is None else min(self._credit, batch)
                    state = self.manager._wake_state(self.queue_id)
                    if not self._must_claim and slot.drained_at == state:
                        # A claim of this group on this node (or a handoff for it), made after the
                        # queue's last wake-up, came back short: nothing was committed since (a
                        # commit wakes), so this claim would be empty. Every wake-up used to make
                        # each consumer of every node claim, most of them for nothing.
                        slot.lock.release()
                        await self._idle_wait(waker, poll)   # (a handoff may come meanwhile)
                        continue
                fetch = asyncio.ensure_future(self._fetch(n))
                if slot is not None:
                    fetch.add_done_callback(functools.partial(slot.claimed, n, state))
                try:
                    try:
                        deliveries = await asyncio.shield(fetch)
                    except asyncio.CancelledError:
                        # Closed while a claim runs: it may still commit; what it took is
                        # released by close() (pika's suite saw such a message hidden 30 s).
                        if self.kind == "classic":
                            try:
                                self._claimed = deque(await fetch)
                            except Exception:  # noqa: BLE001 - nothing was claimed
                                pass
                        raise
                    backoff = 0.05
                    self._must_claim = False
                except Unavailable as exc:
                    if exc.sqlstate == "23503":
                        # The group (or its queue) was deleted while this claim joined it: not a
                        # database fault; the retry finds the queue gone and ends the subscription.
                        log.info("%s/%s: its group was deleted during a claim; checking the queue",
                                 self.queue, self.consumer)
                    else:
                        log.warning("%s/%s: %s; retrying in %.2fs", self.queue, self.consumer, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                    continue
                except FluxError as exc:
                    await self._fail(exc)
                    return
                if deliveries:
                    await self._deliver(deliveries)
                if self.kind == "stream" and self.auto_commit and loop.time() >= next_commit:
                    await self._auto_commit()
                    next_commit = loop.time() + commit_every
                if deliveries and len(deliveries) >= n:
                    continue
                if await self._filtered_and_behind():
                    continue
                await self._idle_wait(waker, poll)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.exception("subscription %s/%s stopped", self.queue, self.consumer)
            await self._fail(db.translate_error(exc))

    async def _filtered_and_behind(self) -> bool:
        """A classic claim with a topic filter or a selector scans a window of a few thousand
        offsets; when few of them match it comes back short with the queue's head still far off.
        Then claim on at once (and past the slot's drained mark) instead of one window per
        wake-up or poll: a filtered consumer on a large backlog used to drain ~4,000 offsets per
        CLASSIC_POLL. Only while the cursor moves: a claim held back by delivery.max_pending
        does not move it, and waits as before."""
        if self.kind != "classic" or (self.filter is None and self.selector is None):
            return False
        try:
            rows = await db.fetch(self.manager.pool, "classic_cursor_behind", self.queue, self.group)
        except FluxError:
            return False
        row = rows[0] if rows else None
        if row is None or not row[1] or row[0] == self._behind_at:
            return False
        self._behind_at = row[0]
        self._must_claim = True
        return True

    async def _idle_wait(self, waker: asyncio.Event, poll: float):
        """Wait for a wake-up (or the poll). Meanwhile a classic subscription without a selector
        is idle: the appender may claim for it in a publish's transaction (LocalHandoff), whose
        deliveries are handed over here. (A handoff that reached the queue's head marks the claim
        slot drained, as a short claim does: the loop then waits instead of claiming for nothing.)"""
        mgr = self.manager
        idle = self.kind == "classic" and self.selector is None and self.queue_id is not None
        if idle:
            mgr._idle_add(self)
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the wait in a task of its own (3.11),
            # two more loop iterations, a task and a future between a wake-up and the delivery.
            async with asyncio.timeout(poll):
                await waker.wait()
        except TimeoutError:
            self._must_claim = True     # redeliveries due by time send no wake-up
        finally:
            if idle:
                mgr._idle_remove(self)
        fut = self._handoff
        if fut is None:
            return
        try:
            deliveries = await fut
        finally:
            self._handoff = None
        # None or empty: skipped (cursor busy, redeliveries due, …) or nothing for this group: the
        # loop claims as usual (the slot was not marked), or a due redelivery would wait for the poll.
        if deliveries:
            await self._deliver(deliveries)

    async def _heartbeat(self) -> None:
        try:
            await db.fetchval(self.manager.pool, "member_heartbeat", self.queue, self.group, self.consumer)
        except Exception as exc:  # noqa: BLE001 - the next read retries
            log.warning("heartbeat of %s/%s failed: %s", self.queue, self.consumer, exc)

    async def _auto_commit(self) -> None:
        for part, seq in list(self._delivered_max.items()):
            if self._committed_max.get(part, -1) < seq:
                try:
                    await stream.checkpoint(self.manager.pool, self.queue, self.group, [seq], part)
                    self._committed_max[part] = seq
                except FluxError as exc:
                    log.warning("auto-commit of %s/%s failed: %s", self.queue, self.group, exc)

    async def _fail(self, exc: FluxError) -> None:
        log.warning("subscription %s/%s ended: %s", self.queue, self.consumer, exc)
        self._closed = True
        self.manager._detach(self)   # an ended subscription is no consumer any more (counts, if-unused)
        if self._on_error is not None:
            result = self._on_error(exc)
            if asyncio.iscoroutine(result):
                await result

    async def close(self) -> None:
        if self._closed and self._task is None:
            return
        self._closed = True
        self._credit_event.set()
        if self._task is not None and not self._task.done():
            # Let the loop finish what it is doing rather than cancel it mid-claim: a batch the
            # database already handed to this consumer is then released by _deliver instead of
            # staying pending until the visibility timeout. Cancelled only if it hangs.
            if self.queue_id is not None:
                self.manager._wake(self.queue_id)
            await asyncio.wait({self._task}, timeout=5)
        await cancel_and_wait([self._task])
        self._task = None
        if self.kind == "classic" and self._claimed:
            claimed, self._claimed = list(self._claimed), deque()
            try:
                await self.manager.release(self.queue, self.group, [d.seq for d in claimed])
            except FluxError as exc:  # they come back after the visibility timeout instead
                log.warning("releasing %d undelivered messages of %s/%s failed: %s", len(claimed),
                            self.queue, self.group, exc)
        if self.kind == "stream":
            if self.auto_commit:
                await self._auto_commit()
            try:
                # Hand this member's partitions to the rest of the group now, not after a timeout.
                await db.fetchval(self.manager.pool, "leave_group", self.queue, self.group, self.consumer)
            except Exception as exc:  # noqa: BLE001 - the member times out instead
                log.warning("leaving %s/%s failed: %s", self.queue, self.group, exc)
        # Classic members stay: their node's death must still release their pending entries.
        self.manager._detach(self)
        await self.manager._auto_delete(self)


class LocalHandoff:
    """The Handoff of the appender and the sequencer (queues/appender.py, queues/sequencer.py):
    which subscriptions of this node wait for new messages of a queue being appended to, and
    handing them what the append's transaction claimed for them.

    A subscription is eligible while it waits in `_idle_wait` with no wake-up since it began to
    (it would claim by itself next), has credit, and is the first of its group here (one claim per
    group and batch). After the commit every queue of the batch is woken locally at once — this
    node's consumers no longer wait for the NOTIFY, which carries this handoff's notify_tag (the
    appender and the sequencer pass it to the SQL) so the listener here skips it — and each
    reserved subscription gets its deliveries; one whose claim came back short marks its group's
    claim slot drained at that wake-up (as a short claim does).
    """

    def __init__(self, manager: QueueManager):
        self.manager = manager
        # Every batch of this node's appender and sequencer is woken here at commit (done()), so
        # their NOTIFYs need only name queues another node or a SQL listener watches.
        self.notify_tag = f",@{manager.node_id}"

    def plan(self, queue_ids: set[int], carry_acks: bool = False) -> list[ClaimTarget]:
        mgr = self.manager
        targets: list[ClaimTarget] = []
        for qid in queue_ids:
            subs = mgr._idle.get(qid)
            if not subs:
                continue
            now = mgr._wake_state(qid)
            groups: set[str] = set()
            for sub, since in subs.items():
                credit = sub._credit
                if (since != now or sub._handoff is not None or sub._closed or sub.group in groups
                        or (credit is not None and credit <= 0)):
                    continue
                groups.add(sub.group)
                sub._handoff = asyncio.get_running_loop().create_future()
                n = mgr.qm.delivery_batch if credit is None else min(credit, mgr.qm.delivery_batch)
                # The front-end's acks not written yet ride along (as in the subscription's own
                # claim, Subscription._fetch): no ack transaction of their own.
                carried = sub.carry_acks() if carry_acks and sub.carry_acks is not None else None
                targets.append(ClaimTarget(sub.queue, sub.group, sub.consumer, n, (sub, now, carried),
                                           carried[0] if carried is not None else None))
        return targets

    def done(self, queue_ids: set[int], targets: list[ClaimTarget], claimed: list[list[Any]] | None) -> None:
        mgr = self.manager
        if claimed is not None:
            for qid in queue_ids:
                mgr._wake(qid)
        for i, t in enumerate(targets):
            sub, (count, epoch), carried = t.token
            if carried is not None:
                # Written with the batch (committed), or not at all: the front-end writes them itself.
                carried[1](None if claimed is not None else Unavailable("the append carrying the acks failed"))
            result = None
            if claimed is not None:
                # Rows of fluxpg.append_claim: r_target, r_ord, r_queue_id, r_partition, r_seq,
                # r_topic, r_payload, r_headers, r_created_at, r_delivery_count.
                deliveries = [Delivery(queue=t.queue, group=t.group, partition=r[3], seq=r[4], topic=r[5],
                                       payload=bytes(r[6]), headers=r[7] or {}, created_at=r[8],
                                       delivery_count=r[9], kind="classic") for r in claimed[i]]
                result = deliveries
                if deliveries and len(deliveries) < t.n and sub._slot is not None:
                    # It reached the head: the group's other consumers here need not claim on
                    # this batch's wake-up (set now, before any of them runs).
                    sub._slot.drained_at = (count + 1, epoch)
            fut = sub._handoff
            task = sub._task
            waiting = fut is not None and not fut.done()
            if waiting and task is not None and not task.done() and not task.cancelling():
                fut.set_result(result)
                if claimed is None or sub.queue_id not in queue_ids:
                    # Nothing woke it (a failed batch, or a sequencer round that moved nothing
                    # into its queue): free it for the next batch's handoff now; it goes on waiting
                    # for its wake-up and finds nothing handed.
                    sub._handoff = None
                continue
            if waiting:
                fut.set_result(None)
            if result:
                # The subscription's task ended meanwhile: give its messages back now.
                asyncio.ensure_future(self._release(t.queue, t.group, [d.seq for d in result]))

    async def _release(self, queue: str, group: str, seqs: list[int]) -> None:
        try:
            await self.manager.release(queue, group, seqs)
        except FluxError as exc:   # they come back after the visibility timeout instead
            log.warning("releasing %d handed messages of %s/%s failed: %s", len(seqs), queue, group, exc)


class QueueManager:
    def __init__(self, dsn: str, config: Config | None = None):
        self.dsn = dsn
        self.config = config or Config()
        self.qm: QueueManagerConfig = self.config.queue_manager
        self.pool: asyncpg.Pool | None = None
        self.node_id: int | None = None
        self.queues: dict[str, QueueInfo] = {}
        self.queues_by_id: dict[int, QueueInfo] = {}
        self._bindings: TopicTree[str] = TopicTree()
        self._routes: dict[str, list[QueueInfo]] = {}   # topic → target queues, cleared on reload
        # The largest max_message_size over the queues (0: one is unlimited), or None: recompute.
        # Front-ends check it per message before buffering a body; queues change rarely.
        self._largest_limit: int | None = None
        self._reserved_bindings: TopicTree[str] = TopicTree()
        self.subscriptions: set[Subscription] = set()
        # AMQP 0-9-1 exclusive consumers of this node: queue → the consumer holding it (front-ends
        # refuse other consumers while it is there; a queue's consumers on other nodes are not seen).
        self.exclusive_consumers: dict[str, object] = {}
        self._wakers: dict[int | None, asyncio.Event] = {}
        # Wake-ups so far, per queue and of all queues (the claim slots' drained marks), and the
        # subscriptions waiting for one: queue id → {subscription: wake state when it began}.
        self._wake_counts: dict[int, int] = {}
        self._wake_epoch = 0
        self._idle: dict[int, dict[Subscription, tuple[int, int]]] = {}
        # Queues being auto-created here (ensure_queue): one creation per name, however many
        # publishes and attaches ask for it meanwhile.
        self._creating: dict[str, asyncio.Future] = {}
        self._claim_slots: weakref.WeakValueDictionary[tuple[int | None, str, str | None], ClaimSlot] = \
            weakref.WeakValueDictionary()
        # The node's one LISTEN connection (db.Listener says why one); other parts of the node
        # add their channels to it (listen()).
        self._listener: db.Listener | None = None
        # Queues this node has consumers of, as fluxpg.log_watchers says (other nodes' appends
        # NOTIFY only those: fluxpg._notify_log); queue ids pinned by subscribe() while it starts.
        self._watched: frozenset[int] = frozenset()
        self._watch_pins: dict[int, int] = {}
        self._watch_lock = asyncio.Lock()
        self.appender: Appender | None = None
        self.sequencer: Sequencer | None = None
        self.vacuumer: Vacuumer | None = None
        self._tasks: list[asyncio.Task] = []
        self._retention = None
        self.started = False

    # --- life cycle -----------------------------------------------------------------------------

    @classmethod
    async def start(cls, dsn: str, config: Config | None = None, *, migrate: bool = True,
                    retention: bool = True) -> QueueManager:
        mgr = cls(dsn, config)
        await mgr._start(migrate=migrate, retention=retention)
        return mgr

    async def _start(self, *, migrate: bool, retention: bool) -> None:
        if migrate:
            await asyncio.to_thread(db.migrate, self.dsn)
        conn = await db.connect(self.dsn)
        try:
            self.node_id = await conn.fetchval(db.queries()["register_node"], socket.gethostname(), os.getpid())
        finally:
            await conn.close()
        dbc = self.config.database
        self.pool = await db.create_pool(self.dsn, min_size=min(dbc.min_pool_size, dbc.pool_size),
                                         max_size=dbc.pool_size, node_id=self.node_id,
                                         transient_max_bytes=self.qm.transient_max_bytes)
        self._listener = db.Listener(self.dsn, {"fluxpg_log": self._on_log_notify,
                                                "fluxpg_queues": self._on_queues_notify,
                                                "fluxpg_outbox": self._on_outbox_notify})
        await self._listener.start()
        await self._declare_configured()
        handoff = LocalHandoff(self)
        self.appender = Appender(self.pool, handoff=handoff)
        self.appender.start()
        self.sequencer = Sequencer(self.pool, handoff=handoff, dsn=self.dsn)
        self.sequencer.start()
        self.vacuumer = Vacuumer(self.pool)
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="fluxpg-housekeeping"))
        if retention:
            from fluxpg.queues.retention import RetentionLoop
            self._retention = RetentionLoop(self.dsn, self.qm.retention_interval.total_seconds())
            await self._retention.start()
        self.started = True
        log.info("queue manager started as node %s with %d queues", self.node_id, len(self.queues))

    async def close(self) -> None:
        for sub in list(self.subscriptions):
            await sub.close()
        if self.appender is not None:
            await self.appender.close()
        if self.sequencer is not None:
            await self.sequencer.close()
        await cancel_and_wait(self._tasks)
        if self._retention is not None:
            await self._retention.close()
        if self._listener is not None:
            await self._listener.close()
        if self.pool is not None:
            try:
                await self.pool.execute(db.queries()["deregister_node"], self.node_id)
            except Exception:  # noqa: BLE001 - the database may be gone; the heartbeat times out
                pass
            await self.pool.close()
        self.started = False

    async def _housekeeping(self) -> None:
        interval = self.qm.heartbeat_interval.total_seconds()
        timeout = self.qm.heartbeat_timeout
        while True:
            await asyncio.sleep(interval)
            try:
                # Dead nodes go, and with them (ON DELETE CASCADE) their transient queues.
                released = await self.pool.fetchval(db.queries()["node_heartbeat"], self.node_id, timeout)
                if released:
                    log.info("released %d pending entries of dead nodes", released)
                    self._wake_all()
            except Exception as exc:  # noqa: BLE001
                log.warning("node heartbeat failed: %s", exc)
            try:
                # Again every heartbeat: queues no consumer here reads any more stop being watched,
                # and rows lost with this node's row come back.
                await self._watch(force=True)
            except Exception as exc:  # noqa: BLE001 - until then other nodes NOTIFY as they did
                log.warning("updating the queues this node watches failed: %s", exc)
            try:
                # Queues with dlq.expired (AMQP x-dead-letter-exchange): expired messages nobody
                # claims reach their dead-letter queue within a heartbeat interval.
                await db.fetchval(self.pool, "dead_letter_expired")
            except Exception as exc:  # noqa: BLE001
                log.warning("dead-lettering expired messages failed: %s", exc)
            try:
                if self.vacuumer is not None:
                    await self.vacuumer.run_once()
            except Exception as exc:  # noqa: BLE001 - autovacuum (if on) still does it, later
                log.warning("vacuuming fluxpg's tables failed: %s", exc)

    # --- queue registry -------------------------------------------------------------------------

    async def _declare_configured(self) -> None:
        configured = self.config.effective_queues()
        for qc in configured:
            await self._declare(qc)
        # A reserved catch-all of an earlier run that the config no longer lists stops being
        # one, in the database, so fluxpg.route and this process route alike (one rule).
        retired = await db.fetch(self.pool, "retire_reserved", [q.name for q in configured])
        for (name,) in retired:
            log.warning("queue %r was a reserved catch-all of an earlier run; the config does not list "
                        "it, so it now takes only $queue/%s/… (kept, not dropped)", name, name)
        await self.reload_queues()
        names = {q.name for q in configured}
        unlisted = sorted(name for name, info in self.queues.items()
                          if name not in names and not name.startswith("$dlq/") and not info.transient)
        if unlisted:
            # Auto-created and AMQP-declared queues are expected here; say it once, quietly, in
            # one line however many there are (a database with thousands of queues made this a
            # line per queue before the broker listened).
            shown = ", ".join(repr(n) for n in unlisted[:UNLISTED_SHOWN])
            more = f" and {len(unlisted) - UNLISTED_SHOWN} more" if len(unlisted) > UNLISTED_SHOWN else ""
            log.info("%d queue(s) in the database are not in the config: %s%s; kept, not dropped "
                     "(`fluxpg queues` lists them; drop one by hand if it is no longer wanted)",
                     len(unlisted), shown, more)

    async def _declare(self, qc: QueueConfig, *, if_absent: bool = False) -> int:
        settings = qc.to_settings(self.qm)
        query = db.queries()["declare_queue_if_absent" if if_absent else "declare_queue"]
        try:
            return await self.pool.fetchval(query, qc.name, qc.type, qc.topics, settings)
        except Exception as exc:  # noqa: BLE001
            raise db.translate_error(exc) from exc

    async def declare_queue(self, qc: QueueConfig, *, if_absent: bool = False) -> QueueInfo:
        """Create or update a durable queue (AMQP queue.declare, the API). if_absent (auto-creation):
        create it only; a queue of that name that exists when the declaration runs (created
        meanwhile by anyone) is returned as it is, whatever `qc` says."""
        await self._declare(qc, if_absent=if_absent)
        await self.reload_queues()
        return self.queues[qc.name]

    async def reload_queues(self) -> None:
        rows = await self.pool.fetch(db.queries()["load_queues"])
        queues = {r["name"]: QueueInfo.from_row(r) for r in rows}
        bindings: TopicTree[str] = TopicTree()
        reserved: TopicTree[str] = TopicTree()
        for q in queues.values():
            # settings.reserved in the database, as fluxpg.route reads it: a reserved queue only
            # takes what no other queue does.
            tree = reserved if q.settings.get("reserved") else bindings
            for t in q.topics:
                tree.add(t, q.name)
        self.queues = queues
        self.queues_by_id = {q.id: q for q in queues.values()}
        self._routes = {}
        self._largest_limit = None
        self._bindings, self._reserved_bindings = bindings, reserved
        # A queue deleted elsewhere (another node's queue.delete, the CLI): its consumers here end
        # now (AMQP basic.cancel), even those idle without credit that would never read again.
        for sub in [s for s in self.subscriptions
                    if s.queue_id is not None and s.queue_id not in self.queues_by_id]:
            asyncio.ensure_future(self._end_subscription(sub, UnknownQueue(f"queue {sub.queue!r} was deleted")))

    async def _end_subscription(self, sub: Subscription, exc: FluxError) -> None:
        if not sub._closed:
            await sub._fail(exc)
        await sub.close()

    def _on_queues_notify(self, payload: str | None) -> Awaitable[None] | None:
        if self.pool is None:
            return None
        if payload and payload[:2] in ("t+", "t-"):
            # A transient queue came or went (an RPC client may declare one per call): update
            # the registry for that queue only instead of reloading every queue.
            return self._transient_changed(payload[1], int(payload[2:]))
        return self.reload_queues()

    async def _transient_changed(self, sign: str, queue_id: int) -> None:
        if sign == "-":
            self._forget(queue_id)
            return
        row = await self.pool.fetchrow(db.queries()["load_queue"], queue_id)
        if row is not None:
            self._remember(QueueInfo.from_row(row))

    def _remember(self, info: QueueInfo) -> None:
        old = self.queues.get(info.name)
        if old is not None and old.id != info.id:
            self._forget(old.id)
        self.queues[info.name] = info
        self.queues_by_id[info.id] = info
        for t in info.topics:
            self._bindings.add(t, info.name)
        self._routes = {}
        self._largest_limit = None

    def _forget(self, queue_id: int) -> None:
        info = self.queues_by_id.pop(queue_id, None)
        if info is None:
            return
        if self.queues.get(info.name) is info:
            del self.queues[info.name]
        for t in info.topics:
            self._bindings.remove(t, info.name)
        self._routes = {}
        self._largest_limit = None
        self._wake(queue_id)   # its consumers find out at once (their next claim: unknown queue)

    def queue_info(self, name: str) -> QueueInfo | None:
        return self.queues.get(name)

    def largest_message_limit(self, default: int) -> int:
        """The largest limits.max_message_size of any queue known here, at least `default`;
        0 when some queue has no limit. Cached until the queues change (reload, declare, delete)."""
        limit = self._largest_limit
        if limit is None:
            sizes = [q.max_message_size for q in self.queues.values()]
            limit = 0 if any(s == 0 for s in sizes) else max(sizes + [default])
            self._largest_limit = limit
        return limit

    async def _require_queue(self, name: str) -> QueueInfo:
        info = self.queues.get(name)
        if info is None:
            await self.reload_queues()
            info = self.queues.get(name)
        if info is None:
            raise UnknownQueue(f"unknown queue {name!r}")
        return info

    def listen(self, callbacks: dict[str, Callable[[str | None], Any]]) -> db.Channels:
        """Channels for another part of this node on the node's LISTEN connection (start() it
        after the queue manager started; close() it before the manager closes, or not at all)."""
        if self._listener is None:
            raise Unavailable("the queue manager has not started")
        return db.Channels(self._listener, callbacks)

    # --- wake-ups ---------------------------------------------------------------------------------

    def _waker(self, queue_id: int | None) -> asyncio.Event:
        ev = self._wakers.get(queue_id)
        if ev is None:
            ev = self._wakers[queue_id] = asyncio.Event()
        return ev

    def _wake(self, queue_id: int) -> None:
        self._wake_counts[queue_id] = self._wake_counts.get(queue_id, 0) + 1
        ev = self._wakers.pop(queue_id, None)
        if ev is not None:
            ev.set()

    def _wake_all(self) -> None:
        self._wake_epoch += 1
        wakers, self._wakers = self._wakers, {}
        for ev in wakers.values():
            ev.set()

    def _wake_state(self, queue_id: int | None) -> tuple[int, int]:
        return (self._wake_counts.get(queue_id, 0), self._wake_epoch)

    def _claim_slot(self, queue_id: int | None, group: str, selector: str | None) -> ClaimSlot:
        """Shared by this node's classic subscriptions of (queue, group, selector); it lives as
        long as one of them does."""
        key = (queue_id, group, selector)
        slot = self._claim_slots.get(key)
        if slot is None:
            slot = self._claim_slots[key] = ClaimSlot()
        return slot

    def _idle_add(self, sub: Subscription) -> None:
        self._idle.setdefault(sub.queue_id, {})[sub] = self._wake_state(sub.queue_id)

    def _idle_remove(self, sub: Subscription) -> None:
        subs = self._idle.get(sub.queue_id)
        if subs is not None:
            subs.pop(sub, None)
            if not subs:
                del self._idle[sub.queue_id]

    def _on_outbox_notify(self, _payload: str | None) -> None:
        # A publishing commit found a sequencer asleep (fluxpg._outbox_commit), or the listener
        # reconnected: this node's sequencer looks now.
        if self.sequencer is not None:
            self.sequencer.wake()

    def _on_log_notify(self, payload: str | None) -> None:
        if payload is None:     # listener reconnected: anything may have happened
            self._wake_all()
            return
        parts = payload.split(",")
        if parts[-1].startswith("@"):
            # A node's tag (LocalHandoff.notify_tag): the node that appended woke its own
            # consumers at commit.
            if parts.pop()[1:] == str(self.node_id):
                return
        for part in parts:
            if part:
                self._wake(int(part))

    # --- publish ------------------------------------------------------------------------------------

    def route(self, topic: str) -> list[QueueInfo]:
        cached = self._routes.get(topic)
        if cached is not None:
            return cached
        targets = self._route(topic)
        if targets:  # an empty answer may change with the next auto-created queue: not cached
            if len(self._routes) >= ROUTE_CACHE_SIZE:
                self._routes.clear()
            self._routes[topic] = targets
        return targets

    def _route(self, topic: str) -> list[QueueInfo]:
        names = self._bindings.match(topic)
        if not names:
            names = self._reserved_bindings.match(topic)
        return sorted((self.queues[n] for n in names if n in self.queues), key=lambda q: q.id)

    def durable_rows(self, topic: str, payload: bytes, headers: dict[str, Any] | None,
                     partition_key: str | None = None) -> list[AppendRow] | None:
        """Validate and route a publish without doing it: the log rows it becomes (one per
        matching queue, durable or transient), or None when no queue matches yet (see
        rows_for_publish). Raises FluxError for bad input. Shared by the publish path and
        transactions (queues/transactions.py)."""
        targets = self._routes.get(topic)   # a cached topic was validated when it was cached
        if targets is None:
            # Any topic routes by the queues' bindings, as fluxpg.route does (a queue bound to
            # sensors/# takes sensors/a); only $queue/<name>/… can auto-create a queue.
            validate_topic_name(topic)
            targets = self.route(topic)
        if not targets:
            return None
        # append_batch enforces the limit too; checking here refuses an oversized publish
        # without sending it, and keeps it from failing (and splitting) a whole group commit.
        size = len(payload)
        for q in targets:
            if q.max_message_size and size > q.max_message_size:
                raise PayloadTooLarge(f"message of {len(payload)} bytes exceeds limits.max_message_size "
                                      f"{q.max_message_size} of queue {q.name!r}")
        key = partition_key or (headers.get("x-partition-key") if headers else None)
        if key is not None:
            key = str(key)
        return [AppendRow(q.id, topic, payload, headers, key) for q in targets]

    def _names(self, results: list[tuple[int, int, int]]) -> list[tuple[str, int]]:
        return [(self.queues_by_id[qid].name if qid in self.queues_by_id else str(qid), seq)
                for qid, _part, seq in results]

    async def rows_for_publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None,
                               partition_key: str | None = None) -> list[AppendRow]:
        """durable_rows, creating the queue `<name>` of an unmatched `$queue/<name>/…` first as
        queue_manager.auto_create says (UnknownQueue when it is off)."""
        rows = self.durable_rows(topic, payload, headers, partition_key)
        if rows is None:
            await self.ensure_queue(self._unmatched_name(topic))
            rows = self.durable_rows(topic, payload, headers, partition_key)
            if rows is None:
                raise UnknownQueue(f"no queue is bound to topic {topic!r}")
        return rows

    def _unmatched_name(self, topic: str) -> str:
        if not is_queue_topic(topic) and not topic.startswith("$dlq/"):
            raise UnknownQueue(f"no queue is bound to topic {topic!r}")
        if topic.startswith("$dlq/"):
            raise UnknownQueue(f"no dead-letter queue {topic!r}: dead-letter queues are created by "
                               "dead-lettering, not by publishing")
        return parse_queue_topic(topic).queue

    async def ensure_queue(self, name: str) -> QueueInfo:
        """The queue `name`, created as `queue_manager.auto_create` says when it does not exist
        (durable: a classic queue with the default settings; transient: owned by this node;
        off: UnknownQueue). Concurrent calls for the same name share one creation."""
        info = self.queues.get(name)
        if info is not None:
            return info
        creating = self._creating.get(name)
        if creating is None:
            creating = self._creating[name] = asyncio.ensure_future(self._ensure_queue(name))
            creating.add_done_callback(lambda f: (self._creating.pop(name, None),
                                                  f.cancelled() or f.exception()))   # retrieved: no warning
        return await asyncio.shield(creating)

    async def _ensure_queue(self, name: str) -> QueueInfo:
        info = self.queues.get(name)
        if info is None:
            await self.reload_queues()   # another node (or the CLI) may have created it
            info = self.queues.get(name)
        if info is not None:
            return info
        mode = self.qm.auto_create
        if mode == "off":
            raise UnknownQueue(f"unknown queue {name!r} (queue_manager.auto_create is off: declare it in "
                               "the config or over AMQP)")
        if mode == "transient":
            return await self.declare_transient(name)
        log.info("auto-creating durable classic queue %r (queue_manager.auto_create: durable)", name)
        # Create-if-absent: the look-up above does not see a declaration made since (another node,
        # the CLI, SQL, AMQP), and an upsert would reset its settings to the defaults.
        return await self.declare_queue(QueueConfig(name=name), if_absent=True)

    async def publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None, *,
                      partition_key: str | None = None) -> list[tuple[str, int]]:
        """Append to every queue whose topics match, in one transaction; returns (queue, offset)
        per queue after commit. With no queue matching, `<name>` of `$queue/<name>/…` is created
        first as queue_manager.auto_create says (or UnknownQueue when it is off)."""
        fut = await self.submit_publish(topic, payload, headers, partition_key=partition_key)
        return self._names(await fut)

    async def submit_publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None, *,
                             partition_key: str | None = None) -> asyncio.Future:
        """publish() up to the group commit: the queue created if need be (as publish()), the rows
        queued for the appender when this returns; the future of their (queue_id, partition,
        seq) resolves after commit. For callers that keep an order across publishes
        (protocols/appends.py): they start the next one only when this one has returned."""
        rows = await self.rows_for_publish(topic, bytes(payload), headers, partition_key)
        return self.appender.submit(rows)

    def publish_submit(self, topic: str, payload: bytes, headers: dict[str, Any] | None = None
                       ) -> asyncio.Future | None:
        """publish() for a topic that routes to a queue now, without a coroutine: validated,
        routed and queued for the group commit at once (so in call order), returning the future
        of its rows ((queue_id, partition, seq) each, after commit). None when the queue has to be
        created first: then use publish(). Bad input raises FluxError here."""
        rows = self.durable_rows(topic, bytes(payload), headers)
        if rows is None:
            return None
        return self.appender.submit(rows)

    async def publish_many(self, messages: list[tuple[str, bytes, dict[str, Any] | None]]
                           ) -> list[list[tuple[str, int]]]:
        """Publish a batch in one transaction (all or nothing for the durable part); returns,
        per message, its (queue, offset) list. For producers that batch themselves: one
        future for the whole batch instead of one per message."""
        rows: list[AppendRow] = []
        spans: list[tuple[int, int]] = []
        for topic, payload, headers in messages:
            out = await self.rows_for_publish(topic, bytes(payload), headers, None)
            spans.append((len(rows), len(rows) + len(out)))
            rows.extend(out)
        results = self._names(await self.appender.append(rows)) if rows else []
        return [results[a:b] for a, b in spans]

    # --- consume ----------------------------------------------------------------------------------

    async def subscribe(self, queue: str, group: str, consumer: str, *, on_delivery: DeliveryCallback,
                        filter: str | None = None, position: object = None, auto_commit: bool | None = None,
                        credit: int | None = 100, on_error: ErrorCallback | None = None,
                        handed_by_caller: bool = False, selector: str | None = None) -> Subscription:
        """Join `group` of `queue` as `consumer`; deliveries go to on_delivery in offset order.

        position (streams): first | last | next | <offset> | offset=N | timestamp=N; None resumes
        from the group's checkpoint (a new group starts at the oldest retained message).
        selector (classic queues): a JMS message selector; this consumer gets only the messages
        it selects, the group's other consumers the rest (fluxpg.selectors).
        """
        if not consumer:
            raise InvalidArgument("consumer name must not be empty")
        validate_group_name(group)  # the rule of SQL's fluxpg.group_name_error, refused before any SQL
        if filter is not None:
            validate_topic_filter(filter)
        internal = internal_group_name(group, filter)
        info = self.queues.get(queue)
        if info is None:
            await self.reload_queues()
            info = self.queues.get(queue)
        if info is None and queue.startswith("$dlq/") and queue[5:] in self.queues:
            # A queue's dead-letter queue is created on first dead letter; a consumer may come
            # first, and waits on the real DLQ.
            await db.fetchval(self.pool, "ensure_dlq", queue[5:])
            await self.reload_queues()
            info = self.queues.get(queue)
        if info is None:
            info = await self.ensure_queue(queue)
        if info.kind == "classic" and position not in (None, ""):
            raise WrongQueueKind(f"queue {queue!r} is a classic queue; a stream offset needs a stream queue")
        jsonpath = None
        if selector is not None:
            if info.kind != "classic":
                raise WrongQueueKind(f"queue {queue!r} is a stream; message selectors apply to classic queues "
                                     "(a stream consumer can filter by topic)")
            jsonpath = selector_jsonpath(selector)
        pos = stream.normalize_position(position) if info.kind == "stream" else None
        effective_auto = await db.fetchval(self.pool, "ensure_group", queue, internal)
        if info.kind == "stream":
            if auto_commit is not None and auto_commit != effective_auto:
                await stream.configure(self.pool, queue, internal, auto_commit)
                effective_auto = auto_commit
            if info.partitions > 1:
                # OCI semantics: a start position applies to a new group only; members
                # share the partitions and resume from the group's checkpoint.
                await db.fetchval(self.pool, "join_group", queue, internal, pos)
            elif pos is not None:
                await stream.seek(self.pool, queue, internal, pos)
            elif not any(s.queue == queue and s.group == internal for s in self.subscriptions):
                await stream.seek(self.pool, queue, internal, "resume")
        self._watch_pins[info.id] = self._watch_pins.get(info.id, 0) + 1
        try:
            if info.id not in self._watched:
                # Before the first claim: appends of other nodes NOTIFY this queue from now on,
                # and those that did not have committed (fluxpg._node_watches).
                await self._watch()
            sub = Subscription(self, queue, info.kind, internal, consumer, filter, on_delivery, credit, on_error,
                               queue_id=info.id, auto_commit=effective_auto, partitions=info.partitions,
                               handed_by_caller=handed_by_caller, selector=jsonpath)
            self.subscriptions.add(sub)
        finally:
            left = self._watch_pins.pop(info.id) - 1
            if left:
                self._watch_pins[info.id] = left
        sub.start()
        return sub

    async def _watch(self, force: bool = False) -> None:
        """fluxpg.log_watchers lists exactly the queues this node has consumers of (or is about to)."""
        async with self._watch_lock:
            wanted = frozenset({s.queue_id for s in self.subscriptions if s.queue_id is not None}
                               | set(self._watch_pins))
            if wanted == self._watched and not force:
                return
            await db.fetchval(self.pool, "node_watches", self.node_id, sorted(wanted))
            self._watched = wanted

    def _detach(self, sub: Subscription) -> None:
        self.subscriptions.discard(sub)

    async def _auto_delete(self, sub: Subscription) -> None:
        info = self.queues.get(sub.queue)
        if (info is not None and info.id == sub.queue_id and info.auto_delete
                and not any(s.queue == sub.queue for s in self.subscriptions)):
            # AMQP auto-delete: the queue goes as soon as its last consumer does (so a mandatory
            # publish to it afterwards is returned, which aio-pika's RPC relies on).
            try:
                await self.delete_transient(sub.queue)
            except FluxError as exc:
                log.warning("auto-deleting transient queue %r failed: %s", sub.queue, exc)

    def consumer_count(self, queue: str) -> int:
        """Consumers of `queue` on this node."""
        return sum(1 for s in self.subscriptions if s.queue == queue)

    async def _add_work_properties(self, queue: str, deliveries: list[Delivery]) -> None:
        info = self.queues.get(queue)
        if info is None or not info.primary_group or not deliveries:
            return
        committed: dict[int, int | None] = {}
        for d in deliveries:
            if d.partition not in committed:
                committed[d.partition] = await self.pool.fetchval(
                    db.queries()["group_committed"], info.id, info.primary_group, d.partition)
            d.work_group = info.primary_group
            d.work_committed = committed[d.partition]

    # --- acknowledgements -------------------------------------------------------------------------

    async def _kind(self, queue: str) -> str:
        return (await self._require_queue(queue)).kind

    # `executor` (default: the pool) lets a transaction (queues/transactions.py) run the very
    # same settlement inside its own PostgreSQL transaction.

    async def ack(self, queue: str, group: str, seqs: list[int], partition: int = 0, *, executor=None) -> int:
        """Classic: done, remove from the pending list. Stream: checkpoint. Returns how many
        entries it affected (0: nothing was pending — a documented no-op)."""
        kind = await self._kind(queue)
        if kind == "stream":
            return await stream.checkpoint(executor or self.pool, queue, group, seqs, partition)
        return await classic.ack(executor or self.pool, queue, group, seqs, partition)

    async def nack(self, queue: str, group: str, seqs: list[int], partition: int = 0, *, executor=None) -> int:
        """Classic: redeliver now (after the retry backoff when the queue sets
        retry.nack_backoff). Stream: no-op."""
        await self._kind(queue)
        n = await classic.nack(executor or self.pool, queue, group, seqs, partition)   # a no-op for streams (in SQL)
        self._wake_queue(queue)
        return n

    async def release(self, queue: str, group: str, seqs: list[int], partition: int = 0, *, executor=None) -> int:
        """Classic: requeue now, no backoff, original order, delivery count kept (the consumer
        went away: channel closed, connection lost, cancelled, recover). Stream: no-op."""
        await self._kind(queue)
        n = await classic.release(executor or self.pool, queue, group, seqs, partition)
        self._wake_queue(queue)
        return n

    def _wake_queue(self, queue: str) -> None:
        info = self.queues.get(queue)
        if info is not None:
            self._wake(info.id)   # local consumers at once; other nodes by the NOTIFY

    async def reject(self, queue: str, group: str, seqs: list[int], reason: str | None = None,
                     partition: int = 0, *, executor=None) -> int:
        """Classic: dead-letter. Stream: move the cursor past the message."""
        await self._kind(queue)
        return await classic.reject(executor or self.pool, queue, group, seqs, reason, partition)

    # --- purge and delete (AMQP 0-9-1 queue.purge / queue.delete) ----------------------------

    def configured(self, name: str) -> bool:
        """Is `name` defined in the config file (a client never deletes those)?"""
        return any(q.name == name for q in self.config.effective_queues())

    async def _retry_deadlock(self, query: str, *args: Any, attempts: int = 5) -> Any:
        """Purge and delete lock a queue's head, cursors and pending rows together while its
        consumers claim and ack. Claims and deletes now lock in one order (sql/functions.sql,
        above _ensure_member; tests/integration/test_delete_lock_order.py), but transient
        queues' acks and dead-lettering also lock log rows and heads, whose order against purge
        is not proven; PostgreSQL breaks such a deadlock by aborting one side (40P01). The
        aborted purge/delete changed nothing: run it again (pika's suite deleted a queue under a
        busy consumer and got 541 before the lock order was fixed)."""
        for attempt in range(attempts):
            try:
                return await db.fetchval(self.pool, query, *args)
            except Unavailable as exc:
                if exc.sqlstate != "40P01" or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))

    async def purge_queue(self, name: str) -> int:
        """Skip every message of a classic queue not yet delivered (fluxpg.purge_queue); pending
        ones stay. Returns how many were purged. A stream is refused (WrongQueueKind)."""
        await self._require_queue(name)
        return int(await self._retry_deadlock("purge_queue", name))

    async def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        """Drop a queue with its segments, groups and pending entries (fluxpg.delete_queue) and
        end its consumers here (on_error with UnknownQueue: AMQP basic.cancel); other nodes'
        consumers end when their next read finds it gone (the function NOTIFYs them). Queues of
        the config file are refused (PreconditionFailed), as are if_unused with consumers and
        if_empty with messages. Returns how many messages were waiting."""
        if self.configured(name):
            raise PreconditionFailed(f"queue {name!r} is defined in the config file; remove it there "
                                     "(clients cannot delete it)")
        if if_unused and any(s.queue == name for s in self.subscriptions):
            raise PreconditionFailed(f"queue {name!r} in use")
        await self._require_queue(name)
        # Consumers of this node were judged above; the SQL judges other nodes' by their last read.
        window = timedelta(seconds=max(CLASSIC_POLL * 10, self.qm.heartbeat_interval.total_seconds()))
        n = int(await self._retry_deadlock("delete_queue", name, if_unused, if_empty, window))
        # Its log table, if delete_queue found it busy: now, in a transaction holding no row locks.
        try:
            await self.pool.fetchval(db.queries("queue_lifecycle_queries.sql")["drop_deleted_logs"])
        except Exception as exc:  # noqa: BLE001 - the retention loop drops it later
            log.info("log table of deleted queue %r left for the retention loop: %s", name, exc)
        await self.reload_queues()
        gone = UnknownQueue(f"queue {name!r} was deleted")
        for sub in [s for s in self.subscriptions if s.queue == name]:
            await self._end_subscription(sub, gone)
        return n

    def transaction(self, *, max_bytes: int | None = None):
        """A local transaction: publishes and settlements collected, applied together in one
        PostgreSQL transaction by `commit()` (see queues/transactions.py)."""
        from fluxpg.queues.transactions import Transaction

        return Transaction(self, max_bytes=max_bytes)

    # --- transient queues -------------------------------------------------------------------------

    async def declare_transient(self, name: str, *, owner: str | None = None, auto_delete: bool = False,
                                config: QueueConfig | None = None) -> QueueInfo:
        """Create (or find) a transient queue: classic semantics, messages in the unlogged
        fluxpg.log_transient, gone when this node stops (or dies) or on delete_transient.

        owner: an exclusive queue's connection (any string unique per connection, e.g.
        f"{manager.node_id}:{conn_id}"); another owner gets ResourceLocked. auto_delete: deleted
        when its last consumer on this node leaves. config: limits / retry / dlq settings
        (QueueConfig(name=name, ...)), defaults otherwise. Raises WrongQueueKind when a durable
        queue has the name. No DDL runs: about as cheap as a publish.
        """
        qc = config or QueueConfig(name=name)
        queue_id = await transient.declare(self.pool, name, self.node_id, owner=owner, auto_delete=auto_delete,
                                           settings=qc.to_settings(self.qm))
        info = self.queues_by_id.get(queue_id)
        if info is None:
            row = await self.pool.fetchrow(db.queries()["load_queue"], queue_id)
            if row is None:
                raise UnknownQueue(f"transient queue {name!r} was deleted while being declared")
            info = QueueInfo.from_row(row)
            self._remember(info)
        return info

    async def delete_transient(self, name: str) -> int | None:
        """Delete a transient queue and its messages; returns how many were waiting (None: it did
        not exist). Its consumers end (their subscription fails with UnknownQueue)."""
        info = self.queues.get(name)
        count = await transient.delete(self.pool, name)
        if info is not None:
            self._forget(info.id)
        return count

    async def get(self, queue: str, group: str, consumer: str) -> list[Delivery]:
        """One message for a synchronous get (AMQP basic.get): claimed (classic, it is then
        pending for `consumer`) or read (stream); [] when none is waiting."""
        info = await self._require_queue(queue)
        if info.kind == "classic":
            return await classic.claim(self.pool, queue, group, consumer, 1)
        return await stream.read(self.pool, queue, group, consumer, 1)

    async def ready_count(self, queue: str) -> int:
        """Messages the queue's default group (named like the queue, as AMQP consumers join it)
        can still get: not yet delivered, or given back and due again (fluxpg.ready_count)."""
        return int(await db.fetchval(self.pool, "ready_count", queue) or 0)

    async def queue_depth(self, name: str) -> tuple[int, int]:
        """(messages waiting, consumers across nodes) of one queue, as fluxpg.queue_stats says."""
        row = await self.pool.fetchrow(db.queries()["queue_depth"], name)
        if row is None:
            raise UnknownQueue(f"unknown queue {name!r}")
        return max(int(row["depth"] or 0), 0), int(row["consumers"] or 0)

    async def commit(self, queue: str, group: str, seq: int, partition: int = 0) -> None:
        """Stream: checkpoint at `seq` (the first offset not yet processed)."""
        await self._require_queue(queue)
        await stream.commit(self.pool, queue, group, seq, partition)

    async def seek(self, queue: str, group: str, position: object) -> int:
        await self._require_queue(queue)
        pos = stream.normalize_position(position) or "resume"
        return await stream.seek(self.pool, queue, group, pos)

    @property
    def mqtt(self):
        """The MQTT front-end's tables (relay, retained, shared groups, sessions) by named query."""
        store = self.__dict__.get("_mqtt_store")
        if store is None:
            from fluxpg.queues.mqtt_store import MqttStore
            store = self.__dict__["_mqtt_store"] = MqttStore(self)
        return store

    async def resolve_group(self, queue: str, group: str) -> str:
        """A group as a client named it (`workers`, or `workers@#`) → its internal name, by SQL's
        fluxpg.resolve_group (InvalidArgument naming the groups when none or several match)."""
        return await db.fetchval(self.pool, "resolve_group", queue, group)

    async def claim_stale(self, queue: str, group: str, consumer: str, min_idle: timedelta,
                          n: int = 10) -> list[Delivery]:
        await self._require_queue(queue)
        return await classic.claim_stale(self.pool, queue, group, consumer, min_idle, n)

    # --- inspection ---------------------------------------------------------------------------------

    async def queue_stats(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(db.queries()["queue_stats"])]

    async def group_status(self, queue: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(db.queries()["group_status"], queue)]

    async def pending_entries(self, queue: str, group: str, limit: int = 1000) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.pool.fetch(db.queries()["pending_entries"], queue, group, limit)]

    # --- broker users (fluxpg.auth_config) -----------------------------------------------------

    async def user(self, username: str) -> tuple[str, Any] | None:
        """(password_hash, permissions) of a user of the fluxpg.users table, None when there is
        no such user; FluxError when the database cannot tell (unreachable, not migrated)."""
        rows = await db.fetch(self.pool, "auth_user", username, file="auth_queries.sql")
        return (rows[0]["password_hash"], rows[0]["permissions"]) if rows else None


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)
