"""The browser console served by the HTTP listener at `/`: server-rendered pages (Jinja2 templates
in templates/, a small script and stylesheet of our own in static/, charts drawn as inline SVG), so
the wheel carries everything and a fresh `pip install` serves it with no build step.

Every page reads through the queue manager's admin operations (fluxpg/queues/admin.py); long lists
are paged on the server by keyset. See views.py for the pages and actions, sessions.py for log-in
and CSRF protection.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web


def setup(app: web.Application, ctx: Any) -> None:
    """Add the console's routes to the HTTP application (unless `console.enabled` is false)."""
    console_config = getattr(ctx.config, "console", None)
    if console_config is not None and not console_config.enabled:
        return
    from fluxpg.console.views import install  # noqa: PLC0415

    install(app, ctx)
