"""python-qpid-proton's protocol engine, sans-I/O: bytes in → events, bytes out.

No reactor and no threads: a `Transport(Transport.SERVER)` bound to a `Connection`, with a
`Collector` gathering the events. The asyncio adapter (connection.py) pushes what it reads with
`receive`, handles `events()`, writes `output()` and calls `tick()` when `next_tick` says so
(idle-timeout heartbeats both ways).

Events are taken out of the collector in one go (`events()`), before any handler runs: handlers
call proton (open a link, send a delivery) which queues new events, and draining the collector
from inside a handler would re-enter it (FACTS.md). The caller loops until `events()` is empty.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

from proton import Collector, Connection, Data, Described, Event, Transport, symbol, ulong

CLOSE = 0x18      # amqp:close:list
ERROR = 0x1D      # amqp:error:list


@dataclass(slots=True)
class EngineEvent:
    """A proton event with its objects taken out (the proton Event is only valid until popped)."""

    type: Any
    connection: Any = None
    session: Any = None
    link: Any = None
    delivery: Any = None

    @property
    def name(self) -> str:
        return str(self.type)


class ProtonEngine:
    """One AMQP 1.0 connection's protocol state (no SASL: that is sasl.py's job)."""

    def __init__(self, *, container_id: str, idle_timeout: float | None = 60.0,
                 max_frame_size: int = 1024 * 1024, channel_max: int = 255):
        self.connection = Connection()
        self.connection.container = container_id
        self.collector = Collector()
        self.connection.collect(self.collector)
        self.transport = Transport(Transport.SERVER)
        self.transport.max_frame_size = max_frame_size
        self.transport.channel_max = channel_max
        if idle_timeout:
            # Our idle timeout: the client must send something at least this often (proton
            # advertises half of it so that the client's heartbeats arrive in time).
            self.transport.idle_timeout = idle_timeout
        self.transport.bind(self.connection)
        self._next_tick: float | None = None
        self._input_closed = False

    # --- bytes in / out ---------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Push bytes read from the socket; what proton cannot take now is an error (it buffers
        up to its capacity, and our reads are smaller than that)."""
        view = memoryview(data)
        while view:
            capacity = self.transport.capacity()
            if capacity < 0:
                # Input side closed (after a close frame or an error): drop the rest.
                return
            if capacity == 0:
                raise BufferError("proton transport input is full")
            n = min(capacity, len(view))
            self.transport.push(bytes(view[:n]))
            view = view[n:]

    def receive_eof(self) -> None:
        if not self._input_closed:
            self._input_closed = True
            self.transport.close_tail()

    @property
    def input_failed(self) -> bool:
        """Proton stopped reading although the peer neither closed nor hung up: the input was not
        valid AMQP (proton then closes its input side silently, without a close frame)."""
        return (not self._input_closed and self.transport.capacity() < 0
                and not self.connection.state & Connection.REMOTE_CLOSED)

    def close_after_input_error(self, condition: str, description: str) -> bytes:
        """The bytes that end a connection whose input was invalid: our open (if not sent yet)
        and a close frame with the error, which proton no longer writes once its input is closed."""
        conn = self.connection
        if conn.state & Connection.LOCAL_UNINIT:
            conn.open()
        out = self.output()
        return out + close_frame(condition, description)

    def output(self) -> bytes:
        """Everything proton wants to send now (may be empty)."""
        chunks = []
        while True:
            pending = self.transport.pending()
            if pending <= 0:
                break
            chunk = self.transport.peek(pending)
            self.transport.pop(len(chunk))
            chunks.append(chunk)
        return b"".join(chunks)

    @property
    def output_closed(self) -> bool:
        return self.transport.pending() < 0

    @property
    def closed(self) -> bool:
        """Both directions finished: nothing more to read or write."""
        return self.transport.closed

    # --- time ---------------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> float | None:
        """Let proton send heartbeats and detect a silent peer; returns the monotonic time at which
        to call again (None: no timer needed)."""
        now = time.monotonic() if now is None else now
        deadline = self.transport.tick(now)
        self._next_tick = deadline if deadline else None
        return self._next_tick

    @property
    def next_tick(self) -> float | None:
        return self._next_tick

    # --- events ---------------------------------------------------------------------------------

    def events(self) -> list[EngineEvent]:
        """Drain the collector (call only from the top of the loop, never from a handler)."""
        out = []
        while True:
            event = self.collector.peek()
            if event is None:
                break
            out.append(_extract(event))
            self.collector.pop()
        return out

    def close_with_error(self, condition) -> None:
        """Close the connection with an error condition (opening it first if the peer's open has not
        been answered yet: a close must follow an open)."""
        conn = self.connection
        conn.condition = condition
        if conn.state & Connection.LOCAL_UNINIT:
            conn.open()
        if not conn.state & Connection.LOCAL_CLOSED:
            conn.close()


def _extract(event: Event) -> EngineEvent:
    ctx = event.context
    conn = session = link = delivery = None
    try:
        delivery = event.delivery
    except Exception:  # noqa: BLE001
        delivery = None
    try:
        link = event.link
    except Exception:  # noqa: BLE001
        link = None
    try:
        session = event.session
    except Exception:  # noqa: BLE001
        session = None
    try:
        conn = event.connection
    except Exception:  # noqa: BLE001
        conn = None
    if conn is None and isinstance(ctx, Connection):
        conn = ctx
    return EngineEvent(event.type, conn, session, link, delivery)


def close_frame(condition: str, description: str) -> bytes:
    """An AMQP close frame (channel 0) carrying an error."""
    data = Data()
    data.put_object(Described(ulong(CLOSE), [Described(ulong(ERROR), [symbol(condition), description])]))
    body = bytes(data.encode())
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body
