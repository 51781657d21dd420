"""MQTT 5.0 properties (§2.2.2): identifiers, types, where each is allowed, encode and decode.

`Properties` stores only what is set: unset properties read as None (lists read as empty), so
the common case -- a packet with no properties -- costs one tiny object.
"""
from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any

from .reasons import MalformedPacket, ProtocolError


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


# Data types (§1.5)
BYTE, TWO_BYTE_INT, FOUR_BYTE_INT, VARINT, UTF8, BINARY, UTF8_PAIR = range(7)

# Packet type numbers (§2.1.2); WILL is a pseudo type for the will properties of CONNECT.
WILL = 0
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = range(8, 16)

_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)
_ALL_USER = (CONNECT, CONNACK, PUBLISH, WILL, *_ACKS, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK,
             DISCONNECT, AUTH)

# id: (attribute, type, packets where allowed, value check)
# value check: None, "bool" (0 or 1 only), "nonzero" -- violations are protocol errors (§3.x).
_SPEC: dict[int, tuple[str, int, tuple[int, ...], str | None]] = {
    0x01: ("payload_format_indicator", BYTE, (PUBLISH, WILL), "bool"),
    0x02: ("message_expiry_interval", FOUR_BYTE_INT, (PUBLISH, WILL), None),
    0x03: ("content_type", UTF8, (PUBLISH, WILL), None),
    0x08: ("response_topic", UTF8, (PUBLISH, WILL), None),
    0x09: ("correlation_data", BINARY, (PUBLISH, WILL), None),
    0x0B: ("subscription_identifiers", VARINT, (PUBLISH, SUBSCRIBE), "nonzero"),
    0x11: ("session_expiry_interval", FOUR_BYTE_INT, (CONNECT, CONNACK, DISCONNECT), None),
    0x12: ("assigned_client_identifier", UTF8, (CONNACK,), None),
    0x13: ("server_keep_alive", TWO_BYTE_INT, (CONNACK,), None),
    0x15: ("authentication_method", UTF8, (CONNECT, CONNACK, AUTH), None),
    0x16: ("authentication_data", BINARY, (CONNECT, CONNACK, AUTH), None),
    0x17: ("request_problem_information", BYTE, (CONNECT,), "bool"),
    0x18: ("will_delay_interval", FOUR_BYTE_INT, (WILL,), None),
    0x19: ("request_response_information", BYTE, (CONNECT,), "bool"),
    0x1A: ("response_information", UTF8, (CONNACK,), None),
    0x1C: ("server_reference", UTF8, (CONNACK, DISCONNECT), None),
    0x1F: ("reason_string", UTF8, (CONNACK, *_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH), None),
    0x21: ("receive_maximum", TWO_BYTE_INT, (CONNECT, CONNACK), "nonzero"),
    0x22: ("topic_alias_maximum", TWO_BYTE_INT, (CONNECT, CONNACK), None),
    0x23: ("topic_alias", TWO_BYTE_INT, (PUBLISH,), "nonzero"),
    0x24: ("maximum_qos", BYTE, (CONNACK,), "bool"),
    0x25: ("retain_available", BYTE, (CONNACK,), "bool"),
    0x26: ("user_properties", UTF8_PAIR, _ALL_USER, None),
    0x27: ("maximum_packet_size", FOUR_BYTE_INT, (CONNECT, CONNACK), "nonzero"),
    0x28: ("wildcard_subscription_available", BYTE, (CONNACK,), "bool"),
    0x29: ("subscription_identifier_available", BYTE, (CONNACK,), "bool"),
    0x2A: ("shared_subscription_available", BYTE, (CONNACK,), "bool"),
}
assert set(_SPEC) == {p.value for p in PropertyId}

# Per packet type: {id: (attr, type, check)} of the properties it may carry.
ALLOWED: dict[int, dict[int, tuple[str, int, str | None]]] = {t: {} for t in range(16)}
for _pid, (_attr, _typ, _where, _chk) in _SPEC.items():
    for _t in _where:
        ALLOWED[_t][_pid] = (_attr, _typ, _chk)

# attribute -> (id, type, check) for encoding
_BY_ATTR: dict[str, tuple[int, int, str | None]] = {a: (i, t, c) for i, (a, t, _, c) in _SPEC.items()}
_LISTS = ("user_properties", "subscription_identifiers")  # the repeatable ones
_MAX_VARINT = 268_435_455


class Properties:
    """The properties of one packet. Construct with keyword arguments named after §2.2.2.2:
    ``Properties(receive_maximum=10, user_properties=[("k", "v")])``.

    `user_properties` is a list of (key, value) pairs in wire order, duplicates kept.
    `subscription_identifiers` is a list: PUBLISH may carry several (one per matching
    subscription), SUBSCRIBE at most one.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None
    user_properties: list[tuple[str, str]]
    subscription_identifiers: list[int]

    def __init__(self, **values: Any):
        if not values:
            # Most packets have no properties: one is built for every decoded PUBLISH and ack.
            self.user_properties = []
            self.subscription_identifiers = []
            return
        self.user_properties = list(values.pop("user_properties", None) or ())
        self.subscription_identifiers = list(values.pop("subscription_identifiers", None) or ())
        for name, value in values.items():
            if name not in _BY_ATTR:
                raise TypeError(f"unknown MQTT property {name!r}")
            if value is not None:
                setattr(self, name, value)

    def is_empty(self) -> bool:
        """Nothing set (cheaper than bool(), which builds the dict of set values)."""
        d = self.__dict__
        return len(d) == 2 and not d["user_properties"] and not d["subscription_identifiers"]

    def set_values(self) -> dict[str, Any]:
        """The properties that are set (non-None, non-empty lists), in identifier order."""
        d = {k: v for k, v in vars(self).items() if v is not None and v != []}
        return dict(sorted(d.items(), key=lambda kv: _BY_ATTR[kv[0]][0] if kv[0] in _BY_ATTR else 0))

    def __bool__(self) -> bool:
        return bool(self.set_values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Properties):
            return NotImplemented
        return self.set_values() == other.set_values()

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.set_values().items())
        return f"Properties({inner})"


# --- encoding -----------------------------------------------------------------------------------
_pack_H = struct.Struct(">H").pack
_pack_I = struct.Struct(">I").pack


def encode_varint(n: int) -> bytes:
    if n < 0x80:
        if n < 0:
            raise ValueError(f"variable byte integer {n} is negative")
        return bytes((n,))
    if n > _MAX_VARINT:
        raise ValueError(f"variable byte integer {n} exceeds {_MAX_VARINT}")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_str(s: str) -> bytes:
    """UTF-8 string (§1.5.4): two-byte length, well-formed UTF-8, no U+0000."""
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates
        raise ValueError(f"string {s!r} is not encodable as UTF-8: {e}") from None
    if len(b) > 0xFFFF:
        raise ValueError(f"string of {len(b)} bytes exceeds 65535")
    if "\x00" in s:
        raise ValueError(f"string {s!r} contains U+0000, which MQTT forbids")
    return _pack_H(len(b)) + b


def encode_bin(b: bytes) -> bytes:
    if len(b) > 0xFFFF:
        raise ValueError(f"binary data of {len(b)} bytes exceeds 65535")
    return _pack_H(len(b)) + bytes(b)


def _encode_value(name: str, typ: int, check: str | None, v: Any) -> bytes:
    if typ == UTF8:
        return encode_str(v)
    if typ == BINARY:
        return encode_bin(v)
    if check == "bool" and v not in (0, 1):
        raise ValueError(f"property {name} must be 0 or 1, not {v!r}")
    if check == "nonzero" and v == 0:
        raise ValueError(f"property {name} must not be 0")
    if typ == BYTE:
        if not 0 <= v <= 0xFF:
            raise ValueError(f"property {name}={v} does not fit a byte")
        return bytes((v,))
    if typ == TWO_BYTE_INT:
        if not 0 <= v <= 0xFFFF:
            raise ValueError(f"property {name}={v} does not fit two bytes")
        return _pack_H(v)
    if typ == FOUR_BYTE_INT:
        if not 0 <= v <= 0xFFFFFFFF:
            raise ValueError(f"property {name}={v} does not fit four bytes")
        return _pack_I(v)
    return encode_varint(v)  # VARINT


def encode_properties(props: Properties | None, packet_type: int) -> bytes:
    """Property length + properties. Raises ValueError for a property not allowed on the packet."""
    if props is None:
        return b"\x00"
    d = vars(props)
    # Fast path: nothing set except the two always-present (empty) lists.
    if len(d) == 2 and not d["user_properties"] and not d["subscription_identifiers"]:
        return b"\x00"
    allowed = ALLOWED[packet_type]
    parts: list[bytes] = []
    for name, value in props.set_values().items():
        spec = _BY_ATTR.get(name)
        if spec is None:
            raise ValueError(f"unknown MQTT property {name!r}")
        pid, typ, check = spec
        if pid not in allowed:
            raise ValueError(f"property {name} is not allowed on packet type {packet_type}")
        if name == "user_properties":
            for k, val in value:
                parts.append(b"\x26" + encode_str(k) + encode_str(val))
        elif name == "subscription_identifiers":
            if packet_type == SUBSCRIBE and len(value) > 1:
                raise ValueError("SUBSCRIBE carries at most one subscription identifier")
            for sid in value:
                if not 1 <= sid <= _MAX_VARINT:
                    raise ValueError(f"subscription identifier {sid} out of range 1..{_MAX_VARINT}")
                parts.append(b"\x0b" + encode_varint(sid))
        else:
            parts.append(bytes((pid,)) + _encode_value(name, typ, check, value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


# --- decoding -----------------------------------------------------------------------------------
_unpack_H = struct.Struct(">H").unpack_from
_unpack_I = struct.Struct(">I").unpack_from


def decode_varint(mv: memoryview, pos: int, end: int) -> tuple[int, int]:
    """Variable byte integer (§1.5.5) at pos; at most 4 bytes."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise MalformedPacket("variable byte integer runs past the end of the packet")
        b = mv[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift == 28:
            raise MalformedPacket("variable byte integer longer than 4 bytes")


def decode_str(mv: memoryview, pos: int, end: int) -> tuple[str, int]:
    """UTF-8 string (§1.5.4). Python's strict UTF-8 decoder already refuses surrogates and
    overlong forms, which MQTT forbids; U+0000 is checked here."""
    if pos + 2 > end:
        raise MalformedPacket("string length runs past the end of the packet")
    stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if stop > end:
        raise MalformedPacket("string runs past the end of the packet")
    try:
        s = str(mv[pos + 2:stop], "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("string is not well-formed UTF-8") from None
    if "\x00" in s:
        raise MalformedPacket("string contains U+0000")
    return s, stop


def decode_bin(mv: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("binary length runs past the end of the packet")
    stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if stop > end:
        raise MalformedPacket("binary data runs past the end of the packet")
    return bytes(mv[pos + 2:stop]), stop


def decode_properties(mv: memoryview, pos: int, end: int, packet_type: int) -> tuple[Properties, int]:
    """Property length + properties at pos; returns (Properties, position after them)."""
    if pos >= end:
        raise MalformedPacket("missing property length")
    b = mv[pos]
    if b < 0x80:
        length, pos = b, pos + 1
    else:
        length, pos = decode_varint(mv, pos, end)
    props = Properties()
    if length == 0:
        return props, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("properties run past the end of the packet")
    allowed = ALLOWED[packet_type]
    d = vars(props)
    while pos < stop:
        pid = mv[pos]
        if pid >= 0x80:  # identifiers are varints, but none defined needs more than one byte
            raise MalformedPacket(f"unknown property identifier (varint starting {pid:#04x})")
        pos += 1
        spec = allowed.get(pid)
        if spec is None:
            # §2.2.2.2: an identifier not valid for the packet type is a Malformed Packet.
            raise MalformedPacket(f"property {pid:#04x} is not allowed on packet type {packet_type}")
        name, typ, check = spec
        if typ == UTF8_PAIR:
            k, pos = decode_str(mv, pos, stop)
            v, pos = decode_str(mv, pos, stop)
            props.user_properties.append((k, v))
            continue
        if typ == BYTE:
            if pos >= stop:
                raise MalformedPacket(f"property {name} runs past the end")
            value: Any = mv[pos]
            pos += 1
        elif typ == TWO_BYTE_INT:
            if pos + 2 > stop:
                raise MalformedPacket(f"property {name} runs past the end")
            value = (mv[pos] << 8) | mv[pos + 1]
            pos += 2
        elif typ == FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise MalformedPacket(f"property {name} runs past the end")
            value = _unpack_I(mv, pos)[0]
            pos += 4
        elif typ == UTF8:
            value, pos = decode_str(mv, pos, stop)
        elif typ == BINARY:
            value, pos = decode_bin(mv, pos, stop)
        else:  # VARINT: only the subscription identifier
            value, pos = decode_varint(mv, pos, stop)
        if check == "bool":
            if value > 1:
                raise ProtocolError(f"property {name} must be 0 or 1, got {value}")
        elif check == "nonzero" and value == 0:
            raise ProtocolError(f"property {name} must not be 0")
        if typ == VARINT:
            sids = props.subscription_identifiers
            if sids and packet_type != PUBLISH:
                raise ProtocolError("subscription identifier given more than once")
            sids.append(value)
            continue
        if name in d:
            raise ProtocolError(f"property {name} given more than once")
        d[name] = value
    if pos != stop:
        raise MalformedPacket("a property runs past the property length")
    return props, pos
