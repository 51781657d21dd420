"""A protocol front-end's publishes into the queue manager's group commit, in arrival order
(AMQP 0-9-1 channels and MQTT connections: the order a client published in is the order of the
offsets, and its confirms / PUBACKs follow that order)."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class OrderedPublisher:
    """One connection's or channel's publishes into the group commit, in arrival order. A topic
    whose queue exists is queued for the group commit at once (QueueManager.publish_submit: a
    future, no task and coroutine per message, ~15 µs each). One whose queue must be created
    first goes through a task (QueueManager.submit_publish), and while such a task is pending
    every later publish does too, each handing its rows to the appender only after the one
    before it did (or failed): the tasks wait for the queue (a database round trip or two)
    and would otherwise reach the appender in whatever order those came back, not in arrival
    order. `spawn` starts those tasks (a channel keeps track of its own)."""

    def __init__(self, manager: Any,
                 spawn: Callable[[Awaitable[Any]], asyncio.Future] = asyncio.ensure_future):
        self.manager = manager
        self._spawn = spawn
        self._slow = 0           # publishes going through a task, not finished yet
        # Done when the latest slow publish has handed its rows to the appender (or failed):
        # the next one waits for it.
        self._handed: asyncio.Future | None = None

    def append(self, topic: str, payload: bytes, headers: dict[str, Any] | None) -> asyncio.Future:
        """Start the append of one publish; the future (a task on the slow path) says how it ended."""
        if not self._slow:
            try:
                fut = self.manager.publish_submit(topic, payload, headers)
            except Exception as exc:  # noqa: BLE001 - reported through the future, as a task would
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(exc)
            if fut is not None:
                return fut
        before, handed = self._handed, asyncio.get_running_loop().create_future()
        self._handed = handed
        task = self._spawn(self._publish_after(before, handed, topic, payload, headers))
        self._slow += 1
        # Also when the task ends without running (cancelled first): the next must not wait forever.
        task.add_done_callback(lambda _t: handed.done() or handed.set_result(None))
        task.add_done_callback(self._done)
        return task

    async def _publish_after(self, before: asyncio.Future | None, handed: asyncio.Future, topic: str,
                             payload: bytes, headers: dict[str, Any] | None) -> Any:
        try:
            if before is not None and not before.done():
                await asyncio.wait((before,))   # not `await before`: cancelling us must not cancel it
            fut = await self.manager.submit_publish(topic, payload, headers)
        finally:
            if not handed.done():
                handed.set_result(None)
        return await fut

    def _done(self, _task: asyncio.Future) -> None:
        self._slow -= 1
        if not self._slow:
            self._handed = None
