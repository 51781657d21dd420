"""The configured authenticator: users from the config's `auth:` section, then from the
`fluxpg.users` table (hashes only; sql/auth.sql).

- A user's password is checked against its scrypt hash in a worker thread (scrypt takes ~50 ms of
  CPU; the event loop keeps serving other connections). Successful checks are remembered for a
  short while, keyed by an HMAC of the password under a per-process random key, so a client that
  reconnects in a loop does not cost a hash each time.
- A failed login is logged (username, peer, protocol — never the password) and answered only
  after a delay that doubles with each failure of the same peer host or username (0.1 s up to
  1.5 s, forgotten after a minute without failures). The delay is an `asyncio.sleep`: it slows the
  guesser, never the broker. Unknown users cost a hash too, so timing does not reveal which
  usernames exist.
- Database users are looked up through the queue manager and cached for `cache_ttl`;
  when the database cannot be reached, only configured users can log in.
- ANONYMOUS (no username, or SASL ANONYMOUS) is let in only with `allow_anonymous: true`, with
  `anonymous_permissions`.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
from typing import Any

from fluxpg.auth import (EVERYTHING, PERMISSION_ACTIONS, AuthError, Permission, Principal, hash_password,
                         verify_password)

log = logging.getLogger("fluxpg.auth")

MIN_DELAY = 0.1
MAX_DELAY = 1.5
FAILURE_MEMORY = 60.0       # seconds without failures after which a peer/username starts afresh
VERIFIED_TTL = 60.0         # seconds a successful password check is remembered
_VERIFIED_MAX = 10_000


def permissions_tuple(perms: Any) -> tuple[Permission, ...] | None:
    """Config or table permissions → Principal.permissions (None = everything allowed). Entries
    this broker does not understand (an unknown action, no pattern) grant nothing."""
    if perms is None:
        return None
    if isinstance(perms, str):
        perms = json.loads(perms)
    out = []
    for p in perms:
        if isinstance(p, dict):
            action, pattern, groups = p.get("action"), p.get("pattern", EVERYTHING), p.get("groups")
        else:
            action = getattr(p, "action", None)
            pattern = getattr(p, "pattern", EVERYTHING)
            groups = getattr(p, "groups", None)
        if groups is not None:
            if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) and g for g in groups):
                continue
            groups = tuple(groups)
        if action in PERMISSION_ACTIONS and isinstance(pattern, str) and pattern:
            out.append(Permission(action, pattern, groups))
    return tuple(out)


class ConfiguredAuthenticator:
    enabled = True

    def __init__(self, config, manager=None):
        self.config = config
        self.manager = manager
        self.allow_anonymous = bool(config.allow_anonymous)
        self._users = {u.username: (u.password_hash, permissions_tuple(u.permissions)) for u in config.users}
        self._anonymous_permissions = permissions_tuple(getattr(config, "anonymous_permissions", None))
        ttl = getattr(config, "cache_ttl", None)
        self._cache_ttl = ttl.total_seconds() if ttl is not None else 5.0
        self._db_cache: dict[str, tuple[float, tuple[str, Any] | None]] = {}
        self._failures: dict[str, tuple[int, float]] = {}
        self._verified: dict[tuple[str, bytes], float] = {}
        self._key = os.urandom(32)
        # A hash to check unknown usernames against (same cost as a real one).
        self._dummy_hash = hash_password(os.urandom(12).hex())

    async def authenticate(self, username: str | None, password: str | bytes | None, *,
                           protocol: str, peer: str | None = None) -> Principal:
        if not username:
            if self.allow_anonymous:
                return Principal(username=None, anonymous=True, permissions=self._anonymous_permissions)
            await self._fail(None, peer, protocol, "anonymous access is not allowed")
        if password is None:
            await self._fail(username, peer, protocol, "no password given")
        if isinstance(password, str):
            password = password.encode("utf-8")
        user = await self._lookup(username)
        encoded = user[0] if user is not None else self._dummy_hash
        if not await self._check(username, password, encoded) or user is None:
            await self._fail(username, peer, protocol, "unknown user" if user is None else "wrong password")
        self._forget_failures(username, peer)
        return Principal(username=username, anonymous=False, permissions=user[1])

    # --- users ------------------------------------------------------------------------------------

    async def _lookup(self, username: str) -> tuple[str, Any] | None:
        """(password_hash, permissions) of a user: the config first, then the table."""
        found = self._users.get(username)
        if found is not None:
            return found
        if self.manager is None:
            return None
        now = time.monotonic()
        cached = self._db_cache.get(username)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            row = await self.manager.user(username)
        except Exception as exc:  # noqa: BLE001 - no table (not migrated) or no database: no DB users
            log.warning("auth: cannot look up user %r in fluxpg.users: %s", username, exc)
            return None
        result = None
        if row is not None:
            result = (row[0], permissions_tuple(row[1]))
        if len(self._db_cache) > _VERIFIED_MAX:
            self._db_cache.clear()
        self._db_cache[username] = (now + self._cache_ttl, result)
        return result

    async def _check(self, username: str, password: bytes, encoded: str) -> bool:
        mark = hmac.new(self._key, password + b"\x00" + encoded.encode(), hashlib.sha256).digest()
        now = time.monotonic()
        key = (username, mark)
        if self._verified.get(key, 0.0) > now:
            return True
        ok = await asyncio.to_thread(verify_password, password, encoded)
        if ok:
            if len(self._verified) > _VERIFIED_MAX:
                self._verified.clear()
            self._verified[key] = now + VERIFIED_TTL
        return ok

    # --- failures ---------------------------------------------------------------------------------

    def _keys(self, username: str | None, peer: str | None) -> list[str]:
        keys = []
        if peer:
            # peers are "host:port"; failures count per host (a guesser opens many connections)
            keys.append("peer:" + peer.rsplit(":", 1)[0].strip("[]"))
        if username:
            keys.append("user:" + username)
        return keys

    async def _fail(self, username: str | None, peer: str | None, protocol: str, why: str) -> None:
        now = time.monotonic()
        count = 0
        for key in self._keys(username, peer):
            n, last = self._failures.get(key, (0, 0.0))
            if now - last > FAILURE_MEMORY:
                n = 0
            n += 1
            self._failures[key] = (n, now)
            count = max(count, n)
        if len(self._failures) > _VERIFIED_MAX:
            self._failures = {k: v for k, v in self._failures.items() if now - v[1] <= FAILURE_MEMORY}
        log.warning("auth: %s login refused for user %r from %s: %s", protocol, username, peer or "unknown", why)
        delay = min(MAX_DELAY, MIN_DELAY * 2 ** max(0, count - 1))
        await asyncio.sleep(delay)
        raise AuthError(f"login refused for user {username!r}" if username else "anonymous login refused")

    def _forget_failures(self, username: str | None, peer: str | None) -> None:
        if username:
            self._failures.pop("user:" + username, None)
