"""The delivery fast path of the AMQP 0-9-1 codec (framing.deliver_frame, the content header in
framing.content_frames) writes exactly the bytes pamqp writes, for every value: the types it
encodes itself and those it hands to pamqp (floats, timestamps, long strings, long keys)."""
from __future__ import annotations

import datetime as dt
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, header

from fluxpg.protocols.amqp091 import framing

Properties = commands.Basic.Properties

scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=40),
    st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1),
    st.sampled_from([-129, -128, 127, 128, -32769, -32768, 32767, 32768, 65535, 65536, 2 ** 31 - 1, 2 ** 31,
                     2 ** 32 - 1, 2 ** 32, -2 ** 31, -2 ** 31 - 1]),
    st.floats(width=32, allow_nan=False),
    st.datetimes(min_value=dt.datetime(1971, 1, 1), timezones=st.just(dt.timezone.utc)),
)
keys = st.one_of(st.text(max_size=20), st.text(min_size=129, max_size=140, alphabet="ab"))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=4)), max_leaves=12)
shortstr = st.one_of(st.none(), st.just(""), st.text(max_size=30), st.text(min_size=256, max_size=260, alphabet="x"))


@st.composite
def properties(draw) -> Properties:
    p = Properties.__new__(Properties)
    for slot in Properties.__slots__:
        kind = getattr(Properties, "_" + slot)
        if kind == "table":
            v = draw(st.one_of(st.none(), st.dictionaries(keys, values, max_size=6)))
        elif kind == "octet":
            v = draw(st.one_of(st.none(), st.integers(0, 255)))
        elif kind == "timestamp":
            v = draw(st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1971, 1, 1),
                                                       timezones=st.just(dt.timezone.utc))))
        else:
            v = draw(shortstr)
        setattr(p, slot, v)
    return p


def _pamqp_header(props: Properties, size: int) -> bytes | type:
    try:
        return header.ContentHeader(0, size, props).marshal()
    except Exception as exc:  # noqa: BLE001 - both paths must fail alike
        return type(exc)


def _fast_header(props: Properties, size: int) -> bytes | type:
    try:
        return framing._content_header_payload(props, size)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(properties(), st.integers(0, 2 ** 40))
def test_content_header_bytes_equal_pamqp(props, size):
    assert _fast_header(props, size) == _pamqp_header(props, size)


def test_delivery_headers_take_the_fast_path(monkeypatch):
    # What a delivery carries (delivery_properties) never needs pamqp's encoder.
    p = Properties(content_type="text/plain", delivery_mode=2, message_id="q:1",
                   headers={"message-id": "q:1", "group-id": "q", "offset": "1", "n": 7, "ok": True,
                            "nested": {"a": [1, "b", None]}})
    expected = header.ContentHeader(0, 10, p).marshal()
    monkeypatch.setattr(header.ContentHeader, "marshal", lambda self: (_ for _ in ()).throw(AssertionError("slow path")))
    assert framing._content_header_payload(p, 10) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(0, 2 ** 64), st.booleans(), st.text(max_size=40), st.text(max_size=300))
def test_deliver_frame_equals_pamqp(tag, delivery_tag, redelivered, exchange, rk):
    def slow():
        return framing.method_frame(3, framing.build(commands.Basic.Deliver, tag, delivery_tag, redelivered,
                                                     exchange, rk))
    try:
        expected = slow()
    except Exception as exc:  # noqa: BLE001
        expected = type(exc)
    try:
        got = framing.deliver_frame(3, tag, delivery_tag, redelivered, exchange, rk)
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got == expected
    if isinstance(got, bytes):
        assert struct.unpack(">BHI", got[:7])[0] == framing.FRAME_METHOD


def _decoded(payload: bytes):
    try:
        m = framing.decode_method(payload)
    except framing.FrameError as exc:
        return ("error", str(exc))
    return (type(m), {slot: getattr(m, slot) for slot in type(m).__slots__})


def _generic(payload: bytes):
    # decode_method with the fast path switched off
    orig = framing._fast_method
    framing._fast_method = lambda _p: None
    try:
        return _decoded(payload)
    finally:
        framing._fast_method = orig


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 65535), st.text(max_size=60), st.text(max_size=200), st.booleans(), st.booleans(),
       st.integers(-2 ** 63, 2 ** 63 - 1), st.data())
def test_publish_and_ack_decode_like_pamqp(ticket, exchange, rk, mandatory, immediate, tag, data):
    pub = framing._method_payload(framing.build(commands.Basic.Publish, ticket, exchange, rk, mandatory, immediate))
    ack = framing._method_payload(framing.build(commands.Basic.Ack, tag, mandatory))
    for payload in (pub, ack):
        assert _decoded(payload) == _generic(payload)
        # Mutations: cut, extended, a byte changed: whatever pamqp makes of it, so does the fast path.
        cut = data.draw(st.integers(0, len(payload)))
        assert _decoded(payload[:cut]) == _generic(payload[:cut])
        assert _decoded(payload + b"\x00\xff") == _generic(payload + b"\x00\xff")
        i = data.draw(st.integers(4, len(payload) - 1))
        changed = payload[:i] + bytes([data.draw(st.integers(0, 255))]) + payload[i + 1:]
        assert _decoded(changed) == _generic(changed)


def _header_state(payload: bytes, fast: bool):
    orig = framing._fast_content_header
    if not fast:
        framing._fast_content_header = lambda _p: None
    try:
        ch = framing.decode_content_header(payload)
    except framing.FrameError as exc:
        return ("error", str(exc))
    finally:
        framing._fast_content_header = orig
    props = {slot: getattr(ch.properties, slot, "<unset>") for slot in Properties.__slots__}
    return (ch.class_id, ch.weight, ch.body_size, props)


@settings(max_examples=400, deadline=None)
@given(properties(), st.integers(0, 2 ** 40), st.data())
def test_content_header_decodes_like_pamqp(props, size, data):
    try:
        payload = header.ContentHeader(0, size, props).marshal()
    except Exception:  # noqa: BLE001 - not encodable (a shortstr too long): nothing to decode
        return
    assert _header_state(payload, True) == _header_state(payload, False)
    cut = data.draw(st.integers(0, len(payload)))
    assert _header_state(payload[:cut], True) == _header_state(payload[:cut], False)
    assert _header_state(payload + b"\x01", True) == _header_state(payload + b"\x01", False)
    if len(payload) > 12:
        i = data.draw(st.integers(12, len(payload) - 1))
        changed = payload[:i] + bytes([data.draw(st.integers(0, 255))]) + payload[i + 1:]
        assert _header_state(changed, True) == _header_state(changed, False)


# --- properties.encode_delivery: a delivery's frames without building Properties ---------------

from fluxpg.delivery import Delivery  # noqa: E402
from fluxpg.protocols.amqp091 import properties as amqp_props  # noqa: E402

json_scalars = st.one_of(st.none(), st.booleans(), st.text(max_size=30),
                         st.text(min_size=250, max_size=300, alphabet="xé"),
                         st.integers(), st.sampled_from([0, 1, 2, 3, 255, 256, -1, 2 ** 63, -2 ** 63 - 1]),
                         st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(st.text(max_size=10), inner, max_size=3)),
                           max_leaves=8)
property_keys = st.sampled_from(sorted(amqp_props._PROPERTY_KEYS | {"reply-to", "correlation-id", "message-id",
                                                                     "offset", "queue", "group-id", "x-source-topic"}))
stored_headers = st.dictionaries(st.one_of(property_keys, st.text(max_size=12), keys), json_values, max_size=8)


def _general_delivery(d: Delivery, tag: int, frame_max: int) -> bytes | type:
    try:
        props, exchange, rk = amqp_props.delivery_properties(d)
        return (framing.deliver_frame(3, "ctag", tag, d.redelivered, exchange, rk)
                + framing.content_frames(3, props, d.payload, frame_max))
    except Exception as exc:  # noqa: BLE001 - both paths must fail alike
        return type(exc)


@settings(max_examples=600, deadline=None)
@given(stored_headers, st.sampled_from(["classic", "stream"]), st.text(max_size=20), st.text(max_size=20),
       st.integers(0, 2 ** 62), st.text(max_size=40), st.binary(max_size=300), st.integers(1, 5),
       st.integers(1, 2 ** 40), st.sampled_from([0, 4096, 131072, 9, 100]))
def test_encode_delivery_equals_the_general_path(stored, kind, queue, group, seq, topic, payload, count, tag,
                                                 frame_max):
    d = Delivery(queue, group, 0, seq, topic, payload, stored, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc),
                 count, kind=kind)
    try:
        fast = amqp_props.encode_delivery(3, "ctag", tag, d, frame_max)
    except Exception as exc:  # noqa: BLE001
        fast = type(exc)
    assert fast == _general_delivery(d, tag, frame_max)


def test_encode_delivery_takes_the_fast_path_for_plain_messages(monkeypatch):
    """An aio-pika message (delivery mode, routing key, a header) never reaches the general path."""
    def boom(*_a, **_k):
        raise AssertionError("general path used")
    stored = {"x-amqp-delivery-mode": 2, "x-amqp-routing-key": "jobs", "x-tenant": "acme", "x-amqp-message-id": "m1"}
    d = Delivery("jobs", "jobs", 0, 41, "$queue/jobs", b"x" * 256, stored, dt.datetime.now(dt.timezone.utc), 2)
    expected = _general_delivery(d, 9, 131072)
    monkeypatch.setattr(amqp_props, "delivery_properties", boom)
    assert amqp_props.encode_delivery(3, "ctag", 9, d, 131072) == expected


def test_encode_delivery_remembers_headers_by_value_and_type():
    """Equal stored headers of different types (1, True, 1.0; -0.0 and 0.0) are not confused by
    what encode_delivery remembers per stored headers."""
    now = dt.datetime.now(dt.timezone.utc)
    for values in ([1, True, 1.0, "1"], [0.0, -0.0, 0, False], [2, 2.0, "2"]):
        for key in ("x-amqp-type", "x-amqp-delivery-mode", "x-amqp-priority", "x-amqp-routing-key", "x-tenant",
                    "x-amqp-message-id", "x-amqp-exchange"):
            for round_ in range(2):
                for i, value in enumerate(values):
                    d = Delivery("q", "g", 0, 10 * i + round_, "t", b"x", {key: value}, now, 1)
                    assert amqp_props.encode_delivery(1, "c", 5, d, 4096) == _general_delivery_on(1, "c", 5, d, 4096)


def _general_delivery_on(channel, tag_str, tag, d, frame_max):
    props, exchange, rk = amqp_props.delivery_properties(d)
    return (framing.deliver_frame(channel, tag_str, tag, d.redelivered, exchange, rk)
            + framing.content_frames(channel, props, d.payload, frame_max))


# --- the publish side: confirms written directly, basic.publish recognised for the fast path -----

from fluxpg.protocols import prescan  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 65535), st.one_of(st.integers(0, 2 ** 63 - 1), st.integers(2 ** 63, 2 ** 64 - 1),
                                        st.integers(-2 ** 63, -1)), st.booleans())
def test_ack_frame_equals_method_frame(channel, tag, multiple):
    def general():
        try:
            return framing.method_frame(channel, commands.Basic.Ack(tag, multiple))
        except Exception as exc:  # noqa: BLE001 - both must fail alike
            return type(exc)

    def fast():
        try:
            return framing.ack_frame(channel, tag, multiple)
        except Exception as exc:  # noqa: BLE001
            return type(exc)

    assert fast() == general()


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 65535), st.text(max_size=60), st.text(max_size=200), st.booleans(), st.booleans(), st.data())
def test_exact_publish_is_what_the_fast_decoder_takes(ticket, exchange, rk, mandatory, immediate, data):
    # The decoder skips the pre-scan for exactly these payloads, and publish_method decodes them
    # as decode_method does; anything else goes the general way (pre-scan, decode_method).
    pub = framing._method_payload(framing.build(commands.Basic.Publish, ticket, exchange, rk, mandatory, immediate))
    cut = data.draw(st.integers(0, len(pub)))
    i = data.draw(st.integers(4, len(pub) - 1))
    changed = pub[:i] + bytes([data.draw(st.integers(0, 255))]) + pub[i + 1:]
    ack = framing._method_payload(framing.build(commands.Basic.Ack, 5, False))
    for payload in (pub, pub[:cut], pub + b"\x00", changed, ack):
        exact = framing._exact_publish(payload)
        fast = framing.publish_method(payload)
        if exact:
            prescan.amqp091_method(payload, prescan.DEFAULT_LIMITS)   # would have passed
        if fast is not None:
            assert exact
            assert _decoded(payload) == (type(fast), {s: getattr(fast, s) for s in type(fast).__slots__})
        else:
            assert payload[:4] != framing._PUBLISH_INDEX or _decoded(payload) == _generic(payload)
    assert framing.publish_method(pub) is not None


@settings(max_examples=300, deadline=None)
@given(properties(), st.integers(0, 2 ** 40), st.data())
def test_generated_property_decoders_equal_the_generic_loop(props, size, data):
    # _fast_content_header runs a decoder written out per flags word (at most _MAX_DECODERS of
    # them), the generic loop past that: both make the same Properties or both give up.
    try:
        payload = header.ContentHeader(0, size, props).marshal()
    except Exception:  # noqa: BLE001 - not encodable: nothing to decode
        return
    cut = data.draw(st.integers(14, max(len(payload), 14)))
    for p in (payload, payload[:cut], payload + b"\x00"):
        flags = struct.unpack_from(">H", p, 12)[0]

        def state(fn):
            try:
                got = fn()
            except Exception as exc:  # noqa: BLE001
                return type(exc)
            return None if got is None else {s: getattr(got, s) for s in Properties.__slots__}

        assert state(lambda: framing._props_decoder(flags)(p, len(p))) == state(lambda: framing._props_generic(p, flags))


# --- headers_from_properties: the pre-session version, as the reference -------------------------

import datetime as _dt  # noqa: E402

from fluxpg.protocols.amqp091.properties import (EXCHANGE_KEY, ROUTING_KEY_KEY, _RESERVED, _SHARED,  # noqa: E402
                                                 _text, json_safe)


def _reference_headers(props: Properties | None, exchange: str, routing_key: str) -> dict[str, Any]:
    """What to store for a published message (see the module docstring)."""
    out: dict[str, Any] = {}
    if props is not None:
        table = getattr(props, "headers", None)
        if table:
            for key, value in table.items():
                out[_text(key) or ""] = json_safe(value)
        for attr, key in _SHARED.items():
            value = getattr(props, attr, None)
            if value not in (None, ""):
                out[key] = _text(value)
        for attr, key in _RESERVED.items():
            value = getattr(props, attr, None)
            if value in (None, ""):
                continue
            if attr == "timestamp":
                if isinstance(value, _dt.datetime):
                    if value.tzinfo is None:
                        value = value.replace(tzinfo=_dt.timezone.utc)
                    value = int(value.timestamp())
                out[key] = value
            elif attr in ("delivery_mode", "priority"):
                out[key] = int(value)
            else:
                out[key] = _text(value)
    if exchange:
        out[EXCHANGE_KEY] = exchange
    out[ROUTING_KEY_KEY] = routing_key
    return out


odd_property = st.one_of(st.none(), st.just(""), st.text(max_size=10), st.integers(0, 300), st.sampled_from(["2", "x"]),
                         st.binary(max_size=5), st.datetimes(min_value=dt.datetime(1971, 1, 1)),
                         st.datetimes(min_value=dt.datetime(1971, 1, 1), timezones=st.just(dt.timezone.utc)))


@settings(max_examples=400, deadline=None)
@given(st.one_of(properties(), st.builds(lambda vals: _odd_props(vals), st.lists(odd_property, min_size=14,
                                                                                  max_size=14))),
       st.text(max_size=10), st.text(max_size=10))
def test_headers_from_properties_equal_the_reference(props, exchange, rk):
    def run(f):
        try:
            out = f(props, exchange, rk)
        except Exception as exc:  # noqa: BLE001 - both must fail alike
            return type(exc)
        return list(out.items()), [type(v) for v in out.values()]
    assert run(amqp_props.headers_from_properties) == run(_reference_headers)


def _odd_props(vals) -> Properties:
    p = Properties.__new__(Properties)
    for slot, v in zip(Properties.__slots__, vals):
        setattr(p, slot, v if slot != "headers" else None)
    return p
