"""MQTT over WebSocket from a real browser (issue 16): headless Chromium (the system's
/usr/bin/chromium driven by Playwright, which downloads no browser) loads a page the test writes,
which uses MQTT.js (npm package `mqtt`, its dist bundle, installed outside the source tree -- by
.ci/run or here with `npm install`) to connect to the broker's `ws` listener, subscribe, publish
and receive; the test asserts what the page shows, and that a paho client on plain TCP saw the
browser's message too."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fluxpg.config import Config

from test_mqtt_paho import Paho, uid

CHROMIUM = "/usr/bin/chromium"
NPM_DIR = Path(os.environ.get("FLUXPG_NPM_DIR", Path.home() / ".cache" / "fluxpg-npm"))
MQTT_JS = NPM_DIR / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>fluxpg MQTT.js</title>
<script src="mqtt.min.js"></script></head>
<body><h1>MQTT over WebSocket</h1><div id="status">loading</div><ul id="messages"></ul>
<script>
const url = new URLSearchParams(location.search).get("url");
const topic = new URLSearchParams(location.search).get("topic");
const client = mqtt.connect(url, {protocolVersion: 5, clientId: "browser-" + Math.random().toString(16).slice(2)});
client.on("connect", () => {
  document.getElementById("status").textContent = "connected";
  client.subscribe(topic + "/#", {qos: 1}, (err) => {
    if (err) { document.getElementById("status").textContent = "subscribe failed: " + err; return; }
    document.getElementById("status").textContent = "subscribed";
    for (let i = 0; i < 3; i++) client.publish(topic + "/browser", "from-browser-" + i, {qos: 1});
  });
});
client.on("message", (t, payload) => {
  const li = document.createElement("li");
  li.textContent = t + " " + payload.toString();
  document.getElementById("messages").appendChild(li);
});
client.on("error", (e) => { document.getElementById("status").textContent = "error: " + e.message; });
</script></body></html>
"""


def _mqtt_js() -> Path:
    if not MQTT_JS.exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed for the browser test (.ci/run installs nodejs/npm)"
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(NPM_DIR), "mqtt@5"],
                       check=True, capture_output=True, timeout=300)
    assert MQTT_JS.exists(), f"MQTT.js not found at {MQTT_JS}"
    return MQTT_JS


@pytest.mark.slow
def test_mqtt_js_in_headless_chromium(threaded_broker, tmp_path):
    assert Path(CHROMIUM).exists(), "Chromium is needed at /usr/bin/chromium (.ci/run installs it)"
    from playwright.sync_api import sync_playwright

    shutil.copy(_mqtt_js(), tmp_path / "mqtt.min.js")
    (tmp_path / "page.html").write_text(PAGE)
    server = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"}))
    topic = f"browser/{uid()}"
    tcp = Paho(server.port("mqtt"))
    tcp.subscribe(f"{topic}/#", qos=1)
    url = f"ws://127.0.0.1:{server.port('ws')}/mqtt"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--allow-file-access-from-files"])
        try:
            page = browser.new_page()
            page.goto(f"file://{tmp_path / 'page.html'}?url={url}&topic={topic}")
            page.wait_for_function("document.getElementById('status').textContent === 'subscribed'", timeout=15000)
            # The browser's own three messages come back to it; then one from the TCP client.
            page.wait_for_function("document.querySelectorAll('#messages li').length >= 3", timeout=15000)
            tcp.publish(f"{topic}/tcp", b"from-tcp", qos=1)
            page.wait_for_function("document.querySelectorAll('#messages li').length >= 4", timeout=15000)
            shown = page.eval_on_selector_all("#messages li", "els => els.map(e => e.textContent)")
        finally:
            browser.close()
    assert shown == [f"{topic}/browser from-browser-{i}" for i in range(3)] + [f"{topic}/tcp from-tcp"]
    got = [tcp.get() for _ in range(4)]
    assert [m.payload for m in got] == [b"from-browser-0", b"from-browser-1", b"from-browser-2", b"from-tcp"]
    tcp.close()
