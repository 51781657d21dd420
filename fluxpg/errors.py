"""Errors every layer raises and every front-end renders: the bottom of the import graph.

`fluxpg.db`, `fluxpg.config`, `fluxpg.topics`, the queue manager and the protocol front-ends all
raise or catch these, so this module imports nothing from fluxpg (nothing can form a cycle
through it).
"""
from __future__ import annotations


class FluxError(Exception):
    """An error a client caused or must be told about; `code` is a stable short name.

    Front-ends map codes to their own reason codes (MQTT reason code, AMQP reply code,
    AMQP 1.0 error condition). `sqlstate` is set when the database raised it.
    """

    code = "error"

    def __init__(self, message: str, *, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class UnknownQueue(FluxError):
    code = "not-found"


class WrongQueueKind(FluxError):
    code = "wrong-kind"


class PayloadTooLarge(FluxError):
    code = "too-large"


class QueueFull(FluxError):
    code = "queue-full"


class InvalidArgument(FluxError):
    code = "invalid"


class LimitExceeded(FluxError):
    """A configured limit refuses the request (e.g. delivery.max_groups of a stream)."""

    code = "limit"


class PreconditionFailed(FluxError):
    """The state of the queue refuses the request (a delete with if-unused while it has
    consumers, with if-empty while it holds messages; a queue the config file defines)."""

    code = "precondition"
class ResourceLocked(FluxError):
    """The queue is exclusive to another connection (AMQP 0-9-1 405 RESOURCE_LOCKED)."""

    code = "locked"


class Unavailable(FluxError):
    """The database could not be reached or the transaction failed: nothing was confirmed."""

    code = "unavailable"


# SQLSTATEs raised by sql/*.sql (class FP) and how Python names them.
SQLSTATE_ERRORS: dict[str, type[FluxError]] = {
    "FP001": UnknownQueue,
    "FP002": WrongQueueKind,
    "FP003": QueueFull,
    "FP004": InvalidArgument,
    "FP005": InvalidArgument,   # unknown group
    "FP006": LimitExceeded,
    "FP007": ResourceLocked,    # exclusive transient queue of another connection
    "FP008": PreconditionFailed,   # FP007 is the transient queues' "locked by another connection"
    "54000": PayloadTooLarge,  # program_limit_exceeded
    "22023": InvalidArgument,  # invalid_parameter_value
}
