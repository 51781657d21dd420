"""Authentication and per-user permissions, shared by every protocol front-end.

Front-ends call `ctx.auth.authenticate(...)` once per connection (MQTT CONNECT username/password,
AMQP 0-9-1 PLAIN, AMQP 1.0 SASL PLAIN/ANONYMOUS) and `principal.allowed(action, name)` before a
publish or a subscribe/consume. With no `auth:` section in the config the broker is open: everybody
is let in with every permission (and `fluxpg serve` says so at start).
"""
from __future__ import annotations

from dataclasses import dataclass, field


class AuthError(Exception):
    """Login refused; the message is safe to log (never contains the password)."""


@dataclass(frozen=True)
class Principal:
    username: str | None
    anonymous: bool = False
    # (action, pattern) pairs; action is "publish" or "consume"; None means everything is allowed
    permissions: tuple[tuple[str, str], ...] | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def allowed(self, action: str, name: str) -> bool:
        """May this principal `action` ("publish" | "consume") on `name` (a queue name or a topic)?"""
        if self.permissions is None:
            return True
        from fluxpg.topics import topic_matches

        for act, pattern in self.permissions:
            if act in (action, "all") and (pattern == name or _safe_match(topic_matches, pattern, name)):
                return True
        return False


def _safe_match(fn, pattern: str, name: str) -> bool:
    try:
        return fn(pattern, name)
    except Exception:  # noqa: BLE001 - an invalid pattern grants nothing
        return False


class OpenAuthenticator:
    """No `auth:` configured: every client gets in, with every permission."""

    enabled = False
    allow_anonymous = True

    async def authenticate(self, username: str | None, password: str | bytes | None, *,
                           protocol: str, peer: str | None = None) -> Principal:
        return Principal(username=username or None, anonymous=not username)


def authenticator_for(config) -> OpenAuthenticator:
    """The authenticator the config asks for (open when it has no auth section)."""
    auth_config = getattr(config, "auth", None)
    if auth_config is None:
        return OpenAuthenticator()
    from fluxpg.auth_config import ConfiguredAuthenticator  # noqa: PLC0415 - only with auth on

    return ConfiguredAuthenticator(auth_config)
