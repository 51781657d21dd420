"""Fuzzing the MQTT decoder: random bytes and mutated valid encodings.

Whatever arrives, the decoder either returns packets or raises MalformedPacket / ProtocolError
(subclasses included) -- never IndexError, struct.error, UnicodeDecodeError, BufferError, ...
A packet it does return must be one we can encode again and that decodes to itself.
"""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxpg.protocols.mqtt.codec import (
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    Pingreq,
    Pingresp,
    Properties,
    ProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
)
from fluxpg.protocols.mqtt.properties import encode_varint

RC = ReasonCode
_UP = [("k", "v"), ("k", "v"), ("ключ", "значение")]

# Seeds: every packet type, with and without properties, so mutations land in every parser.
_COMMON = [
    Connect("client-1", clean_start=False, keep_alive=30, username="u", password=b"p",
            will=Will("w/t", b"bye", 1, True, Properties(will_delay_interval=5, content_type="t",
                                                       user_properties=_UP))),
    Connect("", properties=Properties(session_expiry_interval=60, receive_maximum=10,
                                      authentication_method="SCRAM", authentication_data=b"\x01\x02",
                                      user_properties=_UP)),
    Connack(True), Connack(False, RC.NOT_AUTHORIZED),
    Connack(properties=Properties(maximum_qos=1, retain_available=0, topic_alias_maximum=5,
                                  assigned_client_identifier="auto-1", server_keep_alive=20)),
    Publish("a/b", b"payload", 0), Publish("a/b", b"\x00" * 40, 1, True, True, 7),
    Publish("a/€", b"", 2, packet_id=65535, properties=Properties(
        payload_format_indicator=1, message_expiry_interval=100, response_topic="r",
        correlation_data=b"c", subscription_identifiers=[1, 300, 70000], topic_alias=3,
        user_properties=_UP)),
    Puback(1), Puback(2, RC.NO_MATCHING_SUBSCRIBERS), Pubrec(3, properties=Properties(reason_string="x")),
    Pubrel(4), Pubcomp(5, RC.PACKET_IDENTIFIER_NOT_FOUND),
    Subscribe(6, [Subscription("a/+", 1), Subscription("#", 2)]),
    Subscribe(7, [Subscription("a", 1, True, True, 2)], Properties(subscription_identifiers=[9], user_properties=_UP)),
    Suback(6, [RC.GRANTED_QOS_1, RC.UNSPECIFIED_ERROR]),
    Unsubscribe(8, ["a/+", "b"], Properties(user_properties=_UP)),
    Unsuback(8, [RC.SUCCESS, RC.NO_SUBSCRIPTION_EXISTED], Properties(reason_string="gone")),
    Pingreq(), Pingresp(), Disconnect(), Disconnect(RC.SERVER_SHUTTING_DOWN, Properties(server_reference="s2")),
    Auth(RC.CONTINUE_AUTHENTICATION, Properties(authentication_method="m", authentication_data=b"d")),
]


def _seed_streams() -> list[tuple[int, bytes]]:
    out = []
    for v in (3, 4, 5):
        for p in _COMMON:
            if isinstance(p, Auth) and v != 5:
                continue
            if isinstance(p, Connect) and v < 5 and (not p.client_id or v == 3 and len(p.client_id) > 23):
                continue
            if v < 5 and isinstance(p, Unsuback):
                p = Unsuback(p.packet_id)
            if v < 5 and isinstance(p, Subscribe):  # the v5 subscription options cannot be sent
                p = Subscribe(p.packet_id, [Subscription(s.topic_filter, s.qos) for s in p.subscriptions])
            out.append((v, encode(p, v)))
    return out


SEEDS = _seed_streams()
ALLOWED = (MalformedPacket, ProtocolError)


def _decode_everything(data: bytes, version: int | None, chunk: int, max_size: int) -> None:
    dec = Decoder(max_packet_size=max_size, version=version)
    try:
        for i in range(0, max(len(data), 1), chunk):
            dec.feed(data[i:i + chunk])
            for pkt in dec:
                v = dec.version
                assert v is not None
                # A decoded packet must re-encode, and that encoding must decode to it again.
                wire = encode(pkt, v)
                again = Decoder(version=v)
                again.feed(wire)
                assert again.next_packet() == pkt, (pkt, wire.hex())
    except ALLOWED:
        pass


def _mutate(draw, data: bytearray) -> None:
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "dup"]))
        if not data:
            return
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete":
            del data[i:i + draw(st.integers(1, 4))]
        elif kind == "truncate":
            del data[i:]
        else:
            data[i:i] = data[i:i + draw(st.integers(1, 8))]


def _split(wire: bytes) -> tuple[int, bytes]:
    """(first byte, body) of one encoded packet."""
    i = 1
    while wire[i] & 0x80:
        i += 1
    return wire[0], wire[i + 1:]


@st.composite
def mutated(draw):
    """A few valid packets of one version back to back, mutated. Half the time the mutation
    hits one packet's body and the packet is framed again with the right remaining length, so
    the damage reaches the parsers instead of only desynchronising the framing."""
    v = draw(st.sampled_from([3, 4, 5]))
    pool = [w for ver, w in SEEDS if ver == v]
    wires = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    if draw(st.booleans()):
        k = draw(st.integers(0, len(wires) - 1))
        first, body = _split(wires[k])
        body = bytearray(body)
        _mutate(draw, body)
        if draw(st.integers(0, 3)) == 0:
            first = draw(st.integers(0, 255))  # type and flags too
        wires[k] = bytes([first]) + encode_varint(len(body)) + body
        data = bytearray(b"".join(wires))
    else:
        data = bytearray(b"".join(wires))
        _mutate(draw, data)
    # the server side learns the version from CONNECT; a client knows it
    version = draw(st.sampled_from([None, v])) if data[:1] and data[0] >> 4 == 1 else v
    return version, bytes(data)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.integers(1, 64), st.sampled_from([1 << 20, 64]))
def test_mutated_valid_encodings(case, chunk, max_size):
    version, data = case
    _decode_everything(data, version, chunk, max_size)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([None, 3, 4, 5]), st.binary(max_size=200), st.integers(1, 200))
def test_random_bytes(version, data, chunk):
    _decode_everything(data, version, chunk, 1 << 20)


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 15), st.integers(0, 15), st.sampled_from([3, 4, 5]), st.binary(max_size=60))
def test_random_bodies_behind_every_fixed_header(ptype, flags, v, body):
    # Well-framed packets of every type with random bodies reach deep into each parser.
    data = bytes([ptype << 4 | flags, len(body)]) + body
    _decode_everything(data, v, len(data), 1 << 20)


def test_seeds_decode_cleanly():
    # The fuzz corpus itself is valid: guards against fuzzing nothing but errors.
    for v, wire in SEEDS:
        dec = Decoder(version=v)
        dec.feed(wire)
        pkt = dec.next_packet()
        assert pkt is not None and dec.buffered == 0
        assert encode(pkt, v) == wire


def test_every_truncation_and_byte_value_of_every_seed_body():
    # Exhaustive and deterministic, where random mutation would need luck: each seed's body cut
    # at every position and framed again, and each body byte replaced by a few telling values.
    for v, wire in SEEDS:
        first, body = _split(wire)
        for cut in range(len(body)):
            b = body[:cut]
            _decode_everything(bytes([first]) + encode_varint(len(b)) + b, v, 1 << 20, 1 << 20)
        for i in range(len(body)):
            for value in (0x00, 0x01, 0x7F, 0x80, 0xFF, body[i] ^ 0x40):
                b = body[:i] + bytes([value]) + body[i + 1:]
                _decode_everything(bytes([first]) + encode_varint(len(b)) + b, v, 1 << 20, 1 << 20)
