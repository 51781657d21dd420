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


def publish(conn, topic, payload, headers=None):
    """Publish inside the application's own transaction on `conn` (asyncpg, psycopg or SQLAlchemy):
    delivered if and only if it commits; see fluxpg.outbox."""
    from fluxpg.outbox import publish as _publish

    return _publish(conn, topic, payload, headers)


def publish_batch(conn, messages):
    """fluxpg.publish for many (topic, payload, headers) messages, in order; see fluxpg.outbox."""
    from fluxpg.outbox import publish_batch as _publish_batch

    return _publish_batch(conn, messages)


__all__ = ["connect", "publish", "publish_batch", "Delivery", "FluxError", "InvalidArgument", "PayloadTooLarge", "QueueFull",
           "Unavailable", "UnknownQueue", "WrongQueueKind", "__version__"]
