"""MQTT codec: round trips (hypothesis), byte-exact spec examples, streaming, validation, and
interop with real peers (paho-mqtt as a client of a tiny server driven by the codec; the
Mosquitto broker on :1883 as a server for a client driven by the codec)."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluxpg.protocols.mqtt.codec import (
    MAX_REMAINING_LENGTH,
    Auth,
    Connack,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
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
    UnsupportedProtocolVersion,
    Will,
    encode,
)
from fluxpg.protocols.mqtt.properties import PropertyId, encode_varint
from fluxpg.protocols.mqtt.reasons import connack_code_from_v3, connack_code_v3, suback_code_v3
from tests.helpers import paho_loop_stop

RC = ReasonCode

# --- strategies -------------------------------------------------------------------------------
# Strings MQTT can carry: any scalar value but surrogates and U+0000 (§1.5.4).
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
topic_names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
                      min_size=1, max_size=12)
binary = st.binary(max_size=24)
pids = st.integers(1, 0xFFFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
flag = st.integers(0, 1)

# Written from the spec's table (§2.2.2.2) independently of properties.py, so a slip in the
# codec's table shows up here. Packet names: W = will properties.
_PROPS = {
    "payload_format_indicator": (flag, "PUBLISH W"),
    "message_expiry_interval": (u32, "PUBLISH W"),
    "content_type": (text, "PUBLISH W"),
    "response_topic": (topic_names, "PUBLISH W"),
    "correlation_data": (binary, "PUBLISH W"),
    "subscription_identifiers": (None, "PUBLISH SUBSCRIBE"),
    "session_expiry_interval": (u32, "CONNECT CONNACK DISCONNECT"),
    "assigned_client_identifier": (text, "CONNACK"),
    "server_keep_alive": (u16, "CONNACK"),
    "authentication_method": (text, "CONNECT CONNACK AUTH"),
    "authentication_data": (binary, "CONNECT CONNACK AUTH"),
    "request_problem_information": (flag, "CONNECT"),
    "will_delay_interval": (u32, "W"),
    "request_response_information": (flag, "CONNECT"),
    "response_information": (text, "CONNACK"),
    "server_reference": (text, "CONNACK DISCONNECT"),
    "reason_string": (text, "CONNACK PUBACK PUBREC PUBREL PUBCOMP SUBACK UNSUBACK DISCONNECT AUTH"),
    "receive_maximum": (st.integers(1, 0xFFFF), "CONNECT CONNACK"),
    "topic_alias_maximum": (u16, "CONNECT CONNACK"),
    "topic_alias": (st.integers(1, 0xFFFF), "PUBLISH"),
    "maximum_qos": (flag, "CONNACK"),
    "retain_available": (flag, "CONNACK"),
    "user_properties": (st.lists(st.tuples(text, text), max_size=3),
                        "CONNECT CONNACK PUBLISH W PUBACK PUBREC PUBREL PUBCOMP SUBSCRIBE SUBACK "
                        "UNSUBSCRIBE UNSUBACK DISCONNECT AUTH"),
    "maximum_packet_size": (st.integers(1, 0xFFFFFFFF), "CONNECT CONNACK"),
    "wildcard_subscription_available": (flag, "CONNACK"),
    "subscription_identifier_available": (flag, "CONNACK"),
    "shared_subscription_available": (flag, "CONNACK"),
}
_SUBID = st.integers(1, MAX_REMAINING_LENGTH)


def props_for(packet: str, v5: bool = True) -> st.SearchStrategy[Properties]:
    if not v5:
        return st.just(Properties())
    optional = {}
    for name, (strat, where) in _PROPS.items():
        if packet not in where.split():
            continue
        if name == "subscription_identifiers":
            strat = st.lists(_SUBID, max_size=3 if packet == "PUBLISH" else 1)
        optional[name] = strat
    return st.fixed_dictionaries({}, optional=optional).map(lambda d: Properties(**d))


def codes(allowed: list[int]) -> st.SearchStrategy[ReasonCode]:
    return st.sampled_from([RC(c) for c in allowed])


def packets(v: int, only: tuple[type, ...] = (), exclude: tuple[type, ...] = ()) -> st.SearchStrategy:
    """Any valid packet for protocol level v (restricted to / excluding some types)."""
    v5 = v == 5
    will = st.builds(Will, topic_names, binary, st.integers(0, 2), st.booleans(), props_for("W", v5))

    @st.composite
    def connect(draw):
        if v == 3:
            client_id = draw(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                     min_size=1, max_size=23))
        else:
            client_id = draw(text)
        clean = draw(st.booleans()) if (client_id or v5) else True
        username = draw(st.none() | text)
        password = draw(st.none() | binary) if (username is not None or v5) else None
        p = draw(props_for("CONNECT", v5))
        if p.authentication_data is not None and p.authentication_method is None:
            p.authentication_method = "m"
        return Connect(client_id, clean, draw(u16), username, password, draw(st.none() | will), p,
                       protocol_level=v, protocol_name="MQIsdp" if v == 3 else "MQTT")

    v3_connack = [0x00, 0x84, 0x85, 0x88, 0x86, 0x87]  # the ones with a v3 return code
    connack_codes = [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
                     0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F]
    puback_codes = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99] if v5 else [0]
    pubrel_codes = [0x00, 0x92] if v5 else [0]
    suback_codes = ([0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]
                    if v5 else [0, 1, 2, 0x80])
    unsuback_codes = [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]

    @st.composite
    def publish(draw):
        qos = draw(st.integers(0, 2))
        return Publish(draw(topic_names), draw(st.binary(max_size=64)), qos, draw(st.booleans()),
                       draw(st.booleans()) if qos else False, draw(pids) if qos else None,
                       draw(props_for("PUBLISH", v5)))

    if v5:
        subscription = st.builds(Subscription, text, st.integers(0, 2), st.booleans(), st.booleans(),
                                 st.integers(0, 2)).filter(
            lambda s: not (s.no_local and s.topic_filter.startswith("$share/")))
    else:
        subscription = st.builds(Subscription, text, st.integers(0, 2))

    def ack(cls, name, allowed):
        return st.builds(cls, pids, codes(allowed), props_for(name, v5))

    options = [
        connect(),
        st.builds(Connack, st.booleans(), codes(connack_codes if v5 else v3_connack), props_for("CONNACK", v5)),
        publish(),
        ack(Puback, "PUBACK", puback_codes),
        ack(Pubrec, "PUBREC", puback_codes),
        ack(Pubrel, "PUBREL", pubrel_codes),
        ack(Pubcomp, "PUBCOMP", pubrel_codes),
        st.builds(Subscribe, pids, st.lists(subscription, min_size=1, max_size=4), props_for("SUBSCRIBE", v5)),
        st.builds(Suback, pids, st.lists(codes(suback_codes), min_size=1, max_size=4), props_for("SUBACK", v5)),
        st.builds(Unsubscribe, pids, st.lists(text, min_size=1, max_size=4), props_for("UNSUBSCRIBE", v5)),
        st.builds(Unsuback, pids, st.lists(codes(unsuback_codes), min_size=1, max_size=4)
                  if v5 else st.just([]), props_for("UNSUBACK", v5)),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(Disconnect, codes(sorted({int(c) for c in _disconnect_codes()})) if v5 else st.just(RC.SUCCESS),
                  props_for("DISCONNECT", v5)),
    ]
    if v5:
        options.append(st.builds(Auth, codes([0x00, 0x18, 0x19]), props_for("AUTH")))
    chosen = [s for s, t in zip(options, _TYPES_ORDER)
              if (not only or t in only) and t not in exclude]
    return st.one_of(chosen)


_TYPES_ORDER = [Connect, Connack, Publish, Puback, Pubrec, Pubrel, Pubcomp, Subscribe, Suback,
                Unsubscribe, Unsuback, Pingreq, Pingresp, Disconnect, Auth]


def _disconnect_codes():
    return [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
            0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2]


def decode_all(data: bytes, version: int | None = 5, max_packet_size: int = 1 << 28) -> list:
    dec = Decoder(max_packet_size, version)
    dec.feed(data)
    out = list(dec)
    assert dec.buffered == 0, "bytes left over"
    return out


versions = st.sampled_from([3, 4, 5])


# --- round trips ------------------------------------------------------------------------------
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), versions)
def test_round_trip_every_packet_type(data, v):
    pkt = data.draw(packets(v))
    wire = encode(pkt, v)
    [back] = decode_all(wire, v)
    assert back == pkt
    # Encoding is deterministic: the decoded packet encodes to the same bytes.
    assert encode(back, v) == wire


@settings(max_examples=100, deadline=None)
@given(st.data(), versions)
def test_server_learns_version_from_connect(data, v):
    conn = data.draw(packets(v, only=(Connect,)))
    rest = data.draw(st.lists(packets(v, exclude=(Connect,)), max_size=5))
    dec = Decoder()
    assert dec.version is None
    dec.feed(b"".join(encode(p, v) for p in [conn, *rest]))
    assert list(dec) == [conn, *rest]
    assert dec.version == v


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from([4, 5]))
def test_chunked_feeding_gives_the_same_packets(data, v):
    pkts = data.draw(st.lists(packets(v), min_size=1, max_size=8))
    wire = b"".join(encode(p, v) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    # random chunks
    dec = Decoder(version=v)
    got = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        dec.feed(wire[prev:cut])
        prev = cut
        got.extend(dec)
    assert got == pkts
    # one byte at a time: a packet appears exactly when its last byte arrives
    dec = Decoder(version=v)
    got = []
    for i in range(len(wire)):
        dec.feed(wire[i:i + 1])
        got.extend(dec)
    assert got == pkts and dec.buffered == 0


# --- byte-exact examples ----------------------------------------------------------------------
def test_connect_v311_bytes():
    wire = encode(Connect("a", keep_alive=60), 4)
    assert wire == bytes.fromhex("100d00044d5154540402003c000161")
    [c] = decode_all(wire, None)
    assert (c.protocol_name, c.protocol_level, c.client_id, c.clean_start) == ("MQTT", 4, "a", True)


def test_connect_v5_bytes_with_will_and_credentials():
    pkt = Connect("id", clean_start=False, keep_alive=10, username="u", password=b"pw",
                  will=Will("w", b"bye", qos=1, retain=True, properties=Properties(will_delay_interval=7)),
                  properties=Properties(session_expiry_interval=120))
    expected = bytes.fromhex(
        "10" "29"                      # CONNECT, remaining length 41
        "00044d515454" "05"           # "MQTT", level 5
        "ec"                           # user, password, will retain, will QoS 1, will (no clean start)
        "000a"                         # keep alive 10
        "05" "1100000078"              # properties: session expiry 120
        "00026964"                     # client id "id"
        "05" "1800000007"              # will properties: will delay 7
        "000177" "0003627965"          # will topic "w", payload "bye"
        "000175" "00027077"            # user "u", password "pw"
    )
    assert encode(pkt, 5) == expected
    assert decode_all(expected, None) == [pkt]


def test_publish_bytes():
    assert encode(Publish("a/b", b"hi", qos=1, packet_id=10), 4) == bytes.fromhex("3209" "0003612f62" "000a" "6869")
    v5 = Publish("t", b"", qos=0, retain=True, properties=Properties(user_properties=[("k", "v"), ("k", "v")]))
    assert encode(v5, 5) == bytes.fromhex("3112" "000174" "0e" "260001" "6b" "000176" "260001" "6b" "000176")


def test_subscribe_and_suback_bytes():
    sub = Subscribe(1, [Subscription("a/b", qos=1, no_local=True, retain_as_published=True, retain_handling=1)])
    assert encode(sub, 5) == bytes.fromhex("8209" "0001" "00" "0003612f62" "1d")
    assert encode(Subscribe(1, [Subscription("a/b", qos=2)]), 4) == bytes.fromhex("8208" "0001" "0003612f62" "02")
    assert encode(Suback(1, [RC.GRANTED_QOS_1, RC.NOT_AUTHORIZED]), 5) == bytes.fromhex("9005" "0001" "00" "0187")
    # 3.1.1 has only 0x80 for failure
    assert encode(Suback(1, [RC.GRANTED_QOS_1, RC.NOT_AUTHORIZED]), 4) == bytes.fromhex("9004" "0001" "0180")


def test_short_forms_of_acks_disconnect_auth():
    assert encode(Puback(1), 5) == bytes.fromhex("40020001")
    assert encode(Puback(1, RC.NO_MATCHING_SUBSCRIBERS), 5) == bytes.fromhex("4003000110")
    assert encode(Puback(1, properties=Properties(reason_string="x")), 5) == bytes.fromhex("4008" "0001" "00" "04" "1f000178")
    assert encode(Pubrel(258), 4) == bytes.fromhex("62020102")
    assert encode(Disconnect(), 5) == b"\xe0\x00"
    assert encode(Disconnect(RC.SESSION_TAKEN_OVER), 5) == b"\xe0\x01\x8e"
    assert encode(Disconnect(RC.SESSION_TAKEN_OVER), 4) == b"\xe0\x00"
    assert encode(Auth(), 5) == b"\xf0\x00"
    assert encode(Pingreq(), 4) == b"\xc0\x00" and encode(Pingresp(), 5) == b"\xd0\x00"
    # and the long forms decode the same as the short ones
    assert decode_all(bytes.fromhex("4004000100" "00"), 5) == [Puback(1)]
    assert decode_all(b"\xe0\x02\x00\x00", 5) == [Disconnect()]
    assert decode_all(b"\xf0\x01\x18", 5) == [Auth(RC.CONTINUE_AUTHENTICATION)]


def test_connack_bytes_both_versions():
    assert encode(Connack(True), 4) == bytes.fromhex("20020100")
    assert encode(Connack(reason_code=RC.UNSUPPORTED_PROTOCOL_VERSION), 4) == bytes.fromhex("20020001")
    assert encode(Connack(reason_code=RC.BAD_USER_NAME_OR_PASSWORD), 5) == bytes.fromhex("2003008600")
    assert encode(Connack(properties=Properties(receive_maximum=5, maximum_qos=1)), 5) == \
        bytes.fromhex("2008" "0000" "05" "210005" "2401")
    assert decode_all(bytes.fromhex("20020005"), 4) == [Connack(reason_code=RC.NOT_AUTHORIZED)]


def test_unsubscribe_unsuback_bytes():
    assert encode(Unsubscribe(5, ["a", "b"]), 4) == bytes.fromhex("a208" "0005" "000161" "000162")
    assert encode(Unsuback(5, [RC.SUCCESS, RC.NO_SUBSCRIPTION_EXISTED]), 5) == bytes.fromhex("b005" "0005" "00" "0011")
    assert encode(Unsuback(5, [RC.SUCCESS]), 4) == bytes.fromhex("b0020005")


def test_every_property_identifier_and_type():
    # One of each type, checked byte by byte against §2.2.2.2 ids.
    p = Properties(payload_format_indicator=1, message_expiry_interval=0x01020304, content_type="c",
                   correlation_data=b"\x00\xff", subscription_identifiers=[321], topic_alias=2,
                   user_properties=[("a", "")])
    wire = encode(Publish("t", b"", properties=p), 5)
    props = wire[2 + 3:]  # after the fixed header and topic "t"; the payload is empty
    assert props == bytes.fromhex(
        "1c" "0101" "0201020304" "03000163" "09000200ff" "0bc102" "230002" "260001610000")
    assert {i.value for i in PropertyId} == {
        0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x11, 0x12, 0x13, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1C,
        0x1F, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A}


def test_mqisdp_level_3_is_decoded_like_311():
    wire = bytes.fromhex("1010" "00064d5149736470" "03" "02" "003c" "0002" "6331")
    [c] = decode_all(wire, None)
    assert (c.protocol_name, c.protocol_level, c.client_id) == ("MQIsdp", 3, "c1")
    assert encode(c, 3) == wire


# --- remaining length --------------------------------------------------------------------------
@pytest.mark.parametrize("n, wire", [
    (0, "00"), (127, "7f"), (128, "8001"), (321, "c102"), (16383, "ff7f"), (16384, "808001"),
    (2097151, "ffff7f"), (2097152, "80808001"), (268435455, "ffffff7f"),
])
def test_remaining_length_edges(n, wire):
    assert encode_varint(n) == bytes.fromhex(wire)
    header = b"\x30" + bytes.fromhex(wire)
    if n == 0:
        return  # a PUBLISH cannot be empty; PINGREQ below covers length 0
    dec = Decoder(version=4)
    dec.feed(header)
    assert dec.next_packet() is None  # waits for the body, refuses nothing
    with pytest.raises(PacketTooLarge) as e:
        tight = Decoder(max_packet_size=len(header) + n - 1, version=4)
        tight.feed(header)  # only the header: refused before the body is buffered
        tight.next_packet()
    assert e.value.reason_code == RC.PACKET_TOO_LARGE
    exact = Decoder(max_packet_size=len(header) + n, version=4)
    exact.feed(header)
    assert exact.next_packet() is None


@pytest.mark.parametrize("n", [0, 127, 128, 16383, 16384, 2097151, 2097152])
def test_remaining_length_round_trip(n):
    if n == 0:
        assert decode_all(encode(Pingreq(), 4), 4) == [Pingreq()]
        return
    topic = "t" * (min(n, 100) - 2) if n < 100 else "topic"
    payload = b"\xab" * (n - 2 - len(topic))
    wire = encode(Publish(topic, payload), 4)
    assert wire[1:1 + len(encode_varint(n))] == encode_varint(n)
    assert len(wire) == 1 + len(encode_varint(n)) + n
    assert decode_all(wire, 4) == [Publish(topic, payload)]


def test_five_byte_remaining_length_refused():
    for wire in (b"\x30\xff\xff\xff\xff\x01", b"\x30\x80\x80\x80\x80"):
        dec = Decoder(version=4)
        dec.feed(wire)
        with pytest.raises(MalformedPacket):
            dec.next_packet()
    with pytest.raises(ValueError):
        encode_varint(MAX_REMAINING_LENGTH + 1)


# --- validation ---------------------------------------------------------------------------------
def raises(wire: bytes, exc: type[MQTTError], version: int | None = 5, reason: int | None = None):
    dec = Decoder(version=version)
    dec.feed(wire)
    with pytest.raises(exc) as e:
        dec.next_packet()
    if reason is not None:
        assert e.value.reason_code == reason
    # the decoder stays failed
    with pytest.raises(exc):
        dec.next_packet()
    return e.value


@pytest.mark.parametrize("wire", [
    "6002000a",          # PUBREL must have flags 0010
    "8006000a00016100",  # SUBSCRIBE must have flags 0010
    "a105000a000161",    # UNSUBSCRIBE must have flags 0010
    "c100", "4102000a", "e800", "1100",
])
def test_reserved_fixed_header_flags(wire):
    raises(bytes.fromhex(wire), MalformedPacket, 5, RC.MALFORMED_PACKET)


def test_reserved_packet_type_zero_and_auth_before_v5():
    raises(b"\x00\x00", MalformedPacket, 5)
    raises(b"\xf0\x00", MalformedPacket, 4)


def test_publish_validation():
    raises(bytes.fromhex("3605" "000161" "0001"), MalformedPacket, 4)            # QoS 3
    raises(bytes.fromhex("3205" "000161" "0000"), MalformedPacket, 4)            # packet id 0
    raises(bytes.fromhex("3803" "000161"), MalformedPacket, 4)                   # DUP on QoS 0
    raises(bytes.fromhex("3005" "0003612f2b"), ProtocolError, 4, RC.TOPIC_NAME_INVALID)  # a/+
    raises(bytes.fromhex("3004" "000123" "00"), ProtocolError, 5, RC.TOPIC_NAME_INVALID)      # #
    raises(bytes.fromhex("3002" "0000"), ProtocolError, 4)                       # empty topic
    raises(bytes.fromhex("3003" "0000" "00"), ProtocolError, 5)                  # empty, no alias
    assert decode_all(bytes.fromhex("3006" "0000" "03" "230001"), 5) == [
        Publish("", b"", properties=Properties(topic_alias=1))]
    raises(bytes.fromhex("3006" "0000" "03" "230000"), ProtocolError, 5)         # topic alias 0
    raises(bytes.fromhex("3003" "000561"), MalformedPacket, 4)                   # topic runs past end
    raises(bytes.fromhex("3003" "000161"), MalformedPacket, 5)               # no property length


@pytest.mark.parametrize("bad", ["ff", "c0af", "eda080", "c1bf", "e080af", "f4908080", "00"])
def test_utf8_must_be_well_formed_without_nul(bad):
    raw = bytes.fromhex(bad)
    wire = b"\x30" + bytes([2 + len(raw)]) + len(raw).to_bytes(2, "big") + raw
    raises(wire, MalformedPacket, 4, RC.MALFORMED_PACKET)


def test_subscribe_validation():
    raises(bytes.fromhex("8203" "000a" "00"), ProtocolError, 5)                  # no filters (v5)
    raises(bytes.fromhex("8202" "000a"), ProtocolError, 4)                       # no filters (3.1.1)
    raises(bytes.fromhex("8207" "000a" "00" "000161" "40"), MalformedPacket, 5)  # reserved bit 6
    raises(bytes.fromhex("8206" "000a" "000161" "04"), MalformedPacket, 4)       # v5 bit in 3.1.1
    raises(bytes.fromhex("8207" "000a" "00" "000161" "30"), ProtocolError, 5)    # retain handling 3
    raises(bytes.fromhex("8207" "000a" "00" "000161" "03"), MalformedPacket, 5)  # QoS 3
    raises(bytes.fromhex("8206" "000a" "00" "000161"), MalformedPacket, 5)       # options missing
    raises(bytes.fromhex("8206" "0000" "000161" "00"), MalformedPacket, 4)       # packet id 0
    share = b"$share/g/a"
    wire = b"\x82" + bytes([3 + 2 + len(share) + 1]) + b"\x00\x0a\x00" + len(share).to_bytes(2, "big") + share + b"\x04"
    raises(wire, ProtocolError, 5)                                                # no local on shared
    raises(bytes.fromhex("a203" "000a" "00"), ProtocolError, 5)                  # UNSUBSCRIBE empty


def _connect_v(level: int, flags: int, payload: bytes, name: bytes = b"MQTT", props: bytes = b"\x00") -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes([level, flags]) + b"\x00\x3c"
    body += (props if level == 5 else b"") + payload
    return b"\x10" + encode_varint(len(body)) + body


def test_connect_validation():
    cid = b"\x00\x01c"
    raises(_connect_v(4, 0x03, cid), MalformedPacket, None)                      # reserved bit
    raises(_connect_v(5, 0x03, cid), MalformedPacket, None, RC.MALFORMED_PACKET)
    raises(_connect_v(4, 0x0A, cid), MalformedPacket, None)                      # will QoS, no will
    raises(_connect_v(4, 0x22, cid), MalformedPacket, None)                      # will retain, no will
    raises(_connect_v(4, 0x1E, cid + b"\x00\x01w\x00\x00"), MalformedPacket, None)  # will QoS 3
    raises(_connect_v(4, 0x42, cid + b"\x00\x01p"), MalformedPacket, None)       # password w/o user
    # ... which MQTT 5 allows
    [c] = decode_all(_connect_v(5, 0x42, cid + b"\x00\x01p"), None)
    assert c.password == b"p" and c.username is None
    raises(_connect_v(4, 0x02, cid + b"\x00"), MalformedPacket, None)            # trailing byte
    e = raises(_connect_v(4, 0x00, b"\x00\x00"), ProtocolError, None, RC.CLIENT_IDENTIFIER_NOT_VALID)
    assert connack_code_v3(e.reason_code) == 0x02
    raises(_connect_v(5, 0x02, cid, props=b"\x03\x16\x00\x00"), ProtocolError, None)  # auth data w/o method
    raises(_connect_v(4, 0x06, cid + b"\x00\x01#\x00\x00"), ProtocolError, None, RC.TOPIC_NAME_INVALID)


@pytest.mark.parametrize("name, level", [(b"MQTT", 3), (b"MQTT", 6), (b"MQIsdp", 4), (b"MQTX", 4), (b"MQTT", 0)])
def test_unsupported_protocol_version(name, level):
    dec = Decoder()
    dec.feed(_connect_v(level, 0x02, b"\x00\x01c", name=name))
    with pytest.raises(UnsupportedProtocolVersion) as e:
        dec.next_packet()
    assert e.value.reason_code == RC.UNSUPPORTED_PROTOCOL_VERSION
    assert e.value.protocol_level == level and dec.version is None
    # The session answers in the 3.1.1 format every client understands: return code 0x01.
    assert encode(Connack(reason_code=e.value.reason_code), 4) == b"\x20\x02\x00\x01"


def test_version_is_known_when_a_later_connect_check_fails():
    dec = Decoder()
    dec.feed(_connect_v(5, 0x03, b"\x00\x01c"))
    with pytest.raises(MalformedPacket):
        dec.next_packet()
    assert dec.version == 5  # so the session sends a v5 CONNACK 0x81


def test_first_packet_must_be_connect():
    e = raises(b"\x30", ProtocolError, None)  # refused from its first byte
    assert e.reason_code == RC.PROTOCOL_ERROR


def test_property_validation():
    # not allowed on the packet (topic alias on PUBACK): malformed (§2.2.2.2)
    raises(bytes.fromhex("4007" "0001" "00" "03" "230001"), MalformedPacket, 5)
    # unknown identifier
    raises(bytes.fromhex("4006" "0001" "00" "02" "7f00"), MalformedPacket, 5)
    # duplicate non-repeatable property: protocol error
    raises(bytes.fromhex("400c" "0001" "00" "08" "1f000161" "1f000162"), ProtocolError, 5)
    # duplicate user properties are fine and keep their order
    [p] = decode_all(bytes.fromhex("4019" "0001" "00" "15" "26000161000162" "26000161000162" "26000163000164"), 5)
    assert p.properties.user_properties == [("a", "b"), ("a", "b"), ("c", "d")]
    # bool property with value 2, receive maximum 0, subscription identifier 0
    raises(bytes.fromhex("3006" "000174" "02" "0102"), ProtocolError, 5)
    raises(_connect_v(5, 0x02, b"\x00\x01c", props=b"\x03\x21\x00\x00"), ProtocolError, None)
    raises(bytes.fromhex("3006" "000174" "02" "0b00"), ProtocolError, 5)
    # two subscription identifiers are fine on PUBLISH, not on SUBSCRIBE
    [pub] = decode_all(bytes.fromhex("3008" "000174" "04" "0b01" "0b02"), 5)
    assert pub.properties.subscription_identifiers == [1, 2]
    raises(bytes.fromhex("820b" "0001" "04" "0b01" "0b02" "000161" "00"), ProtocolError, 5)
    # property length runs past the properties / the packet
    raises(bytes.fromhex("3006" "000174" "05" "0101"), MalformedPacket, 5)
    raises(bytes.fromhex("3006" "000174" "01" "0201"), MalformedPacket, 5)


def test_reason_code_validation():
    raises(bytes.fromhex("40030001" "05"), MalformedPacket, 5)   # 0x05 is no reason code
    raises(bytes.fromhex("40030001" "92"), ProtocolError, 5)     # valid code, wrong packet
    raises(bytes.fromhex("20020006"), MalformedPacket, 4)        # 3.1.1 CONNACK return code 6
    raises(bytes.fromhex("9003000103"), MalformedPacket, 4)      # 3.1.1 SUBACK code 3
    raises(bytes.fromhex("20020200"), MalformedPacket, 4)        # CONNACK reserved flags


def test_trailing_bytes_inside_packets():
    raises(b"\xc0\x01\x00", MalformedPacket, 5)                  # PINGREQ
    raises(b"\xe0\x01\x00", MalformedPacket, 4)                  # 3.1.1 DISCONNECT
    raises(bytes.fromhex("4003000100"), MalformedPacket, 4)      # 3.1.1 PUBACK
    raises(bytes.fromhex("b003000100"), MalformedPacket, 4)      # 3.1.1 UNSUBACK
    raises(bytes.fromhex("40050001000000"), MalformedPacket, 5)  # PUBACK after properties


def test_packet_too_large_before_body_is_buffered():
    dec = Decoder(max_packet_size=100, version=5)
    dec.feed(b"\x30\x80\x01")  # announces 128 bytes of body
    with pytest.raises(PacketTooLarge):
        dec.next_packet()
    dec.feed(b"x" * 1000)  # ignored: the connection is over
    assert dec.buffered == 0


def test_encode_refuses_invalid_packets():
    bad = [
        (Publish("a/#", b""), 5), (Publish("a", qos=1), 5), (Publish("a", qos=3, packet_id=1), 5),
        (Publish("a", dup=True), 5), (Publish("", b""), 4), (Publish("a\x00", b""), 4),
        (Publish("\ud800", b""), 4), (Puback(0), 4), (Subscribe(1, []), 4),
        (Subscribe(1, [Subscription("a", no_local=True)]), 4), (Unsubscribe(1, []), 5),
        (Connect("c", password=b"p"), 4), (Auth(), 4), (Puback(1, RC.GRANTED_QOS_2), 5),
        (Puback(1, properties=Properties(topic_alias=3)), 5), (Publish("a", properties=Properties(topic_alias=0)), 5),
        (Publish("a", b"x" * (MAX_REMAINING_LENGTH)), 4),
    ]
    for pkt, v in bad:
        with pytest.raises(ValueError):
            encode(pkt, v)
    with pytest.raises(TypeError):
        Properties(recieve_maximum=3)
    with pytest.raises(ValueError):
        encode(Pingreq(), 6)


def test_v3_reason_code_mapping():
    assert [connack_code_v3(rc) for rc in (RC.SUCCESS, RC.UNSUPPORTED_PROTOCOL_VERSION,
            RC.CLIENT_IDENTIFIER_NOT_VALID, RC.SERVER_UNAVAILABLE, RC.BAD_USER_NAME_OR_PASSWORD,
            RC.NOT_AUTHORIZED, RC.QUOTA_EXCEEDED, RC.BANNED)] == [0, 1, 2, 3, 4, 5, 3, 5]
    assert [connack_code_from_v3(c) for c in range(6)] == [
        RC.SUCCESS, RC.UNSUPPORTED_PROTOCOL_VERSION, RC.CLIENT_IDENTIFIER_NOT_VALID,
        RC.SERVER_UNAVAILABLE, RC.BAD_USER_NAME_OR_PASSWORD, RC.NOT_AUTHORIZED]
    assert [suback_code_v3(c) for c in (RC.GRANTED_QOS_0, RC.GRANTED_QOS_2, RC.QUOTA_EXCEEDED)] == [0, 2, 0x80]
    assert RC.NORMAL_DISCONNECTION is RC.SUCCESS and RC(0x95).name == "PACKET_TOO_LARGE"


def test_properties_value_semantics():
    a = Properties(user_properties=[("k", "v")], receive_maximum=3)
    assert a == Properties(receive_maximum=3, user_properties=[("k", "v")])
    assert a != Properties(receive_maximum=3)
    assert not Properties() and a
    assert "receive_maximum=3" in repr(a)
    assert Properties().topic_alias is None and Properties().user_properties == []


# --- interop: paho-mqtt as a real client of a server made of this codec ---------------------------

async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list) -> None:
    """Accept one client: CONNACK, SUBACK, PUBACK (and PUBREC/PUBCOMP), echo the publish back."""
    dec = Decoder(max_packet_size=1 << 20)
    v = None
    while True:
        data = await reader.read(65536)
        if not data:
            break
        dec.feed(data)
        for pkt in dec:
            seen.append(pkt)
            v = dec.version
            out: list = []
            if isinstance(pkt, Connect):
                out.append(Connack(properties=Properties(user_properties=[("server", "fluxpg")])))
            elif isinstance(pkt, Subscribe):
                out.append(Suback(pkt.packet_id, [RC(s.qos) for s in pkt.subscriptions]))
            elif isinstance(pkt, Publish):
                if pkt.qos == 1:
                    out.append(Puback(pkt.packet_id))
                elif pkt.qos == 2:
                    out.append(Pubrec(pkt.packet_id))
                out.append(Publish(pkt.topic, pkt.payload, qos=0, properties=Properties(
                    user_properties=[*pkt.properties.user_properties, ("echo", "1")])))
            elif isinstance(pkt, Pubrel):
                out.append(Pubcomp(pkt.packet_id))
            elif isinstance(pkt, Pingreq):
                out.append(Pingresp())
            elif isinstance(pkt, Disconnect):
                writer.close()
                return
            for o in out:
                writer.write(encode(o, v))
        await writer.drain()
    writer.close()


@pytest.mark.parametrize("protocol", ["v311", "v5"])
async def test_paho_client_against_codec_server(protocol):
    from paho.mqtt.client import CallbackAPIVersion, Client, MQTTv5, MQTTv311
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as PahoProperties

    seen: list = []
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, seen), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    v5 = protocol == "v5"
    events = {k: threading.Event() for k in ("connect", "subscribe", "publish", "message", "publish2")}
    got: dict = {}

    client = Client(CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=MQTTv5 if v5 else MQTTv311)
    client.username_pw_set("user", "secret")
    client.will_set("will/topic", b"gone", qos=1, retain=False)

    def on_connect(c, userdata, flags, rc, props):
        got["connect_rc"] = rc
        got["connack_props"] = props
        events["connect"].set()

    def on_subscribe(c, userdata, mid, rcs, props):
        got["suback"] = [int(r.value) for r in rcs]
        events["subscribe"].set()

    def on_publish(c, userdata, mid, rc, props):
        events["publish" if "publish" not in got else "publish2"].set()
        got["publish"] = mid

    def on_message(c, userdata, msg):
        got.setdefault("messages", []).append(
            (msg.topic, msg.payload, getattr(msg.properties, "UserProperty", None)))
        events["message"].set()

    client.on_connect, client.on_subscribe, client.on_publish, client.on_message = (
        on_connect, on_subscribe, on_publish, on_message)

    async def wait(name):
        assert await asyncio.to_thread(events[name].wait, 5), f"paho never saw {name}"

    try:
        if v5:
            cp = PahoProperties(PacketTypes.CONNECT)
            cp.SessionExpiryInterval = 30
            cp.UserProperty = [("consumer-group", "g1")]
            client.connect("127.0.0.1", port, keepalive=30, clean_start=True, properties=cp)
        else:
            client.connect("127.0.0.1", port, keepalive=30)
        client.loop_start()
        await wait("connect")
        assert not got["connect_rc"].is_failure
        if v5:
            sp = PahoProperties(PacketTypes.SUBSCRIBE)
            sp.SubscriptionIdentifier = 7
            client.subscribe([("a/+", 1), ("b/#", 2)], properties=sp)
        else:
            client.subscribe([("a/+", 1), ("b/#", 2)])
        await wait("subscribe")
        assert got["suback"] == [1, 2]
        if v5:
            pp = PahoProperties(PacketTypes.PUBLISH)
            pp.UserProperty = [("message-id", "orders:42"), ("group-id", "g1"), ("message-id", "dup")]
            pp.ContentType = "text/plain"
            client.publish("a/x", b"hello", qos=1, properties=pp)
        else:
            client.publish("a/x", b"hello", qos=1)
        await wait("publish")
        await wait("message")
        client.publish("b/y", b"\x00\xff" * 100, qos=2)
        await wait("publish2")
    finally:
        client.disconnect()
        paho_loop_stop(client)
        server.close()
        await server.wait_closed()

    connect, sub, pub = seen[0], next(p for p in seen if isinstance(p, Subscribe)), next(
        p for p in seen if isinstance(p, Publish))
    assert isinstance(connect, Connect) and connect.protocol_level == (5 if v5 else 4)
    assert (connect.client_id, connect.username, connect.password) == ("paho-1", "user", b"secret")
    assert connect.will == Will("will/topic", b"gone", 1, False, connect.will.properties)
    assert [(s.topic_filter, s.qos) for s in sub.subscriptions] == [("a/+", 1), ("b/#", 2)]
    assert (pub.topic, pub.payload, pub.qos) == ("a/x", b"hello", 1)
    assert any(isinstance(p, Pubrel) for p in seen)  # the QoS 2 flow went through
    if v5:
        assert connect.properties.session_expiry_interval == 30
        assert connect.properties.user_properties == [("consumer-group", "g1")]
        assert sub.properties.subscription_identifiers == [7]
        assert pub.properties.user_properties == [("message-id", "orders:42"), ("group-id", "g1"), ("message-id", "dup")]
        assert pub.properties.content_type == "text/plain"
        assert got["messages"][0][2] == [("message-id", "orders:42"), ("group-id", "g1"), ("message-id", "dup"), ("echo", "1")]
        assert got["connack_props"].UserProperty == [("server", "fluxpg")]
    assert [m[:2] for m in got["messages"]] == [("a/x", b"hello"), ("b/y", b"\x00\xff" * 100)]


# --- interop: the codec as a client of the real Mosquitto broker ----------------------------------
def _mosquitto_up() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 1883), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _mosquitto_up(), reason="no Mosquitto broker on 127.0.0.1:1883")
@pytest.mark.parametrize("v", [4, 5])
async def test_codec_client_against_mosquitto(v):
    reader, writer = await asyncio.open_connection("127.0.0.1", 1883)
    dec = Decoder(version=v)

    async def recv():
        while (pkt := dec.next_packet()) is None:
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "broker closed the connection"
            dec.feed(data)
        return pkt

    topic = f"fluxpg-codec-test/{v}/{id(dec)}"
    props = Properties(user_properties=[("k", "v1"), ("k", "v2")]) if v == 5 else Properties()
    try:
        writer.write(encode(Connect(f"fluxpg-codec-{v}-{id(dec)}", keep_alive=30), v))
        assert (await recv()).reason_code == RC.SUCCESS
        writer.write(encode(Subscribe(1, [Subscription(topic, qos=1)]), v))
        assert await recv() == Suback(1, [RC.GRANTED_QOS_1])
        writer.write(encode(Publish(topic, b"payload", qos=1, packet_id=2, properties=props), v))
        got = {type(p): p for p in [await recv(), await recv()]}
        assert got[Puback].packet_id == 2
        msg = got[Publish]
        assert (msg.topic, msg.payload, msg.qos) == (topic, b"payload", 1)
        assert msg.properties.user_properties == props.user_properties
        writer.write(encode(Puback(msg.packet_id), v))
        writer.write(encode(Pingreq(), v))
        assert await recv() == Pingresp()
        writer.write(encode(Disconnect(), v))
    finally:
        writer.close()
