"""Per-connection exchanges and bindings (pure, no I/O), as FluxMQ documents them.

Exchanges and bindings live in the connection only: they are not shared with other connections,
not persisted (a `durable` flag is accepted and has no effect), and a passive exchange.declare
checks this connection's state. Publishing through an exchange resolves the bound queues here;
the channel then appends to `$queue/<queue>/<routing-key>` for each, through the shared queue
manager. Each connection starts with RabbitMQ's predeclared exchanges (`amq.direct`, `amq.topic`,
`amq.fanout`, `amq.headers`, `amq.match`); the default exchange ("") is implicit and needs no
bindings: its routing key names the queue.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
PREDECLARED = {"amq.direct": "direct", "amq.topic": "topic", "amq.fanout": "fanout",
               "amq.headers": "headers", "amq.match": "headers"}


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    source: str          # exchange
    destination: str     # queue name, or exchange name when to_exchange
    routing_key: str
    arguments: tuple = ()   # sorted (key, value) pairs: hashable, for unbind equality
    to_exchange: bool = False

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.arguments)


def freeze_args(args: dict[str, Any] | None) -> tuple:
    def freeze(v: Any) -> Any:
        if isinstance(v, dict):
            return tuple(sorted((str(k), freeze(x)) for k, x in v.items()))
        if isinstance(v, (list, bytearray)):
            return tuple(freeze(x) for x in v) if isinstance(v, list) else bytes(v)
        return v
    return tuple(sorted((str(k), freeze(v)) for k, v in (args or {}).items()))


def _words(text: str) -> tuple[str, ...]:
    # RabbitMQ: the empty routing key is zero words ('#' matches it, '*' does not).
    return tuple(text.split(".")) if text else ()


@lru_cache(maxsize=4096)
def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: words separated by '.', '*' is exactly one word, '#' zero or more."""
    p, k = _words(pattern), _words(routing_key)

    @lru_cache(maxsize=None)
    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(match(i + 1, x) for x in range(j, len(k) + 1))
        if j == len(k):
            return False
        return (p[i] == "*" or p[i] == k[j]) and match(i + 1, j + 1)

    return match(0, 0)


def headers_match(binding_args: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """Headers exchange: x-match all (default) / any, and the `-with-x` variants that also
    compare `x-` keys (RabbitMQ 3.10+)."""
    headers = headers or {}
    mode = str(binding_args.get("x-match", "all"))
    if isinstance(binding_args.get("x-match"), (bytes, bytearray)):
        mode = bytes(binding_args["x-match"]).decode()
    with_x = mode.endswith("-with-x")
    mode = mode.removesuffix("-with-x")
    wanted = {k: v for k, v in binding_args.items()
              if k != "x-match" and (with_x or not k.startswith("x-"))}
    if not wanted:
        return mode == "all"

    def ok(k: str, v: Any) -> bool:
        if k not in headers:
            return False
        # A void (None) binding value matches on the key's presence alone.
        return v is None or headers[k] == v

    results = (ok(k, v) for k, v in wanted.items())
    return any(results) if mode == "any" else all(results)


class ExchangeTable:
    def __init__(self) -> None:
        self.exchanges: dict[str, Exchange] = {n: Exchange(n, t, durable=True) for n, t in PREDECLARED.items()}
        self.bindings: list[Binding] = []

    def get(self, name: str) -> Exchange | None:
        return self.exchanges.get(name)

    def declare(self, ex: Exchange) -> None:
        self.exchanges[ex.name] = ex

    def delete(self, name: str) -> None:
        self.exchanges.pop(name, None)
        self.bindings = [b for b in self.bindings
                         if b.source != name and not (b.to_exchange and b.destination == name)]

    def has_bindings_from(self, name: str) -> bool:
        return any(b.source == name for b in self.bindings)

    def bind(self, binding: Binding) -> None:
        if binding not in self.bindings:
            self.bindings.append(binding)

    def unbind(self, binding: Binding) -> None:
        try:
            self.bindings.remove(binding)
        except ValueError:
            pass  # RabbitMQ: unbinding what is not bound is not an error

    def unbind_queue(self, queue: str) -> None:
        self.bindings = [b for b in self.bindings if b.to_exchange or b.destination != queue]

    def _matches(self, ex: Exchange, b: Binding, routing_key: str, headers: dict[str, Any] | None) -> bool:
        if ex.type == "fanout":
            return True
        if ex.type == "direct":
            return b.routing_key == routing_key
        if ex.type == "topic":
            return topic_matches(b.routing_key, routing_key)
        if ex.type == "headers":
            return headers_match(b.args, headers)
        return False

    def route(self, exchange: str, routing_key: str, headers: dict[str, Any] | None = None) -> list[str]:
        """Queue names a publish to `exchange` reaches (each once, in binding order), following
        exchange-to-exchange bindings without looping."""
        queues: dict[str, None] = {}
        seen: set[str] = set()
        todo = [exchange]
        while todo:
            name = todo.pop(0)
            if name in seen:
                continue
            seen.add(name)
            ex = self.exchanges.get(name)
            if ex is None:
                continue
            for b in self.bindings:
                if b.source != name or not self._matches(ex, b, routing_key, headers):
                    continue
                if b.to_exchange:
                    todo.append(b.destination)
                else:
                    queues.setdefault(b.destination, None)
        return list(queues)
