"""Embedding fluxpg in an application: publish, consume as an async iterator, inspect.

    import fluxpg

    async with fluxpg.connect("postgresql://localhost/app") as broker:
        await broker.declare("orders")                       # a classic (work) queue
        await broker.publish("$queue/orders/eu", b'{"id": 1}')
        async with broker.consume("orders", group="workers") as messages:
            async for msg in messages:
                try:
                    handle(msg.payload)
                    await msg.ack()                          # done: leaves the pending list
                except TemporaryError:
                    await msg.nack()                         # again, after the retry backoff
                except Exception:
                    await msg.reject("bad input")            # to the dead-letter queue

Stream queues: `broker.declare("events", type="stream")`, then
`broker.consume("events", group="audit", position="first")`; `msg.ack()` checkpoints the group.

This is the same engine the protocol front-ends use (fluxpg.queues.manager.QueueManager); the
broker process and embedded users can share one database.
"""
from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from fluxpg.config import Config, QueueConfig
from fluxpg.queues.manager import QueueManager, Subscription
from fluxpg.delivery import Delivery
from fluxpg.errors import FluxError


class Message:
    """A delivered message with its acknowledgement methods."""

    __slots__ = ("delivery", "_consumer", "_settled", "_released")

    def __init__(self, delivery: Delivery, consumer: Consumer):
        self.delivery = delivery
        self._consumer = consumer
        self._settled = False
        self._released = False

    @property
    def payload(self) -> bytes:
        return self.delivery.payload

    @property
    def topic(self) -> str:
        return self.delivery.topic

    @property
    def headers(self) -> dict[str, Any]:
        return self.delivery.headers

    @property
    def offset(self) -> int:
        return self.delivery.seq

    @property
    def message_id(self) -> str:
        return self.delivery.message_id

    @property
    def delivery_count(self) -> int:
        return self.delivery.delivery_count

    @property
    def properties(self) -> dict[str, str]:
        return self.delivery.properties()

    async def _settle(self, op: str, *args: Any) -> int:
        if self._settled:
            return 0
        c = self._consumer
        d = self.delivery
        try:
            result = await getattr(c.broker.manager, op)(d.queue, d.group, [d.seq], *args, partition=d.partition)
            self._settled = True
            return result
        finally:
            # Even when the settlement failed (the message then comes back after the visibility
            # timeout) it has left this consumer's window: free the slot, once.
            if not self._released:
                self._released = True
                c._subscription.grant(1)

    async def ack(self) -> int:
        """Classic: processed, remove it. Stream: checkpoint past it."""
        return await self._settle("ack")

    async def nack(self) -> int:
        """Classic: deliver again after the retry backoff. Stream: no-op."""
        return await self._settle("nack")

    async def reject(self, reason: str | None = None) -> int:
        """Classic: to the dead-letter queue. Stream: skip it."""
        return await self._settle("reject", reason)

    def __repr__(self) -> str:
        return f"<Message {self.message_id} topic={self.topic!r} {len(self.payload)} bytes>"


class Consumer:
    """An async iterator over a group's messages; at most `prefetch` unsettled at a time."""

    def __init__(self, broker: Broker, queue: str, group: str, consumer: str, *, filter: str | None,
                 position: object, prefetch: int, auto_commit: bool | None):
        self.broker = broker
        self.queue = queue
        self.group = group
        self.consumer = consumer
        self._args = dict(filter=filter, position=position, auto_commit=auto_commit)
        self._prefetch = prefetch
        self._inbox: asyncio.Queue[Delivery | FluxError] = asyncio.Queue()
        self._subscription: Subscription | None = None

    async def start(self) -> Consumer:
        if self._subscription is None:
            self._subscription = await self.broker.manager.subscribe(
                self.queue, self.group, self.consumer, on_delivery=self._inbox.put_nowait,
                on_error=self._inbox.put_nowait, credit=self._prefetch, handed_by_caller=True, **self._args)
        return self

    @property
    def internal_group(self) -> str:
        return self._subscription.group if self._subscription else self.group

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        if self._subscription is None:
            await self.start()
        item = await self._inbox.get()
        if isinstance(item, FluxError):
            raise item
        # Only now does the application have it: stream auto-commit stops here, not at the
        # prefetched messages still in the inbox (they are read again by the next consumer).
        self._subscription.handed(item)
        if self._subscription.kind == "stream":
            # Nothing to settle for flow control: streams checkpoint.
            self._subscription.grant(1)
        return Message(item, self)

    async def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout` seconds."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except asyncio.TimeoutError:
            return None

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Broker:
    def __init__(self, manager: QueueManager):
        self.manager = manager
        self._counter = 0

    async def declare(self, name: str, type: str = "classic", **settings: Any) -> None:
        """Create or update a durable queue; settings are the YAML queue keys
        (topics, limits, retry, dlq, retention, primary_group, partitions, segment_size)."""
        await self.manager.declare_queue(QueueConfig(name=name, type=type, **settings))

    async def publish(self, topic: str, payload: bytes | str, headers: dict[str, Any] | None = None, *,
                      partition_key: str | None = None) -> list[tuple[str, int]]:
        """Append to every queue bound to `topic`; returns (queue, offset) per queue once committed."""
        if isinstance(payload, str):
            payload = payload.encode()
        return await self.manager.publish(topic, payload, headers, partition_key=partition_key)

    async def publish_many(self, messages: list[tuple[str, bytes | str, dict[str, Any] | None]]
                           ) -> list[list[tuple[str, int]]]:
        """Publish (topic, payload, headers) tuples in one transaction; returns each one's
        (queue, offset) list once committed."""
        return await self.manager.publish_many(
            [(t, p.encode() if isinstance(p, str) else p, h) for t, p, h in messages])

    def consume(self, queue: str, group: str, *, consumer: str | None = None, filter: str | None = None,
                position: object = None, prefetch: int = 100, auto_commit: bool | None = None) -> Consumer:
        """Consume `queue` as a member of `group`. `consumer` names this member (default: unique
        per process); a consumer that comes back under the same name gets its pending entries first."""
        if consumer is None:
            self._counter += 1
            consumer = f"{socket.gethostname()}-{os.getpid()}-{self._counter}"
        return Consumer(self, queue, group, consumer, filter=filter, position=position, prefetch=prefetch,
                        auto_commit=auto_commit)

    async def queues(self) -> list[dict[str, Any]]:
        return await self.manager.queue_stats()

    async def groups(self, queue: str) -> list[dict[str, Any]]:
        return await self.manager.group_status(queue)

    async def pending(self, queue: str, group: str, limit: int = 1000) -> list[dict[str, Any]]:
        return await self.manager.pending_entries(queue, group, limit)

    async def close(self) -> None:
        await self.manager.close()

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Connecting:
    """`await fluxpg.connect(...)` and `async with fluxpg.connect(...)` both work."""

    def __init__(self, dsn: str, config: Config | None, migrate: bool, retention: bool):
        self._args = (dsn, config, migrate, retention)
        self._broker: Broker | None = None

    def __await__(self):
        return self._open().__await__()

    async def _open(self) -> Broker:
        dsn, config, migrate, retention = self._args
        manager = await QueueManager.start(dsn, config, migrate=migrate, retention=retention)
        self._broker = Broker(manager)
        return self._broker

    async def __aenter__(self) -> Broker:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        if self._broker is not None:
            await self._broker.close()


def connect(dsn: str, config: Config | None = None, *, migrate: bool = True, retention: bool = False) -> _Connecting:
    """Open fluxpg on a PostgreSQL database (migrating it unless migrate=False). Pass
    retention=True in one long-running process to run the retention loop there."""
    return _Connecting(dsn, config, migrate, retention)
