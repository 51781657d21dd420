"""The browser console, driven by a real browser (Debian's Chromium through Playwright; no browser
download) against a two-node broker on one database, with real AMQP 0-9-1 clients (aio-pika):
log in, see a queue, browse it, dead-letter a message through the client, redrive it from the
console and see the client consume it again; actions without the right or without the CSRF token
are refused; HTTP auth for /api and /metrics.

Screenshots of the main pages go to a temporary folder, or to docs/screenshots/ (shown by the
README) when FLUXPG_SCREENSHOTS=1.
"""
from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
from pathlib import Path

import aio_pika
import aiohttp
import pytest
from aio_pika.abc import AbstractIncomingMessage

from fluxpg import db
from fluxpg.config import Config
from fluxpg.server import Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ADDRESSES = {"mqtt": None, "amqp": None, "amqp091": "127.0.0.1:0", "http": "127.0.0.1:0"}
TOKEN = "prometheus-scrape-token-0123456789"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Chromium (installed by .ci/run)")


def screenshot_dir(tmp_path: Path) -> Path:
    if os.environ.get("FLUXPG_SCREENSHOTS"):
        out = REPO / "docs" / "screenshots"
    else:
        out = tmp_path / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    return out


def auth_config(qname: str) -> Config:
    return Config.model_validate({
        "queues": [{"name": qname, "retry": {"initial_backoff": "0s"}}],
        "auth": {
            "users": [
                {"username": "admin", "password": "admin-secret"},                       # every right
                {"username": "viewer", "password": "viewer-secret",
                 "permissions": [{"action": "monitoring", "pattern": "#"}]},
                {"username": "app", "password": "app-secret",
                 "permissions": [{"action": "all", "pattern": qname}, {"action": "all", "pattern": f"$dlq/{qname}"}]},
            ],
            "tokens": [{"name": "prometheus", "token": TOKEN,
                        "permissions": [{"action": "monitoring", "pattern": "#"}]}],
        },
        "console": {"secret": "a shared secret of both test nodes", "rate_interval": "0.5s"},
    })


@pytest.fixture
async def cluster(dsn, qname):
    """Two broker nodes on the run's database, with auth."""
    config = auth_config(qname)
    nodes = []
    try:
        for _ in range(2):
            nodes.append(await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False))
        yield nodes
    finally:
        for node in reversed(nodes):
            await node.close()


@pytest.fixture
async def browser():
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            await b.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def submit(page, selector: str) -> None:
    """Click a submit button and wait for the page the form leads to."""
    async with page.expect_navigation():
        await page.click(selector)


async def login(page, base: str, user: str, password: str) -> None:
    await page.goto(f"{base}/")
    assert page.url.startswith(f"{base}/login")          # not logged in: sent to the log-in page
    await page.fill("input[name=username]", user)
    await page.fill("input[name=password]", password)
    await submit(page, "#login-form button")


async def test_console_with_auth_off_on_loopback(dsn, qname, browser):
    server = await Server.start(dsn, Config.model_validate({"queues": [{"name": qname}]}),
                                addresses=dict(ADDRESSES), migrate=False, retention=False)
    try:
        base = f"http://127.0.0.1:{server.port('http')}"
        page = await browser.new_page()
        await page.goto(f"{base}/queue?name={qname}")
        assert "Authentication is off" in await page.inner_text("#auth-off")
        await page.fill("#publish-form input[name=topic]", f"$queue/{qname}/hello")
        await page.fill("#publish-form textarea[name=payload]", "from the console")
        await submit(page, "#publish-form button")
        assert "published 16 bytes" in await page.inner_text("#flash")
        assert await page.locator("tr.message pre.payload").all_inner_texts() == ["from the console"]
        # Hex view of the same message.
        await page.goto(f"{base}/queue?name={qname}&format=hex")
        assert (await page.locator("tr.message pre.payload").inner_text()).startswith(
            "00000000  66 72 6f 6d 20 74 68 65 20 63 6f 6e 73 6f 6c 65  from the console")
        await page.close()
        async with aiohttp.ClientSession() as http:          # a POST with no session, no token
            async with http.post(f"{base}/action/publish", data={"topic": f"$queue/{qname}/x"},
                                 allow_redirects=False) as r:
                assert r.status == 403
        assert {s["queue"]: s["head"] for s in await server.manager.queue_stats()}[qname] == 1
    finally:
        await server.close()


async def test_connections_are_reported_by_every_node_and_closed_across_nodes(dsn, qname):
    """Node A's AMQP client shows in fluxpg.connections (read by node B's admin), and node B's
    close request reaches node A, which closes it."""
    from fluxpg.queues.admin import Admin

    config = Config.model_validate({"queues": [{"name": qname}]})
    node_a = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    node_b = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    client = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{node_a.port('amqp091')}/")
    try:
        admin_b = Admin(node_b.manager)
        mine = []
        for _ in range(50):
            mine = [c for c in await admin_b.all_connections()
                    if c["node_id"] == node_a.manager.node_id and c["protocol"] == "amqp091"]
            if mine:
                break
            await asyncio.sleep(0.1)
        assert len(mine) == 1 and mine[0]["username"] == "guest" and mine[0]["peer"].startswith("127.0.0.1:")
        await admin_b.request_close(node_a.manager.node_id, mine[0]["id"])
        for _ in range(100):
            if not client.connected.is_set():
                break
            await asyncio.sleep(0.1)
        assert not client.connected.is_set()
        for _ in range(50):          # and its row goes away with the next report
            if not [c for c in await admin_b.all_connections() if c["id"] == mine[0]["id"]
                    and c["node_id"] == node_a.manager.node_id]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the closed connection is still reported")
    finally:
        await client.close()
        await node_b.close()
        await node_a.close()
    # A stopped node's rows go with it.
    conn = await db.connect(dsn)
    try:
        left = await conn.fetchval("SELECT count(*) FROM fluxpg.connections WHERE node_id = ANY($1::int[])",
                                   [node_a.manager.node_id, node_b.manager.node_id])
    finally:
        await conn.close()
    assert left == 0
