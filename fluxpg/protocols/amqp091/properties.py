"""AMQP 0-9-1 basic properties ↔ the message headers JSON stored in the log (pure, no I/O).

Key layout (one flat JSON object per message, so MQTT and AMQP 1.0 consumers see the same keys):

* the AMQP `headers` table: its entries at the top level, as they are (`{"x-tenant": "acme"}`);
* properties other protocols share, under the keys the MQTT front-end uses for MQTT 5's
  equivalents, so an MQTT 5 subscriber gets real properties and vice versa: `content-type`,
  `response-topic` (AMQP reply-to), `correlation-data` (AMQP correlation-id), and
  `content-encoding`; on delivery `reply-to` / `correlation-id` keys are read too;
* the other AMQP basic properties under reserved `x-amqp-` keys: `x-amqp-message-id`,
  `x-amqp-delivery-mode`, `x-amqp-priority`, `x-amqp-expiration`, `x-amqp-timestamp` (unix
  seconds), `x-amqp-type`, `x-amqp-user-id`, `x-amqp-app-id` — `message-id` itself is the
  broker's `<queue>:<offset>` delivery property (DESIGN §4), so the publisher's message id cannot
  live there;
* where the message came from: `x-amqp-exchange`, `x-amqp-routing-key` (what basic.deliver
  reports back, as RabbitMQ does).

On delivery the properties are rebuilt from those keys, every remaining key goes into the AMQP
headers table, and the DESIGN §4 delivery properties (`message-id`, `group-id`, `queue`, `offset`,
stream offsets …) are added to the table, overriding a publisher header of the same name. The AMQP
`message-id` property is the publisher's when it set one, else the broker's `<queue>:<offset>`.

JSON cannot hold every AMQP field type: byte strings become text (UTF-8, invalid bytes
backslash-escaped), decimals become text, timestamps ISO 8601 text; integers, floats, booleans,
strings, nested tables and arrays survive as they are.
"""
from __future__ import annotations

import datetime as _dt
import decimal
import struct
from typing import Any

from pamqp import commands

from fluxpg.delivery import Delivery

Properties = commands.Basic.Properties

# property attribute (pamqp) → stored header key
_SHARED = {
    "content_type": "content-type",
    "content_encoding": "content-encoding",
    "correlation_id": "correlation-data",
    "reply_to": "response-topic",
}
_RESERVED = {
    "message_id": "x-amqp-message-id",
    "delivery_mode": "x-amqp-delivery-mode",
    "priority": "x-amqp-priority",
    "expiration": "x-amqp-expiration",
    "timestamp": "x-amqp-timestamp",
    "message_type": "x-amqp-type",
    "user_id": "x-amqp-user-id",
    "app_id": "x-amqp-app-id",
}
EXCHANGE_KEY = "x-amqp-exchange"
ROUTING_KEY_KEY = "x-amqp-routing-key"
_PROPERTY_KEYS = frozenset(_SHARED.values()) | frozenset(_RESERVED.values()) | {EXCHANGE_KEY, ROUTING_KEY_KEY}
# Other names another front-end may have used for the same thing.
_ALIASES = {"reply_to": ("reply-to",), "correlation_id": ("correlation-id",)}
_SHARED_LOOKUP = frozenset(_SHARED.values()) | frozenset(a for names in _ALIASES.values() for a in names)
_RESERVED_LOOKUP = frozenset(_RESERVED.values())
_RESERVED_ATTR = {key: attr for attr, key in _RESERVED.items()}
_MAX_TIMESTAMP = 253402300799   # 9999-12-31T23:59:59Z


def json_safe(value: Any) -> Any:
    """An AMQP field value as something json.dumps takes (see the module docstring)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.isoformat()
    if isinstance(value, dict):
        return {str(json_safe(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return str(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return str(value)


_SHARED_ITEMS = tuple(_SHARED.items())
# (attribute, key, how): 0 text, 1 timestamp (unix seconds), 2 integer
_RESERVED_ITEMS = tuple((attr, key, 1 if attr == "timestamp" else 2 if attr in ("delivery_mode", "priority") else 0)
                        for attr, key in _RESERVED.items())


def headers_from_properties(props: Properties | None, exchange: str, routing_key: str) -> dict[str, Any]:
    """What to store for a published message (see the module docstring)."""
    out: dict[str, Any] = {}
    if props is not None:
        table = getattr(props, "headers", None)
        if table:
            for key, value in table.items():
                out[_text(key) or ""] = json_safe(value)
        for attr, key in _SHARED_ITEMS:
            value = getattr(props, attr, None)
            if value not in (None, ""):
                out[key] = value if type(value) is str else _text(value)
        for attr, key, how in _RESERVED_ITEMS:
            value = getattr(props, attr, None)
            if value in (None, ""):
                continue
            if how == 0:
                out[key] = value if type(value) is str else _text(value)
            elif how == 1:
                if isinstance(value, _dt.datetime):
                    if value.tzinfo is None:
                        value = value.replace(tzinfo=_dt.timezone.utc)
                    value = int(value.timestamp())
                out[key] = value
            else:
                out[key] = int(value)
    if exchange:
        out[EXCHANGE_KEY] = exchange
    out[ROUTING_KEY_KEY] = routing_key
    return out


def _int(value: Any, low: int, high: int) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if low <= n <= high else None


def _shortstr(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return None
    # A shortstr holds at most 255 bytes; a longer value (from another protocol) is cut, not fatal.
    raw = text.encode("utf-8")
    if len(raw) > 255:
        text = raw[:255].decode("utf-8", "ignore")
    return text


def _table_value(value: Any) -> Any:
    """A stored JSON value as an AMQP field value pamqp can encode."""
    if isinstance(value, dict):
        return {str(k): _table_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_table_value(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2 ** 63) <= value < 2 ** 63:
        return str(value)
    if isinstance(value, float) and abs(value) > _FLOAT32_MAX and value == value and abs(value) != float("inf"):
        # pamqp writes every float in a table as a 32-bit `f`: a larger double (a publisher's
        # `d` header, a number from another protocol) would raise OverflowError and make the
        # message undeliverable over AMQP 0-9-1. Found by the fuzz harness.
        return str(value)
    return value


_FLOAT32_MAX = 3.4028234663852886e38


def delivery_properties(delivery: Delivery) -> tuple[Properties, str, str]:
    """(basic properties, exchange, routing key) for delivering a stored message."""
    stored = delivery.headers or {}
    kwargs: dict[str, Any] = {}
    # Per delivery: look up only the property keys the message has (most have one or two of the
    # ~14), not every key and alias (34 dict lookups a delivery before).
    if not _SHARED_LOOKUP.isdisjoint(stored):
        for attr, key in _SHARED.items():
            value = stored.get(key)
            if value is None:
                for alias in _ALIASES.get(attr, ()):
                    if stored.get(alias) is not None:
                        value = stored[alias]
                        break
            if value is not None:
                kwargs[attr] = _shortstr(value)
    for key in _RESERVED_LOOKUP.intersection(stored):   # each attribute on its own: order does not matter
        attr = _RESERVED_ATTR[key]
        value = stored[key]
        if value is None:
            continue
        if attr == "timestamp":
            # Up to 9999-12-31 (datetime's range): a larger stored value (another protocol's
            # header, a bad SQL insert) is left out like any other invalid value instead of
            # raising, which made the message undeliverable over AMQP 0-9-1.
            n = _int(value, 0, _MAX_TIMESTAMP)
            if n is not None:
                kwargs[attr] = _dt.datetime.fromtimestamp(n, _dt.timezone.utc)
        elif attr == "delivery_mode":
            n = _int(value, 1, 2)
            if n is not None:
                kwargs[attr] = n
        elif attr == "priority":
            n = _int(value, 0, 255)
            if n is not None:
                kwargs[attr] = n
        else:
            kwargs[attr] = _shortstr(value)
    table = {k: _table_value(v) for k, v in stored.items() if k not in _PROPERTY_KEYS}
    table.update(delivery.properties())
    kwargs["headers"] = table
    kwargs.setdefault("message_id", delivery.message_id)
    exchange = stored.get(EXCHANGE_KEY) or ""
    routing_key = stored.get(ROUTING_KEY_KEY)
    if routing_key is None:
        # Published by another protocol: the topic is what a default-exchange publish would use.
        routing_key = delivery.topic
    props = Properties.__new__(Properties)
    for slot in Properties.__slots__:
        setattr(props, slot, kwargs.get(slot))
    props.cluster_id = ""
    return props, _shortstr(exchange) or "", _shortstr(routing_key) or ""


# ----------------------------------------------------------------- a delivery's frames, fast path
#
# Per delivery, delivery_properties built a pamqp Properties (14 attributes), a kwargs dict and
# the headers table, and the content header encoder walked all 14 properties again: on the
# consume + ack benchmark ~a fifth of the broker's CPU per message. encode_delivery writes the
# same bytes (basic.deliver, content header, body frames) for a classic delivery straight from
# the stored headers; anything else (streams, timestamps, values the fast codec gives up on)
# goes the general way. What a message's stored headers make (flags, fixed properties, exchange
# and routing key) is remembered per distinct stored headers, the table bytes that are the same
# for a queue, group and topic per that triple, basic.deliver's head per consumer tag (each ≤
# 1,024 entries): per delivery only the offset, message-id and tag are written (timeit on the
# benchmark's message: ~21 → ~6 µs). tests/unit/test_amqp091_fastcodec.py checks byte equality.

from fluxpg.protocols.amqp091 import framing as _framing  # noqa: E402  (framing never imports this module)

_U8 = _framing._U8
_U32 = _framing._U32
_FRAME_HEADER = _framing.FRAME_HEADER
_FRAME_BODY = _framing.FRAME_BODY
_FRAME_OVERHEAD = _framing.FRAME_OVERHEAD
_frame = _framing._frame
_FRAME_HEAD = _framing._HEADER          # frame type, channel, payload size
_FRAME_METHOD = _framing.FRAME_METHOD
_END = b"\xce"
_I64 = _framing._I64
_fast_shortstr = _framing._fast_shortstr
_Slow = _framing._Slow
_FLAG = Properties.flags
_HEADER_PREFIX = _framing._CONTENT_HEADER_PREFIX
_BASIC_CLASS = commands.Basic.frame_id
_FLAGS = struct.Struct(">H")
# Reserved keys with shortstr values, by attribute (timestamp is left to the general path).
_RESERVED_SHORTSTR = {key: attr for attr, key in _RESERVED.items()
                      if attr not in ("delivery_mode", "priority", "timestamp")}
_SHORTSTR_ORDER = ("correlation_id", "reply_to", "expiration", "message_id", "message_type", "user_id", "app_id")


def _tkey(name: str) -> bytes:
    raw = name.encode("utf-8")
    return _U8.pack(len(raw)) + raw


# A classic delivery's table entries (Delivery.properties), in the sorted order _fast_table writes.
_K_GROUP, _K_MID, _K_OFFSET, _K_QUEUE, _K_TOPIC = (_tkey(k) for k in ("group-id", "message-id", "offset", "queue",
                                                                      "x-source-topic"))


_TABLE_PARTS: dict[tuple[str, str, str], tuple[bytes, bytes, bytes]] = {}


def _s(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"S" + _U32.pack(len(raw)) + raw


_PLANS: dict[tuple, tuple | None] = {}
_NO_PLAN = object()
_DELIVER_HEAD: dict[str, bytes] = {}
_MID_FLAG = _FLAG["message_id"]
MESSAGE_ID_KEY = _RESERVED["message_id"]


def _plan(stored: dict[str, Any]) -> tuple | None:
    """What delivery_properties makes of a message's stored headers, other than the per-message
    table entries and default message-id: (extra table entries or None, flags, bytes before the
    message-id, the message-id's bytes or None for the default, bytes after it, basic.deliver's
    exchange + routing key shortstrs or None when the routing key is the topic, the exchange
    shortstr). None: the general path must do it."""
    shortstrs: dict[str, str] = {}
    delivery_mode = priority = None
    extra = None
    exchange = routing_key = None
    for key, value in stored.items():
        if key not in _PROPERTY_KEYS:
            if extra is None:
                extra = {}
            extra[key] = value
        elif key == "x-amqp-delivery-mode":
            if value is not None:
                delivery_mode = _int(value, 1, 2)
        elif key == ROUTING_KEY_KEY:
            routing_key = value
        elif key == EXCHANGE_KEY:
            exchange = value
        elif key in _RESERVED_SHORTSTR:
            if value is not None:
                shortstrs[_RESERVED_SHORTSTR[key]] = _shortstr(value)
        elif key == "x-amqp-priority":
            if value is not None:
                priority = _int(value, 0, 255)
        else:
            return None   # timestamp, shared keys (content-type …): the general path
    if not _SHARED_LOOKUP.isdisjoint(stored):
        return None       # aliases (reply-to, correlation-id) that are not property keys
    shortstrs.pop("message_id", None)   # _header_payload takes it out before (per message)
    flags = _FLAG["headers"]
    before = []
    if delivery_mode is not None:
        flags |= _FLAG["delivery_mode"]
        before.append(_U8.pack(delivery_mode))
    if priority is not None:
        flags |= _FLAG["priority"]
        before.append(_U8.pack(priority))
    after = []
    seen_mid = False
    for attr in _SHORTSTR_ORDER:
        if attr == "message_id":
            seen_mid = True
            continue
        value = shortstrs.get(attr)
        if value is not None and value != "":
            flags |= _FLAG[attr]
            (after if seen_mid else before).append(_fast_shortstr(value))
    exchange_s = _fast_shortstr(_shortstr(exchange or "") or "")
    route = None if routing_key is None else exchange_s + _fast_shortstr(_shortstr(routing_key) or "")
    return extra, flags, b"".join(before), b"".join(after), route, exchange_s


def _header_payload(d: Delivery, size: int) -> tuple[bytes, bytes]:
    """The content header payload of delivery_properties(d) (classic) and basic.deliver's
    exchange + routing key shortstrs; _Slow when the general path must do it."""
    stored = d.headers or {}
    # Messages of a queue mostly carry the same stored headers but for the publisher's message
    # id (aio-pika sets one per message): what the rest makes is remembered, keyed by items and
    # value types (1 and True, 1 and 1.0 are equal keys otherwise); floats (-0.0 == 0.0) and
    # unhashable values are not remembered.
    mid_value = None
    if MESSAGE_ID_KEY in stored:
        stored = dict(stored)
        mid_value = stored.pop(MESSAGE_ID_KEY)
    try:
        types = tuple(map(type, stored.values()))
        key = (tuple(stored.items()), types) if float not in types else None
        plan = _PLANS.get(key, _NO_PLAN) if key is not None else _NO_PLAN
    except TypeError:
        key, plan = None, _NO_PLAN
    if plan is _NO_PLAN:
        plan = _plan(stored)
        if key is not None:
            if len(_PLANS) >= 1024:
                _PLANS.clear()
            _PLANS[key] = plan
    if plan is None:
        raise _Slow
    extra, flags, before, after, route, exchange_s = plan
    seq = d.seq
    queue = d.queue
    offset = str(seq)
    if extra is None:
        # The same for every message of a queue, group and topic but the offset (message-id too).
        tkey = (d.group, queue, d.topic)
        fixed = _TABLE_PARTS.get(tkey)
        if fixed is None:
            if len(_TABLE_PARTS) >= 1024:
                _TABLE_PARTS.clear()
            raw_queue = queue.encode("utf-8")
            fixed = _TABLE_PARTS[tkey] = (_K_GROUP + _s(d.group) + _K_MID, raw_queue,
                                          _K_QUEUE + _s(queue) + _K_TOPIC + _s(d.topic))
        head, raw_queue, tail = fixed
        raw_offset = offset.encode("ascii")
        mid_len = len(raw_queue) + 1 + len(raw_offset)
        body_len = len(head) + len(tail) + 5 + mid_len + len(_K_OFFSET) + 5 + len(raw_offset)
        table = b"".join((_U32.pack(body_len), head, b"S", _U32.pack(mid_len), raw_queue, b":", raw_offset,
                          _K_OFFSET, b"S", _U32.pack(len(raw_offset)), raw_offset, tail))
    else:
        full = {k: _table_value(v) for k, v in extra.items()}
        full.update(d.properties())
        table = _framing._fast_table(full)
    if mid_value is None:   # absent or null: the broker's <queue>:<offset>
        mid = _fast_shortstr(f"{queue}:{offset}")
        flags |= _MID_FLAG
    else:
        text = _shortstr(mid_value)
        mid = _fast_shortstr(text) if text else b""   # an empty one is left out
        if text:
            flags |= _MID_FLAG
    if route is None:
        route = exchange_s + _fast_shortstr(_shortstr(d.topic) or "")
    return (b"".join((_HEADER_PREFIX.pack(_BASIC_CLASS, size), _FLAGS.pack(flags), table, before, mid, after)),
            route)


def encode_delivery(channel: int, consumer_tag: str, delivery_tag: int, d: Delivery, frame_max: int) -> bytes:
    """basic.deliver + content header + body frames of `d`: the bytes of
    deliver_frame(...) + content_frames(channel, *delivery_properties(d) ...)."""
    if d.kind == "classic":
        payload = d.payload
        try:
            header, route = _header_payload(d, len(payload))
            head = _DELIVER_HEAD.get(consumer_tag)
            if head is None:
                if len(_DELIVER_HEAD) >= 1024:
                    _DELIVER_HEAD.clear()
                head = _DELIVER_HEAD[consumer_tag] = _framing._DELIVER_INDEX + _fast_shortstr(consumer_tag)
            tag = _I64.pack(delivery_tag)
        except (_Slow, TypeError, struct.error):
            pass
        else:
            redelivered = b"\x01" if d.delivery_count > 1 else b"\x00"
            size = len(payload)
            chunk = max(frame_max - _FRAME_OVERHEAD, 1) if frame_max else size
            if 0 < size <= chunk:
                # The usual case, written in one join: basic.deliver, content header, one body frame.
                return b"".join((_FRAME_HEAD.pack(_FRAME_METHOD, channel, len(head) + 9 + len(route)), head, tag,
                                 redelivered, route, _END, _FRAME_HEAD.pack(_FRAME_HEADER, channel, len(header)),
                                 header, _END, _FRAME_HEAD.pack(_FRAME_BODY, channel, size), payload, _END))
            out = (_frame(_FRAME_METHOD, channel, b"".join((head, tag, redelivered, route)))
                   + _frame(_FRAME_HEADER, channel, header))
            if not payload:
                return out
            view = memoryview(payload)
            return out + b"".join([_frame(_FRAME_BODY, channel, bytes(view[i:i + chunk]))
                                   for i in range(0, size, chunk)])
    props, exchange, routing_key = delivery_properties(d)
    return (_framing.deliver_frame(channel, consumer_tag, delivery_tag, d.redelivered, exchange, routing_key)
            + _framing.content_frames(channel, props, d.payload, frame_max))
