"""Console log-in sessions and CSRF tokens, as signed cookies (no server-side store, so a log-in
costs no memory and, with `console.secret`, works on every node).

The cookie holds {user, rights, csrf, expires} as JSON, base64url, then an HMAC-SHA256 of it. The
rights ("monitoring", "manage") are decided once at log-in by fluxpg.auth.authorize. Every POST of
the console must carry the session's CSRF token in its form (`_csrf`), compared in constant time;
the cookie is HttpOnly and SameSite=Strict (Secure on TLS), so another site can neither read the
token nor send the cookie along with a forged form. With auth off a visitor still gets a session
(user None, all rights) so that actions still need the token.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass

COOKIE = "fluxpg_session"


@dataclass(frozen=True)
class Session:
    user: str | None
    rights: frozenset[str]
    csrf: str
    expires: float

    def can(self, right: str) -> bool:
        return right in self.rights


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sessions:
    def __init__(self, secret: str | None, ttl: float):
        self._key = hashlib.sha256(b"fluxpg-console:" + secret.encode()).digest() if secret else os.urandom(32)
        self.ttl = ttl

    def new(self, user: str | None, rights: set[str] | frozenset[str]) -> Session:
        return Session(user, frozenset(rights), secrets.token_urlsafe(24), time.time() + self.ttl)

    def encode(self, session: Session) -> str:
        body = _b64(json.dumps({"u": session.user, "r": sorted(session.rights), "c": session.csrf,
                                "e": session.expires}, separators=(",", ":")).encode())
        return f"{body}.{_b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())}"

    def decode(self, value: str | None) -> Session | None:
        """The session of a cookie value; None when absent, forged, malformed or expired."""
        if not value or "." not in value:
            return None
        body, _, sig = value.rpartition(".")
        expected = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(sig, expected):
            return None
        try:
            data = json.loads(_unb64(body))
            session = Session(data["u"], frozenset(data["r"]), str(data["c"]), float(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        return session if session.expires > time.time() else None

    @staticmethod
    def csrf_ok(session: Session | None, token: str | None) -> bool:
        return bool(session is not None and token and hmac.compare_digest(session.csrf, token))
