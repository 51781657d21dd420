"""AMQP 0-9-1 front-end pieces without a server: framing, exchange routing, property mapping."""
from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands, frame as pframe, header as pheader

from fluxpg.protocols.amqp091 import framing
from fluxpg.protocols.amqp091.exchanges import Binding, Exchange, ExchangeTable, freeze_args, headers_match, topic_matches
from fluxpg.protocols.amqp091.properties import delivery_properties, headers_from_properties
from fluxpg.delivery import Delivery


def _method_bytes(channel: int, method) -> bytes:
    return pframe.marshal(method, channel)


def test_decoder_splits_partial_and_joined_frames():
    data = (_method_bytes(1, commands.Basic.Qos(0, 10, False))
            + framing.heartbeat_frame()
            + _method_bytes(2, commands.Channel.Open()))
    dec = framing.FrameDecoder()
    frames = []
    for i in range(len(data)):            # byte by byte: incomplete data is never an error
        frames += dec.feed(data[i:i + 1])
    assert [(f.type, f.channel) for f in frames] == [(1, 1), (8, 0), (1, 2)]
    qos = framing.decode_method(frames[0].payload)
    assert isinstance(qos, commands.Basic.Qos) and qos.prefetch_count == 10
    assert dec.buffered == 0


def test_decoder_rejects_corrupt_frames():
    good = _method_bytes(1, commands.Channel.Open())
    with pytest.raises(framing.FrameError, match="frame-end"):
        framing.FrameDecoder().feed(good[:-1] + b"\x00")
    with pytest.raises(framing.FrameError, match="unknown frame type"):
        framing.FrameDecoder().feed(b"\x09" + good[1:])
    with pytest.raises(framing.FrameError, match="frame-max"):
        framing.FrameDecoder(max_frame=4096).feed(b"\x03\x00\x01\x00\x01\x00\x00")   # announces 65536 bytes
    with pytest.raises(framing.FrameError) as err:
        framing.decode_method(b"\x00\x63\x00\x01")   # class 99: no such method
    assert err.value.code == framing.NOT_IMPLEMENTED


def test_heartbeat_then_bad_end_byte_is_a_frame_error_after_the_heartbeat():
    # Issue 12: this stream raised IndexError (the error text read the buffer after trimming it).
    dec = framing.FrameDecoder()
    frames = dec.feed(bytes.fromhex("08000000000000ce01000100000006003c0028000000"))
    assert [(f.type, f.channel) for f in frames] == [(framing.FRAME_HEARTBEAT, 0)]
    assert dec.error_pending
    with pytest.raises(framing.FrameError, match="frame-end byte is 0x00") as err:
        dec.feed(b"")
    assert err.value.code == framing.FRAME_ERROR
    with pytest.raises(framing.FrameError):   # a failed decoder stays failed and holds nothing
        dec.feed(b"\x08\x00\x00\x00\x00\x00\x00\xce")
    assert dec.buffered == 0


def _valid_stream() -> bytes:
    """Frames of many kinds a client sends: method frames with field tables, a content header
    with every property, bodies, heartbeats."""
    props = commands.Basic.Properties(
        content_type="text/plain", content_encoding="utf-8", headers={"a": 1, "b": "x", "c": [1, "y"], "d": {"e": 1.5}},
        delivery_mode=2, priority=3, correlation_id="c1", reply_to="r", expiration="1000", message_id="m",
        timestamp=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), message_type="t", user_id="guest", app_id="app")
    return b"".join([
        _method_bytes(1, commands.Channel.Open()),
        _method_bytes(1, commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10})),
        _method_bytes(1, commands.Basic.Consume(queue="q", consumer_tag="t", arguments={"x-stream-offset": "first"})),
        _method_bytes(1, commands.Basic.Publish(exchange="", routing_key="q", mandatory=True)),
        pframe.marshal(pheader.ContentHeader(0, 5, props), 1),
        pframe.marshal(pframe.unmarshal(b"\x03\x00\x01\x00\x00\x00\x05hello\xce")[2], 1),
        framing.heartbeat_frame(),
        _method_bytes(1, commands.Basic.Ack(7, True)),
        _method_bytes(1, commands.Exchange.Bind(destination="a", source="b", routing_key="k", arguments={"x-match": "any"})),
        _method_bytes(0, commands.Connection.Close(200, "bye", 0, 0)),
    ])


def _decode_everything(data: bytes, chunk: int) -> None:
    """What the connection does with bytes: frame them, then decode each frame's payload. Only
    FrameError may come out (it becomes connection.close 501 / 540)."""
    dec = framing.FrameDecoder(131072)
    try:
        for i in range(0, max(len(data), 1), chunk):
            for f in dec.feed(data[i:i + chunk]):
                if f.type == framing.FRAME_METHOD:
                    framing.decode_method(f.payload)
                elif f.type == framing.FRAME_HEADER:
                    framing.decode_content_header(f.payload)
        if dec.error_pending:
            dec.feed(b"")
    except framing.FrameError as exc:
        assert exc.code in (framing.FRAME_ERROR, framing.NOT_IMPLEMENTED)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), chunk=st.integers(1, 64))
def test_random_bytes_only_raise_frame_errors(data, chunk):
    _decode_everything(data, chunk)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]), st.integers(0, 10_000),
                                st.integers(0, 255)), min_size=1, max_size=6),
       chunk=st.integers(1, 200))
def test_mutated_valid_frames_only_raise_frame_errors(edits, chunk):
    data = bytearray(_valid_stream())
    for op, where, value in edits:
        i = where % len(data)
        if op == "flip":
            data[i] ^= 1 << (value % 8)
        elif op == "insert":
            data[i:i] = bytes([value])
        elif op == "delete" and len(data) > 1:
            del data[i]
        else:
            data[i] = value
    _decode_everything(bytes(data), chunk)


def test_encoding_echoes_dollar_names_and_splits_bodies():
    # pamqp's own validation refuses `$`; the server must still be able to send such names.
    raw = framing.method_frame(1, framing.build(commands.Queue.DeclareOk, "$dlq/orders", 3, 0))
    frames = framing.FrameDecoder().feed(raw)
    ok = framing.decode_method(frames[0].payload)
    assert ok.queue == "$dlq/orders" and ok.message_count == 3
    body = bytes(range(256)) * 40   # 10240 bytes
    out = framing.FrameDecoder().feed(framing.content_frames(1, commands.Basic.Properties(), body, 4096))
    assert out[0].type == framing.FRAME_HEADER
    assert [len(f.payload) for f in out[1:]] == [4088, 4088, 2064]
    assert b"".join(f.payload for f in out[1:]) == body
    assert isinstance(framing.decode_content_header(out[0].payload), pheader.ContentHeader)


def test_topic_exchange_matching():
    assert topic_matches("orders.#", "orders.eu.images")
    assert topic_matches("orders.#", "orders")
    assert topic_matches("*.eu", "orders.eu") and not topic_matches("*.eu", "orders.eu.x")
    assert topic_matches("#", "") and not topic_matches("*", "")
    assert topic_matches("a.#.c", "a.c") and topic_matches("a.#.c", "a.b.b.c") and not topic_matches("a.#.c", "a.b")


def test_exchange_table_routes_through_bindings_without_loops():
    t = ExchangeTable()
    t.declare(Exchange("logs", "fanout"))
    t.declare(Exchange("events", "topic"))
    t.bind(Binding("events", "q1", "orders.#"))
    t.bind(Binding("events", "q2", "*.eu"))
    t.bind(Binding("events", "logs", "#", to_exchange=True))
    t.bind(Binding("logs", "audit", ""))
    t.bind(Binding("logs", "events", "", to_exchange=True))   # a cycle must not loop
    assert t.route("events", "orders.eu") == ["q1", "q2", "audit"]
    assert t.route("events", "billing.us") == ["audit"]
    t.unbind(Binding("events", "q2", "*.eu"))
    assert t.route("events", "orders.eu") == ["q1", "audit"]
    t.delete("logs")
    assert t.route("events", "x") == []


def test_headers_exchange_matching():
    assert headers_match({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 0})
    assert not headers_match({"x-match": "all", "a": 1, "b": "x"}, {"a": 1})
    assert headers_match({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"})
    assert not headers_match({"a": 1}, {})
    assert freeze_args({"b": 1, "a": {"z": 1}}) == freeze_args({"a": {"z": 1}, "b": 1})


def test_properties_round_trip_through_stored_headers():
    ts = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    props = commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip", headers={"tenant": "acme", "n": 7,
                                                                            "raw": b"\xff", "nested": {"k": [1, 2]}},
        delivery_mode=2, priority=5, correlation_id="c-1", reply_to="replies", expiration="60000",
        message_id="m-1", timestamp=ts, message_type="order.created", user_id="guest", app_id="shop")
    stored = headers_from_properties(props, "events", "orders.eu")
    import json
    json.dumps(stored)   # what the log stores must be JSON
    d = Delivery(queue="orders", group="workers", partition=0, seq=42, topic="$queue/orders/orders.eu",
                 payload=b"{}", headers=json.loads(json.dumps(stored)), created_at=ts, delivery_count=2)
    out, exchange, rk = delivery_properties(d)
    assert (exchange, rk) == ("events", "orders.eu")
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "message_type", "user_id", "app_id"):
        assert getattr(out, attr) == getattr(props, attr), attr
    assert out.headers["tenant"] == "acme" and out.headers["n"] == 7 and out.headers["nested"] == {"k": [1, 2]}
    assert out.headers["raw"] == "\\xff"
    assert out.headers["message-id"] == "orders:42" and out.headers["group-id"] == "workers"
    assert not any(k.startswith("x-amqp-") for k in out.headers)
    # Keys shared with the MQTT front-end (MQTT 5 response topic / correlation data).
    assert stored["response-topic"] == "replies" and stored["correlation-data"] == "c-1"
    # What another protocol stored: content-type header, no AMQP keys → broker message id, topic as key.
    d2 = Delivery(queue="orders", group="g", partition=0, seq=1, topic="$queue/orders/eu", payload=b"",
                  headers={"content-type": "text/plain", "reply-to": "r/1"}, created_at=ts, delivery_count=1)
    out2, ex2, rk2 = delivery_properties(d2)
    assert out2.content_type == "text/plain" and out2.reply_to == "r/1" and out2.message_id == "orders:1"
    assert (ex2, rk2) == ("", "$queue/orders/eu")
    framing.content_frames(1, out2, b"", 4096)   # encodable


@pytest.mark.parametrize("stamp", [253402300800, "253402300800", 2 ** 62, -1])
def test_out_of_range_stored_timestamp_is_left_out(stamp):
    # Found by comparing delivery_properties before/after a change with hypothesis: a stored
    # x-amqp-timestamp past year 9999 raised ValueError, so the message could not be delivered.
    d = Delivery("q", "g", 0, 5, "$queue/q", b"p", {"x-amqp-timestamp": stamp},
                 dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), 1)
    props, _exchange, _rk = delivery_properties(d)
    assert props.timestamp is None


def test_largest_stored_timestamp_is_delivered():
    d = Delivery("q", "g", 0, 5, "$queue/q", b"p", {"x-amqp-timestamp": 253402300799},
                 dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), 1)
    props, _exchange, _rk = delivery_properties(d)
    assert props.timestamp == dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone.utc)
