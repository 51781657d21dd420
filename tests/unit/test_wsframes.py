"""FrameScanner (fluxpg/protocols/wsframes.py): it follows a client's WebSocket frames from raw
bytes however they are split, so the frame deadline and the inbound byte count match what the
WebSocket library holds."""
from __future__ import annotations

from fluxpg.protocols.wsframes import FrameScanner
from tests.ws_frames import client_frame


def frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    return client_frame(payload, opcode, fin)


def feed_split(scanner: FrameScanner, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        scanner.feed(data[i:i + step])


def test_whole_messages_are_held_until_taken_whatever_the_split():
    a, b, c = frame(b"a" * 10), frame(b"b" * 300), frame(b"c" * 70_000)
    for step in (1, 3, 7, 1000, len(a + b + c)):
        s = FrameScanner()
        feed_split(s, a + b + c, step)
        assert not s.started and s.waiting == 3 and s.messages == 3
        assert s.held == len(a) + len(b) + len(c)
        assert [s.take(), s.take(), s.take(), s.take()] == [len(a), len(b), len(c), 0]
        assert s.held == 0


def test_a_partial_frame_is_started_and_held():
    data = frame(b"x" * 1000)
    s = FrameScanner()
    s.feed(data[:1])
    assert s.started and s.held == 1
    s.feed(data[1:600])
    assert s.started and s.held == 600 and s.waiting == 0
    s.feed(data[600:])
    assert not s.started and s.waiting == 1 and s.held == len(data)


def test_fragmented_message_with_a_ping_between_its_fragments():
    first, ping, last = frame(b"x" * 100, fin=False), frame(b"p", opcode=0x9), frame(b"y" * 50, opcode=0x0)
    s = FrameScanner()
    s.feed(first)
    assert s.started and s.held == len(first)      # the message is not complete
    s.feed(ping)
    assert s.started and s.held == len(first)      # the ping left once complete
    s.feed(last)
    assert not s.started and s.waiting == 1 and s.take() == len(first) + len(last)


def test_empty_frames_and_control_frames_alone():
    s = FrameScanner()
    s.feed(frame(b"", opcode=0xA) + frame(b""))
    assert not s.started and s.waiting == 1 and s.take() == 6 and s.held == 0


def test_an_impossible_length_stops_the_count():
    s = FrameScanner()
    s.feed(b"\x82\xff" + b"\xff" * 8 + b"\x00" * 4)
    assert s.broken
