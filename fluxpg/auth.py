"""Authentication and per-user permissions, shared by every protocol front-end.

Front-ends call `ctx.auth.authenticate(...)` once per connection (MQTT CONNECT username/password,
AMQP 0-9-1 PLAIN, AMQP 1.0 SASL PLAIN/ANONYMOUS) and `principal.allowed(action, name)` before a
publish or a subscribe/consume. With no `auth:` section in the config the broker is open: everybody
is let in with every permission (and `fluxpg serve` says so at start).

Passwords are stored only as scrypt hashes: `scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>`
(`hash_password`, `verify_password`; `fluxpg passwd` prints one). The configured authenticator
(users in the config, then in the `fluxpg.users` table) is in auth_config.py.

Authorization is ONE function, `authorize(principal, action, resource, group=...)`, that every
front-end (MQTT, AMQP 0-9-1, AMQP 1.0, HTTP) calls for every action, so the same user gets the same
answer whichever protocol it speaks:

  action       resource                                   granted by a permission of action
  publish      the topic published to (`$queue/orders/eu`) publish (a control topic: see ack)
  consume      the subscription: queue (`orders`) or       consume, covering every topic the
               queue + filter (`$queue/orders/eu/#`)        subscription can match, and the group
  ack, nack,   the queue (`$queue/<q>/$ack` etc. is this)   consume on the WHOLE queue and the group
  reject,
  commit
  configure    the queue declared                          configure
  read         the queue inspected (passive declare, depth) read, consume or configure
  monitoring   a queue, or None for the whole broker        monitoring or manage
  manage       a queue, or None for the whole broker        manage
  (`all` grants every action on its pattern.)

Permissions are (action, pattern[, groups]) triples: pattern a queue name (`orders`: everything in
that queue), a topic filter (`$queue/orders/eu/#`, `$queue/+/audit`) or `#` (everything); groups
an optional list of consumer-group names (`*`/`?` wildcards) the consume right is limited to.
A subscription is allowed when the pattern covers every topic it can match. Config files written
before `configure`/`read`/`monitoring`/`manage` existed keep their meaning for publish and consume;
declaring a queue now needs `configure` (or `all`), as in RabbitMQ.
"""
from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import NamedTuple

from fluxpg.topics import ack_verb

QUEUE_PREFIX = "$queue/"   # same as fluxpg.topics.QUEUE_PREFIX

# scrypt cost: n=2^14, r=8 takes ~50 ms and 16 MiB — OWASP's minimum recommendation for scrypt.
SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
_MAX_N = 2 ** 20


class AuthError(Exception):
    """Login refused; the message is safe to log (never contains the password)."""


#: What a client can be authorized for (see the table in the module docstring).
ACTIONS = ("publish", "consume", "ack", "nack", "reject", "commit", "configure", "read", "monitoring", "manage")
#: What a permission in the config / fluxpg.users can name.
PERMISSION_ACTIONS = ("publish", "consume", "configure", "read", "monitoring", "manage", "all")
#: Acknowledgement verbs: consume rights on the whole queue (and the group).
CONTROL_ACTIONS = frozenset({"ack", "nack", "reject", "commit"})
# A permission of action X (key) grants the actions in the value.
_GRANTS = {
    "publish": frozenset({"publish"}),
    "consume": frozenset({"consume", "ack", "nack", "reject", "commit", "read"}),
    "configure": frozenset({"configure", "read"}),
    "read": frozenset({"read"}),
    "monitoring": frozenset({"monitoring"}),
    "manage": frozenset({"manage", "monitoring"}),
    "all": frozenset(ACTIONS),
}
EVERYTHING = "#"


class Permission(NamedTuple):
    action: str
    pattern: str = EVERYTHING
    groups: tuple[str, ...] | None = None   # consumer groups (fnmatch patterns); None = any


@dataclass(frozen=True)
class Principal:
    username: str | None
    anonymous: bool = False
    # Permission triples (plain (action, pattern) pairs work too); None means everything is allowed
    permissions: tuple[tuple, ...] | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def allowed(self, action: str, name: str | None = None, *, group: str | None = None) -> bool:
        """Shorthand for `authorize(self, action, name, group=group)`."""
        return authorize(self, action, name, group=group)

    @property
    def display(self) -> str:
        return self.username or "anonymous"


def subscription(queue: str, topic_filter: str | None) -> str:
    """The consume resource of a queue subscription: `orders` (all of it) or `$queue/orders/eu/#`.
    Every protocol names subscriptions this way, so the answer does not depend on the spelling."""
    if topic_filter is None or topic_filter == "#":
        return queue
    return f"{QUEUE_PREFIX}{queue}/{topic_filter}"


def _group_allowed(groups: tuple[str, ...] | None, group: str | None) -> bool:
    if groups is None or group is None:
        return True
    # `workers@orders/+` (a filtered group's internal name) is the group `workers`.
    name = group.partition("@")[0] or group
    return any(fnmatch.fnmatchcase(name, g) for g in groups)


def authorize(principal: Principal | None, action: str, resource: str | None = None, *,
              group: str | None = None) -> bool:
    """THE authorization decision of the broker: may `principal` do `action` on `resource`
    (as consumer group `group`, where groups matter)? Every protocol calls this for every action;
    see the module docstring for the resource each action takes. Never raises; an unknown action
    is refused. `principal` None (no login step, e.g. auth off) and permissions None allow all."""
    if action not in _ALL_KNOWN:
        return False
    if principal is None or principal.permissions is None:
        return True
    if action == "publish" and resource is not None and resource.startswith(QUEUE_PREFIX):
        # A control publish (`$queue/<q>/$ack` …) acts on other consumers' entries: it needs the
        # consume right on the whole queue and the group, whatever publish rights say.
        try:
            verb = ack_verb(resource)
        except Exception:  # noqa: BLE001 - a malformed ack topic: the protocol refuses it anyway
            return False
        if verb is not None:
            resource, action = verb
    if resource is None:
        if action not in ("monitoring", "manage"):
            return False
        resource = EVERYTHING
    for perm in principal.permissions:
        granted, pattern = perm[0], perm[1]
        groups = perm[2] if len(perm) > 2 else None
        if action not in _GRANTS.get(granted, ()):
            continue
        if resource == EVERYTHING:
            if pattern != EVERYTHING:
                continue
        elif not pattern_allows(pattern, resource):
            continue
        if action in ("consume", *CONTROL_ACTIONS) and not _group_allowed(groups, group):
            continue
        return True
    return False


_ALL_KNOWN = frozenset(ACTIONS)


def _queue_and_rest(name: str) -> tuple[str, str | None]:
    """`$queue/orders/eu/#` or `orders/eu/#` → ("orders", "eu/#"); `orders` → ("orders", None);
    `$dlq/orders/x` → ("$dlq/orders", "x")."""
    rest = name[len(QUEUE_PREFIX):] if name.startswith(QUEUE_PREFIX) else name
    first, sep, tail = rest.partition("/")
    if first == "$dlq" and sep:
        second, sep, tail = tail.partition("/")
        first = "$dlq/" + second
    return first, (tail if sep else None)


def _levels_cover(pattern: list[str], name: list[str]) -> bool:
    """Does the filter `pattern` match every topic the filter (or topic) `name` matches?"""
    for i, level in enumerate(pattern):
        if level == "#":
            return True
        if i >= len(name):
            return False
        if name[i] == "#":
            return False  # `name` reaches deeper than this pattern allows
        if level == "+":
            continue
        if name[i] == "+" or name[i] != level:
            return False
    return len(pattern) == len(name)


def pattern_allows(pattern: str, name: str) -> bool:
    """Does a permission pattern (queue name or topic filter) cover `name`? Never raises."""
    if not pattern or not name:
        return False
    if pattern == name:
        return True
    queue, rest = _queue_and_rest(name)
    is_topic_pattern = pattern.startswith(QUEUE_PREFIX) or "/" in pattern or "+" in pattern or "#" in pattern
    if not is_topic_pattern:
        # a queue name: everything in that queue
        return queue == pattern
    # Compare as topic levels, names normalised to `$queue/<q>[/<rest>]`; a bare queue
    # (`$queue/orders` consumed whole) is the subscription `$queue/orders/#`.
    if name.startswith(QUEUE_PREFIX) or not pattern.startswith(QUEUE_PREFIX):
        full = name
    else:
        full = QUEUE_PREFIX + name
    levels = full.split("/")
    if rest is None and full.startswith(QUEUE_PREFIX):
        levels_whole = levels + ["#"]
        # Publishing to `$queue/orders` is a topic; consuming `orders` is every topic in it.
        return _levels_cover(pattern.split("/"), levels) and _levels_cover(pattern.split("/"), levels_whole)
    return _levels_cover(pattern.split("/"), levels)


# --------------------------------------------------------------------------- password hashes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new scrypt hash of `password` with a random salt: `scrypt$n$r$p$salt$hash`."""
    if not isinstance(password, str) or not password:
        raise ValueError("the password must be a non-empty string")
    salt = os.urandom(SALT_BYTES)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES,
                            maxmem=_maxmem(n, r, p))
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _maxmem(n: int, r: int, p: int) -> int:
    return 128 * n * r * (p + 1) + 1024 * 1024


def parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """`scrypt$n$r$p$salt$hash` → (n, r, p, salt, hash). Raises ValueError saying what is wrong."""
    if not isinstance(encoded, str):
        raise ValueError("a password hash must be a string")
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("expected a hash like scrypt$16384$8$1$<salt>$<hash> (make one with `fluxpg passwd`)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError("malformed scrypt hash: n, r, p must be numbers and salt, hash base64") from None
    if n < 2 or n > _MAX_N or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16:
        raise ValueError(f"unsupported scrypt parameters n={n} r={r} p={p}")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("scrypt hash: salt or hash too short")
    return n, r, p, salt, digest


def verify_password(password: str | bytes, encoded: str) -> bool:
    """Constant-time check of a password against a stored hash (False on a malformed hash)."""
    try:
        n, r, p, salt, digest = parse_hash(encoded)
    except ValueError:
        return False
    if isinstance(password, str):
        password = password.encode("utf-8")
    candidate = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=len(digest), maxmem=_maxmem(n, r, p))
    return hmac.compare_digest(candidate, digest)


# --------------------------------------------------------------------------- authenticators


class OpenAuthenticator:
    """No `auth:` configured: every client gets in, with every permission."""

    enabled = False
    allow_anonymous = True

    async def authenticate(self, username: str | None, password: str | bytes | None, *,
                           protocol: str, peer: str | None = None) -> Principal:
        return Principal(username=username or None, anonymous=not username)


def authenticator_for(config, manager=None):
    """The authenticator the config asks for (open when it has no auth section). `manager` (a
    QueueManager) gives the configured one the database, for the users of `fluxpg.users`."""
    auth_config = getattr(config, "auth", None)
    if auth_config is None:
        return OpenAuthenticator()
    from fluxpg.auth_config import ConfiguredAuthenticator  # noqa: PLC0415 - only with auth on

    return ConfiguredAuthenticator(auth_config, manager=manager)
