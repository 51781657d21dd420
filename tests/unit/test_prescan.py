"""The decoder pre-scans (fluxpg/protocols/prescan.py): what real encoders produce passes, and
depth, element counts and zero-width arrays are refused before any decoder runs."""
from __future__ import annotations

import struct

import pytest
from pamqp import commands, header
from pamqp import frame as pframe
from proton import Array, Data, Described, Message, UNDESCRIBED, symbol

from fluxpg.protocols import prescan


def nested(depth: int) -> dict:
    table: dict = {}
    for _ in range(depth - 1):
        table = {"a": table}
    return table


def test_real_encodings_pass():
    m = Message(body={"a": [1, 2, {"x": b"y"}], "arr": Array(UNDESCRIBED, Data.INT, 1, 2, 3)},
                properties={"k": "v"}, subject="s", address="$queue/q/a")
    m.annotations = {symbol("x-opt"): Described(symbol("d"), [1, 2])}
    raw = m.encode()
    assert prescan.amqp10_values(raw) == len(raw)
    props = commands.Basic.Properties(content_type="t", headers={"h": nested(10), "l": [1, "s", [2]]})
    prescan.amqp091_content_header(header.ContentHeader(0, 5, props).marshal())
    for method in (commands.Connection.StartOk(client_properties={"capabilities": {"a": True}}, response="\0u\0p"),
                   commands.Queue.Declare(queue="q", arguments={"x-max-length": 5, "nested": nested(8)}),
                   commands.Basic.Consume(queue="q", arguments={"x-consumer-group": "g"})):
        prescan.amqp091_method(pframe.marshal(method, 1)[7:-1])


def test_amqp091_depth_and_elements():
    limits = prescan.Limits(max_depth=16, max_elements=100)
    deep = header.ContentHeader(0, 1, commands.Basic.Properties(headers=nested(17))).marshal()
    with pytest.raises(prescan.DecodeLimitError, match="decoder_max_depth"):
        prescan.amqp091_content_header(deep, limits)
    wide = pframe.marshal(commands.Queue.Declare(queue="q", arguments={"l": list(range(101))}), 1)[7:-1]
    with pytest.raises(prescan.DecodeLimitError, match="decoder_max_elements"):
        prescan.amqp091_method(wide, limits)
    # arrays nest too
    arr: list = []
    for _ in range(20):
        arr = [arr]
    with pytest.raises(prescan.DecodeLimitError, match="decoder_max_depth"):
        prescan.amqp091_method(pframe.marshal(commands.Basic.Consume(queue="q", arguments={"a": arr}), 1)[7:-1])


def test_amqp10_zero_width_arrays_are_bounded_by_the_input():
    # amqp-value: array32 of N nulls — 13 bytes whatever N is
    def value(n: int) -> bytes:
        return b"\x00\x53\x77\xf0" + struct.pack(">II", 5, n) + b"\x40"
    with pytest.raises(prescan.DecodeLimitError, match="zero-width"):
        prescan.amqp10_values(value(7168))
    with pytest.raises(prescan.DecodeLimitError, match="decoder_max_elements"):
        prescan.amqp10_values(value(1_000_000))
    prescan.amqp10_values(value(12))   # no more elements than bytes: fine


def test_amqp10_depth_and_truncation():
    inner = b"\x45"   # list0
    for _ in range(20):
        inner = b"\xc0" + bytes([len(inner) + 1, 1]) + inner
    with pytest.raises(prescan.DecodeLimitError, match="decoder_max_depth"):
        prescan.amqp10_values(inner)
    with pytest.raises(prescan.DecodeLimitError, match="past the end"):
        prescan.amqp10_values(b"\xb1\x00\x00\x00\x10abc")
    with pytest.raises(prescan.DecodeLimitError, match="unknown"):
        prescan.amqp10_values(b"\x3f")


def test_amqp10_message_is_sections_only():
    raw = Message(body="x", subject="s").encode()
    assert prescan.amqp10_message(raw) >= 2
    with pytest.raises(prescan.DecodeLimitError, match="starts no section"):
        prescan.amqp10_message(raw + b"\x43" * 800)
