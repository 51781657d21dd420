"""Every FluxError kind has a row in the one front-end error table, and the front-ends answer
from it (AMQP 1.0 used to lack LimitExceeded)."""
from __future__ import annotations

import fluxpg.errors as errors
from fluxpg.errors import FluxError, LimitExceeded, QueueFull, UnknownQueue
from fluxpg.protocols.amqp091.channel import _error_from_flux
from fluxpg.protocols.amqp10.connection import _condition
from fluxpg.protocols.errors import ERRORS, reply_for
from fluxpg.protocols.mqtt.session import _flux_reason


def kinds() -> list[type[FluxError]]:
    return [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, FluxError)]


def test_every_error_kind_has_a_row():
    missing = sorted(c.__name__ for c in kinds() if c.code not in ERRORS)
    assert not missing


def test_the_front_ends_answer_from_the_table():
    for cls in kinds():
        exc = cls("boom")
        row = reply_for(exc)
        assert _condition(exc).name == row.amqp10, cls
        assert _error_from_flux(exc, None).code == row.amqp091, cls
        if cls is not errors.InvalidArgument:  # MQTT: an invalid topic is 0x90 (topic name invalid)
            assert int(_flux_reason(exc)[0]) == row.mqtt, cls
    assert _condition(LimitExceeded("too many groups")).name == "amqp:resource-limit-exceeded"
    assert _condition(QueueFull("full")).name == "amqp:resource-limit-exceeded"
    assert _error_from_flux(UnknownQueue("x"), None).code == 404
