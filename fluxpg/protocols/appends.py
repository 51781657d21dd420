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
    first goes through a task (QueueManager.publish), and while such a task is pending every
    later publish does too: tasks start in creation order, so appends still reach the appender
    in arrival order. `spawn` starts those tasks (a channel keeps track of its own)."""

    def __init__(self, manager: Any,
                 spawn: Callable[[Awaitable[Any]], asyncio.Future] = asyncio.ensure_future):
        self.manager = manager
        self._spawn = spawn
        self._slow = 0           # publishes going through a task, not finished yet

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
        task = self._spawn(self.manager.publish(topic, payload, headers))
        self._slow += 1
        task.add_done_callback(self._done)
        return task

    def _done(self, _task: asyncio.Future) -> None:
        self._slow -= 1
