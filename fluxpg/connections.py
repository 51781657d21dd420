"""The live client connections of this broker process, for the console (list, close one).

The listener registers every connection once its protocol is known and removes it when it ends;
while a protocol handler runs, `current()` is that connection's entry (a context variable of the
connection's task), so a handler records who logged in without passing anything around:

    info = connections.current()
    if info is not None:
        info.client_id, info.user = client_id, username

Closing a connection cancels its task; the listener then closes the socket (the protocol's own
clean-up runs as on any cancellation). Only this process's connections are here; every node
reports its own to the table fluxpg.connections (fluxpg/queues/connection_sync.py), where the
console of any node lists them, and closes one of another node by a NOTIFY to that node.
"""
from __future__ import annotations

import asyncio
import itertools
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone

_current: ContextVar[ConnectionInfo | None] = ContextVar("fluxpg_connection", default=None)
_ids = itertools.count(1)
_changes = itertools.count(1)
changes = 0       # bumped on every add, remove or field change: tells the reporter to report again


def _changed() -> None:
    global changes
    changes = next(_changes)


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
    transport: asyncio.BaseTransport | None = field(default=None, repr=False)
    # Set by the protocol once the client's handshake and login are done (bounds.handshake_timeout:
    # the listener closes a connection that has not got this far in time).
    logged_in: bool = False

    def __setattr__(self, name: str, value) -> None:
        object.__setattr__(self, name, value)
        _changed()

    def as_row(self) -> dict:
        return {"id": self.id, "protocol": self.protocol, "listener": self.listener, "peer": self.peer,
                "client_id": self.client_id, "username": self.user, "since": self.since.isoformat()}

    def close(self) -> bool:
        """Close the connection: cancel its task and drop its socket (a cancellation alone can be
        swallowed by a handler blocked in a write; an aborted transport cannot be). False when it
        had ended already."""
        if self.task is None or self.task.done():
            return False
        self.task.cancel()
        if self.transport is not None:
            self.transport.abort()
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
        _changed()

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
