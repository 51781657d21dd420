"""Fuzz targets: one per decoder, shared by the quick hypothesis runs CI makes on every change
(test_fuzz.py) and the long coverage-guided atheris runs (run_atheris.py).

A target takes arbitrary bytes and runs them through everything a client's bytes reach in that
front-end's codec, with the bounds the broker uses. It may raise only the codec's own protocol
errors (EXPECTED[name]); anything else escaping is a bug. `timed()` adds the work bound: an input
of at most 1 KiB must decode within 5 ms of CPU time (the minimum of a few runs, so that CI noise
— cache misses, another process taking the CPU — does not fail a run; a real amplification is
slow every time).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from proton import Message

from fluxpg.delivery import Delivery
from fluxpg.protocols import prescan
from fluxpg.protocols.amqp091 import framing
from fluxpg.protocols.amqp091.properties import delivery_properties, headers_from_properties
from fluxpg.protocols.amqp10 import messages as amqp10_messages
from fluxpg.protocols.amqp10.engine import ProtonEngine
from fluxpg.protocols.amqp10.framegate import FrameGate
from fluxpg.protocols.mqtt.codec import Decoder, Properties, Puback, Publish, encode
from fluxpg.protocols.mqtt.reasons import MQTTError
from fluxpg.protocols.wsframes import FrameScanner

MAX_INPUT = 1024          # the bound applies to inputs under 1 KiB
MAX_SECONDS = 0.005       # 5 ms per input
RUNS = 5                  # a slow input is re-run (after a pause); the minimum counts
LIMITS = prescan.DEFAULT_LIMITS


class SlowInput(AssertionError):
    def __init__(self, name: str, data: bytes, seconds: float):
        super().__init__(f"{name}: input of {len(data)} bytes took {seconds * 1000:.1f} ms "
                         f"(> {MAX_SECONDS * 1000:.0f} ms): {data!r}")
        self.data = data
        self.seconds = seconds


# --------------------------------------------------------------------------- MQTT


def mqtt(data: bytes) -> None:
    """The server-side MQTT decoder: a CONNECT first (it learns the version), then packets. The
    first byte picks the version a second decoder is pre-set to, so packets after CONNECT are
    reached without the fuzzer having to build a valid CONNECT first."""
    if not data:
        return
    version = (None, 4, 5, 3)[data[0] % 4]
    dec = Decoder(max_packet_size=1 << 20, version=version)
    dec.feed(data[1:])
    slow = []
    try:
        for pkt in dec:
            # What we decode we must be able to encode again (the broker echoes/forwards packets).
            encode(pkt, dec.version or 5)
            slow.append(pkt)
    finally:
        # The broker's read loop decodes with next_fast (tuples for PUBLISH without properties,
        # ints for plain PUBACKs): the same packets, and the same error at the same place.
        fast_dec = Decoder(max_packet_size=1 << 20, version=version)
        fast_dec.feed(data[1:])
        fast = []
        try:
            while (pkt := fast_dec.next_fast()) is not None:
                if type(pkt) is tuple:
                    pkt = Publish(*pkt, Properties())
                elif type(pkt) is int:
                    pkt = Puback(pkt)
                fast.append(pkt)
        except MQTTError:
            pass
        assert fast == slow[:len(fast)] and len(fast) >= len(slow), "next_fast differs from next_packet"


# --------------------------------------------------------------------------- AMQP 0-9-1


def amqp091(data: bytes) -> Callable[[], None] | None:
    """Framing, then every method / content header through pamqp and our property conversion.
    With an even first byte the input is split into frames; with an odd one it is a method or
    content-header payload as is (so the fuzzer reaches pamqp without learning the framing)."""
    if not data:
        return None
    body = data[1:]
    if data[0] & 1:
        frames = [framing.Frame(framing.FRAME_HEADER if data[0] & 2 else framing.FRAME_METHOD, 1, body)]
        try:
            prescan.amqp091_frame(frames[0].type, body, LIMITS)
        except prescan.DecodeLimitError as exc:
            raise framing.FrameError(str(exc)) from None
    else:
        dec = framing.FrameDecoder(131072, LIMITS)
        frames = dec.feed(body)
        if dec.error_pending:
            dec.feed(b"")
    stored: list[dict] = []
    for frame in frames:
        if frame.type == framing.FRAME_METHOD:
            framing.decode_method(frame.payload)
        elif frame.type == framing.FRAME_HEADER:
            ch = framing.decode_content_header(frame.payload)
            stored.append(headers_from_properties(ch.properties, "ex", "rk"))
    if stored:
        return lambda: [_deliver091(h) for h in stored]
    return None


def _deliver091(stored: dict) -> None:
    """…and back out to a consumer, as the broker does on delivery (another event loop turn)."""
    props, _, _ = delivery_properties(_delivery(stored))
    framing.content_frames(1, props, b"body", 131072)


def _delivery(headers: dict) -> Delivery:
    return Delivery("q", "g", 0, 1, "$queue/q/x", b"payload", headers, datetime(2026, 1, 1, tzinfo=timezone.utc), 1)


# --------------------------------------------------------------------------- AMQP 1.0


def amqp10(data: bytes) -> Callable[[], None] | None:
    """Even first byte: the rest is a transfer's message bytes — decoded (pre-scan, proton),
    converted for the log, and converted back for a receiver. Odd: the rest is the connection's
    byte stream after the protocol header — frame gate, then proton's transport and events."""
    if not data:
        return None
    body = data[1:]
    if data[0] & 1:
        engine = ProtonEngine(container_id="fuzz")
        gate = FrameGate(LIMITS, 1024 * 1024)
        engine.receive(gate.feed(b"AMQP\x00\x01\x00\x00" + body))
        engine.events()
        engine.output()
        return None
    message = amqp10_messages.decode(body, LIMITS)
    payload, headers = amqp10_messages.to_log(message)
    return lambda: _deliver10(payload, headers)


def _deliver10(payload: bytes, headers: dict) -> None:
    """The stored message back out to a receiver (another event loop turn)."""
    out = amqp10_messages.from_delivery(Delivery("q", "g", 0, 1, "$queue/q/x", payload, headers,
                                                 datetime(2026, 1, 1, tzinfo=timezone.utc), 1))
    out.encode()


# --------------------------------------------------------------------------- WebSocket frames


def wsframes(data: bytes) -> None:
    """The WebSocket frame scanner that follows a client's raw bytes beside the WebSocket library
    (MQTT over WebSocket): fed in chunks of a size the first byte picks, the library taking each
    whole message. It must never raise, and its counts must stay consistent."""
    if not data:
        return
    chunk = 1 + data[0] % 64
    scanner = FrameScanner()
    body = data[1:]
    for i in range(0, len(body), chunk):
        scanner.feed(body[i:i + chunk])
        while scanner.waiting:
            assert scanner.take() >= 0
        assert scanner.held >= 0
    assert scanner.held <= len(body)


TARGETS: dict[str, Callable[[bytes], Callable[[], None] | None]] = {
    "mqtt": mqtt, "amqp091": amqp091, "amqp10": amqp10, "wsframes": wsframes}
# The errors each codec is allowed to raise (its own protocol errors).
EXPECTED: dict[str, tuple[type[BaseException], ...]] = {
    "mqtt": (MQTTError,),
    "amqp091": (framing.FrameError,),
    "amqp10": (prescan.DecodeLimitError, amqp10_messages.MessageError),
    "wsframes": (),
}


def run_once(name: str, data: bytes) -> float:
    """Run a target on one input; the seconds it took. A target may return a second step (the
    stored message delivered to a consumer: another turn of the event loop), timed on its own;
    the longer of the two counts. Expected errors are swallowed; anything else propagates."""
    target, expected = TARGETS[name], EXPECTED[name]
    # CPU time of this process, not wall time: what an input costs the event loop, without the
    # time other processes (a loaded CI machine, a niced long run) take the CPU away from us.
    started = time.process_time()
    then = None
    try:
        then = target(data)
    except expected:
        pass
    took = time.process_time() - started
    if then is not None:
        started = time.process_time()
        then()
        took = max(took, time.process_time() - started)
    return took


def timed(name: str, data: bytes) -> float:
    """run_once, plus the work bound for inputs of at most MAX_INPUT bytes (SlowInput)."""
    best = run_once(name, data)
    if len(data) > MAX_INPUT:
        return best
    runs = 1
    while best > MAX_SECONDS and runs < RUNS:
        time.sleep(0.01 * runs)   # let whatever else holds the CPU have its turn
        best = min(best, run_once(name, data))
        runs += 1
    if best > MAX_SECONDS:
        raise SlowInput(name, data, best)
    return best
