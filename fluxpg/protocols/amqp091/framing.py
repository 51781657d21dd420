"""AMQP 0-9-1 framing, sans-I/O: bytes in → frames out, frames → bytes.

pamqp encodes and decodes the frame *payloads* (methods, content headers), but its
`pamqp.frame.unmarshal` raises the same exception for "not all bytes are here yet" and "these bytes
are garbage" (FACTS.md), which a stream reader cannot tell apart. So the stream is framed here:

    type (1 byte) | channel (2) | size (4) | payload (size bytes) | frame-end 0xCE

`FrameDecoder.feed()` buffers partial frames and returns only complete ones; a wrong frame-end
byte, an unknown frame type or a frame larger than the negotiated frame-max is a `FrameError`
(AMQP 501 FRAME_ERROR, a connection exception).

Outgoing method frames are encoded without pamqp's client-side name validation: that pattern
refuses `$` (`$queue/…`, `$dlq/…`), and the server must be able to echo the names clients use.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import base, commands, constants, decode, encode, header, heartbeat

from fluxpg.protocols import prescan

FRAME_METHOD = constants.FRAME_METHOD          # 1
FRAME_HEADER = constants.FRAME_HEADER          # 2
FRAME_BODY = constants.FRAME_BODY              # 3
FRAME_HEARTBEAT = constants.FRAME_HEARTBEAT    # 8
FRAME_END = constants.FRAME_END                # 0xCE
FRAME_HEADER_SIZE = 7
FRAME_OVERHEAD = FRAME_HEADER_SIZE + 1         # header + frame-end byte
MIN_FRAME_MAX = 4096                           # spec: frame-min-size; valid before tune-ok

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))

_HEADER = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_HEARTBEAT_BYTES = heartbeat.Heartbeat().marshal()

# Reply codes (AMQP 0-9-1 spec, "Constants").
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311      # channel
NO_ROUTE = 312               # basic.return
NO_CONSUMERS = 313
CONNECTION_FORCED = 320      # connection
INVALID_PATH = 402
ACCESS_REFUSED = 403         # channel (connection during the handshake)
NOT_FOUND = 404              # channel
RESOURCE_LOCKED = 405        # channel
PRECONDITION_FAILED = 406    # channel
FRAME_ERROR = 501            # connection
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXT = {
    200: "OK", 311: "CONTENT_TOO_LARGE", 312: "NO_ROUTE", 313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED", 402: "INVALID_PATH", 403: "ACCESS_REFUSED", 404: "NOT_FOUND",
    405: "RESOURCE_LOCKED", 406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID", 504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME", 506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED", 540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR",
}


class FrameError(Exception):
    """The byte stream is not AMQP 0-9-1 framing (501 FRAME_ERROR or, for a method we do not
    know, 540 NOT_IMPLEMENTED)."""

    def __init__(self, text: str, code: int = FRAME_ERROR):
        super().__init__(text)
        self.code = code


class AMQPError(Exception):
    """An AMQP exception to report with channel.close (channel=True) or connection.close.

    `method` is the pamqp method class that caused it (its class and method ids go in the close).
    """

    def __init__(self, code: int, text: str, method: type[base.Frame] | base.Frame | None = None,
                 *, channel: bool):
        super().__init__(text)
        self.code = code
        self.text = text
        self.method = method
        self.channel = channel

    @property
    def reply_text(self) -> str:
        # RabbitMQ's form, which clients show to users: "NOT_FOUND - no queue 'x'".
        text = f"{REPLY_TEXT.get(self.code, 'ERROR')} - {self.text}"
        return text[:255]  # a shortstr

    @property
    def ids(self) -> tuple[int, int]:
        if self.method is None:
            return 0, 0
        index = self.method.index
        return index >> 16, index & 0xFFFF


def channel_error(code: int, text: str, method=None) -> AMQPError:
    return AMQPError(code, text, method, channel=True)


def connection_error(code: int, text: str, method=None) -> AMQPError:
    return AMQPError(code, text, method, channel=False)


@dataclass(slots=True)
class Frame:
    type: int
    channel: int
    payload: bytes


class FrameDecoder:
    """Incremental frame splitter. `max_frame` is the largest whole frame accepted (frame-max).

    Never raises anything but FrameError. Frames that arrived complete before a broken one are
    returned first; the error then comes from the next `feed()` call (`feed(b"")` will do — see
    `error_pending`), so the connection still processes what the peer sent correctly and then
    answers the broken frame with connection.close 501. After an error the decoder stays failed.
    """

    def __init__(self, max_frame: int = 131072, limits: prescan.Limits | None = prescan.DEFAULT_LIMITS):
        self.max_frame = max_frame
        # Decoder work bounds (bounds.decoder_max_depth / _elements): method and content header
        # frames are pre-scanned before pamqp builds objects from them.
        self.limits = limits
        self._buf = bytearray()
        self._error: FrameError | None = None

    @property
    def error_pending(self) -> bool:
        return self._error is not None

    def feed(self, data: bytes) -> list[Frame]:
        """Add bytes; return the complete frames now available (possibly none)."""
        if self._error is not None:
            raise self._error
        if not self._buf:
            # The usual case: the read starts at a frame boundary. Frames are sliced from the
            # read's bytes (one copy each), only a partial frame at the end is kept.
            buf = data
        else:
            if data:
                self._buf += data
            buf = self._buf
        frames: list[Frame] = []
        append = frames.append
        unpack = _HEADER.unpack_from
        limits = self.limits
        max_frame = self.max_frame
        pos = 0
        n = len(buf)
        error: FrameError | None = None
        while n - pos >= FRAME_HEADER_SIZE:
            ftype, channel, size = unpack(buf, pos)
            if ftype not in _FRAME_TYPES:
                error = FrameError(f"unknown frame type {ftype}")
                break
            total = FRAME_OVERHEAD + size
            if max_frame and total > max_frame:
                error = FrameError(f"frame of {total} bytes exceeds the negotiated frame-max {max_frame}")
                break
            if n - pos < total:
                break
            end = buf[pos + total - 1]
            if end != FRAME_END:
                error = FrameError(f"frame-end byte is 0x{end:02x}, not 0xCE")
                break
            payload = buf[pos + FRAME_HEADER_SIZE:pos + total - 1]
            if type(payload) is not bytes:
                payload = bytes(payload)
            # A basic.ack of the exact size (one per consumed message) and a basic.publish laid
            # out exactly (one per published message) hold no table: the scan would only walk
            # their fixed fields.
            if (limits is not None and (ftype == FRAME_HEADER or ftype == FRAME_METHOD and not (
                    (size == 13 and payload[:4] == _ACK_INDEX) or _exact_publish(payload)))):
                try:
                    prescan.amqp091_frame(ftype, payload, limits)
                except prescan.DecodeLimitError as exc:
                    error = FrameError(f"frame on channel {channel} refused before decoding: {exc}")
                    break
            append(Frame(ftype, channel, payload))
            pos += total
        if error is not None:
            # The stream cannot be framed past this point: drop what is buffered (it is garbage
            # or unframeable) so a failed decoder holds no memory.
            self._buf = bytearray()
            self._error = error
            if not frames:
                raise error
            return frames
        if buf is self._buf:
            if pos:
                del buf[:pos]
        elif pos < len(buf):
            self._buf = bytearray(buf[pos:]) if pos else bytearray(buf)
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


# --------------------------------------------------------------------------- payload decoding


# The two methods a client sends per message, basic.publish and basic.ack, decoded directly:
# pamqp's generic unmarshal costs ~16 µs per publish here. Only a payload laid out exactly as the
# spec says takes this path (no trailing bytes, strings within the payload, valid UTF-8); anything
# else goes through pamqp as before, so errors stay the same. tests/unit/test_amqp091_fastcodec.py
# compares both on valid and on mutated payloads.
_PUBLISH_INDEX = _U32.pack(commands.Basic.Publish.index)
_ACK_INDEX = _U32.pack(commands.Basic.Ack.index)
_U16 = struct.Struct(">H")
_ACK_BODY = struct.Struct(">qB")


def _fast_method(payload: bytes) -> base.Frame | None:
    head = payload[:4]
    try:
        if head == _PUBLISH_INDEX:
            n = len(payload)
            p = 7 + payload[6]                      # ticket (short), exchange length
            exchange = payload[7:p]
            q = p + 1 + payload[p]                  # routing key length
            if q != n - 1:
                return None
            m = commands.Basic.Publish.__new__(commands.Basic.Publish)
            m.ticket = _U16.unpack_from(payload, 4)[0]
            m.exchange = exchange.decode("utf-8")
            m.routing_key = payload[p + 1:q].decode("utf-8")
            bits = payload[q]
            m.mandatory = (bits & 1) != 0
            m.immediate = (bits & 2) != 0
            return m
        if head == _ACK_INDEX and len(payload) == 13:
            tag, bits = _ACK_BODY.unpack_from(payload, 4)
            m = commands.Basic.Ack.__new__(commands.Basic.Ack)
            m.delivery_tag = tag
            m.multiple = (bits & 1) != 0
            return m
    except (IndexError, UnicodeDecodeError, struct.error):
        return None
    return None


def _exact_publish(payload: bytes) -> bool:
    """A basic.publish payload whose fields end exactly at its end (what _fast_method decodes)."""
    if payload[:4] != _PUBLISH_INDEX:
        return False
    n = len(payload)
    if n < 9:   # class, method, ticket, two empty shortstrs, bits
        return False
    p = 7 + payload[6]
    return p < n and p + 1 + payload[p] == n - 1


def publish_method(payload: bytes) -> commands.Basic.Publish | None:
    """A basic.publish payload laid out exactly as the spec says, decoded as decode_method does;
    None for anything else (another method, or one decode_method must look at)."""
    if payload[:4] != _PUBLISH_INDEX:
        return None
    return _fast_method(payload)


def ack_fields(payload: bytes) -> tuple[int, bool] | None:
    """(delivery tag, multiple) of a basic.ack payload laid out exactly as the spec says, as
    decode_method reads it; None for anything else."""
    if len(payload) == 13 and payload[:4] == _ACK_INDEX:
        tag, bits = _ACK_BODY.unpack_from(payload, 4)
        return tag, (bits & 1) != 0
    return None


def decode_method(payload: bytes) -> base.Frame:
    """A method frame's payload → pamqp method object. Raises FrameError."""
    fast = _fast_method(payload)
    if fast is not None:
        return fast
    if len(payload) < 4:
        raise FrameError("method frame shorter than its class and method ids")
    _, index = decode.long_int(payload[:4])
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise FrameError(f"unknown method (class {index >> 16}, method {index & 0xFFFF})", NOT_IMPLEMENTED)
    method = cls.__new__(cls)   # no __init__: it validates defaults we are about to overwrite
    try:
        method.unmarshal(payload[4:])
    except Exception as exc:  # noqa: BLE001 - pamqp raises many types on bad bytes; all are 501 here
        raise FrameError(f"malformed {cls.name}: {type(exc).__name__}: {exc}") from None
    for slot in cls.__slots__:
        # A short payload can leave arguments unset without an exception: say so here, not
        # with an AttributeError deep in a handler.
        if not hasattr(method, slot):
            raise FrameError(f"malformed {cls.name}: argument {slot!r} is missing")
    return method


# A content header per publish: decoded directly (pamqp builds and validates a default Properties
# first, then dispatches per field: ~6 µs). Shortstrs and octets are read here, a headers table or
# a timestamp by pamqp's own decoders; a header not laid out exactly (continuation flags, a field
# running past the payload, trailing bytes, bad UTF-8) goes through pamqp as before.
_CONTENT_HEADER = struct.Struct(">HHQH")
_PROPERTY_DEFAULTS = tuple((name, "" if name == "cluster_id" else None)
                           for name in commands.Basic.Properties.__slots__)
_DECODE_PLAN = tuple((name, commands.Basic.Properties.flags[name], getattr(commands.Basic.Properties, "_" + name))
                     for name in commands.Basic.Properties.__slots__)


_plans: dict[int, tuple[tuple[str, str], ...]] = {}   # property flags → the fields present, in order


def _props_decoder(flags: int):
    """A function decoding the property fields that `flags` announces (bytes after the flags word)
    into a Properties, written out for these flags: what the loop in _props_generic does, without
    its per-field dispatch and setattr calls. None returned by it: not laid out exactly."""
    present = {}
    lines = ["def decode(payload, n):", "    p = 14"]
    for name, flag, kind in _DECODE_PLAN:   # pamqp's slot names: identifiers, never input
        if not flags & flag:
            continue
        present[name] = True
        if kind == "shortstr":
            lines += ["    e = p + 1 + payload[p]", "    if e > n:", "        return None",
                      f"    v_{name} = payload[p + 1:e].decode('utf-8')", "    p = e"]
        elif kind == "octet":
            lines += [f"    v_{name} = payload[p]", "    p += 1"]
        elif kind == "table":
            lines += [f"    used, v_{name} = field_table(payload[p:])", "    p += used"]
        else:   # timestamp
            lines += ["    if p + 8 > n:", "        return None", f"    used, v_{name} = timestamp(payload[p:])",
                      "    p += used"]
    lines += ["    if p != n:", "        return None", "    props = new(Properties)"]
    for name, default in _PROPERTY_DEFAULTS:
        lines.append(f"    props.{name} = v_{name}" if name in present else f"    props.{name} = {default!r}")
    lines.append("    return props")
    scope = {"field_table": decode.field_table, "timestamp": decode.timestamp, "Properties": commands.Basic.Properties,
             "new": commands.Basic.Properties.__new__}
    exec("\n".join(lines), scope)   # noqa: S102 - generated from pamqp's property table only
    return scope["decode"]


_decoders: dict[int, Any] = {}   # property flags → _props_decoder(flags); bounded (flags come from clients)
_MAX_DECODERS = 64


def _props_generic(payload: bytes, flags: int) -> commands.Basic.Properties | None:
    plan = _plans.get(flags)
    if plan is None:
        plan = _plans[flags] = tuple((name, kind) for name, flag, kind in _DECODE_PLAN if flags & flag)
    props = commands.Basic.Properties.__new__(commands.Basic.Properties)   # no __init__: no validate()
    for name, default in _PROPERTY_DEFAULTS:
        setattr(props, name, default)
    p = 14
    for name, kind in plan:
        if kind == "shortstr":
            end = p + 1 + payload[p]
            if end > len(payload):
                return None
            value = payload[p + 1:end].decode("utf-8")
            p = end
        elif kind == "octet":
            value = payload[p]
            p += 1
        elif kind == "table":
            used, value = decode.field_table(payload[p:])
            p += used
        else:   # timestamp
            if p + 8 > len(payload):
                return None
            used, value = decode.timestamp(payload[p:])
            p += used
        setattr(props, name, value)
    if p != len(payload):
        return None
    return props


def _fast_content_header(payload: bytes) -> header.ContentHeader | None:
    try:
        class_id, weight, body_size, flags = _CONTENT_HEADER.unpack_from(payload, 0)
        if flags & 1:
            return None
        dec = _decoders.get(flags)
        if dec is None and len(_decoders) < _MAX_DECODERS:
            dec = _decoders[flags] = _props_decoder(flags)
        props = dec(payload, len(payload)) if dec is not None else _props_generic(payload, flags)
        if props is None:
            return None
    except Exception:  # noqa: BLE001 - anything odd: pamqp decides, as before
        return None
    ch = header.ContentHeader.__new__(header.ContentHeader)
    ch.class_id, ch.weight, ch.body_size, ch.properties = class_id, weight, body_size, props
    return ch


def decode_content_header(payload: bytes) -> header.ContentHeader:
    fast = _fast_content_header(payload)
    if fast is not None:
        return fast
    ch = header.ContentHeader()
    try:
        ch.unmarshal(payload)
    except Exception as exc:  # noqa: BLE001 - see decode_method
        raise FrameError(f"malformed content header: {type(exc).__name__}: {exc}") from None
    return ch


# --------------------------------------------------------------------------- encoding


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return _HEADER.pack(ftype, channel, len(payload)) + payload + b"\xce"


def _method_payload(method: base.Frame) -> bytes:
    """pamqp's Frame.marshal without its validate() call (see the module docstring)."""
    byte, offset, output, processing_bitset = -1, 0, [], False
    for argument in method.__slots__:
        data_type = method.amqp_type(argument)
        if not processing_bitset and data_type == "bit":
            byte, offset, processing_bitset = 0, 0, True
        value = getattr(method, argument, 0)
        if processing_bitset:
            if data_type != "bit":
                processing_bitset = False
                output.append(encode.octet(byte))
            else:
                byte = encode.bit(value, byte, offset)
                offset += 1
                if offset == 8:
                    output.append(encode.octet(byte))
                    processing_bitset = False
                continue
        output.append(encode.by_type(value, data_type))
    if processing_bitset:
        output.append(encode.octet(byte))
    return struct.pack(">I", method.index) + b"".join(output)


def build(cls: type[base.Frame], *args) -> base.Frame:
    """A method object from positional arguments, without pamqp's name validation (which
    refuses e.g. `$` in queue and exchange names the server must be able to echo)."""
    obj = cls.__new__(cls)
    slots = cls.__slots__
    for i, slot in enumerate(slots):
        setattr(obj, slot, args[i] if i < len(args) else None)
    return obj


def method_frame(channel: int, method: base.Frame) -> bytes:
    return _frame(FRAME_METHOD, channel, _method_payload(method))


# ----------------------------------------------------------------- encoding: the delivery fast path
#
# Every delivery encodes a basic.deliver and a content header whose headers table carries the
# delivery properties (message-id, offset …). pamqp encodes field by field through generic
# dispatch (by_type, isinstance chains): ~9 % of the broker's CPU when consuming. The functions
# below write the same bytes directly for the value types deliveries carry (str, int, bool, None,
# nested tables and arrays) and give up (_Slow) on anything else — a float, a timestamp in a
# table, a string too long for a shortstr, a key longer than 128 bytes — which then goes through
# pamqp exactly as before. tests/unit/test_amqp091_fastcodec.py checks byte equality with pamqp.

class _Slow(Exception):
    """A value the fast path does not encode: use pamqp."""


_U8 = struct.Struct(">B")
_INT_FORMATS = ((-128, 127, b"b", struct.Struct(">b")), (-32768, 32767, b"s", struct.Struct(">h")),
                (0, 65535, b"u", struct.Struct(">H")), (-2 ** 31, 2 ** 31 - 1, b"I", struct.Struct(">i")),
                (0, 2 ** 32 - 1, b"i", struct.Struct(">I")), (-2 ** 63, 2 ** 63 - 1, b"l", struct.Struct(">q")))


def _fast_shortstr(value) -> bytes:
    if type(value) is not str:
        raise _Slow
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise _Slow
    return _U8.pack(len(raw)) + raw


def _fast_value(value) -> bytes:
    t = type(value)
    if t is str:
        raw = value.encode("utf-8")
        return b"S" + _U32.pack(len(raw)) + raw
    if t is bool:
        return b"t\x01" if value else b"t\x00"
    if t is int:
        if encode.DEPRECATED_RABBITMQ_SUPPORT:
            raise _Slow
        for low, high, tag, fmt in _INT_FORMATS:
            if low <= value <= high:
                return tag + fmt.pack(value)
        raise _Slow
    if t is dict:
        return b"F" + _fast_table(value)
    if t is list:
        data = b"".join([_fast_value(v) for v in value])
        return b"A" + _U32.pack(len(data)) + data
    if value is None:
        return b"V"
    raise _Slow


def _fast_table(table) -> bytes:
    if not table:
        return b"\x00\x00\x00\x00"
    if type(table) is not dict:
        raise _Slow
    parts = []
    for key, value in sorted(table.items()):
        if type(key) is not str:
            raise _Slow
        raw = key.encode("utf-8")
        if len(raw) > 128:
            raise _Slow   # pamqp truncates (and logs)
        parts.append(_U8.pack(len(raw)) + raw)
        parts.append(_fast_value(value))
    data = b"".join(parts)
    return _U32.pack(len(data)) + data


def _fast_octet(value) -> bytes:
    if type(value) is not int or not 0 <= value <= 255:
        raise _Slow
    return _U8.pack(value)


_PROPERTY_ENCODERS = {"shortstr": _fast_shortstr, "table": _fast_table, "octet": _fast_octet,
                      "timestamp": encode.timestamp}
_PROPERTY_PLAN = tuple((name, commands.Basic.Properties.flags[name],
                        _PROPERTY_ENCODERS[getattr(commands.Basic.Properties, "_" + name)])
                       for name in commands.Basic.Properties.__slots__)
_CONTENT_HEADER_PREFIX = struct.Struct(">HxxQ")


def _content_header_payload(properties: commands.Basic.Properties, body_size: int) -> bytes:
    flags = 0
    parts = []
    try:
        for name, flag, enc in _PROPERTY_PLAN:
            value = getattr(properties, name)
            if value is not None and value != "":
                flags |= flag
                parts.append(enc(value))
    except (_Slow, TypeError):
        return header.ContentHeader(0, body_size, properties).marshal()
    # Basic's flags fit in 16 bits (no continuation word), as pamqp writes them.
    return _CONTENT_HEADER_PREFIX.pack(commands.Basic.frame_id, body_size) + struct.pack(">H", flags) + b"".join(parts)


_DELIVER_INDEX = struct.pack(">I", commands.Basic.Deliver.index)
_I64 = struct.Struct(">q")   # pamqp writes the delivery tag as a signed longlong


def deliver_frame(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                  routing_key: str) -> bytes:
    """method_frame(channel, basic.deliver(...)) written directly (see above)."""
    try:
        payload = (_DELIVER_INDEX + _fast_shortstr(consumer_tag) + _I64.pack(delivery_tag)
                   + (b"\x01" if redelivered else b"\x00") + _fast_shortstr(exchange) + _fast_shortstr(routing_key))
    except (_Slow, struct.error):
        return method_frame(channel, build(commands.Basic.Deliver, consumer_tag, delivery_tag, redelivered, exchange,
                                           routing_key))
    return _frame(FRAME_METHOD, channel, payload)


def content_frames(channel: int, properties: commands.Basic.Properties, payload: bytes,
                   frame_max: int) -> bytes:
    """Content header + body frames, bodies split so no frame exceeds frame_max."""
    out = [_frame(FRAME_HEADER, channel, _content_header_payload(properties, len(payload)))]
    if payload:
        chunk = max(frame_max - FRAME_OVERHEAD, 1) if frame_max else len(payload)
        view = memoryview(payload)
        for start in range(0, len(payload), chunk):
            out.append(_frame(FRAME_BODY, channel, bytes(view[start:start + chunk])))
    return b"".join(out)


_ACK_FRAME = struct.Struct(">BHIIqBB")   # frame header, basic.ack's index, tag, bits, frame-end
_ACK_INDEX_INT = commands.Basic.Ack.index


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """method_frame(channel, basic.ack(delivery_tag, multiple)) written directly (a publisher
    confirm per batch of publishes)."""
    try:
        return _ACK_FRAME.pack(FRAME_METHOD, channel, 13, _ACK_INDEX_INT, delivery_tag, 1 if multiple else 0, FRAME_END)
    except struct.error:
        return method_frame(channel, commands.Basic.Ack(delivery_tag, multiple))


def heartbeat_frame() -> bytes:
    return _HEARTBEAT_BYTES


__all__ = [
    "AMQPError", "Frame", "FrameDecoder", "FrameError", "PROTOCOL_HEADER", "ack_frame", "build", "channel_error",
    "connection_error", "content_frames", "decode_content_header", "decode_method", "deliver_frame", "heartbeat_frame",
    "method_frame",
]
