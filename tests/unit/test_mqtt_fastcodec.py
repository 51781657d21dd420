"""The per-message fast paths of the MQTT codec write exactly what encode() writes, and the
decoder's short-ack path reads exactly what the general ack parser reads: for every value,
including the ones both must refuse (same exception type)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluxpg.protocols.mqtt import codec
from fluxpg.protocols.mqtt.codec import (Decoder, Properties, Puback, Pubcomp, Publish, Pubrec, Pubrel, encode,
                                         encode_ack_ok, encode_publish_plain)

VERSIONS = (3, 4, 5)

topics = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "a", "a/b", "sport/+", "#", "a\x00b", "\ud800", "$SYS/x", "é/ü/😀"]),
    st.integers(65530, 65540).map(lambda n: "t" * n),          # around the 65535-byte limit
    st.integers(21840, 21850).map(lambda n: "€" * n),          # 3 bytes each: ~65535 encoded
)
payloads = st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"x" * 127, b"x" * 128, b"x" * 16383,
                                                                b"x" * 16384, b"x" * 70000]))
packet_ids = st.one_of(st.none(), st.integers(-2, 70000), st.sampled_from([0, 1, 65535, 65536]))
qoss = st.one_of(st.integers(0, 2), st.sampled_from([-1, 3]))


def _outcome(fn):
    try:
        return fn()
    except ValueError as exc:
        return ValueError, type(exc)


@settings(max_examples=400, deadline=None)
@given(topic=topics, payload=payloads, qos=qoss, retain=st.booleans(), pid=packet_ids,
       version=st.sampled_from(VERSIONS))
def test_publish_without_properties_is_byte_identical(topic, payload, qos, retain, pid, version):
    codec._topic_cache.clear()
    slow = _outcome(lambda: encode(Publish(topic, payload, qos, retain, False, pid, Properties()), version))
    fast = _outcome(lambda: encode_publish_plain(topic, payload, qos, retain, pid, version))
    assert fast == slow
    # Twice: the second call takes the topic from the cache.
    assert _outcome(lambda: encode_publish_plain(topic, payload, qos, retain, pid, version)) == slow


@pytest.mark.parametrize("cls, first", [(Puback, 0x40), (Pubrec, 0x50), (Pubrel, 0x62), (Pubcomp, 0x70)])
@settings(max_examples=200, deadline=None)
@given(pid=st.one_of(st.integers(-2, 70000), st.sampled_from([0, 1, 65535, 65536])),
       version=st.sampled_from(VERSIONS))
def test_success_ack_is_byte_identical(cls, first, pid, version):
    slow = _outcome(lambda: encode(cls(pid), version))
    assert _outcome(lambda: encode_ack_ok(first, pid)) == slow


def _decode(data: bytes, version: int):
    d = Decoder(version=version)
    d.feed(data)
    try:
        return d.next_packet()
    except Exception as exc:  # noqa: BLE001 - compared below
        return type(exc), getattr(exc, "reason_code", None)


@settings(max_examples=400, deadline=None)
@given(ptype=st.sampled_from([0x40, 0x50, 0x62, 0x70]), body=st.binary(min_size=0, max_size=8),
       version=st.sampled_from(VERSIONS))
def test_short_ack_decodes_as_the_general_parser(ptype, body, version):
    # The fast path takes bodies of exactly two bytes with a non-zero packet id; the general
    # parser's answer for the same bytes is rebuilt from the ack's fields.
    data = bytes((ptype, len(body))) + body
    got = _decode(data, version)
    if len(body) == 2:
        pid = (body[0] << 8) | body[1]
        cls = {0x40: Puback, 0x50: Pubrec, 0x62: Pubrel, 0x70: Pubcomp}[ptype]
        if pid:
            assert got == cls(pid)
            assert got.properties.is_empty() and got.properties == Properties()
        else:
            assert got[0] is codec.MalformedPacket
    # Whatever the body, the result is the same as the general path's, which is what
    # Decoder._ack does after its fast check.
    dec = Decoder(version=version)
    from fluxpg.protocols.mqtt import properties as P
    allowed = {0x40: (P.PUBACK, codec.PUBACK_CODES, "PUBACK"), 0x50: (P.PUBREC, codec.PUBACK_CODES, "PUBREC"),
               0x62: (P.PUBREL, codec.PUBREL_CODES, "PUBREL"), 0x70: (P.PUBCOMP, codec.PUBREL_CODES, "PUBCOMP")}[ptype]
    mv = memoryview(bytes(body))
    try:
        slow = _general_ack(dec, *allowed, mv, 0, len(body))
    except Exception as exc:  # noqa: BLE001
        slow = (type(exc), getattr(exc, "reason_code", None))
    if isinstance(got, tuple):
        assert got == slow
    else:
        assert (got.packet_id, got.reason_code, got.properties) == slow


def _general_ack(dec, ptype, allowed, name, mv, pos, end):
    """Decoder._ack without its short-body fast path (the code it had before)."""
    pid = codec._packet_id(mv, pos, end)
    pos += 2
    rc = codec.ReasonCode.SUCCESS
    props = None
    if dec.version == codec.MQTT_5 and pos < end:
        rc = codec._reason(mv[pos], allowed, name)
        pos += 1
        if pos < end:
            props, pos = codec.decode_properties(mv, pos, end, ptype)
    codec._no_trailing(pos, end, name)
    return pid, rc, props if props is not None else Properties()


def test_empty_properties_are_cheap_and_equal():
    p = Properties()
    assert p.is_empty() and p == Properties() and not p
    assert not Properties(user_properties=[("k", "v")]).is_empty()
    assert not Properties(topic_alias=3).is_empty()
    assert Properties(user_properties=None).is_empty()


user_texts = st.one_of(st.text(max_size=30), st.sampled_from(["", "a\x00b", "\ud800", "é😀", "message-id", "group-id"]),
                       st.integers(65530, 65540).map(lambda n: "u" * n))


@settings(max_examples=400, deadline=None)
@given(topic=topics, payload=payloads, qos=qoss, retain=st.booleans(), pid=packet_ids,
       users=st.lists(st.tuples(user_texts, user_texts), max_size=6))
def test_publish_with_user_properties_is_byte_identical(topic, payload, qos, retain, pid, users):
    codec._topic_cache.clear()
    codec._key_cache.clear()
    slow = _outcome(lambda: encode(Publish(topic, payload, qos, retain, False, pid,
                                           Properties(user_properties=users)), 5))
    assert _outcome(lambda: codec.encode_publish_users(topic, payload, qos, retain, pid, users)) == slow
    # Twice: names and topic from the caches.
    assert _outcome(lambda: codec.encode_publish_users(topic, payload, qos, retain, pid, users)) == slow


# -- Decoder.next_fast: the broker read loop's decoder gives the same packets as next_packet --

def _packet_bytes(draw_publish, version):
    topic, payload, qos, retain, dup, pid, props = draw_publish
    try:
        return encode(Publish(topic, payload, qos, retain, dup, pid, props), version)
    except (ValueError, codec.MQTTError):
        return b""


publish_props = st.one_of(st.just(Properties()), st.just(Properties()),
                          st.builds(lambda u: Properties(user_properties=u),
                                    st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=2)),
                          st.builds(lambda a: Properties(topic_alias=a), st.integers(1, 5)))
publishes = st.tuples(st.one_of(st.text(max_size=12), st.sampled_from(["a/b", "", "a+", "#", "x\x00", "é"])),
                      st.one_of(st.binary(max_size=40), st.sampled_from([b"x" * 120, b"x" * 200, b"x" * 20000])),
                      st.integers(0, 2), st.booleans(), st.booleans(), st.integers(1, 65535), publish_props)


@st.composite
def streams(draw):
    version = draw(st.sampled_from(VERSIONS))
    parts = []
    for kind in draw(st.lists(st.sampled_from(["pub", "pub", "rawpub", "puback", "ack", "raw"]), max_size=8)):
        if kind == "rawpub":
            # What encode() refuses to write: wildcards, NUL, bad UTF-8, empty topics, zero ids,
            # QoS 3, DUP on QoS 0, property bytes that are not 0.
            first = 0x30 | draw(st.integers(0, 15))
            topic = draw(st.one_of(st.sampled_from([b"a/+", b"#", b"a\x00", b"\xff", b"", b"ok"]), st.binary(max_size=4)))
            body = len(topic).to_bytes(2, "big") + topic + draw(st.sampled_from([b"", b"\x00", b"\x00\x01", b"\x00\x00"]))
            if version == 5:
                body += draw(st.sampled_from([b"\x00", b"\x01", b"\x03\x23\x00\x01"]))
            body += draw(st.binary(max_size=6))
            parts.append(bytes((first,)) + codec.encode_varint(len(body)) + body)
        elif kind == "pub":
            pub = draw(publishes)
            qos = pub[2]
            pub = (pub[0], pub[1], qos, pub[3], pub[4] and qos > 0, pub[5] if qos else None, pub[6])
            parts.append(_packet_bytes(pub, version))
        elif kind == "puback":
            parts.append(encode_ack_ok(0x40, draw(st.integers(1, 65535))))
        elif kind == "ack":
            parts.append(bytes((draw(st.sampled_from([0x40, 0x50, 0x62, 0x70])),)) + draw(st.binary(max_size=5)))
        else:
            parts.append(draw(st.binary(max_size=12)))
    data = bytearray(b"".join(parts))
    for _ in range(draw(st.integers(0, 2))):      # mutations
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    chunks = [bytes(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)])]
    max_size = draw(st.sampled_from([codec.MAX_PACKET_SIZE, 4, 64, 300]))
    return version, chunks, max_size


def _run(version, chunks, max_size, fast):
    d = Decoder(max_packet_size=max_size, version=version)
    out = []
    for chunk in chunks:
        d.feed(chunk)
        while True:
            try:
                pkt = d.next_fast() if fast else d.next_packet()
            except Exception as exc:  # noqa: BLE001 - compared
                out.append((type(exc), getattr(exc, "reason_code", None), str(exc)))
                return out
            if pkt is None:
                break
            if type(pkt) is tuple:
                pkt = Publish(*pkt, Properties())
            elif type(pkt) is int:
                pkt = Puback(pkt, codec.ReasonCode.SUCCESS, Properties())
            out.append((pkt, d.last_size, d.buffered))
    return out


@settings(max_examples=1500, deadline=None)
@given(streams())
def test_next_fast_decodes_as_next_packet(stream):
    version, chunks, max_size = stream
    assert _run(version, chunks, max_size, True) == _run(version, chunks, max_size, False)


def test_next_fast_takes_the_plain_shapes():
    for version in VERSIONS:
        d = Decoder(version=version)
        d.feed(encode_publish_plain("a/b", b"x" * 300, 1, True, 7, version) + encode_ack_ok(0x40, 9)
               + encode_publish_plain("c", b"", 0, False, None, version))
        assert d.next_fast() == ("a/b", b"x" * 300, 1, True, False, 7)
        assert d.next_fast() == 9
        assert d.next_fast() == ("c", b"", 0, False, False, None)
        assert d.next_fast() is None and d.buffered == 0
