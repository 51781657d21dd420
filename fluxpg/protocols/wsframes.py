"""Where a client's WebSocket byte stream is, frame by frame (RFC 6455 §5.2), without keeping payloads.

The WebSocket libraries (websockets for the `ws` listener, aiohttp for the HTTP listener's `/mqtt`)
buffer a frame, and a fragmented message, until it is whole; the code above them sees nothing of
a message still arriving. `FrameScanner` follows the same raw bytes alongside the library, reading
only frame headers (at most 14 bytes kept), so the broker knows

- `started`: a frame, or a fragmented data message, has begun and is not complete -- the
  frame deadline (bounds.frame_timeout) runs;
- `held`: how many raw bytes of data messages the library holds that were not taken yet (whole
  messages waiting, the message being received, the frame being received) -- charged to
  bounds.connection_inbound_bytes / broker_inbound_bytes.

Control frames (ping, pong, close) count while they arrive and leave `held` when complete: the
library answers them itself. No I/O; linear in the input. A stream it cannot follow (a length
over 2**63) marks it `broken` and it stops counting: the library fails such a connection anyway.
"""
from __future__ import annotations

from collections import deque


class FrameScanner:
    def __init__(self) -> None:
        self._head = bytearray()     # the frame header being received (2 to 14 bytes)
        self._left = 0               # payload bytes of the current frame still to come
        self._in_payload = False
        self._control = False
        self._fin = False
        self._frame = 0              # raw bytes of the current frame so far (header included)
        self._message = 0            # raw bytes of the complete frames of an unfinished data message
        self._fragmented = False     # a data frame without FIN was seen, its final frame was not
        self._complete: deque[int] = deque()   # raw sizes of whole data messages not taken yet
        self._complete_bytes = 0
        self.messages = 0            # data messages completed so far
        self.broken = False

    @property
    def held(self) -> int:
        return self._complete_bytes + self._message + self._frame

    @property
    def started(self) -> bool:
        return self._frame > 0 or self._fragmented

    @property
    def waiting(self) -> int:
        """Whole data messages received and not taken yet."""
        return len(self._complete)

    def take(self) -> int:
        """The library handed over its oldest message: its raw size leaves `held`."""
        if not self._complete:
            return 0
        n = self._complete.popleft()
        self._complete_bytes -= n
        return n

    def _need(self) -> int:
        head = self._head
        if len(head) < 2:
            return 2
        size = head[1] & 0x7F
        return 2 + (2 if size == 126 else 8 if size == 127 else 0) + (4 if head[1] & 0x80 else 0)

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while not self.broken:
            if not self._in_payload:
                need = self._need()
                have = len(self._head)
                if have < need:
                    if i >= n:
                        return
                    take = min(need - have, n - i)
                    self._head += data[i:i + take]
                    self._frame += take
                    i += take
                    continue
                self._begin_payload()
                continue
            if i >= n:
                return
            take = min(self._left, n - i)
            self._left -= take
            self._frame += take
            i += take
            if not self._left:
                self._end_frame()

    def _begin_payload(self) -> None:
        head = self._head
        size = head[1] & 0x7F
        if size == 126:
            size = int.from_bytes(head[2:4], "big")
        elif size == 127:
            size = int.from_bytes(head[2:10], "big")
            if size >> 63:
                self.broken = True
                return
        self._fin = bool(head[0] & 0x80)
        self._control = bool(head[0] & 0x08)
        self._left = size
        self._in_payload = True
        head.clear()
        if not size:
            self._end_frame()

    def _end_frame(self) -> None:
        self._in_payload = False
        frame, self._frame = self._frame, 0
        if self._control:
            return
        self._message += frame
        if not self._fin:
            self._fragmented = True
            return
        self._complete.append(self._message)
        self._complete_bytes += self._message
        self._message = 0
        self._fragmented = False
        self.messages += 1
