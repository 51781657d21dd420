"""Sans-I/O MQTT 3.1.1 / 5.0 codec (OASIS MQTT 3.1.1 and 5.0).

Nothing here touches a socket: `encode(packet, version)` turns a packet into bytes and
`Decoder` turns bytes, fed in whatever chunks the transport delivers, back into packets.

    dec = Decoder(max_packet_size=1 << 20)       # server side: version learned from CONNECT
    dec.feed(data)
    while (pkt := dec.next_packet()) is not None:
        ...

Errors raised for bad input carry the v5 reason code to answer with (`MQTTError.reason_code`);
after an error the decoder stays failed (the connection must be closed).

Version numbers are the protocol levels: 3 (3.1, "MQIsdp", decoded like 3.1.1), 4 (3.1.1), 5.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterator, Union

from . import properties as P
from .properties import (
    Properties,
    decode_bin,
    decode_properties,
    decode_str,
    encode_bin,
    encode_properties,
    encode_str,
    encode_varint,
)
from .reasons import (
    AUTH_CODES,
    BY_VALUE,
    CONNACK_CODES,
    DISCONNECT_CODES,
    PUBACK_CODES,
    PUBREL_CODES,
    SUBACK_CODES,
    UNSUBACK_CODES,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    ReasonCode,
    UnsupportedProtocolVersion,
    connack_code_from_v3,
    connack_code_v3,
    suback_code_v3,
)

__all__ = [
    "MQTT_3_1", "MQTT_3_1_1", "MQTT_5", "MAX_REMAINING_LENGTH", "PacketType",
    "Connect", "Will", "Connack", "Publish", "Puback", "Pubrec", "Pubrel", "Pubcomp",
    "Subscribe", "Subscription", "Suback", "Unsubscribe", "Unsuback", "Pingreq", "Pingresp",
    "Disconnect", "Auth", "Packet", "Properties", "ReasonCode",
    "encode", "encode_ack_ok", "encode_publish_plain", "Decoder", "MQTTError", "MalformedPacket", "ProtocolError", "PacketTooLarge",
    "UnsupportedProtocolVersion",
]

MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5
MAX_REMAINING_LENGTH = 268_435_455
# Largest whole packet: 1 type byte + 4 length bytes + the largest remaining length.
MAX_PACKET_SIZE = 1 + 4 + MAX_REMAINING_LENGTH


class PacketType:
    CONNECT = P.CONNECT
    CONNACK = P.CONNACK
    PUBLISH = P.PUBLISH
    PUBACK = P.PUBACK
    PUBREC = P.PUBREC
    PUBREL = P.PUBREL
    PUBCOMP = P.PUBCOMP
    SUBSCRIBE = P.SUBSCRIBE
    SUBACK = P.SUBACK
    UNSUBSCRIBE = P.UNSUBSCRIBE
    UNSUBACK = P.UNSUBACK
    PINGREQ = P.PINGREQ
    PINGRESP = P.PINGRESP
    DISCONNECT = P.DISCONNECT
    AUTH = P.AUTH


# --- packets ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT. The protocol level is the `version` given to encode(); a decoded CONNECT
    records what the client asked for in `protocol_level` / `protocol_name`."""

    TYPE: ClassVar[int] = P.CONNECT
    client_id: str = ""
    clean_start: bool = True  # "clean session" in 3.1.1
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)
    protocol_level: int = MQTT_5
    protocol_name: str = "MQTT"


@dataclass(slots=True)
class Connack:
    TYPE: ClassVar[int] = P.CONNACK
    session_present: bool = False
    reason_code: ReasonCode = ReasonCode.SUCCESS  # v3.1.1 return codes are mapped, see reasons.py
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    TYPE: ClassVar[int] = P.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # required (1..65535) when qos > 0, None when qos == 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Puback:
    TYPE: ClassVar[int] = P.PUBACK
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubrec:
    TYPE: ClassVar[int] = P.PUBREC
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubrel:
    TYPE: ClassVar[int] = P.PUBREL
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubcomp:
    TYPE: ClassVar[int] = P.PUBCOMP
    packet_id: int
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (§3.8.3.1); the v5-only options
    must stay at their defaults for 3.1.1."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0 send retained, 1 only if new subscription, 2 never


@dataclass(slots=True)
class Subscribe:
    """Topic filter syntax ('#' last, '+' alone in a level) is not checked here: a bad filter
    is answered per filter with SUBACK 0x8F / 0x80, not by closing the connection."""

    TYPE: ClassVar[int] = P.SUBSCRIBE
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Suback:
    TYPE: ClassVar[int] = P.SUBACK
    packet_id: int
    reason_codes: list[ReasonCode]  # 3.1.1: granted QoS 0..2, or 0x80 (any error maps to it)
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    TYPE: ClassVar[int] = P.UNSUBSCRIBE
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsuback:
    TYPE: ClassVar[int] = P.UNSUBACK
    packet_id: int
    reason_codes: list[ReasonCode] = field(default_factory=list)  # v5 only; 3.1.1 has none
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pingreq:
    TYPE: ClassVar[int] = P.PINGREQ


@dataclass(slots=True)
class Pingresp:
    TYPE: ClassVar[int] = P.PINGRESP


@dataclass(slots=True)
class Disconnect:
    TYPE: ClassVar[int] = P.DISCONNECT
    reason_code: ReasonCode = ReasonCode.NORMAL_DISCONNECTION  # v5 only
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    """v5 only (enhanced authentication)."""

    TYPE: ClassVar[int] = P.AUTH
    reason_code: ReasonCode = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


Packet = Union[Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback,
               Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth]


# --- encoding -----------------------------------------------------------------------------------
_pack_H = struct.Struct(">H").pack
_PINGREQ_BYTES = b"\xc0\x00"
_PINGRESP_BYTES = b"\xd0\x00"
_WILDCARDS = frozenset("+#")


def _fixed(first: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((first, n)) + body
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"packet body of {n} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}")
    return bytes((first,)) + encode_varint(n) + body


def _check_packet_id(pid: object) -> None:
    if not isinstance(pid, int) or not 1 <= pid <= 0xFFFF:
        raise ValueError(f"packet identifier must be 1..65535, got {pid!r}")


def _check_qos(qos: object) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")


def _check_rc(rc: int, allowed: frozenset[ReasonCode], what: str) -> None:
    if rc not in allowed:
        raise ValueError(f"reason code {int(rc):#04x} is not valid in {what}")


def _enc_connect(p: Connect, v: int) -> bytes:
    if v == MQTT_3_1:
        head = b"\x00\x06MQIsdp\x03"
    else:
        head = b"\x00\x04MQTT" + bytes((v,))
    flags = 0x02 if p.clean_start else 0
    w = p.will
    if w is not None:
        _check_qos(w.qos)
        flags |= 0x04 | (w.qos << 3) | (0x20 if w.retain else 0)
    if p.password is not None:
        if v < MQTT_5 and p.username is None:
            raise ValueError("MQTT 3.1.1 forbids a password without a user name")
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise ValueError(f"keep alive {p.keep_alive} out of range 0..65535")
    parts = [head, bytes((flags,)), _pack_H(p.keep_alive)]
    if v == MQTT_5:
        parts.append(encode_properties(p.properties, P.CONNECT))
    parts.append(encode_str(p.client_id))
    if w is not None:
        if v == MQTT_5:
            parts.append(encode_properties(w.properties, P.WILL))
        if not w.topic or _WILDCARDS.intersection(w.topic):
            raise ValueError(f"will topic {w.topic!r} must be non-empty and without wildcards")
        parts.append(encode_str(w.topic))
        parts.append(encode_bin(w.payload))
    if p.username is not None:
        parts.append(encode_str(p.username))
    if p.password is not None:
        parts.append(encode_bin(p.password))
    return _fixed(0x10, b"".join(parts))


def _enc_connack(p: Connack, v: int) -> bytes:
    if v == MQTT_5:
        _check_rc(p.reason_code, CONNACK_CODES, "CONNACK")
        body = (b"\x01" if p.session_present else b"\x00") + bytes((p.reason_code,)) \
            + encode_properties(p.properties, P.CONNACK)
        return _fixed(0x20, body)
    return bytes((0x20, 2, 1 if p.session_present else 0, connack_code_v3(p.reason_code)))


def _enc_publish(p: Publish, v: int) -> bytes:
    qos = p.qos
    first = 0x30 | (qos << 1) | (0x01 if p.retain else 0)
    if qos:
        if qos not in (1, 2):
            raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")
        _check_packet_id(p.packet_id)
        if p.dup:
            first |= 0x08
    elif p.dup:
        raise ValueError("DUP must be 0 for QoS 0 messages")
    topic = p.topic
    if "+" in topic or "#" in topic:
        raise ValueError(f"topic name {topic!r} contains a wildcard")
    if not topic and (v < MQTT_5 or p.properties.topic_alias is None):
        raise ValueError("empty topic name requires a topic alias (MQTT 5)")
    parts = [encode_str(topic)]
    if qos:
        parts.append(_pack_H(p.packet_id))  # type: ignore[arg-type]
    if v == MQTT_5:
        parts.append(encode_properties(p.properties, P.PUBLISH))
    parts.append(p.payload)
    return _fixed(first, b"".join(parts))


def _enc_ack(first: int, allowed: frozenset[ReasonCode], ptype: int, name: str) -> Callable[[object, int], bytes]:
    def enc(p: Puback, v: int) -> bytes:  # type: ignore[type-arg]
        _check_packet_id(p.packet_id)
        pid = _pack_H(p.packet_id)
        if v < MQTT_5:
            return bytes((first, 2)) + pid
        rc = p.reason_code
        _check_rc(rc, allowed, name)
        props = encode_properties(p.properties, ptype)
        if props == b"\x00":
            # §3.4.2.1: the reason code (and property length) may be omitted when 0 / empty.
            if rc == 0:
                return bytes((first, 2)) + pid
            return bytes((first, 3)) + pid + bytes((rc,))
        return _fixed(first, pid + bytes((rc,)) + props)
    return enc  # type: ignore[return-value]


def _enc_subscribe(p: Subscribe, v: int) -> bytes:
    _check_packet_id(p.packet_id)
    if not p.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one topic filter")
    parts = [_pack_H(p.packet_id)]
    if v == MQTT_5:
        parts.append(encode_properties(p.properties, P.SUBSCRIBE))
    for s in p.subscriptions:
        _check_qos(s.qos)
        opts = s.qos
        if v == MQTT_5:
            if s.retain_handling not in (0, 1, 2):
                raise ValueError(f"retain handling must be 0..2, got {s.retain_handling!r}")
            opts |= (0x04 if s.no_local else 0) | (0x08 if s.retain_as_published else 0) \
                | (s.retain_handling << 4)
        elif s.no_local or s.retain_as_published or s.retain_handling:
            raise ValueError("no_local / retain_as_published / retain_handling need MQTT 5")
        parts.append(encode_str(s.topic_filter))
        parts.append(bytes((opts,)))
    return _fixed(0x82, b"".join(parts))


def _enc_suback(p: Suback, v: int) -> bytes:
    _check_packet_id(p.packet_id)
    if v == MQTT_5:
        for rc in p.reason_codes:
            _check_rc(rc, SUBACK_CODES, "SUBACK")
        body = _pack_H(p.packet_id) + encode_properties(p.properties, P.SUBACK) + bytes(p.reason_codes)
    else:
        body = _pack_H(p.packet_id) + bytes(suback_code_v3(rc) for rc in p.reason_codes)
    return _fixed(0x90, body)


def _enc_unsubscribe(p: Unsubscribe, v: int) -> bytes:
    _check_packet_id(p.packet_id)
    if not p.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [_pack_H(p.packet_id)]
    if v == MQTT_5:
        parts.append(encode_properties(p.properties, P.UNSUBSCRIBE))
    parts.extend(encode_str(f) for f in p.topic_filters)
    return _fixed(0xA2, b"".join(parts))


def _enc_unsuback(p: Unsuback, v: int) -> bytes:
    _check_packet_id(p.packet_id)
    if v < MQTT_5:
        return b"\xb0\x02" + _pack_H(p.packet_id)
    for rc in p.reason_codes:
        _check_rc(rc, UNSUBACK_CODES, "UNSUBACK")
    return _fixed(0xB0, _pack_H(p.packet_id) + encode_properties(p.properties, P.UNSUBACK)
                  + bytes(p.reason_codes))


def _enc_disconnect(p: Disconnect, v: int) -> bytes:
    if v < MQTT_5:
        return b"\xe0\x00"
    _check_rc(p.reason_code, DISCONNECT_CODES, "DISCONNECT")
    props = encode_properties(p.properties, P.DISCONNECT)
    if props == b"\x00":
        if p.reason_code == 0:
            return b"\xe0\x00"
        return bytes((0xE0, 1, p.reason_code))
    return _fixed(0xE0, bytes((p.reason_code,)) + props)


def _enc_auth(p: Auth, v: int) -> bytes:
    if v < MQTT_5:
        raise ValueError("AUTH exists only in MQTT 5")
    _check_rc(p.reason_code, AUTH_CODES, "AUTH")
    props = encode_properties(p.properties, P.AUTH)
    if props == b"\x00" and p.reason_code == 0:
        return b"\xf0\x00"
    return _fixed(0xF0, bytes((p.reason_code,)) + props)


_ENCODERS: dict[type, Callable[[object, int], bytes]] = {
    Connect: _enc_connect,  # type: ignore[dict-item]
    Connack: _enc_connack,  # type: ignore[dict-item]
    Publish: _enc_publish,  # type: ignore[dict-item]
    Puback: _enc_ack(0x40, PUBACK_CODES, P.PUBACK, "PUBACK"),
    Pubrec: _enc_ack(0x50, PUBACK_CODES, P.PUBREC, "PUBREC"),
    Pubrel: _enc_ack(0x62, PUBREL_CODES, P.PUBREL, "PUBREL"),
    Pubcomp: _enc_ack(0x70, PUBREL_CODES, P.PUBCOMP, "PUBCOMP"),
    Subscribe: _enc_subscribe,  # type: ignore[dict-item]
    Suback: _enc_suback,  # type: ignore[dict-item]
    Unsubscribe: _enc_unsubscribe,  # type: ignore[dict-item]
    Unsuback: _enc_unsuback,  # type: ignore[dict-item]
    Pingreq: lambda p, v: _PINGREQ_BYTES,
    Pingresp: lambda p, v: _PINGRESP_BYTES,
    Disconnect: _enc_disconnect,  # type: ignore[dict-item]
    Auth: _enc_auth,  # type: ignore[dict-item]
}


# --- fast paths for the per-message packets --------------------------------------------------------
# Byte for byte what encode() gives for the same packet (tests/unit/test_mqtt_fastcodec.py checks
# that with hypothesis); the session uses them where a message needs no properties, so the hot
# path builds no Publish / Puback / Properties objects.
_pack_ack = struct.Struct(">BBH").pack
_TOPIC_CACHE_MAX = 4096
_TOPIC_CACHE_LEN = 512
_topic_cache: dict[str, bytes] = {}


def encode_ack_ok(first: int, packet_id: int) -> bytes:
    """PUBACK (0x40) / PUBREC (0x50) / PUBCOMP (0x70) / PUBREL (0x62) with reason code 0 and no
    properties: the same two bytes + packet id for every protocol level."""
    if not 1 <= packet_id <= 0xFFFF:
        raise ValueError(f"packet identifier must be 1..65535, got {packet_id!r}")
    return _pack_ack(first, 2, packet_id)


def _topic_bytes(topic: str) -> bytes:
    """Length-prefixed topic name, validated as _enc_publish does; remembered per topic."""
    b = _topic_cache.get(topic)
    if b is None:
        if not topic:
            raise ValueError("empty topic name requires a topic alias (MQTT 5)")
        if "+" in topic or "#" in topic:
            raise ValueError(f"topic name {topic!r} contains a wildcard")
        b = encode_str(topic)
        if len(topic) <= _TOPIC_CACHE_LEN:     # bounded memory whatever clients publish
            if len(_topic_cache) >= _TOPIC_CACHE_MAX:
                _topic_cache.clear()
            _topic_cache[topic] = b
    return b


def _publish_head(topic: str, qos: int, retain: bool, packet_id: int | None) -> tuple[int, bytes]:
    """A PUBLISH's first byte and its topic name and packet identifier as encode() writes them
    (the fast encoders' shared start; same errors as encode())."""
    first = 0x30 | (qos << 1) | (0x01 if retain else 0)
    t = _topic_bytes(topic)
    if qos:
        if qos not in (1, 2):
            raise ValueError(f"QoS must be 0, 1 or 2, got {qos!r}")
        if not isinstance(packet_id, int) or not 1 <= packet_id <= 0xFFFF:
            raise ValueError(f"packet identifier must be 1..65535, got {packet_id!r}")
        t += _pack_H(packet_id)
    return first, t


_pack_BBB = struct.Struct(">BBB").pack
_pack_HB = struct.Struct(">HB").pack


def encode_publish_plain(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int | None,
                         version: int) -> bytes:
    """encode(Publish(topic, payload, qos, retain, False, packet_id, Properties()), version)."""
    t = _topic_cache.get(topic)
    if t is not None and qos == 1 and isinstance(packet_id, int) and 1 <= packet_id <= 0xFFFF:
        # The usual delivery: a known topic, QoS 1, a body of 128 B .. 16 KiB -- the same bytes
        # as below, in one join.
        n = len(t) + len(payload)
        if version == MQTT_5:
            n += 3
            tail = _pack_HB(packet_id, 0)
        else:
            n += 2
            tail = _pack_H(packet_id)
        if 0x80 <= n < 0x4000:
            return b"".join((_pack_BBB(0x33 if retain else 0x32, (n & 0x7F) | 0x80, n >> 7), t, tail, payload))
    first, head = _publish_head(topic, qos, retain, packet_id)
    if version == MQTT_5:
        head += b"\x00"
    n = len(head) + len(payload)
    if n < 0x80:
        return bytes((first, n)) + head + payload
    if n < 0x4000:      # two length bytes: payloads up to ~16 KiB
        return b"".join((bytes((first, (n & 0x7F) | 0x80, n >> 7)), head, payload))
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"packet body of {n} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}")
    return b"".join((bytes((first,)), encode_varint(n), head, payload))


_KEY_CACHE_MAX = 256
_key_cache: dict[str, bytes] = {}


def _key_bytes(key: str) -> bytes:
    """A user property's name as encode_str() writes it; the names repeat, so remembered."""
    b = _key_cache.get(key)
    if b is None:
        b = encode_str(key)
        if len(key) <= 64:
            if len(_key_cache) >= _KEY_CACHE_MAX:
                _key_cache.clear()
            _key_cache[key] = b
    return b


def encode_publish_users(topic: str, payload: bytes, qos: int, retain: bool, packet_id: int | None,
                         users: list[tuple[str, str]]) -> bytes:
    """encode(Publish(topic, payload, qos, retain, False, packet_id,
    Properties(user_properties=users)), MQTT_5): a v5 PUBLISH whose only properties are user
    properties (queue deliveries: message-id, group-id, ... -- DESIGN §4) without building
    Properties / Publish objects."""
    first, t = _publish_head(topic, qos, retain, packet_id)
    if users:
        parts = []
        for k, v in users:
            kb = _key_bytes(k)          # the name first, as encode_properties()
            try:
                vb = v.encode("utf-8")
            except (UnicodeEncodeError, AttributeError):
                vb = b""
                encode_str(v)           # raises what encode() raises
            if len(vb) > 0xFFFF or "\x00" in v:
                encode_str(v)           # raises
            parts.append(b"\x26" + kb + _pack_H(len(vb)) + vb)
        body = b"".join(parts)
        n = len(body)
        props = _short_varint(n) + body
    else:
        props = b"\x00"
    n = len(t) + len(props) + len(payload)
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"packet body of {n} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}")
    return b"".join((bytes((first,)), _short_varint(n), t, props, payload))


def _short_varint(n: int) -> bytes:
    """encode_varint(n) for n ≥ 0, the one- and two-byte forms without a loop."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    return encode_varint(n)


def encode(packet: Packet, version: int) -> bytes:
    """The wire bytes of `packet` for protocol level `version` (3, 4 or 5).

    Raises ValueError for a packet that cannot be sent as given (caller bug): out-of-range
    fields, a property not allowed on the packet, a reason code the packet cannot carry.
    3.1.1 drops v5-only fields (properties, non-CONNACK/SUBACK reason codes).
    """
    if version not in (MQTT_3_1, MQTT_3_1_1, MQTT_5):
        raise ValueError(f"unsupported MQTT protocol level {version!r}")
    try:
        enc = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    return enc(packet, version)


# --- decoding -----------------------------------------------------------------------------------
def _u16(mv: memoryview, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise MalformedPacket(f"{what} runs past the end of the packet")
    return (mv[pos] << 8) | mv[pos + 1]


def _packet_id(mv: memoryview, pos: int, end: int) -> int:
    if pos + 2 > end:
        raise MalformedPacket("packet identifier runs past the end of the packet")
    pid = (mv[pos] << 8) | mv[pos + 1]
    if pid == 0:
        raise MalformedPacket("packet identifier 0 is not allowed")
    return pid


def _reason(b: int, allowed: frozenset[ReasonCode], what: str) -> ReasonCode:
    rc = BY_VALUE.get(b)
    if rc is None:
        raise MalformedPacket(f"unknown reason code {b:#04x} in {what}")
    if rc not in allowed:
        raise ProtocolError(f"reason code {b:#04x} is not valid in {what}")
    return rc


def _no_trailing(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{end - pos} unexpected trailing bytes in {what}")


_FLAGS_REQUIRED = {  # the fixed header's low nibble for every type but PUBLISH (§2.1.3)
    P.CONNECT: 0, P.CONNACK: 0, P.PUBACK: 0, P.PUBREC: 0, P.PUBREL: 2, P.PUBCOMP: 0,
    P.SUBSCRIBE: 2, P.SUBACK: 0, P.UNSUBSCRIBE: 2, P.UNSUBACK: 0, P.PINGREQ: 0, P.PINGRESP: 0,
    P.DISCONNECT: 0, P.AUTH: 0,
}


class Decoder:
    """Incremental decoder. `feed()` bytes, then call `next_packet()` until it returns None.

    `version` is None on the server side until the first packet -- which must be a CONNECT --
    sets it; a client sets it up front. `max_packet_size` (whole packet, header included) is
    checked as soon as the fixed header is complete, before the body is buffered.
    """

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, version: int | None = None):
        if version not in (None, MQTT_3_1, MQTT_3_1_1, MQTT_5):
            raise ValueError(f"unsupported MQTT protocol level {version!r}")
        if max_packet_size < 2:
            raise ValueError("max_packet_size must be at least 2")
        self.max_packet_size = max_packet_size
        self.version = version
        self._buf = bytearray()
        self._error: MQTTError | None = None
        self.last_size = 0      # bytes of the packet next_packet() returned last

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as packets."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            return  # the connection is being closed; nothing more will be decoded
        self._buf += data

    def __iter__(self) -> Iterator[Packet]:
        while (pkt := self.next_packet()) is not None:
            yield pkt

    def next_packet(self) -> Packet | None:
        """The next complete packet, or None when more bytes are needed."""
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except MQTTError as e:
            self._error = e
            self._buf = bytearray()  # drop the input; views into the old buffer may linger
            raise

    def _take_plain_puback(self, buf: bytearray, n: int) -> int:
        """The packet id of a PUBACK of packet id only (0x40 0x02 id, id not 0) at the start of
        buf (n >= 4 bytes), taken off the buffer; 0 (nothing taken) for any other PUBACK."""
        if buf[1] != 2 or self.max_packet_size < 4:
            return 0
        pid = (buf[2] << 8) | buf[3]
        if pid:
            if n == 4:
                buf.clear()
            else:
                del buf[:4]
            self.last_size = 4
        return pid

    def next_fast(self) -> Packet | tuple | int | None:
        """next_packet() for the broker's read loop, without objects for the two packets of every
        QoS 1 message: a PUBLISH without properties comes as the tuple (topic, payload, qos,
        retain, dup, packet_id) -- its Publish(..., Properties()) -- and a PUBACK of packet id only
        as that int -- its Puback(packet_id, SUCCESS, Properties()). Anything else, and every
        packet the general parser would refuse, goes through next_packet() (same packets, same
        errors; tests/unit/test_mqtt_fastcodec.py compares the two with hypothesis)."""
        buf = self._buf
        n = len(buf)
        if n < 4 or self._error is not None or self.version is None:
            if not n and self._error is None:
                return None     # the usual end of a read: nothing left
            return self.next_packet()
        first = buf[0]
        if first == 0x40:
            pid = self._take_plain_puback(buf, n)
            return pid if pid else self.next_packet()
        if first & 0xF0 != 0x30 or first & 0x06 == 0x06:
            return self.next_packet()
        b = buf[1]
        if b < 0x80:            # remaining length in one byte or two (bodies up to 16 KiB)
            i = 2
            total = b + 2
        elif buf[2] < 0x80:
            i = 3
            total = ((b & 0x7F) | (buf[2] << 7)) + 3
        else:
            return self.next_packet()
        if n < total or total > self.max_packet_size or total < i + 3:
            return self.next_packet()
        stop = i + 2 + ((buf[i] << 8) | buf[i + 1])
        qos = (first >> 1) & 0x03
        pos = stop + 2 if qos else stop
        v5 = self.version == MQTT_5
        if stop == i + 2 or pos + v5 > total:
            return self.next_packet()
        if qos:
            pid = (buf[stop] << 8) | buf[stop + 1]
            if not pid:
                return self.next_packet()
        elif first & 0x08:
            return self.next_packet()
        else:
            pid = None
        if v5:
            if buf[pos]:
                return self.next_packet()       # properties: the general parser
            pos += 1
        try:
            topic = buf[i + 2:stop].decode()
        except UnicodeDecodeError:
            return self.next_packet()
        if "+" in topic or "#" in topic or "\x00" in topic:
            return self.next_packet()
        payload = bytes(buf[pos:total])
        if total == n:
            buf.clear()
        else:
            del buf[:total]
        self.last_size = total
        return (topic, payload, qos, bool(first & 0x01), bool(first & 0x08), pid)

    def _next(self) -> Packet | None:
        buf = self._buf
        n = len(buf)
        if not n:
            return None
        first = buf[0]
        if first == 0x40 and n >= 4 and self.version is not None:
            # PUBACK with a packet id only, every QoS 1 delivery's answer: what _puback returns
            # for these four bytes, without the general framing and parser.
            pid = self._take_plain_puback(buf, n)
            if pid:
                return Puback(pid, ReasonCode.SUCCESS, Properties())
        ptype = first >> 4
        if self.version is None and ptype != P.CONNECT:
            raise ProtocolError(f"first packet must be CONNECT, got type {ptype}")
        # Remaining length (§2.1.4), at most 4 bytes.
        length = 0
        shift = 0
        i = 1
        while True:
            if i >= n:
                return None
            b = buf[i]
            i += 1
            length |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift == 28:
                raise MalformedPacket("remaining length longer than 4 bytes")
        total = i + length
        if total > self.max_packet_size:
            raise PacketTooLarge(f"packet of {total} bytes exceeds the maximum of {self.max_packet_size}")
        if n < total:
            return None
        parse = _PARSERS.get(ptype)
        if parse is None:
            raise MalformedPacket(f"reserved packet type {ptype}")
        flags = first & 0x0F
        if ptype != P.PUBLISH and flags != _FLAGS_REQUIRED[ptype]:
            raise MalformedPacket(f"invalid fixed header flags {flags:#x} for packet type {ptype}")
        mv = memoryview(buf)
        try:
            pkt = parse(self, flags, mv, i, total)
        finally:
            # Release the view so the buffer may shrink; every slice taken while parsing was a
            # temporary and is already gone.
            mv.release()
        if total == n:
            buf.clear()
        else:
            del buf[:total]  # CPython advances the start of a bytearray in O(1)
        self.last_size = total
        return pkt

    # -- per-type parsers: (flags, view, start of variable header, end of packet) -> packet --

    def _connect(self, flags: int, mv: memoryview, pos: int, end: int) -> Connect:
        name, pos = decode_str(mv, pos, end)
        if pos >= end:
            raise MalformedPacket("CONNECT ends before the protocol level")
        level = mv[pos]
        pos += 1
        if not ((name == "MQTT" and level in (MQTT_3_1_1, MQTT_5)) or (name == "MQIsdp" and level == MQTT_3_1)):
            raise UnsupportedProtocolVersion(
                f"unsupported protocol {name!r} level {level}", protocol_name=name, protocol_level=level)
        if self.version is None:
            # Set before validating the rest so the session knows which CONNACK format to use.
            self.version = level
        if pos + 3 > end:
            raise MalformedPacket("CONNECT variable header is truncated")
        cflags = mv[pos]
        keep_alive = (mv[pos + 1] << 8) | mv[pos + 2]
        pos += 3
        if cflags & 0x01:
            raise MalformedPacket("CONNECT reserved flag is set")
        will_flag = cflags & 0x04
        will_qos = (cflags >> 3) & 0x03
        will_retain = cflags & 0x20
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise MalformedPacket("will QoS/retain set without the will flag")
        has_password = cflags & 0x40
        has_username = cflags & 0x80
        if level < MQTT_5 and has_password and not has_username:
            raise MalformedPacket("password flag set without user name flag (3.1.1)")
        if level == MQTT_5:
            props, pos = decode_properties(mv, pos, end, P.CONNECT)
            if props.authentication_data is not None and props.authentication_method is None:
                raise ProtocolError("authentication data without authentication method")
        else:
            props = Properties()
        client_id, pos = decode_str(mv, pos, end)
        clean = bool(cflags & 0x02)
        if level == MQTT_3_1 and not 1 <= len(client_id) <= 23:
            raise ProtocolError("MQTT 3.1 client identifier must be 1..23 characters",
                                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        if level == MQTT_3_1_1 and not client_id and not clean:
            # §3.1.3-8: a zero-byte client id needs clean session; answer CONNACK 0x02.
            raise ProtocolError("empty client identifier requires clean session",
                                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)
        will = None
        if will_flag:
            if level == MQTT_5:
                wprops, pos = decode_properties(mv, pos, end, P.WILL)
            else:
                wprops = Properties()
            wtopic, pos = decode_str(mv, pos, end)
            if not wtopic or _WILDCARDS.intersection(wtopic):
                raise ProtocolError(f"invalid will topic {wtopic!r}", ReasonCode.TOPIC_NAME_INVALID)
            wpayload, pos = decode_bin(mv, pos, end)
            will = Will(wtopic, wpayload, will_qos, bool(will_retain), wprops)
        username = password = None
        if has_username:
            username, pos = decode_str(mv, pos, end)
        if has_password:
            password, pos = decode_bin(mv, pos, end)
        _no_trailing(pos, end, "CONNECT")
        return Connect(client_id, clean, keep_alive, username, password, will, props, level, name)

    def _connack(self, flags: int, mv: memoryview, pos: int, end: int) -> Connack:
        if pos + 2 > end:
            raise MalformedPacket("CONNACK is truncated")
        ack_flags = mv[pos]
        if ack_flags & 0xFE:
            raise MalformedPacket("CONNACK reserved flags are set")
        code = mv[pos + 1]
        pos += 2
        if self.version == MQTT_5:
            rc = _reason(code, CONNACK_CODES, "CONNACK")
            props, pos = decode_properties(mv, pos, end, P.CONNACK)
        else:
            rc = connack_code_from_v3(code)
            props = Properties()
        _no_trailing(pos, end, "CONNACK")
        return Connack(bool(ack_flags), rc, props)

    def _publish(self, flags: int, mv: memoryview, pos: int, end: int) -> Publish:
        qos = (flags >> 1) & 0x03
        if qos == 3:
            raise MalformedPacket("PUBLISH with QoS 3")
        dup = bool(flags & 0x08)
        if dup and not qos:
            raise MalformedPacket("DUP set on a QoS 0 PUBLISH")
        # topic, inlined decode_str: this is the hot path
        if pos + 2 > end:
            raise MalformedPacket("PUBLISH topic length runs past the end")
        stop = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
        if stop > end:
            raise MalformedPacket("PUBLISH topic runs past the end")
        try:
            topic = str(mv[pos + 2:stop], "utf-8")
        except UnicodeDecodeError:
            raise MalformedPacket("PUBLISH topic is not well-formed UTF-8") from None
        pos = stop
        if "+" in topic or "#" in topic:
            raise ProtocolError(f"wildcard in PUBLISH topic {topic!r}", ReasonCode.TOPIC_NAME_INVALID)
        if "\x00" in topic:
            raise MalformedPacket("PUBLISH topic contains U+0000")
        packet_id = None
        if qos:
            packet_id = _packet_id(mv, pos, end)
            pos += 2
        if self.version == MQTT_5:
            if pos < end and mv[pos] == 0:
                props = Properties()
                pos += 1
            else:
                props, pos = decode_properties(mv, pos, end, P.PUBLISH)
            if not topic and props.topic_alias is None:
                raise ProtocolError("empty PUBLISH topic without a topic alias")
        else:
            props = Properties()
            if not topic:
                raise ProtocolError("empty PUBLISH topic")
        return Publish(topic, bytes(mv[pos:end]), qos, bool(flags & 0x01), dup, packet_id, props)

    def _ack(self, ptype: int, allowed: frozenset[ReasonCode], name: str,
             mv: memoryview, pos: int, end: int) -> tuple[int, ReasonCode, Properties]:
        if end - pos == 2:
            # The usual ack: packet id only (3.1.1, or v5 success without properties).
            pid = (mv[pos] << 8) | mv[pos + 1]
            if pid:
                return pid, ReasonCode.SUCCESS, Properties()
        pid = _packet_id(mv, pos, end)
        pos += 2
        rc = ReasonCode.SUCCESS
        props = None
        if self.version == MQTT_5 and pos < end:
            rc = _reason(mv[pos], allowed, name)
            pos += 1
            if pos < end:
                props, pos = decode_properties(mv, pos, end, ptype)
        _no_trailing(pos, end, name)
        return pid, rc, props if props is not None else Properties()

    def _puback(self, flags: int, mv: memoryview, pos: int, end: int) -> Puback:
        return Puback(*self._ack(P.PUBACK, PUBACK_CODES, "PUBACK", mv, pos, end))

    def _pubrec(self, flags: int, mv: memoryview, pos: int, end: int) -> Pubrec:
        return Pubrec(*self._ack(P.PUBREC, PUBACK_CODES, "PUBREC", mv, pos, end))

    def _pubrel(self, flags: int, mv: memoryview, pos: int, end: int) -> Pubrel:
        return Pubrel(*self._ack(P.PUBREL, PUBREL_CODES, "PUBREL", mv, pos, end))

    def _pubcomp(self, flags: int, mv: memoryview, pos: int, end: int) -> Pubcomp:
        return Pubcomp(*self._ack(P.PUBCOMP, PUBREL_CODES, "PUBCOMP", mv, pos, end))

    def _subscribe(self, flags: int, mv: memoryview, pos: int, end: int) -> Subscribe:
        pid = _packet_id(mv, pos, end)
        pos += 2
        v5 = self.version == MQTT_5
        if v5:
            props, pos = decode_properties(mv, pos, end, P.SUBSCRIBE)
        else:
            props = Properties()
        subs = []
        while pos < end:
            topic_filter, pos = decode_str(mv, pos, end)
            if pos >= end:
                raise MalformedPacket("SUBSCRIBE topic filter without subscription options")
            opts = mv[pos]
            pos += 1
            qos = opts & 0x03
            if qos == 3:
                raise MalformedPacket("subscription with QoS 3")
            if v5:
                if opts & 0xC0:
                    raise MalformedPacket("subscription options reserved bits are set")
                retain_handling = (opts >> 4) & 0x03
                if retain_handling == 3:
                    raise ProtocolError("retain handling 3")
                no_local = bool(opts & 0x04)
                if no_local and topic_filter.startswith("$share/"):
                    raise ProtocolError("no local on a shared subscription")
                subs.append(Subscription(topic_filter, qos, no_local, bool(opts & 0x08), retain_handling))
            else:
                if opts & 0xFC:
                    raise MalformedPacket("subscription options reserved bits are set")
                subs.append(Subscription(topic_filter, qos))
        if not subs:
            raise ProtocolError("SUBSCRIBE without topic filters")
        return Subscribe(pid, subs, props)

    def _suback(self, flags: int, mv: memoryview, pos: int, end: int) -> Suback:
        pid = _packet_id(mv, pos, end)
        pos += 2
        if self.version == MQTT_5:
            props, pos = decode_properties(mv, pos, end, P.SUBACK)
            codes = [_reason(b, SUBACK_CODES, "SUBACK") for b in mv[pos:end]]
        else:
            props = Properties()
            codes = []
            for b in mv[pos:end]:
                if b not in (0, 1, 2, 0x80):
                    raise MalformedPacket(f"invalid 3.1.1 SUBACK return code {b:#04x}")
                codes.append(BY_VALUE[b])
        if not codes:
            raise ProtocolError("SUBACK without return codes")
        return Suback(pid, codes, props)

    def _unsubscribe(self, flags: int, mv: memoryview, pos: int, end: int) -> Unsubscribe:
        pid = _packet_id(mv, pos, end)
        pos += 2
        if self.version == MQTT_5:
            props, pos = decode_properties(mv, pos, end, P.UNSUBSCRIBE)
        else:
            props = Properties()
        filters = []
        while pos < end:
            f, pos = decode_str(mv, pos, end)
            filters.append(f)
        if not filters:
            raise ProtocolError("UNSUBSCRIBE without topic filters")
        return Unsubscribe(pid, filters, props)

    def _unsuback(self, flags: int, mv: memoryview, pos: int, end: int) -> Unsuback:
        pid = _packet_id(mv, pos, end)
        pos += 2
        if self.version != MQTT_5:
            _no_trailing(pos, end, "UNSUBACK")
            return Unsuback(pid)
        props, pos = decode_properties(mv, pos, end, P.UNSUBACK)
        codes = [_reason(b, UNSUBACK_CODES, "UNSUBACK") for b in mv[pos:end]]
        if not codes:
            raise ProtocolError("UNSUBACK without reason codes")
        return Unsuback(pid, codes, props)

    def _pingreq(self, flags: int, mv: memoryview, pos: int, end: int) -> Pingreq:
        _no_trailing(pos, end, "PINGREQ")
        return Pingreq()

    def _pingresp(self, flags: int, mv: memoryview, pos: int, end: int) -> Pingresp:
        _no_trailing(pos, end, "PINGRESP")
        return Pingresp()

    def _disconnect(self, flags: int, mv: memoryview, pos: int, end: int) -> Disconnect:
        if self.version != MQTT_5:
            _no_trailing(pos, end, "DISCONNECT")
            return Disconnect()
        rc = ReasonCode.NORMAL_DISCONNECTION
        props = None
        if pos < end:
            rc = _reason(mv[pos], DISCONNECT_CODES, "DISCONNECT")
            pos += 1
            if pos < end:
                props, pos = decode_properties(mv, pos, end, P.DISCONNECT)
        _no_trailing(pos, end, "DISCONNECT")
        return Disconnect(rc, props if props is not None else Properties())

    def _auth(self, flags: int, mv: memoryview, pos: int, end: int) -> Auth:
        if self.version != MQTT_5:
            raise MalformedPacket("AUTH packet (type 15) is reserved before MQTT 5")
        rc = ReasonCode.SUCCESS
        props = None
        if pos < end:
            rc = _reason(mv[pos], AUTH_CODES, "AUTH")
            pos += 1
            # The spec omits the property length only together with the reason code; a missing
            # one after a reason code is read as empty, as for DISCONNECT (lenient, harmless).
            if pos < end:
                props, pos = decode_properties(mv, pos, end, P.AUTH)
        _no_trailing(pos, end, "AUTH")
        return Auth(rc, props if props is not None else Properties())


_PARSERS: dict[int, Callable[..., Packet]] = {
    P.CONNECT: Decoder._connect, P.CONNACK: Decoder._connack, P.PUBLISH: Decoder._publish,
    P.PUBACK: Decoder._puback, P.PUBREC: Decoder._pubrec, P.PUBREL: Decoder._pubrel,
    P.PUBCOMP: Decoder._pubcomp, P.SUBSCRIBE: Decoder._subscribe, P.SUBACK: Decoder._suback,
    P.UNSUBSCRIBE: Decoder._unsubscribe, P.UNSUBACK: Decoder._unsuback,
    P.PINGREQ: Decoder._pingreq, P.PINGRESP: Decoder._pingresp,
    P.DISCONNECT: Decoder._disconnect, P.AUTH: Decoder._auth,
}
