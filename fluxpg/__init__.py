"""fluxpg: a message broker (MQTT 3.1.1/5, AMQP 0-9-1, AMQP 1.0) whose log is PostgreSQL.

For embedding in an application see fluxpg.api (`fluxpg.connect`)."""
from fluxpg.delivery import Delivery
from fluxpg.errors import (FluxError, InvalidArgument, PayloadTooLarge, QueueFull, Unavailable,
                           UnknownQueue, WrongQueueKind)

__version__ = "0.1.0"


def connect(dsn, config=None, *, migrate=True, retention=False):
    """Open fluxpg on a PostgreSQL database; see fluxpg.api for the whole API."""
    from fluxpg.api import connect as _connect

    return _connect(dsn, config, migrate=migrate, retention=retention)


__all__ = ["connect", "Delivery", "FluxError", "InvalidArgument", "PayloadTooLarge", "QueueFull",
           "Unavailable", "UnknownQueue", "WrongQueueKind", "__version__"]
