"""The YAML configuration, as pydantic models (pure apart from reading the file and two env vars).

Strict like FluxMQ: an unknown key anywhere is an error, so a typo never silently falls back to a
default. Every problem is reported as one line naming the file, the line, the key path
(`queues[1].retry.multiplier`) and what was expected — never a traceback.

Defaults are FluxMQ's (reference/FACTS.md, fluxmq-durable-queues "Configuration"); config/fluxpg.yaml
lists every key with its default.

Durations are Go-style strings (`"5s"`, `"1m30s"`, `"168h"`, `"500ms"`; `"0"` disables), and the
RabbitMQ units of `x-max-age` are accepted too (`7D`, `1W`, `1M` = 30 days, `1Y` = 365 days).
In memory they are `datetime.timedelta`; dumped (and stored in `fluxpg.queues.settings`) they are
Go-style strings again (`format_duration`), which PostgreSQL also reads as `interval`.
"""
from __future__ import annotations

import difflib
import os
import re
import typing
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from fluxpg.errors import InvalidArgument
from fluxpg.topics import (
    DLQ_PREFIX,
    QUEUE_PREFIX,
    dlq_name,
    validate_queue_name,
    validate_topic_filter,
)

ENV_CONFIG = "FLUXPG_CONFIG"
ENV_DSN = "FLUXPG_DSN"


class ConfigError(Exception):
    """A configuration problem; `str(e)` is fit to print as is (one line per problem)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems if problems is not None else [message]


# --------------------------------------------------------------------------- durations

_DURATION_EXPECTED = (
    'expected a duration such as "5s", "1m30s", "500ms", "168h", "7D", "1W", "1M" (30 days), '
    '"1Y" (365 days), or "0" to disable'
)

# Microseconds per unit (timedelta's resolution). `m` is a minute and `M` a month, as in Go and
# RabbitMQ respectively; the day/week/year units are accepted in either case since they collide
# with nothing.
_UNIT_US: dict[str, int] = {
    "ns": 0,  # handled as a fraction below
    "us": 1,
    "µs": 1,
    "μs": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "D": 86_400_000_000,
    "d": 86_400_000_000,
    "W": 7 * 86_400_000_000,
    "w": 7 * 86_400_000_000,
    "M": 30 * 86_400_000_000,
    "Y": 365 * 86_400_000_000,
    "y": 365 * 86_400_000_000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h|D|d|W|w|M|Y|y)")


class DurationError(ValueError):
    pass


def parse_duration(value: str | int | timedelta) -> timedelta:
    """Parse `"1m30s"`, `"500ms"`, `"7D"`, `"0"`… into a timedelta (rounded to microseconds).

    A timedelta is returned as is; the integer 0 means zero. Negative durations are refused.
    """
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise DurationError(f"duration {value} is negative; {_DURATION_EXPECTED}")
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DurationError(f"{_DURATION_EXPECTED}, got {value!r}")
    if isinstance(value, int):
        if value == 0:
            return timedelta(0)
        # A bare number has no unit: seconds? milliseconds? Go would read nanoseconds. Refuse.
        raise DurationError(f'{_DURATION_EXPECTED}, got the number {value} (add a unit, e.g. "{value}s")')
    text = value.strip()
    if text in ("0", "+0", "-0"):
        return timedelta(0)
    if text.startswith("+"):
        text = text[1:]
    if not text:
        raise DurationError(f"{_DURATION_EXPECTED}, got an empty string")
    if text.startswith("-"):
        raise DurationError(f"duration {value!r} is negative; {_DURATION_EXPECTED}")
    total = Fraction(0)
    pos = 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        number, unit = m.groups()
        amount = Fraction(number if not number.endswith(".") else number[:-1])
        total += amount / 1000 if unit == "ns" else amount * _UNIT_US[unit]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise DurationError(f"invalid duration {value!r}: {_DURATION_EXPECTED}")
    try:
        return timedelta(microseconds=round(total))
    except OverflowError:
        raise DurationError(f"duration {value!r} is too large") from None


def format_duration(td: timedelta) -> str:
    """A Go-style string that `parse_duration` (and PostgreSQL's `interval` input) reads back exactly.

    `"0s"`, `"500ms"`, `"250us"`, `"5s"`, `"1m30s"`, `"168h"`, `"1h0.5s"`.
    """
    if not isinstance(td, timedelta):
        raise TypeError(f"format_duration expects a timedelta, got {type(td).__name__}")
    us = td // timedelta(microseconds=1)
    if us < 0:
        raise ValueError(f"cannot format a negative duration ({td})")
    if us == 0:
        return "0s"
    if us < 1_000_000:
        return f"{us // 1000}ms" if us % 1000 == 0 else f"{us}us"
    hours, rest = divmod(us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, micros = divmod(rest, 1_000_000)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if micros:
        out += f"{seconds}.{micros:06d}".rstrip("0") + "s"
    elif seconds:
        out += f"{seconds}s"
    return out


def _duration_field(value: Any) -> timedelta:
    return parse_duration(value)


#: A duration field: accepts what parse_duration accepts, dumps as a Go-style string.
Duration = Annotated[
    timedelta,
    BeforeValidator(_duration_field),
    PlainSerializer(format_duration, return_type=str),
]


def _positive(td: timedelta) -> timedelta:
    if td <= timedelta(0):
        raise ValueError('must be greater than zero (e.g. "5s")')
    return td


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]


# --------------------------------------------------------------------------- addresses


def parse_address(value: str) -> tuple[str, int]:
    """`"0.0.0.0:1883"` / `"[::1]:1883"` / `"localhost:0"` / `":1883"` → (host, port).

    An empty host (`:1883`) means all interfaces, returned as `0.0.0.0`. Port 0 asks the OS for
    a free port (tests). Raises ValueError saying what was expected.
    """
    expected = 'expected HOST:PORT such as "0.0.0.0:1883", "[::1]:1883" or ":1883"'
    if not isinstance(value, str):
        raise ValueError(f"{expected}, got {value!r}")
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError(f"invalid address {value!r}: {expected}")
        host, port_text = text[1:end], text[end + 2 :]
        if not host or ":" not in host:
            raise ValueError(f"invalid address {value!r}: brackets are for IPv6 hosts; {expected}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"invalid address {value!r}: missing ':PORT'; {expected}")
        if ":" in host:
            raise ValueError(f"invalid address {value!r}: put an IPv6 host in brackets, e.g. \"[::1]:1883\"")
        host = host or "0.0.0.0"
    if any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"invalid host {host!r} in {value!r}: {expected}")
    if not port_text.isdigit():
        raise ValueError(f"invalid port {port_text!r} in {value!r}: expected a number 0–65535")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"invalid port {port} in {value!r}: expected a number 0–65535")
    return host, port


def _address_field(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f'expected HOST:PORT (a string), got the number {value}; e.g. "0.0.0.0:{value}"')
    parse_address(value)
    return value


Address = Annotated[str | None, BeforeValidator(_address_field)]


# --------------------------------------------------------------------------- models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class DatabaseConfig(_Strict):
    dsn: str | None = None
    pool_size: int = Field(10, ge=1)
    min_pool_size: int = Field(2, ge=0)
    data_dir: str | None = None

    @model_validator(mode="after")
    def _pool_bounds(self) -> DatabaseConfig:
        if self.min_pool_size > self.pool_size:
            raise ValueError(
                f"min_pool_size ({self.min_pool_size}) must not exceed pool_size ({self.pool_size})"
            )
        return self


class ListenersConfig(_Strict):
    mqtt: Address = "0.0.0.0:1883"
    amqp: Address = "0.0.0.0:5672"  # AMQP 1.0
    amqp091: Address = "0.0.0.0:5682"
    http: Address = "0.0.0.0:8082"
    # MQTT over WebSocket on a port of its own (off unless set; TLS from `tls:` makes it wss).
    ws: Address = None

    def addresses(self) -> dict[str, tuple[str, int]]:
        """The enabled listeners: name → (host, port)."""
        return {
            name: parse_address(value)
            for name in type(self).model_fields
            if (value := getattr(self, name)) is not None
        }


class QueueManagerConfig(_Strict):
    auto_commit_interval: Duration = timedelta(seconds=5)
    visibility_timeout: PositiveDuration = timedelta(seconds=30)
    max_pending_per_group: int = Field(100_000, ge=1)
    claim_batch: int = Field(10, ge=1)
    delivery_batch: int = Field(100, ge=1)
    retention_interval: PositiveDuration = timedelta(minutes=5)
    # What a `$queue/<name>/…` publish or subscription that no configured queue matches gets:
    # durable (a classic queue <name> in PostgreSQL, created on first use), transient (a queue
    # that lives until this node stops), or off (refused: the protocol's not-found answer).
    auto_create: Literal["durable", "transient", "off"] = "durable"
    # Payload bytes all transient queues together may hold (0 = unbounded); publishes beyond are
    # refused (AMQP basic.nack, MQTT quota exceeded), never accepted and dropped.
    transient_max_bytes: int = Field(256 * 2 ** 20, ge=0)
    # Accepted so older configs load; in-memory ephemeral queues are gone (transient queues
    # replace them and have no grace period). Reported as ignored at start-up.
    ephemeral_grace: Duration = timedelta(minutes=5)
    heartbeat_interval: PositiveDuration = timedelta(seconds=5)
    heartbeat_timeout: PositiveDuration = timedelta(seconds=30)
    max_groups_per_stream: int = Field(50, ge=1)

    @model_validator(mode="after")
    def _heartbeats(self) -> QueueManagerConfig:
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_timeout ({format_duration(self.heartbeat_timeout)}) must be longer "
                f"than heartbeat_interval ({format_duration(self.heartbeat_interval)})"
            )
        return self


class LimitsConfig(_Strict):
    max_message_size: int = Field(10_485_760, ge=0)  # bytes; 0 = unlimited
    max_depth: int = Field(100_000, ge=0)  # messages; 0 = unlimited
    message_ttl: Duration = timedelta(hours=168)  # 0 = never expire
    # At max_depth: reject-publish refuses new messages (publisher nack / error); drop-head
    # drops the oldest undelivered ones to make room (RabbitMQ x-overflow).
    overflow: Literal["reject-publish", "drop-head"] = "reject-publish"


class RetryConfig(_Strict):
    max_retries: int = Field(10, ge=0)
    initial_backoff: Duration = timedelta(seconds=5)
    max_backoff: Duration = timedelta(minutes=5)
    multiplier: float = Field(2.0, ge=1.0)
    # An explicit nack (AMQP nack/reject requeue=true, MQTT $nack, AMQP 1.0 released) redelivers
    # at once by default; true applies the backoff above to it. Requeues because a consumer went
    # away (channel close, connection loss, cancel, recover) are always immediate.
    nack_backoff: bool = False

    @model_validator(mode="after")
    def _backoff_bounds(self) -> RetryConfig:
        if self.initial_backoff > self.max_backoff:
            raise ValueError(
                f"initial_backoff ({format_duration(self.initial_backoff)}) must not exceed "
                f"max_backoff ({format_duration(self.max_backoff)})"
            )
        return self


class DlqConfig(_Strict):
    enabled: bool = True
    # The dead-letter queue's name; "" = `$dlq/<queue>`. A plain queue name or `$dlq/<name>`.
    topic: str = ""
    # Dead-letter messages that expire before delivery too (AMQP x-dead-letter-exchange does);
    # false: expired messages are skipped (FluxMQ).
    expired: bool = False

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        if value:
            try:
                validate_queue_name(value, allow_dlq=True)
            except InvalidArgument as e:
                raise ValueError(f"{e} (expected a queue name or {DLQ_PREFIX}<name>)") from None
        return value


class RetentionConfig(_Strict):
    # Applied to stream queues; classic queues are trimmed by acknowledgement and message_ttl.
    # The default max_age depends on the kind (QueueConfig sets 0 for classic queues), as in SQL's
    # fluxpg.default_settings(kind), the one definition of every default.
    max_age: Duration = timedelta(hours=168)  # 0 = unlimited
    max_length_bytes: int = Field(0, ge=0)  # 0 = unlimited
    max_length_messages: int = Field(0, ge=0)  # 0 = unlimited


def _topic_filter(value: str) -> str:
    try:
        return validate_topic_filter(value)
    except InvalidArgument as e:
        raise ValueError(str(e)) from None


TopicFilter = Annotated[str, AfterValidator(_topic_filter)]


class ReplicationConfig(_Strict):
    """Accepted so FluxMQ configs load; ignored (replication is PostgreSQL's business)."""

    enabled: bool = False
    group: str = ""
    mode: Literal["sync", "async"] = "sync"
    ack_timeout: Duration = timedelta(seconds=5)
    replication_factor: int = Field(3, ge=1)
    min_in_sync_replicas: int = Field(2, ge=1)


class QueueConfig(_Strict):
    name: str
    # None (omitted) means [`$queue/<name>/#`]; filled in after validation.
    topics: list[TopicFilter] | None = None
    reserved: bool = False
    type: Literal["classic", "stream"] = "classic"
    primary_group: str = ""
    partitions: int = Field(1, ge=1)
    segment_size: int = Field(100_000, ge=1)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    dlq: DlqConfig = Field(default_factory=DlqConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    replication: ReplicationConfig = Field(default_factory=ReplicationConfig)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        try:
            return validate_queue_name(value)
        except InvalidArgument as e:
            raise ValueError(str(e)) from None

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("must list at least one topic filter (omit the key for $queue/<name>/#)")
        return value

    @model_validator(mode="after")
    def _default_topics(self) -> QueueConfig:
        if self.topics is None:
            # Assign via __dict__: validate_assignment would re-run this validator recursively.
            self.__dict__["topics"] = [f"{QUEUE_PREFIX}{self.name}/#"]
        if self.type == "classic" and "max_age" not in self.retention.model_fields_set:
            # fluxpg.default_settings('classic'): no age limit (acks trim classic queues).
            self.retention.__dict__["max_age"] = timedelta(0)
        if self.type == "stream" and "max_depth" not in self.limits.model_fields_set:
            # fluxpg.default_settings('stream'): no depth limit unless set (a stream's depth is
            # what its slowest group has not committed; retention bounds it otherwise).
            self.limits.__dict__["max_depth"] = 0
        if self.dlq.topic == self.name:
            raise ValueError(f"dlq.topic of queue {self.name!r} names the queue itself")
        return self

    @property
    def dlq_queue(self) -> str | None:
        """The name of this queue's dead-letter queue, None when dead-lettering is disabled."""
        if not self.dlq.enabled:
            return None
        return self.dlq.topic or dlq_name(self.name)

    def to_settings(self, queue_manager: QueueManagerConfig | None = None) -> dict[str, Any]:
        """The JSON stored in `fluxpg.queues.settings` (DESIGN §3), every default filled in."""
        qm = queue_manager if queue_manager is not None else QueueManagerConfig()
        dumped = self.model_dump(mode="json")
        dlq = dumped["dlq"]  # topic "" = $dlq/<name>, resolved by SQL (fluxpg.dlq_name)
        return {
            "limits": dumped["limits"],
            "retry": dumped["retry"],
            "dlq": dlq,
            "retention": dumped["retention"],
            "primary_group": self.primary_group,
            "partitions": self.partitions,
            "segment_size": self.segment_size,
            "delivery": {
                "visibility_timeout": format_duration(qm.visibility_timeout),
                "max_pending": qm.max_pending_per_group,
                "auto_commit_interval": format_duration(qm.auto_commit_interval),
                "member_timeout": format_duration(qm.heartbeat_timeout),
                "max_groups": qm.max_groups_per_stream,
            },
            # Kept in the database so every node (and a later config without it) knows the queue
            # is a catch-all that only takes what no other queue does.
            "reserved": self.reserved,
        }


class PermissionConfig(_Strict):
    """One permission of a user: `action` on the queues/topics `pattern` covers (fluxpg.auth has
    the table of what each action allows)."""

    # publish | consume (also ack/nack/reject/commit and read) | configure (declare; also read) |
    # read (passive declare, depth) | monitoring (HTTP API, metrics) | manage (also monitoring) | all
    action: Literal["publish", "consume", "configure", "read", "monitoring", "manage", "all"]
    # A queue name (`orders`: all of it), a topic filter (`$queue/orders/eu/#`), or "#" (everything).
    pattern: str = "#"
    # consume: only as these consumer groups (`*`, `?` wildcards); omitted = any group.
    groups: list[str] | None = None

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            if "/" in value or "+" in value or "#" in value:
                validate_topic_filter(value)
            else:
                validate_queue_name(value)
        except InvalidArgument as e:
            raise ValueError(f"{e} (expected a queue name or a topic filter such as $queue/orders/#)") from None
        return value

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not g for g in value):
            raise ValueError("a consumer group pattern must not be empty")
        return value


class UserConfig(_Strict):
    username: str = Field(min_length=1)
    # Exactly one of the two. A plain `password` is for development: it is hashed on load and
    # never kept; production configs carry `password_hash` (from `fluxpg passwd`).
    password: str | None = Field(None, repr=False)
    password_hash: str | None = Field(None, repr=False)
    # Omitted: every action on everything. [] = nothing.
    permissions: list[PermissionConfig] | None = None

    @field_validator("password_hash")
    @classmethod
    def _hash(cls, value: str | None) -> str | None:
        if value is not None:
            from fluxpg.auth import parse_hash  # noqa: PLC0415 - keep config importable alone

            parse_hash(value)
        return value

    @model_validator(mode="after")
    def _one_secret(self) -> UserConfig:
        if (self.password is None) == (self.password_hash is None):
            raise ValueError(f"user {self.username!r}: give exactly one of password (development) "
                             "or password_hash (from `fluxpg passwd`)")
        if self.password is not None:
            if not self.password:
                raise ValueError(f"user {self.username!r}: password must not be empty")
            from fluxpg.auth import hash_password  # noqa: PLC0415

            # Assign via __dict__: validate_assignment would re-run this validator.
            self.__dict__["password_hash"] = hash_password(self.password)
            self.__dict__["password"] = None
        return self


class TokenConfig(_Strict):
    """A bearer token for the HTTP listener (e.g. Prometheus scraping /metrics): `Authorization:
    Bearer <token>`. Production configs keep only its SHA-256 (`sha256sum` of the token; tokens
    are long random secrets, so a fast hash is enough); a plain `token` is for development."""

    name: str = Field(min_length=1)
    token: str | None = Field(None, repr=False, min_length=16)
    token_sha256: str | None = Field(None, repr=False, pattern=r"^[0-9a-fA-F]{64}$")
    # Omitted: every right. For scraping: [{action: monitoring, pattern: "#"}].
    permissions: list[PermissionConfig] | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> TokenConfig:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError(f"token {self.name!r}: give exactly one of token (development) or token_sha256")
        return self

    def sha256(self) -> str:
        import hashlib  # noqa: PLC0415

        if self.token_sha256 is not None:
            return self.token_sha256.lower()
        return hashlib.sha256(self.token.encode("utf-8")).hexdigest()


class AuthConfig(_Strict):
    allow_anonymous: bool = False
    # Permissions of anonymous clients (with allow_anonymous); omitted = everything.
    anonymous_permissions: list[PermissionConfig] | None = None
    users: list[UserConfig] = Field(default_factory=list)
    # How long a user looked up in the fluxpg.users table is remembered.
    cache_ttl: Duration = timedelta(seconds=5)
    # Bearer tokens of the HTTP listener (/api/*, /metrics), e.g. for Prometheus.
    tokens: list[TokenConfig] = Field(default_factory=list)

    @field_validator("users")
    @classmethod
    def _unique_users(cls, users: list[UserConfig]) -> list[UserConfig]:
        seen: set[str] = set()
        for i, user in enumerate(users):
            if user.username in seen:
                raise ValueError(f"users[{i}].username: duplicate user {user.username!r}")
            seen.add(user.username)
        return users


class TlsConfig(_Strict):
    """TLS for the listeners (all of them, or those named in `listeners`)."""

    cert_file: str
    key_file: str
    # CA bundle to verify client certificates against (needed for require_client_cert).
    ca_file: str | None = None
    require_client_cert: bool = False
    listeners: list[Literal["mqtt", "amqp", "amqp091", "http", "ws"]] | None = None

    @model_validator(mode="after")
    def _client_certs(self) -> TlsConfig:
        if self.require_client_cert and not self.ca_file:
            raise ValueError("require_client_cert needs ca_file (the CA that signs client certificates)")
        return self

    def applies_to(self, listener: str) -> bool:
        return self.listeners is None or listener in self.listeners

    def ssl_context(self):
        """A server-side ssl.SSLContext (TLS 1.2+). Raises ConfigError naming the unreadable file."""
        import ssl  # noqa: PLC0415

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"tls: cannot load cert_file {self.cert_file!r} / key_file {self.key_file!r}: "
                              f"{getattr(e, 'strerror', None) or e}") from None
        if self.ca_file:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as e:
                raise ConfigError(f"tls: cannot load ca_file {self.ca_file!r}: "
                                  f"{getattr(e, 'strerror', None) or e}") from None
            context.verify_mode = ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_OPTIONAL
        return context


class BoundsConfig(_Strict):
    """Resource bounds that keep one client (or many) from exhausting the broker. Every front-end
    reads them from `config.bounds`; 0 disables a byte/count bound (not advised), "0" a deadline."""

    # Accept → login complete (AMQP 0-9-1 open-ok, AMQP 1.0 open, MQTT CONNACK), however the bytes
    # trickle in: measured from accept, never restarted by traffic.
    handshake_timeout: Duration = timedelta(seconds=10)
    # Once the first byte of a frame/packet arrived, the whole frame/packet must arrive within this
    # (MQTT over WebSocket: the WebSocket message too, followed beside the library: protocols/wsframes.py).
    frame_timeout: Duration = timedelta(seconds=30)
    # Sum of message bytes held for ONE connection before they are stored: partially received
    # bodies (AMQP 0-9-1 content across channels, AMQP 1.0 multi-frame transfers across links,
    # MQTT packet being read; above it the protocol's resource error before buffering more),
    # AMQP 0-9-1 transactions until commit (above it 406, the channel closes) and MQTT publishes
    # until their commit (above it the socket is not read: TCP backpressure); over WebSocket also
    # the bytes the WebSocket library holds before MQTT has them (above it, nothing committing: 0x97).
    connection_inbound_bytes: int = Field(64 * 2 ** 20, ge=0)
    # Unsent outbound bytes per connection (the transport's write buffer): deliveries stop (and
    # claiming pauses) above it until the client reads; nothing confirmed is dropped.
    connection_outbound_bytes: int = Field(8 * 2 ** 20, ge=0)
    # Sum of partially received bodies over ALL connections of this broker process.
    broker_inbound_bytes: int = Field(512 * 2 ** 20, ge=0)
    # Decoder work bounds, checked by a pre-scan of the encoding BEFORE decoding: nesting depth of
    # AMQP 0-9-1 field tables/arrays and AMQP 1.0 lists/maps/arrays/described values ...
    decoder_max_depth: int = Field(16, ge=1)
    # ... and the number of elements (every value at every depth) one encoded structure may hold.
    decoder_max_elements: int = Field(10_000, ge=1)
    # MQTT: per-session outbound queue (messages waiting to be written or unacknowledged QoS 1/2
    # deliveries) — messages and bytes; the MQTT front-end decides what happens above it.
    mqtt_session_outbound_messages: int = Field(1_000, ge=0)
    mqtt_session_outbound_bytes: int = Field(16 * 2 ** 20, ge=0)


class ConsoleConfig(_Strict):
    """The browser console served by the HTTP listener at `/` (fluxpg/console/)."""

    enabled: bool = True
    # The overview warns about a group whose lag (messages not yet committed) or oldest pending
    # delivery passes these.
    lag_warning: int = Field(10_000, ge=0)
    pending_age_warning: Duration = timedelta(minutes=5)
    # How often the message rates are sampled (the chart keeps 120 samples).
    rate_interval: PositiveDuration = timedelta(seconds=5)
    # How long a log-in lasts.
    session_ttl: PositiveDuration = timedelta(hours=8)
    # Key that signs session cookies, the same on every node so a log-in works on all of them;
    # omitted: a random key per process (log in again on each node, and after a restart).
    secret: str | None = Field(None, repr=False, min_length=16)


class Amqp091Config(_Strict):
    # Virtual hosts an AMQP 0-9-1 client may open besides "/" (RabbitMQ's default). fluxpg has
    # one namespace of queues: every accepted vhost reaches the same queues. Others are refused
    # with 530 NOT_ALLOWED, as RabbitMQ refuses a vhost that does not exist.
    virtual_hosts: list[str] = Field(default_factory=lambda: ["/"])

    def accepts(self, vhost: str) -> bool:
        return vhost in ("", "/") or vhost in self.virtual_hosts


class Config(_Strict):
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    listeners: ListenersConfig = Field(default_factory=ListenersConfig)
    queue_manager: QueueManagerConfig = Field(default_factory=QueueManagerConfig)
    queues: list[QueueConfig] = Field(default_factory=list)
    auth: AuthConfig | None = None   # None: no authentication (everybody may do everything)
    tls: TlsConfig | None = None     # None: plain TCP
    bounds: BoundsConfig = Field(default_factory=BoundsConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    amqp091: Amqp091Config = Field(default_factory=Amqp091Config)

    @field_validator("queues")
    @classmethod
    def _unique_names(cls, queues: list[QueueConfig]) -> list[QueueConfig]:
        seen: dict[str, int] = {}
        for i, queue in enumerate(queues):
            if queue.name in seen:
                raise ValueError(
                    f"queues[{i}].name: duplicate queue name {queue.name!r} (already queues[{seen[queue.name]}])"
                )
            seen[queue.name] = i
        return queues

    def effective_queues(self) -> list[QueueConfig]:
        """The configured queues. FluxMQ adds an implicit reserved `mqtt` queue on `$queue/#` when
        none are configured; fluxpg does not: it would take every unmatched publish and so defeat
        `queue_manager.auto_create` (a queue per name, durable by default). A config that lists
        its own reserved catch-all keeps it."""
        return list(self.queues)

    def warnings(self) -> list[str]:
        """Accepted but ineffective settings, for the log at start-up."""
        out = [
            f"queues[{i}].replication is ignored by fluxpg (PostgreSQL replication applies instead)"
            for i, queue in enumerate(self.queues)
            if queue.replication.enabled
        ]
        if "ephemeral_grace" in self.queue_manager.model_fields_set:
            out.append("queue_manager.ephemeral_grace is ignored: in-memory ephemeral queues were replaced by "
                       "transient queues (see queue_manager.auto_create)")
        return out


# --------------------------------------------------------------------------- AMQP declare args

_AMQP_QUEUE_TYPES = {"classic": "classic", "stream": "stream", "quorum": "classic"}


def _amqp_text(key: str, value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise InvalidArgument(f"{key}: expected a string, got {value!r}")
    return value


def _amqp_count(key: str, value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        text = _amqp_text(key, value).strip()
        if not text.isdigit():
            raise InvalidArgument(f"{key}: expected a non-negative integer, got {text!r}")
        return int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{key}: expected a non-negative integer, got {value!r}")
    if value < 0:
        raise InvalidArgument(f"{key}: expected a non-negative integer, got {value}")
    return value


def settings_from_amqp_args(args: dict[str, Any] | None) -> dict[str, Any]:
    """Map AMQP 0-9-1 queue.declare arguments to QueueConfig fields (a dict for `QueueConfig(**…)`).

    `x-queue-type` (classic | stream; quorum → classic), `x-max-age` ("7D", "24h", …),
    `x-max-length` (messages: stream retention, or a classic queue's max depth),
    `x-max-length-bytes`, `x-message-ttl` (milliseconds). Other arguments are ignored, as
    RabbitMQ ignores those it does not know. Bad values raise InvalidArgument naming the argument.
    """
    args = args or {}
    out: dict[str, Any] = {}
    queue_type = "classic"
    if "x-queue-type" in args:
        raw = _amqp_text("x-queue-type", args["x-queue-type"]).strip().lower()
        if raw not in _AMQP_QUEUE_TYPES:
            raise InvalidArgument(f"x-queue-type: expected 'classic' or 'stream', got {raw!r}")
        queue_type = out["type"] = _AMQP_QUEUE_TYPES[raw]
    retention: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if "x-max-age" in args:
        try:
            age = parse_duration(_amqp_text("x-max-age", args["x-max-age"]))
        except DurationError as e:
            raise InvalidArgument(f"x-max-age: {e}") from None
        retention["max_age"] = format_duration(age)
    if "x-max-length" in args:
        count = _amqp_count("x-max-length", args["x-max-length"])
        if queue_type == "stream":
            retention["max_length_messages"] = count
        else:
            limits["max_depth"] = count
    if "x-max-length-bytes" in args:
        retention["max_length_bytes"] = _amqp_count("x-max-length-bytes", args["x-max-length-bytes"])
    if "x-message-ttl" in args:
        ms = _amqp_count("x-message-ttl", args["x-message-ttl"])
        # x-message-ttl 0 means "expire unless delivered at once" in RabbitMQ; fluxpg's 0 means
        # never, so the shortest real TTL stands in for it.
        limits["message_ttl"] = format_duration(timedelta(milliseconds=max(ms, 1)))
    if "x-overflow" in args:
        overflow = _amqp_text("x-overflow", args["x-overflow"]).strip().lower()
        if overflow not in ("drop-head", "reject-publish"):
            raise InvalidArgument(f"x-overflow: expected 'drop-head' or 'reject-publish', got {overflow!r} "
                                  "(reject-publish-dlx is not supported)")
        limits["overflow"] = overflow
    if retention:
        out["retention"] = retention
    if limits:
        out["limits"] = limits
    return out


def queue_config_from_amqp_args(name: str, args: dict[str, Any] | None) -> QueueConfig:
    """A QueueConfig for a queue declared over AMQP 0-9-1 (defaults plus `settings_from_amqp_args`)."""
    fields = settings_from_amqp_args(args)
    try:
        return QueueConfig(name=name, **fields)
    except ValidationError as e:
        problems = [f"{_format_loc(err['loc'])}: {_clean_msg(err['msg'])}" for err in e.errors()]
        raise InvalidArgument("; ".join(problems)) from None


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None) -> Config:
    """Read the YAML file at `path` (or `$FLUXPG_CONFIG`, or nothing: defaults only).

    `$FLUXPG_DSN`, when set, overrides `database.dsn`. Raises ConfigError.
    """
    if path is None:
        env_path = os.environ.get(ENV_CONFIG)
        path = env_path or None
    if path is None:
        data: Any = {}
        source = "<defaults>"
        root = None
    else:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ConfigError(f"{source}: cannot read config file: {reason}") from None
        data, root = _parse_yaml(text, source)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{source}:1: expected a mapping of sections ({', '.join(Config.model_fields)}), "
                f"got {type(data).__name__}"
            )
    dsn = os.environ.get(ENV_DSN)
    if dsn:
        database = data.get("database")
        if database is None or isinstance(database, dict):
            data = {**data, "database": {**(database or {}), "dsn": dsn}}
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        problems = [_describe(err, source, root) for err in e.errors()]
        raise ConfigError("\n".join(problems), problems) from None


def _parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """Parse keeping the node tree, so that problems can be reported with their line."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        duplicate = _find_duplicate_key(root)
        if duplicate is not None:
            raise ConfigError(f"{source}:{duplicate[1]}: duplicate key {duplicate[0]!r}")
        return loader.construct_document(root), root
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"{where}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: YAML error: {e}") from None
    finally:
        loader.dispose()


def _find_duplicate_key(node: yaml.Node) -> tuple[str, int] | None:
    # PyYAML keeps the last of duplicate keys silently; a strict config must not.
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        return key.value, key.start_mark.line + 1
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return None


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _clean_msg(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The YAML node at a pydantic location (the key node for the last part, when a mapping key)."""
    node = root
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == part:
                    node = key if i == len(loc) - 1 else value
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class whose keys live at `loc` (to list the keys it allows)."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = _unwrap_model(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> Any:
    # list[QueueConfig] / Optional[X] / Annotated[X, …] → X
    for arg in (typing.get_args(annotation) or (annotation,)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        inner = _unwrap_model(arg) if typing.get_args(arg) else None
        if inner is not None:
            return inner
    return None


_QUEUE_PROBLEM = re.compile(r"queues\[(\d+)\]\.(\w+): (.*)", re.DOTALL)


def _describe(err: Any, source: str, root: yaml.Node | None) -> str:
    loc = tuple(err["loc"])
    kind = err["type"]
    msg = _clean_msg(err["msg"])
    if loc == ("queues",) and (m := _QUEUE_PROBLEM.match(msg)):
        # Cross-queue checks run on the whole list; point at the offending entry instead.
        loc, msg = ("queues", int(m.group(1)), m.group(2)), m.group(3)
    if kind == "extra_forbidden":
        allowed = list(getattr(_model_at(loc[:-1]), "model_fields", {}))
        msg = f"unknown key {loc[-1]!r}"
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        if close:
            msg += f" (did you mean {close[0]!r}?)"
        if allowed:
            msg += f"; expected one of: {', '.join(allowed)}"
    elif kind == "missing":
        msg = "required key is missing"
    elif "input" in err and not isinstance(err["input"], (dict, list)) and kind not in ("value_error",):
        msg += f" (got {err['input']!r})"
    node = _node_at(root, loc)
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    return f"{source}{line}: {_format_loc(loc)}: {msg}"
