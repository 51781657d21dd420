"""AMQP 1.0 sans-I/O parts without a broker: our SASL layer and the message ↔ log mapping."""
import struct
import uuid
from datetime import datetime, timezone

import pytest
from proton import Message, symbol, ulong

from fluxpg.protocols.amqp10 import sasl
from fluxpg.protocols.amqp10.messages import from_delivery, to_log
from fluxpg.delivery import Delivery


def test_plain_with_initial_response_and_pipelined_amqp_header():
    server = sasl.SaslServer(["PLAIN", "ANONYMOUS"])
    data = sasl.client_frames("PLAIN", "alice", "pw", hostname="broker") + sasl.AMQP_HEADER + b"open..."
    # byte by byte: the layer must cope with any split
    events = []
    for i in range(len(data)):
        events += server.receive(data[i:i + 1])
    out = server.take_output()
    assert out.startswith(sasl.SASL_HEADER)
    code, fields = sasl.decode_frame(out[8:])
    assert code == sasl.SASL_MECHANISMS and [str(m) for m in fields[0]] == ["PLAIN", "ANONYMOUS"]
    [init] = events
    assert (init.mechanism, init.username, init.password, init.hostname) == ("PLAIN", "alice", "pw", "broker")
    outcome = server.outcome(sasl.SaslCode.OK)
    assert sasl.decode_frame(outcome) == (sasl.SASL_OUTCOME, [0])
    assert server.done and server.take_rest() == sasl.AMQP_HEADER + b"open..."


def test_plain_without_initial_response_gets_a_challenge():
    server = sasl.SaslServer(["PLAIN"])
    init = sasl.SASL_HEADER + sasl.encode_frame(sasl.SASL_INIT, [symbol("PLAIN")])
    assert server.receive(init) == []
    out = server.take_output()
    frames = out[8:]
    size = struct.unpack_from(">I", frames)[0]
    assert sasl.decode_frame(frames[size:])[0] == sasl.SASL_CHALLENGE
    [event] = server.receive(sasl.encode_frame(sasl.SASL_RESPONSE, [b"\x00bob\x00secret"]))
    assert (event.username, event.password) == ("bob", "secret")


def test_unoffered_mechanism_is_reported_for_an_auth_failure():
    server = sasl.SaslServer(["PLAIN"])
    [event] = server.receive(sasl.client_frames("ANONYMOUS"))
    assert event.mechanism == "ANONYMOUS"
    assert sasl.decode_frame(server.outcome(sasl.SaslCode.AUTH))[1] == [1]
    assert server.failed


@pytest.mark.parametrize("data", [
    b"AMQP\x00\x01\x00\x00",                                     # not the SASL header
    sasl.SASL_HEADER + struct.pack(">IBBH", 4, 2, 1, 0),         # frame size below 8
    sasl.SASL_HEADER + struct.pack(">IBBH", 1 << 20, 2, 1, 0),   # absurd frame size
    sasl.SASL_HEADER + struct.pack(">IBBH", 12, 2, 0, 0) + b"\x00\x53\x41\x45",   # AMQP frame type
    sasl.SASL_HEADER + struct.pack(">IBBH", 12, 2, 1, 0) + b"\xff\xff\xff\xff",   # undecodable
    sasl.SASL_HEADER + sasl.encode_frame(sasl.SASL_RESPONSE, [b""]),              # response before init
    sasl.SASL_HEADER + sasl.encode_frame(sasl.SASL_INIT, [symbol("PLAIN"), b"no-nuls"]),
])
def test_protocol_violations_raise(data):
    with pytest.raises(sasl.SaslError):
        sasl.SaslServer(["PLAIN"]).receive(data)


def _delivery(payload, headers, seq=7, count=1, kind="classic"):
    return Delivery(queue="orders", group="g", partition=0, seq=seq, topic="$queue/orders/eu", payload=payload,
                    headers=headers, created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
                    delivery_count=count, kind=kind)


@pytest.mark.parametrize("body", ["text", b"bytes", None, {"a": [1, 2]}, 42])
def test_bodies_round_trip(body):
    message = Message(body=body, id=uuid.uuid4(), correlation_id=b"\x01\x02", user_id=b"alice",
                      properties={"n": ulong(3), "t": "x"}, content_type="a/b", ttl=5.0, priority=2,
                      annotations={symbol("x-opt-k"): "v"})
    payload, headers = to_log(message)
    back = from_delivery(_delivery(payload, headers, count=2))
    expected = bytes(body) if isinstance(body, bytes) else body
    got = bytes(back.body) if isinstance(back.body, memoryview) else back.body
    assert got == expected
    assert back.id == message.id and bytes(back.correlation_id) == b"\x01\x02"
    assert bytes(back.user_id) == b"alice" and back.content_type == "a/b"
    assert back.ttl == 5.0 and back.priority == 2 and back.delivery_count == 1 and not back.first_acquirer
    assert back.annotations == {symbol("x-opt-k"): "v"}
    assert type(back.properties["n"]) is ulong and back.properties["message-id"] == "orders:7"


def test_messages_from_other_protocols_are_data_sections():
    back = from_delivery(_delivery(b"raw", {"content-type": "text/plain", "user": {"nested": 1}, "n": 5},
                                   kind="stream"))
    assert bytes(back.body) == b"raw" and back.inferred
    assert back.id == "orders:7" and back.content_type == "text/plain"
    assert back.properties["user"] == '{"nested":1}' and back.properties["n"] == 5
    assert back.properties["x-stream-offset"] == "7"
