"""Memory held by the broker for one hostile AMQP 0-9-1 connection (issue 13): it opens
`--channels` channels, announces a `--body-mib` MiB body on each and sends `--send-mib` MiB of
it, never finishing. Prints the broker process's RSS before, at the peak, and after the client
closed (and a gc), and how the broker answered.

    python benchmarks/memory_bounds.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

`--mqtt N` instead: one MQTT client sends N QoS 1 publishes of `--body-mib` MiB to a queue whose
commits are held up (another transaction holds its head row) as fast as the broker reads them;
prints how much the broker read and its RSS (bounds.connection_inbound_bytes stops the reading).

The broker runs in this process (a thread), on a fresh database dropped afterwards. Run it
against another checkout (e.g. before a change) with FLUXPG_REPO=/path/to/checkout.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.environ.get("FLUXPG_REPO") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pamqp import body as pbody  # noqa: E402
from pamqp import commands  # noqa: E402
from pamqp import frame as pframe  # noqa: E402
from pamqp import header as pheader  # noqa: E402

from fluxpg import db  # noqa: E402
from fluxpg.config import Config, QueueConfig  # noqa: E402
from fluxpg.server import Server  # noqa: E402
from fluxpg.testing import fresh_database  # noqa: E402

LOOPBACK = {"mqtt": "127.0.0.1:0", "amqp": None, "amqp091": "127.0.0.1:0", "http": None}


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def frames(sock: socket.socket, buf: bytearray, timeout: float):
    sock.settimeout(timeout)
    while True:
        while buf:
            try:
                used, channel, value = pframe.unmarshal(bytes(buf))
            except Exception:  # noqa: BLE001 - incomplete: read more
                break
            del buf[:used]
            yield channel, value
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionError):
            return
        if not chunk:
            return
        buf += chunk


def attack(port: int, channels: int, body: int, send: int) -> str:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    buf = bytearray()
    it = frames(sock, buf, 10)
    next(it)  # start
    sock.sendall(pframe.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                            response="\0guest\0guest", locale="en_US"), 0))
    _, tune = next(it)
    sock.sendall(pframe.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0))
    sock.sendall(pframe.marshal(commands.Connection.Open("/"), 0))
    next(it)  # open-ok
    chunk = tune.frame_max - 8
    piece = b"x" * chunk
    outcome = "every body half sent, connection still open"
    try:
        for ch in range(1, channels + 1):
            sock.sendall(pframe.marshal(commands.Channel.Open(), ch))
            sock.sendall(pframe.marshal(commands.Basic.Publish(exchange="", routing_key="$queue/mem/x"), ch))
            sock.sendall(pframe.marshal(pheader.ContentHeader(0, body, commands.Basic.Properties()), ch))
            for start in range(0, send, chunk):
                sock.sendall(pframe.marshal(pbody.ContentBody(piece[:min(chunk, send - start)]), ch))
    except (BrokenPipeError, ConnectionResetError):
        pass
    for _, value in frames(sock, buf, 2):
        if isinstance(value, commands.Connection.Close):
            outcome = f"connection.close {value.reply_code} {value.reply_text}"
            break
    return outcome, sock


def attack_mqtt(port: int, dsn: str, count: int, size: int) -> tuple[str, socket.socket, object]:
    import select

    import psycopg

    from fluxpg.protocols.mqtt.codec import Connect, Publish, encode
    lock = psycopg.connect(dsn)
    lock.execute("SELECT 1 FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id "
                 "WHERE q.name = 'mem' FOR UPDATE")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(encode(Connect(client_id="hostile", keep_alive=0), 5))
    sock.recv(100)
    sock.setblocking(False)
    payload = b"x" * size
    sent = 0
    for i in range(count):
        data = encode(Publish("$queue/mem/x", payload, 1, packet_id=i % 65535 + 1), 5)
        view = memoryview(data)
        while view:
            _, writable, _ = select.select([], [sock], [], 3)
            if not writable:
                return f"stalled after {sent / 2 ** 20:.0f} MiB sent of {count * size / 2 ** 20:.0f} MiB", sock, lock
            try:
                n = sock.send(view[:2 ** 20])
            except BlockingIOError:
                continue
            sent += n
            view = view[n:]
    return f"all {sent / 2 ** 20:.0f} MiB read by the broker", sock, lock


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("FLUXPG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--channels", type=int, default=100)
    ap.add_argument("--body-mib", type=float, default=10)
    ap.add_argument("--send-mib", type=float, default=10)
    ap.add_argument("--mqtt", type=int, default=0, metavar="N", help="N MQTT QoS 1 publishes instead")
    args = ap.parse_args()
    with fresh_database(args.dsn) as dsn:
        db.migrate(dsn)
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        server = asyncio.run_coroutine_threadsafe(
            Server.start(dsn, Config(queues=[QueueConfig(name="mem")]), addresses=dict(LOOPBACK),
                         migrate=False, retention=False), loop).result(60)
        try:
            gc.collect()
            before = rss_mib()
            peak = [before]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_mib())
                    time.sleep(0.02)
            threading.Thread(target=sample, daemon=True).start()
            lock = None
            if args.mqtt:
                outcome, sock, lock = attack_mqtt(server.port("mqtt"), dsn, args.mqtt, int(args.body_mib * 2 ** 20))
            else:
                outcome, sock = attack(server.port("amqp091"), args.channels, int(args.body_mib * 2 ** 20),
                                       int(args.send_mib * 2 ** 20))
            time.sleep(1)
            held = rss_mib()
            sock.close()
            if lock is not None:
                lock.close()    # the commits go through: what was read is stored and let go
            time.sleep(2)
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(10)
            gc.collect()
            after = rss_mib()
            stop.set()
            if args.mqtt:
                print(f"MQTT: {args.mqtt} QoS 1 publishes × {args.body_mib:g} MiB, commits held up")
            else:
                print(f"{args.channels} channels × {args.body_mib:g} MiB announced, {args.send_mib:g} MiB sent each")
            print(f"  broker answer: {outcome}")
            print(f"  RSS before {before:.0f} MiB, peak {peak[0]:.0f} MiB, held while open {held:.0f} MiB, "
                  f"after close {after:.0f} MiB")
        finally:
            asyncio.run_coroutine_threadsafe(server.close(), loop).result(60)


if __name__ == "__main__":
    main()
