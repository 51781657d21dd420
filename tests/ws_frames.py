"""WebSocket frames as a client sends them (RFC 6455 §5.2: masked, any length), for tests that
speak WebSocket byte by byte."""
from __future__ import annotations

import struct


def client_frame(payload: bytes, opcode: int = 0x2, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04") -> bytes:
    """One frame; binary by default; the payload masked with `mask` (4 bytes)."""
    n = len(payload)
    first = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head = first + bytes([0x80 | n])
    elif n < 65536:
        head = first + bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head = first + bytes([0x80 | 127]) + struct.pack(">Q", n)
    if mask == b"\x00\x00\x00\x00":
        return head + mask + payload          # a zero key leaves the payload as it is (large frames)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
