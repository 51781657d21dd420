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
from tests.protocols.test_tls import certs  # noqa: F401 - the throwaway CA and server certificate fixture

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ADDRESSES = {"mqtt": None, "amqp": None, "amqp091": "127.0.0.1:0", "http": "127.0.0.1:0"}
TOKEN = "prometheus-scrape-token-0123456789"



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
    """Debian's Chromium through Playwright (never Playwright's own browser download)."""
    from playwright.async_api import async_playwright

    if not Path(CHROMIUM).exists():
        pytest.skip("needs Chromium at /usr/bin/chromium (.ci/run installs it; Debian: apt-get install chromium)")

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


async def test_console_end_to_end_on_two_nodes(cluster, browser, qname, tmp_path):
    node_a, node_b = cluster
    shots = screenshot_dir(tmp_path)
    base = f"http://127.0.0.1:{node_b.port('http')}"       # the console of node B …
    amqp = await aio_pika.connect(f"amqp://app:app-secret@127.0.0.1:{node_a.port('amqp091')}/")   # … clients on A
    try:
        ch = await amqp.channel()
        for i in range(3):
            await ch.default_exchange.publish(aio_pika.Message(f'{{"order": {i}}}'.encode(),
                                                               headers={"origin": "test"}), routing_key=qname)

        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))

        # Wrong password: refused, still on the log-in page.
        await page.goto(f"{base}/login")
        await page.fill("input[name=username]", "admin")
        await page.fill("input[name=password]", "wrong")
        await submit(page, "#login-form button")
        assert "Wrong user name or password" in await page.inner_text("#login-error")

        await login(page, base, "admin", "admin-secret")
        assert page.url == f"{base}/"
        nodes_text = await page.inner_text("#nodes")
        for node in (node_a, node_b):
            assert re.search(rf"^{node.manager.node_id}\b.*\balive\b", nodes_text, re.M), nodes_text
        assert "admin (manage)" in await page.inner_text("header")

        # Queues: the test's queue with its depth.
        await submit(page, "nav >> text=Queues")
        row = page.locator("#queues tr", has_text=qname).first
        cells = await row.locator("td").all_inner_texts()
        assert cells[0] == qname and cells[1] == "classic" and cells[3] == "3"
        await page.screenshot(path=str(shots / "queues.png"), full_page=True)

        # Browse its messages as pretty JSON.
        async with page.expect_navigation():
            await row.locator("a").first.click()
        await page.select_option("#browse-form select[name=format]", "json")
        await submit(page, "#browse-form button")
        offsets = await page.locator("tr.message").evaluate_all("rows => rows.map(r => r.dataset.offset)")
        assert offsets == ["0", "1", "2"]
        payloads = await page.locator("tr.message pre.payload").all_inner_texts()
        assert payloads == [f'{{\n  "order": {i}\n}}' for i in range(3)]

        # A real client dead-letters message 1 (acks the others).
        q = await ch.get_queue(qname, ensure=False)
        done = asyncio.Event()
        seen: list[bytes] = []

        async def on_message(msg: AbstractIncomingMessage) -> None:
            seen.append(msg.body)
            if msg.body == b'{"order": 1}' and "_redriven_from" not in (msg.headers or {}):
                await msg.reject(requeue=False)
            else:
                await msg.ack()
            if len(seen) >= 3:
                done.set()

        tag = await q.consume(on_message)
        await asyncio.wait_for(done.wait(), 15)

        # The dead letter in the console, with its reason and original topic.
        dead = page.locator("tr.message")
        for _ in range(50):            # the reject is asynchronous: reload until it is there
            await page.goto(f"{base}/queue?name=%24dlq%2F{qname}")
            if await dead.count():
                break
            await asyncio.sleep(0.2)
        assert await dead.count() == 1
        dead_cells = await dead.first.locator("td").all_inner_texts()
        assert f"$queue/{qname}" in " ".join(dead_cells)
        assert await dead.first.locator("td.reason").inner_text() == "rejected by AMQP client"
        await page.screenshot(path=str(shots / "dead-letters.png"), full_page=True)

        # Redrive it from the console: the count moved is shown, the client consumes it again.
        done.clear()
        await dead.first.locator("input.pick").check()
        await submit(page, "#redrive-selected")
        assert await page.inner_text("#flash") == f"moved 1 message from $dlq/{qname} back to {qname}"
        assert await page.locator("tr.message").count() == 0
        for _ in range(100):
            if len(seen) >= 4:
                break
            await asyncio.sleep(0.1)
        assert seen[3] == b'{"order": 1}'
        # The queue page while the consumer is attached: its group, and the redriven copy at offset 3.
        await page.goto(f"{base}/queue?name={qname}")
        assert await page.locator("tr.message").count() == 4
        await page.screenshot(path=str(shots / "queue.png"), full_page=True)
        await q.cancel(tag)

        # The overview's rate chart has samples by now (every 0.5 s here).
        await page.goto(f"{base}/")
        assert await page.locator("#rates-chart polyline").count() == 2
        await page.screenshot(path=str(shots / "overview.png"), full_page=True)

        # Connections: the AMQP client is on node A; node B's console lists it (every node reports
        # its connections to the database) and closes it (node B asks node A by NOTIFY).
        row = page.locator(f"tr.connection[data-node='{node_a.manager.node_id}']", has_text="amqp091")
        for _ in range(50):
            await page.goto(f"{base}/connections")
            if await row.count():
                break
            await asyncio.sleep(0.2)
        assert "app" in await row.first.inner_text()         # the user it logged in as
        await page.screenshot(path=str(shots / "connections.png"), full_page=True)
        async with page.expect_navigation():
            await row.first.locator("button").click()
        assert f"asked node {node_a.manager.node_id} to close connection" in await page.inner_text("#flash")
        for _ in range(100):
            if not amqp.connected.is_set():
                break
            await asyncio.sleep(0.1)
        assert not amqp.connected.is_set()

        # A POST without the CSRF token (as a forged cross-site form would be) is refused.
        cookies = {c["name"]: c["value"] for c in await context.cookies()}
        async with aiohttp.ClientSession(cookies=cookies) as http:
            async with http.post(f"{base}/action/publish", data={"topic": f"$queue/{qname}/x", "payload": "p"},
                                 allow_redirects=False) as r:
                assert r.status == 403 and "CSRF" in await r.text()
            async with http.post(f"{base}/action/publish", allow_redirects=False,
                                 data={"topic": f"$queue/{qname}/x", "payload": "p", "_csrf": "guess"}) as r:
                assert r.status == 403
        assert (await node_a.manager.queue_stats())  # still answering
        await page.close()
        await context.close()

        # A viewer sees the pages but no action buttons, and an action is refused even with
        # the viewer's own valid CSRF token.
        context = await browser.new_context()
        page = await context.new_page()
        await login(page, base, "viewer", "viewer-secret")
        assert "viewer (view only)" in await page.inner_text("header")
        await page.goto(f"{base}/queue?name={qname}")
        assert await page.locator("#publish-form").count() == 0
        token = await page.locator("form[action='/logout'] input[name=_csrf]").get_attribute("value")
        cookies = {c["name"]: c["value"] for c in await context.cookies()}
        async with aiohttp.ClientSession(cookies=cookies) as http:
            async with http.post(f"{base}/action/publish", allow_redirects=False,
                                 data={"topic": f"$queue/{qname}/x", "payload": "p", "_csrf": token}) as r:
                assert r.status == 403 and "lacks the manage right" in await r.text()
        await context.close()
        head = {s["queue"]: s["head"] for s in await node_a.manager.queue_stats()}[qname]
        assert head == 4        # 3 published + 1 redriven; nothing from the refused actions
    finally:
        await amqp.close()


async def test_http_auth_for_api_and_metrics(cluster):
    node = cluster[0]
    base = f"http://127.0.0.1:{node.port('http')}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/healthz") as r:             # open, for load balancers
            assert r.status == 200 and (await r.json())["status"] == "ok"
        for path in ("/api/queues", "/metrics"):
            async with http.get(base + path) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
                assert "credentials required" in (await r.json())["error"]
            async with http.get(base + path, headers=basic("admin", "nope")) as r:
                assert r.status == 401
            async with http.get(base + path, headers=basic("app", "app-secret")) as r:
                assert r.status == 403 and "monitoring" in (await r.json())["error"]
            for headers in (basic("admin", "admin-secret"), basic("viewer", "viewer-secret"),
                            {"Authorization": f"Bearer {TOKEN}"}):
                async with http.get(base + path, headers=headers) as r:
                    assert r.status == 200, (path, headers)
            async with http.get(base + path, headers={"Authorization": "Bearer wrong-token-wrong-token"}) as r:
                assert r.status == 401
            async with http.get(base + path, headers={"Authorization": "Basic !!"}) as r:
                assert r.status == 401
        async with http.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert "fluxpg_queue_depth" in await r.text()
        # The console without a session: sent to the log-in page, which is open.
        async with http.get(f"{base}/queues", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"].startswith("/login")


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


CSRF = re.compile(r'name="_csrf" value="([^"]+)"')


async def test_group_actions_pending_page_warnings_and_errors(dsn, qname, manager_factory):
    """The console's group actions over HTTP as the browser sends them (auth off, loopback):
    pending entries listed, reset to an offset / first / last / a time, claim stale entries to a
    named consumer, delete the group; a lag warning on the overview; bad input is a one-line
    error on the page, never a traceback."""
    config = Config.model_validate({"queues": [{"name": qname}],
                                    "console": {"lag_warning": 5, "pending_age_warning": "0s"}})
    server = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    try:
        mgr = server.manager
        for i in range(20):
            await mgr.publish(f"$queue/{qname}/o", f"m{i}".encode())
        conn = await db.connect(dsn)
        try:
            claimed = await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'workers', 'w1', 3)", qname)
            assert [r["seq"] for r in claimed] == [0, 1, 2]
        finally:
            await conn.close()
        base = f"http://127.0.0.1:{server.port('http')}"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:   # cookies of 127.0.0.1
            async with http.get(f"{base}/") as r:
                page = await r.text()
                assert "group workers of " + qname in page and "lags 20 messages" in page   # lag_warning 5
            async with http.get(f"{base}/queue", params={"name": qname}) as r:
                token = CSRF.search(await r.text()).group(1)

            async def act(name: str, **form) -> str:
                async with http.post(f"{base}/action/{name}", data={"_csrf": token, "back": "/", **form}) as r:
                    assert r.status == 200 and "Traceback" not in await r.text()
                    return r.url.query.get("msg") or "ERROR: " + (r.url.query.get("err") or "")

            async with http.get(f"{base}/pending", params={"queue": qname, "group": "workers"}) as r:
                text = await r.text()
                assert text.count("<td>w1</td>") == 3
            assert await act("claim_stale", queue=qname, group="workers", consumer="rescuer", min_idle="0") == \
                "3 entries idle for 0 s or more now pending for rescuer"
            async with http.get(f"{base}/pending", params={"queue": qname, "group": "workers"}) as r:
                assert (await r.text()).count("<td>rescuer</td>") == 3
            assert await act("reset_group", queue=qname, group="workers", position="offset", offset="10") == \
                f"group workers of {qname} now at offset 10"
            rows = {g["grp"]: g for g in await mgr.group_status(qname)}
            assert rows["workers"]["cursor"] == 10 and rows["workers"]["pending"] == 3   # below 10: kept
            assert await act("reset_group", queue=qname, group="workers", position="first") == \
                f"group workers of {qname} now at offset 0"
            assert (await mgr.group_status(qname))[0]["pending"] == 0       # at or past the cursor: dropped
            assert await act("reset_group", queue=qname, group="workers", position="last") == \
                f"group workers of {qname} now at offset 20"
            assert await act("reset_group", queue=qname, group="workers", position="time",
                             time="2000-01-01T00:00:00") == f"group workers of {qname} now at offset 0"
            assert (await act("reset_group", queue=qname, group="workers", position="offset", offset="abc")) == \
                "ERROR: offset must be a whole number, got 'abc'"
            assert (await act("publish", topic="no/such/#")).startswith("ERROR: ")
            assert await act("delete_group", queue=qname, group="workers") == f"deleted group workers of {qname}"
            assert await mgr.group_status(qname) == []
            assert await act("delete_group", queue=qname, group="workers") == \
                f"ERROR: queue '{qname}' has no group 'workers'"
            # Browse by time: the first message published at or after it (binary search).
            async with http.get(f"{base}/queue", params={"name": qname, "at": "2000-01-01T00:00:00"}) as r:
                assert re.findall(r'data-offset="(\d+)"', await r.text())[:3] == ["0", "1", "2"]
            async with http.get(f"{base}/queue", params={"name": qname, "at": "2999-01-01T00:00:00"}) as r:
                assert 'id="no-messages"' in await r.text()
            async with http.get(f"{base}/queue", params={"name": qname, "from": "x"}) as r:
                assert r.status == 200 and "from must be a whole number" in r.url.query.get("err", "")
            async with http.post(f"{base}/action/nope", data={"_csrf": token}) as r:
                assert r.status == 404
    finally:
        await server.close()


async def test_redrive_all_from_the_console_moves_every_batch(dsn, qname):
    from fluxpg.console import views

    config = Config.model_validate({"queues": [{"name": qname}]})
    server = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    old_batch = views.REDRIVE_BATCH
    views.REDRIVE_BATCH = 7                 # several transactions for 30 dead letters
    try:
        mgr = server.manager
        for i in range(30):
            await mgr.publish(f"$queue/{qname}/o", f"m{i}".encode())
        conn = await db.connect(dsn)
        try:
            seqs = [r["seq"] for r in await conn.fetch("SELECT seq FROM fluxpg.claim($1, 'g', 'c', 30)", qname)]
            assert await conn.fetchval("SELECT fluxpg.reject($1, 'g', $2::bigint[], 'bad')", qname, seqs) == 30
        finally:
            await conn.close()
        base = f"http://127.0.0.1:{server.port('http')}"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:   # cookies of 127.0.0.1
            async with http.get(f"{base}/queue", params={"name": f"$dlq/{qname}", "limit": "10"}) as r:
                page = await r.text()
                assert page.count('class="message"') == 10 and 'id="next-page"' in page   # paged
            token = CSRF.search(page).group(1)
            async with http.post(f"{base}/action/redrive", data={"_csrf": token, "queue": f"$dlq/{qname}",
                                                                 "all": "1", "back": "/"}) as r:
                assert r.url.query.get("msg") == f"moved 30 messages from $dlq/{qname} back to {qname}"
            async with http.get(f"{base}/queue", params={"name": f"$dlq/{qname}"}) as r:
                assert 'class="message"' not in await r.text()
        stats = {s["queue"]: s for s in await mgr.queue_stats()}
        assert stats[qname]["head"] == 60
    finally:
        views.REDRIVE_BATCH = old_batch
        await server.close()


async def test_http_basic_auth_and_console_log_in_over_tls(dsn, qname, certs):
    """The HTTP listener under TLS: Basic credentials travel encrypted, the console's session
    cookie is Secure; the protocol sniffing still works inside TLS."""
    import ssl

    from fluxpg.config import TlsConfig

    config = auth_config(qname)
    config.tls = TlsConfig(cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"),
                           listeners=["http"])
    server = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    try:
        tls = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        base = f"https://127.0.0.1:{server.port('http')}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as http:
            async with http.get(f"{base}/api/queues") as r:
                assert r.status == 401
            async with http.get(f"{base}/api/queues", headers=basic("viewer", "viewer-secret")) as r:
                assert r.status == 200 and qname in {q["queue"] for q in await r.json()}
            async with http.post(f"{base}/login", data={"username": "admin", "password": "admin-secret", "next": "/"},
                                 allow_redirects=False) as r:
                assert r.status == 303
                cookie = r.headers["Set-Cookie"]
                assert "fluxpg_session=" in cookie and "Secure" in cookie and "HttpOnly" in cookie
                assert "SameSite=Strict" in cookie
        # The plain-HTTP listener is TLS-only now: a cleartext request gets no answer.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port("http"))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert b"200 OK" not in data
    finally:
        await server.close()


async def test_queues_page_lists_kinds(dsn, qname):
    """Classic and stream queues with their kind, partitions and a link to their page."""
    config = Config.model_validate({"queues": [{"name": qname},
                                               {"name": f"{qname}_s", "type": "stream", "partitions": 3}]})
    server = await Server.start(dsn, config, addresses=dict(ADDRESSES), migrate=False, retention=False)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{server.port('http')}/queues") as r:
                page = await r.text()
        rows = {m[0]: m[1:] for m in re.findall(
            r'<tr><td><a href="/queue\?name=[^"]+">([^<]+)</a></td><td>([a-z]+)</td><td>(\d+)</td>', page)}
        assert rows[qname] == ("classic", "1") and rows[f"{qname}_s"] == ("stream", "3")
    finally:
        await server.close()
