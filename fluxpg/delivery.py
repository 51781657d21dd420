"""The Delivery value type (one message handed to one consumer) and message-id helpers.

Front-ends translate their wire formats to and from these and never talk SQL themselves. Like
`fluxpg.errors` this sits at the bottom of the import graph: it imports only `fluxpg.errors`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fluxpg.errors import InvalidArgument


@dataclass(slots=True)
class Delivery:
    """One message handed to one consumer of a group (a row of `fluxpg.delivery`)."""

    queue: str
    group: str
    partition: int
    seq: int
    topic: str
    payload: bytes
    headers: dict[str, Any]
    created_at: datetime
    delivery_count: int
    kind: str = "classic"
    # Filled for stream queues with a primary_group: that group's committed offset.
    work_committed: int | None = None
    work_group: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def message_id(self) -> str:
        return f"{self.queue}:{self.seq}"

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    def properties(self) -> dict[str, str]:
        """The delivery properties of DESIGN §4, as strings (MQTT user properties, AMQP headers)."""
        props = {
            "message-id": self.message_id,
            "group-id": self.group,
            "queue": self.queue,
            "offset": str(self.seq),
            "x-source-topic": self.topic,
        }
        if self.kind == "stream":
            props["x-stream-offset"] = str(self.seq)
            props["x-stream-timestamp"] = str(int(self.created_at.timestamp() * 1000))
            props["x-stream-partition"] = str(self.partition)
            if self.work_group is not None:
                committed = self.work_committed if self.work_committed is not None else 0
                props["x-work-committed-offset"] = str(committed)
                props["x-work-acked"] = "true" if self.seq < committed else "false"
                props["x-work-group"] = self.work_group
        return props


def parse_message_id(message_id: str) -> tuple[str | None, int]:
    """`orders:42` → ("orders", 42). The number after the last colon is the offset (FluxMQ)."""
    if not isinstance(message_id, str) or not message_id:
        raise InvalidArgument("message-id is missing")
    queue, sep, number = message_id.rpartition(":")
    try:
        seq = int(number)
    except ValueError:
        raise InvalidArgument(f"malformed message-id {message_id!r}: expected <queue>:<offset>") from None
    if seq < 0:
        raise InvalidArgument(f"malformed message-id {message_id!r}: negative offset")
    return (queue if sep else None), seq


def headers_to_json(headers: dict[str, Any] | None) -> str | None:
    if not headers:
        return None
    return json.dumps(headers, default=_json_default, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
