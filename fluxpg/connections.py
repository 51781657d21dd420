"""The live client connections of this broker process, for the console (list, close one).

The listener registers every connection once its protocol is known and removes it when it ends;
while a protocol handler runs, `current()` is that connection's entry (a context variable of the
connection's task), so a handler records who logged in without passing anything around:

    info = connections.current()
    if info is not None:
        info.client_id, info.user = client_id, username

Closing a connection cancels its task; the listener then closes the socket (the protocol's own
clean-up runs as on any cancellation). Only this process's connections are here: the console
lists those of the node it is served by.
"""
from __future__ import annotations

import asyncio
import itertools
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone

_current: ContextVar[ConnectionInfo | None] = ContextVar("fluxpg_connection", default=None)
_ids = itertools.count(1)


@dataclass(eq=False)
class ConnectionInfo:
    protocol: str                    # mqtt | amqp091 | amqp10 | http
    peer: str
    listener: str
    id: int = field(default_factory=lambda: next(_ids))
    since: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    client_id: str | None = None     # MQTT client id, AMQP container id, …
    user: str | None = None
    task: asyncio.Task | None = field(default=None, repr=False)
    # Set by the protocol once the client's handshake and login are done (bounds.handshake_timeout:
    # the listener closes a connection that has not got this far in time).
    logged_in: bool = False

    def close(self) -> bool:
        """Close the connection (cancel its task). False when it had ended already."""
        if self.task is None or self.task.done():
            return False
        self.task.cancel()
        return True


class Registry:
    """Connections of one broker process by id (bounded by the connections themselves)."""

    def __init__(self) -> None:
        self._by_id: dict[int, ConnectionInfo] = {}

    def add(self, info: ConnectionInfo) -> ConnectionInfo:
        self._by_id[info.id] = info
        _current.set(info)
        return info

    def remove(self, info: ConnectionInfo) -> None:
        self._by_id.pop(info.id, None)

    def get(self, conn_id: int) -> ConnectionInfo | None:
        return self._by_id.get(conn_id)

    def all(self) -> list[ConnectionInfo]:
        return sorted(self._by_id.values(), key=lambda c: c.id)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for info in self._by_id.values():
            out[info.protocol] = out.get(info.protocol, 0) + 1
        return out


def logged_in() -> None:
    """The calling protocol handler's client finished its handshake and login."""
    info = _current.get()
    if info is not None:
        info.logged_in = True


def current() -> ConnectionInfo | None:
    """The connection the calling protocol handler serves (None outside a connection)."""
    return _current.get()
