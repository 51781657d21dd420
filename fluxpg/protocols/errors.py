"""One error table for every front-end: a FluxError's `code` → what each protocol tells its client
(MQTT 5 reason code, AMQP 0-9-1 reply code, AMQP 1.0 error condition). Pure data, no I/O; the
front-ends look errors up here instead of keeping tables of their own (issue 14), and
tests/unit/test_error_table.py checks that every FluxError kind has a row."""
from __future__ import annotations

from typing import NamedTuple

from fluxpg.errors import FluxError


class Reply(NamedTuple):
    mqtt: int        # MQTT 5.0 reason code (PUBACK/SUBACK/DISCONNECT)
    amqp091: int     # AMQP 0-9-1 channel.close reply code
    amqp10: str      # AMQP 1.0 error condition


ERRORS: dict[str, Reply] = {
    "not-found":    Reply(0x80, 404, "amqp:not-found"),
    "wrong-kind":   Reply(0x83, 406, "amqp:not-allowed"),
    "too-large":    Reply(0x97, 406, "amqp:link:message-size-exceeded"),
    "queue-full":   Reply(0x97, 406, "amqp:resource-limit-exceeded"),
    "invalid":      Reply(0x83, 406, "amqp:invalid-field"),
    "limit":        Reply(0x97, 406, "amqp:resource-limit-exceeded"),
    "precondition": Reply(0x83, 406, "amqp:precondition-failed"),
    "locked":       Reply(0x83, 405, "amqp:resource-locked"),
    "unavailable":  Reply(0x80, 541, "amqp:internal-error"),
    "error":        Reply(0x80, 406, "amqp:internal-error"),
}


def reply_for(exc: FluxError) -> Reply:
    """The row of `exc`'s kind (a FluxError's code; unknown codes get the generic row)."""
    return ERRORS.get(exc.code, ERRORS["error"])
