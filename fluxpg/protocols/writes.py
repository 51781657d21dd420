"""Output coalescing for stream connections (no protocol knowledge).

A broker connection writes many small packets per event-loop turn: a batch of deliveries, the
acknowledgements of a batch of publishes. Written one by one, each is a send() system call, which
on this project's measurements was the largest single item of the broker's CPU per message (10-16 %
of it for AMQP 0-9-1 and MQTT). CoalescingWriter keeps what is written during one turn and hands
it to the transport as one buffer at the end of the turn (loop.call_soon), in order.

Anything that must see every byte flushes first: drain(), write_eof(), close(); the transport view
counts the bytes not yet handed over in get_write_buffer_size(), so back-pressure and the outbound
memory bounds see exactly what they saw before.
"""
from __future__ import annotations

import asyncio
from typing import Any


class CoalescingWriter:
    """An asyncio.StreamWriter stand-in whose writes of one loop turn become one write."""

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer
        self._raw = writer.transport    # StreamWriter.write is transport.write
        # The loop is looked up once: asyncio.get_running_loop() is a getpid() system call per
        # call on Python < 3.12 (its fork check), i.e. one per connection per loop turn.
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.transport = _TransportView(self, writer.transport)

    def write(self, data: bytes) -> None:
        pending = self._pending
        if not pending:
            self._loop.call_soon(self.flush)
        pending.append(data)
        self._pending_bytes += len(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self._pending_bytes = 0
        raw = self._raw
        if raw.is_closing():
            return   # closed or aborted meanwhile: the bytes had nowhere to go before either
        try:
            raw.write(data)
        except (RuntimeError, ConnectionError):
            pass   # after write_eof / a lost connection: dropped, as a direct write would be

    def pending_bytes(self) -> int:
        return self._pending_bytes

    def buffer_size(self) -> int:
        """transport.get_write_buffer_size() in one call (checked per delivery)."""
        return self._writer.transport.get_write_buffer_size() + self._pending_bytes

    async def drain(self) -> None:
        self.flush()
        await self._writer.drain()

    def write_eof(self) -> None:
        self.flush()
        self._writer.write_eof()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def is_closing(self) -> bool:
        return self._writer.is_closing()

    def __getattr__(self, name: str) -> Any:   # get_extra_info, wait_closed, can_write_eof, ...
        return getattr(self._writer, name)


class _TransportView:
    """The writer's transport, with the bytes still pending counted as buffered."""

    def __init__(self, owner: CoalescingWriter, transport: asyncio.WriteTransport):
        self._owner = owner
        self._transport = transport

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._owner.pending_bytes()

    def __getattr__(self, name: str) -> Any:   # abort, can_write_eof, get_extra_info, ...
        return getattr(self._transport, name)


__all__ = ["CoalescingWriter"]
