"""Ephemeral queues: in-memory, best effort (FluxMQ "Queue Types").

Created when a `$queue/` publish or subscription names no configured queue. Messages are pushed to
the connected consumers whose filter matches the routing key: one consumer per group name, round
robin within a group. While no consumer can take a message it waits in a bounded buffer (so a
publish to nowhere is not silently dropped); the oldest are dropped when the buffer is full. A
queue is removed a grace period after its last consumer left. Nothing survives a restart, and
there are no acknowledgements: ack/nack/reject are no-ops.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from fluxpg.topics import routing_key_matches, parse_queue_topic
from fluxpg.delivery import Delivery

log = logging.getLogger("fluxpg.ephemeral")

BUFFER_LIMIT = 10_000


class EphemeralConsumer(Protocol):
    group: str
    filter: str | None

    def offer(self, delivery: Delivery) -> bool:
        """Take the delivery now if there is credit; False leaves it with the queue."""


class EphemeralQueue:
    def __init__(self, name: str):
        self.name = name
        self.consumers: list[EphemeralConsumer] = []
        self.buffer: deque[Delivery] = deque(maxlen=BUFFER_LIMIT)
        self._seq = itertools.count()
        self._rr: dict[str, int] = {}
        self.idle_since: float | None = time.monotonic()
        self.dropped = 0

    def publish(self, topic: str, payload: bytes, headers: dict[str, Any] | None) -> int:
        seq = next(self._seq)
        delivery = Delivery(queue=self.name, group="", partition=0, seq=seq, topic=topic, payload=payload,
                            headers=headers or {}, created_at=datetime.now(timezone.utc),
                            delivery_count=1, kind="ephemeral")
        if not self._push(delivery):
            if len(self.buffer) == self.buffer.maxlen:
                self.dropped += 1
            self.buffer.append(delivery)
        return seq

    def _push(self, delivery: Delivery) -> bool:
        key = parse_queue_topic(delivery.topic).routing_key if delivery.topic.startswith("$queue/") else ""
        groups: dict[str, list[EphemeralConsumer]] = {}
        for consumer in self.consumers:
            if routing_key_matches(consumer.filter, key):
                groups.setdefault(consumer.group, []).append(consumer)
        delivered = False
        for group, members in groups.items():
            start = self._rr.get(group, 0)
            for i in range(len(members)):
                member = members[(start + i) % len(members)]
                copy = Delivery(**{**_fields(delivery), "group": group})
                if member.offer(copy):
                    self._rr[group] = (start + i + 1) % len(members)
                    delivered = True
                    break
        return delivered

    def drain(self) -> None:
        """Hand buffered messages to consumers that have credit again."""
        kept: deque[Delivery] = deque(maxlen=BUFFER_LIMIT)
        while self.buffer:
            delivery = self.buffer.popleft()
            if not self._push(delivery):
                kept.append(delivery)
        self.buffer = kept

    def attach(self, consumer: EphemeralConsumer) -> None:
        self.consumers.append(consumer)
        self.idle_since = None
        self.drain()

    def detach(self, consumer: EphemeralConsumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if not self.consumers:
            self.idle_since = time.monotonic()


def _fields(d: Delivery) -> dict[str, Any]:
    return {f: getattr(d, f) for f in Delivery.__slots__}


class EphemeralQueues:
    def __init__(self, grace_seconds: float):
        self.grace = grace_seconds
        self.queues: dict[str, EphemeralQueue] = {}

    def get(self, name: str, create: bool = True) -> EphemeralQueue | None:
        queue = self.queues.get(name)
        if queue is None and create:
            queue = self.queues[name] = EphemeralQueue(name)
            log.info("ephemeral queue %r created (in memory, best effort)", name)
        return queue

    def reap(self, now: Callable[[], float] = time.monotonic) -> list[str]:
        """Remove queues without consumers for longer than the grace period."""
        t = now()
        gone = [name for name, q in self.queues.items()
                if q.idle_since is not None and t - q.idle_since >= self.grace]
        for name in gone:
            queue = self.queues.pop(name)
            log.info("ephemeral queue %r removed after %.0fs without consumers (%d buffered messages dropped)",
                     name, self.grace, len(queue.buffer))
        return gone
