"""Inbound memory accounting: bytes of messages a client has sent that the broker holds before
they are stored (partially received bodies, reassembled multi-frame messages, completed messages
whose publish has not committed yet).

Two levels, both from the config's `bounds:` section:

- per connection: `bounds.connection_inbound_bytes`, summed over all of its channels / links;
- per broker process: `bounds.broker_inbound_bytes`, summed over all connections.

A front-end asks `reserve(n)` BEFORE it buffers n bytes (for AMQP 0-9-1 when the content header
announces the body size) and refuses the message with its protocol's resource error when the
answer is not None; it calls `release(n)` when the bytes are gone (stored, refused, dropped), or
`release_after(futures, n)` to keep them until the publish's futures are done.
`close()` gives back whatever a connection still holds when it ends, so the broker-wide count can
never leak.

A front-end that can push back instead of refusing (MQTT: TCP backpressure) takes bytes it already
holds with `charge(n)`, which never refuses, and stops reading while `over` -- as long as some of
what it holds is a publish that will finish and be released; otherwise it cannot wait and refuses.
No I/O; single event loop (no locks needed).
"""
from __future__ import annotations

from typing import Any

STATE_KEY = "bounds.broker_inbound"

# What one publish waiting in a transaction (AMQP 0-9-1 tx.select, AMQP 1.0 coordinator) costs
# beyond its body: topic, headers, log rows (~400 bytes measured with tracemalloc). Charged with
# the body until commit / rollback, so a transaction of empty messages is bounded as well.
TX_MESSAGE_OVERHEAD = 512


class BrokerInbound:
    """The broker-wide count (one per BrokerContext)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.peak = 0


class ConnectionInbound:
    """One connection's count, charged to the broker's as well."""

    def __init__(self, limit: int, broker: BrokerInbound | None = None):
        self.limit = limit
        self.broker = broker
        self.used = 0

    def reserve(self, n: int) -> str | None:
        """Take n bytes; None when granted, else why not (a sentence naming the setting)."""
        if n <= 0:
            return None
        if self.limit and self.used + n > self.limit:
            return (f"this connection's partially received and unconfirmed messages would exceed "
                    f"bounds.connection_inbound_bytes ({self.limit} bytes)")
        broker = self.broker
        if broker is not None and broker.limit and broker.used + n > broker.limit:
            return (f"the broker's partially received messages would exceed bounds.broker_inbound_bytes "
                    f"({broker.limit} bytes); try again later")
        self.charge(n)
        return None

    def charge(self, n: int) -> None:
        """Take n bytes the front-end holds already, whatever the bounds say (it stops reading
        while `over` instead of refusing)."""
        if n <= 0:
            return
        self.used += n
        broker = self.broker
        if broker is not None:
            broker.used += n
            broker.peak = max(broker.peak, broker.used)

    @property
    def over(self) -> bool:
        """At or above this connection's bound or the broker's."""
        if self.limit and self.used >= self.limit:
            return True
        broker = self.broker
        return broker is not None and bool(broker.limit) and broker.used >= broker.limit

    def release_after(self, futures: list, n: int, then: Any = None) -> None:
        """Keep n bytes until every future is done (stored or failed), then release them and
        call `then()` (a front-end paused while `over` resumes there)."""
        left = [len(futures)]

        def done(_fut: Any = None) -> None:
            left[0] -= 1
            if left[0] <= 0:
                self.release(n)
                if then is not None:
                    then()
        if not futures:
            done()
            return
        for fut in futures:
            fut.add_done_callback(done)

    def release(self, n: int) -> None:
        n = min(max(n, 0), self.used)
        self.used -= n
        if self.broker is not None:
            self.broker.used = max(0, self.broker.used - n)

    def close(self) -> None:
        self.release(self.used)


def broker_inbound(ctx: Any) -> BrokerInbound | None:
    """The broker-wide count of this context (created on first use from its config)."""
    state = getattr(ctx, "state", None)
    if state is None:
        return None
    found = state.get(STATE_KEY)
    if found is None:
        bounds = getattr(getattr(ctx, "config", None), "bounds", None)
        found = state[STATE_KEY] = BrokerInbound(int(getattr(bounds, "broker_inbound_bytes", 0) or 0))
    return found


def connection_inbound(ctx: Any) -> ConnectionInbound:
    """A new connection's count, tied to the broker-wide one."""
    bounds = getattr(getattr(ctx, "config", None), "bounds", None)
    return ConnectionInbound(int(getattr(bounds, "connection_inbound_bytes", 0) or 0), broker_inbound(ctx))


def connection_outbound_limit(ctx: Any, default: int = 8 * 2 ** 20) -> int:
    """bounds.connection_outbound_bytes (0 = unbounded)."""
    bounds = getattr(getattr(ctx, "config", None), "bounds", None)
    value = getattr(bounds, "connection_outbound_bytes", None)
    return default if value is None else int(value)
