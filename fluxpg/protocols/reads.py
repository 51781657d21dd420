"""Reading without a StreamReader (the counterpart of writes.py; no protocol knowledge).

A broker connection's read loop waits in `await reader.read()` between reads. Every read then
costs a StreamReader wake-up: a future, a task step resuming the connection's coroutines, the
StreamReader's own buffer and bookkeeping -- on this project's machine ~7 µs per read in a
ping-pong microbenchmark (37-41 µs per round trip with a StreamReader, 30-34 µs with a plain
Protocol), i.e. several µs per MQTT message when every message arrives in a read of its own.

InlineReader takes the transport over from the StreamReaderProtocol (transport.set_protocol) and
lets the read loop *park*: while it is parked, each data_received hands the bytes straight to the
connection's `consume(data)` (in the connection task's context), which decodes and handles what
is complete. consume returns STAY when the loop may stay parked, or anything else to wake it: an
awaitable the loop awaits before reading on (a packet handler's answer that must wait), or AGAIN
to let the loop go round (a partial packet, back-pressure, the connection closing). An exception
raised by consume is raised in the parked loop, as a read or a handler in the loop would raise it.
While the loop is not parked (busy awaiting something), data is queued in order and `read()`
returns it, as StreamReader.read does; above 2 MiB queued the transport stops reading (the
StreamReader's bound with the listeners' limit of 1 MiB).

Write-side flow control, closing and drain stay with the StreamReaderProtocol: pause_writing,
resume_writing and connection_lost are passed on to it, so StreamWriter.drain() and wait_closed()
work as before.
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any, Callable

STAY = object()       # consume(): keep the loop parked
AGAIN = object()      # consume(): wake the loop, nothing to await
PAUSE_AT = 2 * 2 ** 20


class InlineReader(asyncio.Protocol):
    """The reading side of a connection whose bytes may be consumed in data_received."""

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.Transport,
                 consume: Callable[[bytes], Any]):
        self._old = transport.get_protocol()
        self._transport = transport
        self._consume = consume
        self._ctx = contextvars.copy_context()     # the connection task's (tasks created inline)
        self._loop = asyncio.get_running_loop()
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._inline = False            # parked: data_received consumes
        self._consuming = False
        self._paused = False
        transport.set_protocol(self)
        # What the StreamReader holds already comes first.
        buf = reader._buffer
        if buf:
            self._chunks.append(bytes(buf))
            self._size = len(buf)
            buf.clear()
        if reader._paused:
            reader._paused = False
            transport.resume_reading()
        self._exc = reader.exception()
        self._eof = reader._eof

    @staticmethod
    def usable(reader: Any, transport: Any) -> bool:
        """Whether this connection can be read this way (a StreamReader on a transport that lets
        its protocol be replaced: TCP and TLS; not the WebSocket adapters)."""
        return (type(reader) is asyncio.StreamReader and hasattr(reader, "_buffer")
                and hasattr(transport, "set_protocol")
                and isinstance(transport.get_protocol(), asyncio.StreamReaderProtocol))

    # --- the read loop's side -----------------------------------------------------------------

    async def park(self) -> Any:
        """Wait with inline consumption on. Returns None when there is input (or EOF) to read(),
        else what consume returned to wake the loop (AGAIN or an awaitable)."""
        if self._chunks or self._eof or self._exc is not None:
            return None
        return await self._wait(True)

    async def read(self, n: int = -1) -> bytes:
        """Up to n bytes (all queued when n < 0); b"" at EOF; raises what ended the connection."""
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self._eof:
                return b""
            await self._wait(False)
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        if 0 <= n < len(data):
            chunks.append(data[n:])
            data = data[:n]
        self._size = len(chunks[0]) if chunks else 0
        if self._paused and self._size <= PAUSE_AT:
            self._paused = False
            self._transport.resume_reading()
        return data

    def feed_eof(self) -> None:
        """No more input (the connection is ending): wakes a waiting read."""
        self._eof = True
        if not self._consuming:
            self._wake(None)

    def exception(self) -> BaseException | None:
        return self._exc

    def at_eof(self) -> bool:
        return self._eof and not self._chunks

    async def _wait(self, inline: bool) -> Any:
        self._waiter = w = self._loop.create_future()
        self._inline = inline
        try:
            return await w
        finally:
            self._waiter = None
            self._inline = False

    def _wake(self, value: Any) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(value)

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        w = self._waiter
        if self._inline and w is not None and not w.done():
            self._consuming = True
            try:
                token = self._ctx.run(self._consume, data)
            except Exception as exc:  # noqa: BLE001 - raised in the read loop
                self._consuming = False
                self._inline = False
                w.set_exception(exc)
                return
            self._consuming = False
            if token is STAY and not self._eof:
                return
            self._inline = False
            w.set_result(None if token is STAY else token)
            return
        self._chunks.append(data)
        self._size += len(data)
        if w is not None and not w.done():
            w.set_result(None)
        if self._size > PAUSE_AT and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        keep = self._old.eof_received()     # keeps the half-open socket as before (TLS: closes)
        self._eof = True
        self._wake(None)
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        self._old.connection_lost(exc)      # drain waiters, wait_closed
        self._eof = True
        if exc is not None:
            self._exc = exc
        self._wake(None)

    def pause_writing(self) -> None:
        self._old.pause_writing()

    def resume_writing(self) -> None:
        self._old.resume_writing()


__all__ = ["InlineReader", "STAY", "AGAIN"]
