"""MQTT 5.0 reason codes (OASIS MQTT 5.0 §2.4), their v3.1.1 equivalents, and codec errors.

The errors live here, not in codec.py, because properties.py raises them too.
"""
from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """Every MQTT 5.0 reason code. Aliases share a value where the spec names it twice."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

    @property
    def is_error(self) -> bool:
        return self.value >= 0x80


# value -> member, faster than ReasonCode(value) on the decode path and never raises.
BY_VALUE: dict[int, ReasonCode] = {rc.value: rc for rc in ReasonCode}

# Which reason codes each packet may carry (MQTT 5.0 §3.x.2.1). Keyed by packet type number.
_R = ReasonCode
CONNACK_CODES = frozenset({
    _R.SUCCESS, _R.UNSPECIFIED_ERROR, _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR,
    _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.UNSUPPORTED_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID, _R.BAD_USER_NAME_OR_PASSWORD, _R.NOT_AUTHORIZED,
    _R.SERVER_UNAVAILABLE, _R.SERVER_BUSY, _R.BANNED, _R.BAD_AUTHENTICATION_METHOD,
    _R.TOPIC_NAME_INVALID, _R.PACKET_TOO_LARGE, _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID,
    _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED, _R.USE_ANOTHER_SERVER, _R.SERVER_MOVED,
    _R.CONNECTION_RATE_EXCEEDED,
})
PUBACK_CODES = frozenset({  # PUBACK and PUBREC
    _R.SUCCESS, _R.NO_MATCHING_SUBSCRIBERS, _R.UNSPECIFIED_ERROR,
    _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_NAME_INVALID,
    _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED, _R.PAYLOAD_FORMAT_INVALID,
})
PUBREL_CODES = frozenset({_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND})  # PUBREL and PUBCOMP
SUBACK_CODES = frozenset({
    _R.GRANTED_QOS_0, _R.GRANTED_QOS_1, _R.GRANTED_QOS_2, _R.UNSPECIFIED_ERROR,
    _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
    _R.PACKET_IDENTIFIER_IN_USE, _R.QUOTA_EXCEEDED, _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
})
UNSUBACK_CODES = frozenset({
    _R.SUCCESS, _R.NO_SUBSCRIPTION_EXISTED, _R.UNSPECIFIED_ERROR,
    _R.IMPLEMENTATION_SPECIFIC_ERROR, _R.NOT_AUTHORIZED, _R.TOPIC_FILTER_INVALID,
    _R.PACKET_IDENTIFIER_IN_USE,
})
DISCONNECT_CODES = frozenset({
    _R.NORMAL_DISCONNECTION, _R.DISCONNECT_WITH_WILL_MESSAGE, _R.UNSPECIFIED_ERROR,
    _R.MALFORMED_PACKET, _R.PROTOCOL_ERROR, _R.IMPLEMENTATION_SPECIFIC_ERROR,
    _R.NOT_AUTHORIZED, _R.SERVER_BUSY, _R.SERVER_SHUTTING_DOWN, _R.KEEP_ALIVE_TIMEOUT,
    _R.SESSION_TAKEN_OVER, _R.TOPIC_FILTER_INVALID, _R.TOPIC_NAME_INVALID,
    _R.RECEIVE_MAXIMUM_EXCEEDED, _R.TOPIC_ALIAS_INVALID, _R.PACKET_TOO_LARGE,
    _R.MESSAGE_RATE_TOO_HIGH, _R.QUOTA_EXCEEDED, _R.ADMINISTRATIVE_ACTION,
    _R.PAYLOAD_FORMAT_INVALID, _R.RETAIN_NOT_SUPPORTED, _R.QOS_NOT_SUPPORTED,
    _R.USE_ANOTHER_SERVER, _R.SERVER_MOVED, _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    _R.CONNECTION_RATE_EXCEEDED, _R.MAXIMUM_CONNECT_TIME,
    _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED, _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
})
AUTH_CODES = frozenset({_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.RE_AUTHENTICATE})


# --- MQTT 3.1.1 -------------------------------------------------------------------------------
# v3.1.1 CONNACK return codes (§3.2.2.3); there is nothing else to say to a 3.1.1 client.
CONNACK_V3_ACCEPTED = 0x00
CONNACK_V3_UNACCEPTABLE_PROTOCOL_VERSION = 0x01
CONNACK_V3_IDENTIFIER_REJECTED = 0x02
CONNACK_V3_SERVER_UNAVAILABLE = 0x03
CONNACK_V3_BAD_USER_NAME_OR_PASSWORD = 0x04
CONNACK_V3_NOT_AUTHORIZED = 0x05

_CONNACK_TO_V3 = {
    _R.SUCCESS: CONNACK_V3_ACCEPTED,
    _R.UNSUPPORTED_PROTOCOL_VERSION: CONNACK_V3_UNACCEPTABLE_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID: CONNACK_V3_IDENTIFIER_REJECTED,
    _R.SERVER_UNAVAILABLE: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.SERVER_BUSY: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.SERVER_SHUTTING_DOWN: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.USE_ANOTHER_SERVER: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.SERVER_MOVED: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.CONNECTION_RATE_EXCEEDED: CONNACK_V3_SERVER_UNAVAILABLE,
    _R.BAD_USER_NAME_OR_PASSWORD: CONNACK_V3_BAD_USER_NAME_OR_PASSWORD,
    _R.BAD_AUTHENTICATION_METHOD: CONNACK_V3_BAD_USER_NAME_OR_PASSWORD,
    _R.NOT_AUTHORIZED: CONNACK_V3_NOT_AUTHORIZED,
    _R.BANNED: CONNACK_V3_NOT_AUTHORIZED,
}
_CONNACK_FROM_V3 = {
    CONNACK_V3_ACCEPTED: _R.SUCCESS,
    CONNACK_V3_UNACCEPTABLE_PROTOCOL_VERSION: _R.UNSUPPORTED_PROTOCOL_VERSION,
    CONNACK_V3_IDENTIFIER_REJECTED: _R.CLIENT_IDENTIFIER_NOT_VALID,
    CONNACK_V3_SERVER_UNAVAILABLE: _R.SERVER_UNAVAILABLE,
    CONNACK_V3_BAD_USER_NAME_OR_PASSWORD: _R.BAD_USER_NAME_OR_PASSWORD,
    CONNACK_V3_NOT_AUTHORIZED: _R.NOT_AUTHORIZED,
}


def connack_code_v3(rc: int) -> int:
    """The v3.1.1 CONNACK return code for a v5 reason code.

    Failures with no v3.1.1 counterpart (malformed packet, quota exceeded, ...) become
    "server unavailable": the only generic refusal 3.1.1 has.
    """
    code = _CONNACK_TO_V3.get(rc)  # type: ignore[call-overload]
    if code is not None:
        return code
    return CONNACK_V3_SERVER_UNAVAILABLE if rc >= 0x80 else CONNACK_V3_ACCEPTED


def connack_code_from_v3(code: int) -> ReasonCode:
    """The v5 reason code for a v3.1.1 CONNACK return code; raises MalformedPacket if unknown."""
    rc = _CONNACK_FROM_V3.get(code)
    if rc is None:
        raise MalformedPacket(f"invalid v3.1.1 CONNACK return code {code:#04x}")
    return rc


def suback_code_v3(rc: int) -> int:
    """v3.1.1 SUBACK has granted QoS 0..2 or 0x80 (failure) only."""
    return 0x80 if rc >= 0x80 else int(rc)


# --- errors -------------------------------------------------------------------------------------
class MQTTError(Exception):
    """A packet the peer sent breaks the protocol.

    `reason_code` is what to put in the CONNACK (when the CONNECT failed) or DISCONNECT (v5)
    before closing; a v3.1.1 connection is just closed (or sent the CONNACK return code from
    `connack_code_v3(reason_code)` when the CONNECT itself was refused).
    """

    default_reason = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: ReasonCode | None = None):
        super().__init__(message)
        self.reason_code = ReasonCode(reason_code) if reason_code is not None else self.default_reason

    def __str__(self) -> str:
        return f"{self.args[0]} ({self.reason_code.name} {self.reason_code.value:#04x})"


class MalformedPacket(MQTTError):
    """The bytes cannot be parsed as the packet they claim to be (reason 0x81)."""

    default_reason = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """The packet parses but breaks a protocol rule (reason 0x82 unless more specific)."""

    default_reason = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(ProtocolError):
    """The fixed header announces a packet larger than the maximum packet size (0x95)."""

    default_reason = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(ProtocolError):
    """CONNECT asks for a protocol name/level we do not speak (0x84).

    The session answers with a v3.1.1-format CONNACK (return code 0x01), which every client
    version can read, and closes: `encode(Connack(reason_code=UNSUPPORTED_PROTOCOL_VERSION), 4)`.
    """

    default_reason = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION

    def __init__(self, message: str, protocol_name: str | None = None, protocol_level: int | None = None):
        super().__init__(message)
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level
