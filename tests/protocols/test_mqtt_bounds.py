"""Bounded MQTT outbound memory per session (issue 13), with real paho subscribers that stop
reading (their network loop stopped, the socket left open):

* plain QoS 1: above bounds.mqtt_session_outbound_messages the connection ends (0x97) and the
  persistent session keeps at most that many messages, the oldest dropped and counted; after a
  reconnect the client gets exactly the kept ones, newest last;
* plain QoS 0: above bounds.connection_outbound_bytes unsent bytes new messages are dropped and
  counted; received + dropped = published, exactly;
* queue deliveries are not dropped: credit stops the claiming, the rest waits in the queue."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps
from test_mqtt_paho import Paho, uid, wait_until

from fluxpg.config import Config, QueueConfig

KIB = b"x" * 1024


def _session(server, client_id):
    return server.call(_get_session(server, client_id))


async def _get_session(server, client_id):
    return server.server.ctx.state["mqtt.router"].sessions.get(client_id)


def _router(server):
    return server.server.ctx.state["mqtt.router"]


def test_slow_qos1_subscriber_is_disconnected_and_its_session_bounded(threaded_broker):
    limit = 200
    server = threaded_broker(config=Config(bounds={"mqtt_session_outbound_messages": limit}))
    port = server.port("mqtt")
    topic = f"slow/{uid()}"
    cp = PahoProps(PacketTypes.CONNECT)
    cp.SessionExpiryInterval = 300
    cid = uid("slow")
    sub = Paho(port, cid, clean=True, props=cp)
    sub.subscribe(topic, qos=1)
    sub.c.loop_stop()                      # stops reading; the socket stays open
    pub = Paho(port)
    n = 2000
    for i in range(n):
        pub.publish(topic, b"%06d" % i + KIB, qos=1, wait=False)
    pub.publish(topic + "/sync", b"", qos=1)     # PUBACKs come in order: all n were routed
    router = _router(server)
    wait_until(lambda: router.slow_disconnects == 1, 10)
    sess = _session(server, cid)
    wait_until(lambda: sess.conn is None, 10)
    # Kept for the session: at most `limit` messages of ~1 KiB -- the rows held when it went
    # offline (in memory and in fluxpg.mqtt_session_messages) and, after them, the ones in the
    # shared offline log (only their offsets in memory).
    assert sess.held + len(sess.offline_seqs) == limit
    assert sess.held_bytes + sess.offline_bytes == limit * (6 + 1024)
    assert len(sess.outbox) + len(sess.inflight) == sess.held
    assert sess.dropped == router.offline_dropped == n - limit
    # The client comes back (session present) and gets exactly the kept messages, newest last.
    sub.c._sock.close() if sub.c._sock else None
    again = Paho(port, cid, clean=False, props=cp)
    assert again.connack_flags.session_present
    got = [again.get() for _ in range(limit)]
    numbers = [int(m.payload[:6]) for m in got]
    assert sorted(numbers) == list(range(n - limit, n))
    assert numbers[-1] == n - 1
    again.nothing(0.5)
    again.close()
    pub.close()


def _flood_a_paused_subscriber(threaded_broker, limit: int, n: int):
    """A broker with the session bound `limit`, a clean QoS 1 subscriber that reads nothing for
    now, and n QoS 1 messages published to it (numbered %06d) and routed: PUBACKs come in order,
    so the acknowledged sync message after them means all n were. Returns (server, sub, pub)."""
    server = threaded_broker(config=Config(bounds={"mqtt_session_outbound_messages": limit}))
    port = server.port("mqtt")
    topic = f"behind/{uid()}"
    sub = Paho(port)
    sub.subscribe(topic, qos=1)
    sub.c.loop_stop()
    pub = Paho(port)
    for i in range(n):
        pub.publish(topic, b"%06d" % i, qos=1, wait=False)
    pub.publish(topic + "/sync", b"", qos=1)
    return server, sub, pub


def test_clean_qos1_subscriber_behind_the_publisher_but_within_the_bound_loses_nothing(threaded_broker):
    # The CPU benchmark's pub/sub row: a clean (expiry 0) QoS 1 subscriber slower than its
    # publisher. Up to the bound everything waits for it, nothing is dropped, order is kept.
    limit = 500
    server, sub, pub = _flood_a_paused_subscriber(threaded_broker, limit, n=limit)
    sub.c.loop_start()
    got = [int(sub.get().payload) for _ in range(limit)]
    assert got == list(range(limit))
    sub.nothing(0.5)
    assert _router(server).slow_disconnects == 0
    assert not sub.disconnected.is_set()
    sub.close()
    pub.close()


def test_clean_qos1_subscriber_past_the_bound_is_told_where_its_messages_end(threaded_broker):
    # One message more than the bound: the subscriber gets every message up to and including
    # the one that passed the bound, in order, then DISCONNECT 0x97 -- never a silent gap.
    # (Its session has expiry 0, so what is published after the disconnect is not for it.)
    limit = 200
    server, sub, pub = _flood_a_paused_subscriber(threaded_broker, limit, n=3 * limit)
    router = _router(server)
    assert router.slow_disconnects == 1
    sub.c.reconnect_delay_set(60, 60)      # stay disconnected once told (paho reconnects by itself)
    sub.c.loop_start()
    assert sub.disconnected.wait(30)
    assert sub.disconnect_rc == 0x97
    got = []
    while not sub.messages.empty():
        got.append(int(sub.get().payload))
    assert got == list(range(limit + 1))
    sub.close()
    pub.close()


def test_qos0_to_a_subscriber_that_stops_reading_is_dropped_and_counted(threaded_broker):
    server = threaded_broker(config=Config(bounds={"connection_outbound_bytes": 64 * 1024}))
    port = server.port("mqtt")
    topic = f"slow0/{uid()}"
    sub = Paho(port)
    sub.subscribe(topic, qos=0)
    sub.c.loop_stop()
    pub = Paho(port)
    n = 20_000
    for i in range(n):
        pub.publish(topic, KIB, qos=0)
    pub.publish(topic + "/sync", b"", qos=1)
    router = _router(server)
    dropped = router.qos0_dropped
    assert dropped > 0
    sess = _session(server, sub.client_id)
    # What waits for the client is bounded by the connection bound (plus one message).
    assert sess.conn.transport.get_write_buffer_size() <= 64 * 1024 + 2048
    sub.c.loop_start()                    # reads again: gets everything that was not dropped
    received = 0
    deadline = time.monotonic() + 90   # a loaded CI machine
    while received < n - dropped and time.monotonic() < deadline:
        sub.get()
        received += 1
    sub.nothing(0.5)
    assert received + dropped == n
    assert router.slow_disconnects == 0
    sub.close()
    pub.close()


def test_queue_deliveries_to_a_stalled_subscriber_wait_in_the_queue(threaded_broker, qname):
    # A short visibility timeout: what the stalled subscriber held comes back quickly.
    server = threaded_broker(config=Config(queues=[QueueConfig(name=qname, type="classic")],
                                           queue_manager={"visibility_timeout": "1s"},
                                           bounds={"mqtt_session_outbound_messages": 50}))
    port = server.port("mqtt")
    sub = Paho(port, manual_ack=True)
    sub.subscribe(f"$queue/{qname}", qos=1)
    sub.c.loop_stop()
    pub = Paho(port)
    n = 600
    for i in range(n):
        pub.publish(f"$queue/{qname}", b"%d" % i, qos=1, wait=False)
    pub.publish(f"$queue/{qname}", b"last", qos=1)
    router = _router(server)
    time.sleep(0.5)
    # Not disconnected (queue messages are bounded by credit, not dropped) and far below n held.
    assert router.slow_disconnects == 0
    sess = _session(server, sub.client_id)
    assert len(sess.inflight) + len(sess.outbox) <= 256
    sub.close(clean=False)
    # Every message is still there for another consumer of the same group: nothing lost.
    other = Paho(port, sub.client_id)
    other.subscribe(f"$queue/{qname}", qos=1)
    seen = set()
    while len(seen) < n + 1:
        m = other.get()
        seen.add(m.payload)
    assert len(seen) == n + 1
    other.close()
    pub.close()


@pytest.mark.slow
def test_broker_memory_stays_bounded_with_a_stalled_qos1_subscriber(dsn):
    """A broker process (default bounds) and a paho QoS 1 subscriber that stops reading while
    20,000 × 4 KiB messages (80 MiB) are published: the broker's resident memory grows by far less
    than that (the session bound, 1,000 messages / 16 MiB, then 0x97), and /metrics counts the
    disconnect."""
    import urllib.request

    from test_mqtt_durable_sessions import MqttBrokerProcess

    from tests.broker_process import free_port

    port, http = free_port(), free_port()
    broker = MqttBrokerProcess(dsn, port, http_port=http)
    broker.start()
    try:
        rss = lambda: int(next(l for l in open(f"/proc/{broker.proc.pid}/status") if l.startswith("VmRSS")).split()[1]) * 1024
        topic = f"mem/{uid()}"
        sub = Paho(port)
        sub.subscribe(topic, qos=1)
        sub.c.loop_stop()
        pub = Paho(port)
        pub.publish(topic + "/warmup", KIB, qos=1)
        before = rss()
        big = b"y" * 4096
        for i in range(20_000):
            pub.publish(topic, big, qos=1, wait=(i % 1000 == 999))
        pub.publish(topic + "/sync", b"", qos=1)
        grown = rss() - before
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "fluxpg_mqtt_slow_subscriber_disconnects_total 1" in metrics
        print(f"broker RSS {before / 2**20:.0f} MiB -> +{grown / 2**20:.1f} MiB")
        assert grown < 48 * 2 ** 20, f"broker RSS grew by {grown / 2**20:.0f} MiB for 80 MiB published"
        pub.close()
    finally:
        broker.close()


# --------------------------------------------------------------------------- inbound (publisher side)


def _metric(port: int, name: str) -> int:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    raise AssertionError(f"{name} not on /metrics")


def _tcp_rmem_max() -> int:
    """The most a TCP socket's receive buffer may grow to on this machine (Linux), else Linux's default."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 6 * 1024 * 1024


def _send_until_stalled(sock, data: bytes, stall: float = 1.5) -> int:
    """Write `data` without blocking until the peer stops taking it for `stall` seconds (or all of
    it is written); how many bytes were written."""
    import select
    sock.setblocking(False)
    sent = 0
    while sent < len(data):
        _, writable, _ = select.select([], [sock], [], stall)
        if not writable:
            break
        try:
            sent += sock.send(data[sent:sent + 65536])
        except BlockingIOError:
            continue
    return sent


def test_publishes_awaiting_their_commit_are_bounded_by_bytes(threaded_broker, dsn, qname):
    """QoS 1 publishes whose commit is held up (another transaction holds the queue's head row)
    stay charged to bounds.connection_inbound_bytes until they commit, and the broker stops
    reading the publisher's socket at the bound (TCP pushes back) instead of holding
    count × packet size. Once the commits go through, every publish is stored and acknowledged."""
    import socket

    import psycopg

    from fluxpg.config import BoundsConfig
    from fluxpg.protocols.mqtt.codec import Connect, Decoder, Puback, Publish, encode

    # What TCP itself can hold: the broker's receive buffer, which autotuning may grow on loopback
    # to tcp_rmem's maximum (32 MB here: a CI run saw 19 MB sent while the broker held 1 MB),
    # and the client's send buffer (the kernel doubles the 64 KiB asked for).
    kernel = _tcp_rmem_max() + 2 * 65536
    bound, size = 1_000_000, 200_000                        # 1 MB allowed
    count = (bound + kernel) // size + 20                   # offered: more than the broker and TCP can hold
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=bound)))
    http = srv.port("http")
    stream = b"".join(encode(Publish(f"$queue/{qname}/x", b"p" * size, 1, packet_id=i + 1), 5)
                      for i in range(count))
    with psycopg.connect(dsn) as lock, socket.create_connection(("127.0.0.1", srv.port("mqtt")), timeout=10) as sock:
        # Appends to the queue wait for this row lock until the rollback below.
        lock.execute("SELECT 1 FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id "
                     "WHERE q.name = %s FOR UPDATE", [qname])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sock.sendall(encode(Connect(client_id="bulk", keep_alive=60), 5))
        assert sock.recv(100)[:1] == b"\x20"                  # CONNACK
        sent = _send_until_stalled(sock, stream)
        held = _metric(http, "fluxpg_inbound_bytes")
        # The broker read up to the bound (plus one read and the packet in progress), no further:
        # the rest is in the kernel's socket buffers or not sent at all, so the client stalled.
        assert bound <= held <= bound + 65536 + size + 100, held
        assert sent <= bound + 65536 + size + 100 + kernel < len(stream), (sent, kernel, len(stream))
        lock.rollback()
        sock.settimeout(30)
        sock.setblocking(True)
        sock.sendall(stream[sent:])
        dec, acks = Decoder(version=5), []
        while len(acks) < count:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            dec.feed(chunk)
            acks += [p for p in dec if isinstance(p, Puback)]
    assert [a.packet_id for a in acks] == list(range(1, count + 1))
    assert all(a.reason_code == 0 for a in acks)
    assert [r["depth"] for r in srv.call(srv.manager.queue_stats()) if r["queue"] == qname] == [count]
    assert wait_until(lambda: _metric(http, "fluxpg_inbound_bytes") == 0)
    assert _metric(http, "fluxpg_inbound_bytes_peak") <= bound + 65536 + size + 100


def test_a_publisher_paused_at_the_inbound_bound_can_be_taken_over(threaded_broker, dsn, qname, caplog):
    """A connection whose reading is paused at the bound (its commits held up) still ends at once
    when another connection takes its session over: the pause does not wait for a commit."""
    import logging
    import socket

    import psycopg

    from fluxpg.config import BoundsConfig
    from fluxpg.protocols.mqtt.codec import Connack, Connect, Decoder, Publish, encode

    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=300_000)))
    stream = b"".join(encode(Publish(f"$queue/{qname}/x", b"p" * 100_000, 1, packet_id=i + 1), 5) for i in range(40))
    caplog.set_level(logging.INFO, logger="fluxpg.mqtt")
    with psycopg.connect(dsn) as lock, \
            socket.create_connection(("127.0.0.1", srv.port("mqtt")), timeout=10) as a, \
            socket.create_connection(("127.0.0.1", srv.port("mqtt")), timeout=10) as b:
        lock.execute("SELECT 1 FROM fluxpg.heads h JOIN fluxpg.queues q ON q.id = h.queue_id "
                     "WHERE q.name = %s FOR UPDATE", [qname])
        a.sendall(encode(Connect(client_id="same", keep_alive=60), 5))
        assert a.recv(100)[:1] == b"\x20"
        _send_until_stalled(a, stream)
        assert wait_until(lambda: _metric(srv.port("http"), "fluxpg_inbound_bytes") >= 300_000)
        b.sendall(encode(Connect(client_id="same", keep_alive=60), 5))
        dec = Decoder(version=5)
        while not (packets := list(dec)):
            dec.feed(b.recv(100))
        assert isinstance(packets[0], Connack) and packets[0].reason_code == 0
        lock.rollback()
    assert "did not close in time" not in caplog.text
