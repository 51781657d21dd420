"""AMQP 1.0 messages ↔ the log's (payload, headers) and back; pure functions, no I/O.

Layout of `headers` (the log's jsonb column) for a message published over AMQP 1.0:

    {
      "<application property>": <value>,   # top level, as every protocol shows its user
      ...                                   # properties / headers (MQTT 5, AMQP 0-9-1 headers)
      "content-type": "text/plain",         # top level too: shared by all protocols
      "x-amqp": {                           # what only AMQP 1.0 has, to give it back exactly
        "properties": {"message-id": ..., "correlation-id": ..., "user-id": <base64>,
                       "to": ..., "subject": ..., "reply-to": ..., "content-encoding": ...,
                       "creation-time": <ms>, "absolute-expiry-time": <ms>, "group-id": ...,
                       "group-sequence": n, "reply-to-group-id": ...},
        "header": {"durable": true, "priority": 9, "ttl": <ms>},
        "annotations": {"<message annotation>": <value>},
        "types": {"<application property>": "ulong" | "binary" | "uuid" | "symbol" | ...},
        "id-types": {"message-id": "ulong" | "uuid" | "binary", "correlation-id": ...},
        "body": "data" | "binary" | "string" | "null" | "amqp-value"
      }
    }

Application property values JSON can hold (string, integer, float, boolean, null) are stored as
they are. Binary values are stored base64-encoded, UUIDs, symbols, chars and timestamps as their
string/number form; "types" records the AMQP type so an AMQP 1.0 consumer gets the same type back
(other protocols see the plain JSON value). Other values (described types, decimals) become strings.

The body: a data section (bytes, `inferred`) is the payload as is ("data", the default and what
messages from other protocols are delivered as); an amqp-value string is its UTF-8 ("string");
amqp-value binary is the bytes ("binary"); any other amqp-value (map, list, number) is stored in
its AMQP encoding ("amqp-value").

Deliveries carry the stored application properties plus the DESIGN §4 delivery properties
(`message-id` `<queue>:<offset>`, `group-id`, `queue`, `offset`, `x-source-topic`, stream ones) as
application properties; the broker's values win on a name clash. The message's own
`properties.message-id` is the publisher's when it set one, else the broker's `<queue>:<offset>`.
"""
from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime
from typing import Any

import proton
from proton import Data, Message, symbol
# proton's Message.content_type / content_encoding turn an unset field into symbol('None'); the
# C getters say None.
from proton._message import pn_message_get_content_encoding, pn_message_get_content_type

from fluxpg.delivery import Delivery
from fluxpg.protocols import prescan

AMQP_KEY = "x-amqp"

# AMQP scalar types that are Python subclasses of int/str/float; restored by name.
_SCALAR_TYPES: dict[str, type] = {
    name: getattr(proton, name)
    for name in ("byte", "ubyte", "short", "ushort", "int32", "uint", "ulong", "timestamp", "float32",
                 "char", "symbol")
}
_TYPE_NAMES = {cls: name for name, cls in _SCALAR_TYPES.items()}

_PROPERTY_FIELDS = (
    # (Message attribute, stored name)
    ("address", "to"),
    ("subject", "subject"),
    ("reply_to", "reply-to"),
    ("group_id", "group-id"),
    ("reply_to_group_id", "reply-to-group-id"),
)


class MessageError(ValueError):
    """The message cannot be stored (e.g. an undecodable body); maps to amqp:decode-error."""


# --------------------------------------------------------------------------- values


def _encode_value(value: Any) -> tuple[Any, str | None]:
    """An AMQP simple value → (JSON value, AMQP type name or None when JSON keeps it)."""
    if value is None or isinstance(value, bool):
        return value, None
    for cls, name in _TYPE_NAMES.items():
        if type(value) is cls:
            if isinstance(value, float):
                return float(value), name
            if isinstance(value, int):
                return int(value), name
            return str(value), name
    if isinstance(value, int):
        return int(value), None
    if isinstance(value, float):
        return float(value), None
    if isinstance(value, str):
        return str(value), None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii"), "binary"
    if isinstance(value, uuid.UUID):
        return str(value), "uuid"
    return str(value), None


def _decode_value(value: Any, type_name: str | None) -> Any:
    if type_name is None or value is None:
        return value
    try:
        if type_name == "binary":
            return base64.b64decode(value)
        if type_name == "uuid":
            return uuid.UUID(str(value))
        cls = _SCALAR_TYPES.get(type_name)
        if cls is not None:
            return cls(value)
    except (ValueError, TypeError):
        pass
    return value


def _application_value(value: Any) -> Any:
    """A header value from another protocol as an AMQP application property (simple types only)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def _ms(value: float | None) -> int | None:
    """proton's seconds (float; 0 = unset) → integer milliseconds or None."""
    if not value:
        return None
    return int(round(value * 1000))


# --------------------------------------------------------------------------- incoming


def decode(raw: bytes, limits: prescan.Limits = prescan.DEFAULT_LIMITS) -> Message:
    """A transfer's bytes → Message; MessageError when they are not a well-formed message.
    proton's Message.decode skips a truncated or malformed section without a word, so every
    section is first decoded on its own and must take its bytes exactly. Before proton sees
    them, a pre-scan bounds nesting and element counts (an array of zero-width elements
    announces billions of values in a few bytes)."""
    try:
        prescan.amqp10_message(raw, limits)
    except prescan.DecodeLimitError as exc:
        raise MessageError(f"cannot decode the message: {exc}") from None
    view = memoryview(raw)
    try:
        while view:
            used = Data().decode(bytes(view[:len(view)]))
            if used <= 0:
                raise MessageError("no AMQP value where a message section should be")
            view = view[used:]
        message = Message()
        message.decode(raw)
    except MessageError:
        raise
    except Exception as exc:  # noqa: BLE001 - proton's DataException, UnicodeDecodeError…
        raise MessageError(f"cannot decode the message: {exc}") from None
    return message


def to_log(message: Message) -> tuple[bytes, dict[str, Any]]:
    """A message a client sent us → (payload, headers) for QueueManager.publish.

    Raises MessageError (→ Rejected amqp:decode-error) for a message the spec does not allow or
    that cannot be stored: whatever is wrong with one message must not end the connection."""
    try:
        return _to_log(message)
    except MessageError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. invalid UTF-8 met while reading a field
        raise MessageError(f"malformed message: {type(exc).__name__}: {exc}") from None


def _to_log(message: Message) -> tuple[bytes, dict[str, Any]]:
    headers: dict[str, Any] = {}
    amqp: dict[str, Any] = {}
    types: dict[str, str] = {}
    properties = message.properties
    if properties is not None and not isinstance(properties, dict):
        raise MessageError(f"application-properties must be a map, not {type(properties).__name__}")
    annotations = message.annotations
    if annotations is not None and not isinstance(annotations, dict):
        raise MessageError(f"message-annotations must be a map, not {type(annotations).__name__}")
    for key, value in (properties or {}).items():
        name = str(key)
        if name == AMQP_KEY:
            continue  # reserved for our own layout
        stored, type_name = _encode_value(value)
        headers[name] = stored
        if type_name is not None:
            types[name] = type_name
    if types:
        amqp["types"] = types
    content_type = pn_message_get_content_type(message._msg)
    if content_type:
        headers["content-type"] = str(content_type)

    props: dict[str, Any] = {}
    id_types: dict[str, str] = {}
    for attr, name in (("id", "message-id"), ("correlation_id", "correlation-id")):
        value = getattr(message, attr)
        if value is None:
            continue
        if isinstance(value, (bytes, bytearray, memoryview)):
            props[name], id_types[name] = base64.b64encode(bytes(value)).decode("ascii"), "binary"
        elif isinstance(value, uuid.UUID):
            props[name], id_types[name] = str(value), "uuid"
        elif isinstance(value, int) and not isinstance(value, bool):
            props[name], id_types[name] = int(value), "ulong"
        else:
            props[name] = str(value)
    if id_types:
        amqp["id-types"] = id_types
    if message.user_id:
        props["user-id"] = base64.b64encode(bytes(message.user_id)).decode("ascii")
    for attr, name in _PROPERTY_FIELDS:
        value = getattr(message, attr)
        if value:
            props[name] = str(value)
    content_encoding = pn_message_get_content_encoding(message._msg)
    if content_encoding:
        props["content-encoding"] = str(content_encoding)
    if message.group_sequence:
        props["group-sequence"] = int(message.group_sequence)
    for attr, name in (("creation_time", "creation-time"), ("expiry_time", "absolute-expiry-time")):
        ms = _ms(getattr(message, attr))
        if ms is not None:
            props[name] = ms
    if props:
        amqp["properties"] = props

    header: dict[str, Any] = {}
    if message.durable:
        header["durable"] = True
    if message.priority != Message.DEFAULT_PRIORITY:
        header["priority"] = int(message.priority)
    ttl = _ms(message.ttl)
    if ttl is not None:
        header["ttl"] = ttl
    if header:
        amqp["header"] = header

    if annotations:
        amqp["annotations"] = {str(k): _encode_value(v)[0] for k, v in annotations.items()}

    body = message.body
    if body is None:
        payload, body_type = b"", "null"
    elif isinstance(body, (bytes, bytearray, memoryview)):
        payload, body_type = bytes(body), ("data" if message.inferred else "binary")
    elif isinstance(body, str):
        payload, body_type = body.encode("utf-8"), "string"
    else:
        data = Data()
        try:
            data.put_object(body)
        except Exception as exc:  # noqa: BLE001
            raise MessageError(f"cannot store a body of type {type(body).__name__}: {exc}") from None
        payload, body_type = bytes(data.encode()), "amqp-value"
    if body_type != "data":
        amqp["body"] = body_type
    if amqp:
        headers[AMQP_KEY] = amqp
    return payload, headers


# --------------------------------------------------------------------------- outgoing


def from_delivery(delivery: Delivery) -> Message:
    """A queue delivery → the AMQP 1.0 message sent to a receiver link."""
    headers = dict(delivery.headers or {})
    amqp = headers.pop(AMQP_KEY, None)
    if not isinstance(amqp, dict):
        amqp = {}
    types = amqp.get("types") or {}
    content_type = headers.pop("content-type", None)

    app: dict[Any, Any] = {}
    for key, value in headers.items():
        app[str(key)] = _decode_value(value, types.get(key)) if key in types else _application_value(value)
    app.update(delivery.properties())

    message = Message()
    message.properties = app
    if content_type is not None:
        message.content_type = symbol(str(content_type))

    props = amqp.get("properties") or {}
    id_types = amqp.get("id-types") or {}
    message_id = props.get("message-id")
    message.id = _restore_id(message_id, id_types.get("message-id")) if message_id is not None \
        else delivery.message_id
    if props.get("correlation-id") is not None:
        message.correlation_id = _restore_id(props["correlation-id"], id_types.get("correlation-id"))
    if props.get("user-id"):
        try:
            message.user_id = base64.b64decode(props["user-id"])
        except ValueError:
            pass
    for attr, name in _PROPERTY_FIELDS:
        if props.get(name):
            setattr(message, attr, str(props[name]))
    if props.get("content-encoding"):
        message.content_encoding = symbol(str(props["content-encoding"]))
    if props.get("group-sequence"):
        message.group_sequence = int(props["group-sequence"])
    if props.get("absolute-expiry-time"):
        message.expiry_time = props["absolute-expiry-time"] / 1000.0
    created = props.get("creation-time")
    message.creation_time = (created / 1000.0) if created else _seconds(delivery.created_at)

    header = amqp.get("header") or {}
    message.durable = bool(header.get("durable", delivery.kind != "ephemeral"))
    if "priority" in header:
        message.priority = int(header["priority"])
    if header.get("ttl"):
        message.ttl = header["ttl"] / 1000.0
    message.delivery_count = max(0, delivery.delivery_count - 1)
    message.first_acquirer = delivery.delivery_count <= 1

    annotations = amqp.get("annotations")
    if isinstance(annotations, dict) and annotations:
        message.annotations = {symbol(k): _application_value(v) for k, v in annotations.items()}

    body_type = amqp.get("body", "data")
    payload = bytes(delivery.payload)
    if body_type == "string":
        message.body = payload.decode("utf-8", "replace")
    elif body_type == "null":
        message.body = None
    elif body_type == "binary":
        message.body = payload
    elif body_type == "amqp-value":
        data = Data()
        try:
            data.decode(payload)
            data.rewind()
            data.next()
            message.body = data.get_object()
        except Exception:  # noqa: BLE001 - a corrupt stored value is delivered as the raw bytes
            message.body = payload
            message.inferred = True
    else:
        message.body = payload
        message.inferred = True
    return message


def _restore_id(value: Any, type_name: str | None) -> Any:
    if type_name == "binary":
        try:
            return base64.b64decode(value)
        except ValueError:
            return str(value)
    if type_name == "uuid":
        try:
            return uuid.UUID(str(value))
        except ValueError:
            return str(value)
    if type_name == "ulong":
        try:
            return proton.ulong(int(value))
        except (ValueError, TypeError):
            return str(value)
    return str(value)


def _seconds(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0
