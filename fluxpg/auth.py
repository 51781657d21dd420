"""Authentication and per-user permissions, shared by every protocol front-end.

Front-ends call `ctx.auth.authenticate(...)` once per connection (MQTT CONNECT username/password,
AMQP 0-9-1 PLAIN, AMQP 1.0 SASL PLAIN/ANONYMOUS) and `principal.allowed(action, name)` before a
publish or a subscribe/consume. With no `auth:` section in the config the broker is open: everybody
is let in with every permission (and `fluxpg serve` says so at start).

Passwords are stored only as scrypt hashes: `scrypt$<n>$<r>$<p>$<salt b64>$<hash b64>`
(`hash_password`, `verify_password`; `fluxpg passwd` prints one). The configured authenticator
(users in the config, then in the `fluxpg.users` table) is in auth_config.py.

Permissions are (action, pattern) pairs: action `publish`, `consume` or `all`; pattern a queue name
(`orders`: everything in that queue) or a topic filter (`$queue/orders/eu/#`, `$queue/+/audit`).
`allowed` takes a queue name, a topic published to, or a subscription (`$queue/orders/eu/#`,
`orders/eu/#`): a subscription is allowed when the pattern covers every topic it can match.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass, field

QUEUE_PREFIX = "$queue/"

# scrypt cost: n=2^14, r=8 takes ~50 ms and 16 MiB — OWASP's minimum recommendation for scrypt.
SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
_MAX_N = 2 ** 20


class AuthError(Exception):
    """Login refused; the message is safe to log (never contains the password)."""


@dataclass(frozen=True)
class Principal:
    username: str | None
    anonymous: bool = False
    # (action, pattern) pairs; action is "publish", "consume" or "all"; None means everything is allowed
    permissions: tuple[tuple[str, str], ...] | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def allowed(self, action: str, name: str) -> bool:
        """May this principal `action` ("publish" | "consume") on `name` (a queue name, a topic, or
        a queue subscription with a filter)?"""
        if self.permissions is None:
            return True
        return any(act in (action, "all") and pattern_allows(pattern, name) for act, pattern in self.permissions)


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
