"""A gate in front of proton's transport: whole AMQP 1.0 frames in, checked, then handed on.

proton decodes every performative (attach properties, source filters, …) in C, building a node
for each value: a frame of a few bytes can announce an array of billions of zero-width values.
The gate splits the byte stream into frames (only their 8-byte headers are read), pre-scans each
frame's performative with fluxpg.protocols.prescan (bounds.decoder_max_depth / _elements)
and passes only complete, scanned frames to proton. Because it knows where frames begin, it also
knows since when the current frame is incomplete: `started` is what the adapter's frame
deadline (bounds.frame_timeout) is measured from — trickled bytes do not extend it.

Sans I/O: bytes in, bytes out; DecodeLimitError for a frame that must not reach proton.
"""
from __future__ import annotations

import struct

from fluxpg.protocols import prescan

PROTOCOL_HEADER_SIZE = 8
FRAME_HEADER_SIZE = 8
_SIZE = struct.Struct(">I")


class FrameGate:
    def __init__(self, limits: prescan.Limits = prescan.DEFAULT_LIMITS, max_frame_size: int = 1024 * 1024):
        self.limits = limits
        self.max_frame_size = max_frame_size
        self._header_left = PROTOCOL_HEADER_SIZE   # the AMQP protocol header passes through as is
        self._buf = bytearray()
        self.started: float | None = None           # when the incomplete frame's first byte came

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes, now: float = 0.0) -> bytes:
        """Add bytes read from the socket; the bytes proton may have now (whole frames)."""
        out = bytearray()
        if self._header_left:
            take = data[:self._header_left]
            out += take
            self._header_left -= len(take)
            data = data[len(take):]
        if data:
            self._buf += data
        buf = self._buf
        pos = 0
        while len(buf) - pos >= FRAME_HEADER_SIZE:
            size = _SIZE.unpack_from(buf, pos)[0]
            doff = buf[pos + 4]
            if size < FRAME_HEADER_SIZE or doff < 2 or doff * 4 > size:
                break   # malformed: proton reports it (a decode error) — let it see the bytes
            if self.max_frame_size and size > self.max_frame_size:
                self._fail()
                raise prescan.DecodeLimitError(f"frame of {size} bytes exceeds max-frame-size {self.max_frame_size}")
            if len(buf) - pos < size:
                break
            body = pos + doff * 4
            if body < pos + size:
                try:
                    prescan.amqp10_values(buf, self.limits, start=body, end=pos + size, max_values=1)
                except prescan.DecodeLimitError:
                    self._fail()
                    raise
            pos += size
        if pos:
            out += buf[:pos]
            del buf[:pos]
        if _malformed(buf):
            # Not a frame we can split: hand it to proton, which answers with its decode error.
            out += buf
            buf.clear()
        if not buf:
            self.started = None
        elif self.started is None or pos:
            self.started = now
        return bytes(out)

    def _fail(self) -> None:
        self._buf = bytearray()
        self.started = None


def _malformed(buf: bytearray) -> bool:
    if len(buf) < FRAME_HEADER_SIZE:
        return False
    size = _SIZE.unpack_from(buf, 0)[0]
    doff = buf[4]
    return size < FRAME_HEADER_SIZE or doff < 2 or doff * 4 > size
