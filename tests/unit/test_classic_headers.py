"""classic._headers (fluxpg.ack_claim's headers, read as JSON text): the same values as the pool's
JSON codec gives (`rec["headers"] or {}`), and a dict of its own per message even when remembered."""
from __future__ import annotations

import json

import pytest

from fluxpg.queues.classic import _headers


@pytest.mark.parametrize("text", [None, "null", "{}", "[]", '"x"', "0", "false", "[1]", '{"a": 1, "b": "x"}',
                                  '{"a": [1]}', '{"a": {"b": 1}}', '{"x-amqp-delivery-mode": 2, "f": 1.5, "n": null}'])
def test_like_the_pool_codec(text):
    expected = (json.loads(text) if text is not None else None) or {}
    for _ in range(3):   # decoded, then remembered
        got = _headers(text)
        assert got == expected and type(got) is type(expected)


def test_each_message_gets_its_own_dict():
    text = '{"x-amqp-delivery-mode": 2, "x-amqp-routing-key": "jobs"}'
    first = _headers(text)
    first["mutated"] = True
    second = _headers(text)
    assert second == {"x-amqp-delivery-mode": 2, "x-amqp-routing-key": "jobs"}
    assert second is not _headers(text)
