"""Who may use the HTTP listener when the config has an `auth:` section.

- /healthz is open (load balancers and orchestrators probe it without credentials).
- /api/* and /metrics need a principal with the `monitoring` right (fluxpg.auth.authorize with
  no resource: a permission `{action: monitoring, pattern: "#"}`, or `manage`, or a user without
  a permissions list). The principal comes from
    * `Authorization: Bearer <token>`: a token of `auth.tokens` (stored as its SHA-256), or
    * `Authorization: Basic …`: an `auth:` user and password (checked like every protocol's
      login, with its failure delays). On a TLS listener the credentials travel encrypted; on a
      plain one they do not, so give the HTTP listener TLS (tls.listeners) when it leaves the host.
  Missing or wrong credentials: 401 with `WWW-Authenticate`; a principal without the right: 403.
- The console (every other path) keeps its own log-in session (fluxpg/console/); a request that
  carries Basic or bearer credentials is honoured there too.

With auth off every request is let in (the console says so on its pages).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

from aiohttp import web

from fluxpg.auth import AuthError, Principal, authorize

PRINCIPAL = web.RequestKey("principal", object)   # the authenticated principal (None: auth off)
OPEN_PATHS = ("/healthz",)
REALM = 'Basic realm="fluxpg", charset="UTF-8"'


def has_right(principal: Principal | None, right: str) -> bool:
    """May `principal` do `right` ("monitoring" | "manage") broker-wide? None (auth off): yes."""
    if principal is None:
        return True
    return authorize(principal, right, None)


def parse_authorization(value: str | None) -> tuple[str, Any] | None:
    """`Authorization` header → ("basic", (user, password)) | ("bearer", token) | None.
    Raises ValueError for a malformed one."""
    if not value:
        return None
    scheme, _, rest = value.strip().partition(" ")
    scheme = scheme.lower()
    rest = rest.strip()
    if scheme == "bearer" and rest:
        return "bearer", rest
    if scheme == "basic" and rest:
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise ValueError("malformed Basic credentials") from None
        user, sep, password = decoded.partition(":")
        if not sep:
            raise ValueError("malformed Basic credentials: expected user:password")
        return "basic", (user, password)
    raise ValueError("unsupported Authorization scheme (use Basic or Bearer)")


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _token_principal(ctx: Any, token: str) -> Principal | None:
    """The principal of a configured bearer token. Tokens are long random secrets, so a plain
    SHA-256 stored in the config is safe; comparing digests in constant time leaks nothing."""
    tokens = getattr(getattr(ctx.config, "auth", None), "tokens", None) or []
    digest = token_sha256(token)
    for entry in tokens:
        if hmac.compare_digest(entry.sha256(), digest):
            from fluxpg.auth_config import permissions_tuple  # noqa: PLC0415

            return Principal(username=f"token:{entry.name}", permissions=permissions_tuple(entry.permissions))
    return None


async def authenticate(request: web.Request, ctx: Any) -> Principal | None:
    """The principal of a request's credentials; None when it carries none.
    Raises web.HTTPUnauthorized for wrong or malformed ones."""
    try:
        parsed = parse_authorization(request.headers.get("Authorization"))
    except ValueError as exc:
        raise unauthorized(str(exc)) from None
    if parsed is None:
        return None
    kind, value = parsed
    if kind == "bearer":
        principal = _token_principal(ctx, value)
        if principal is None:
            raise unauthorized("unknown bearer token")
        return principal
    user, password = value
    peer = request.transport.get_extra_info("peername") if request.transport else None
    try:
        return await ctx.auth.authenticate(user, password, protocol="http",
                                           peer=f"{peer[0]}:{peer[1]}" if peer else None)
    except AuthError as exc:
        raise unauthorized(str(exc)) from None


def unauthorized(message: str) -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(text=message, headers={"WWW-Authenticate": REALM})


def _protected(path: str) -> bool:
    return path == "/metrics" or path.startswith("/api/") or path == "/api"


@web.middleware
async def auth_middleware(request: web.Request, handler):
    from fluxpg.protocols.http import CTX  # noqa: PLC0415

    ctx = request.app[CTX]
    auth = ctx.auth
    if auth is None or not getattr(auth, "enabled", False) or request.path in OPEN_PATHS:
        request[PRINCIPAL] = None
        return await handler(request)
    principal = await authenticate(request, ctx)
    request[PRINCIPAL] = principal
    if _protected(request.path):
        if principal is None:
            raise unauthorized("credentials required: HTTP Basic or a bearer token")
        if not has_right(principal, "monitoring"):
            raise web.HTTPForbidden(text=f"{principal.display} lacks the monitoring right")
    return await handler(request)
