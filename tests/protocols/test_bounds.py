"""Resource bounds against a real broker over real sockets: absolute handshake and frame
deadlines (bytes trickled one at a time do not extend them), and decoder work bounds (nesting
depth, element counts) refused before decoding, without stalling other clients.

The deadlines are set short in the test config (bounds.handshake_timeout / frame_timeout); the
clients trickle a byte every 0.2 s, so any timeout that restarted on traffic would never fire.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest
from pamqp import commands
from pamqp import frame as pframe

from fluxpg.config import BoundsConfig, Config
from fluxpg.protocols.mqtt.codec import Connect, Publish, encode
from tests.ws_frames import client_frame

pytestmark = pytest.mark.timeout(60)

TRICKLE = 0.2
AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"


def _server(threaded_broker, **bounds):
    return threaded_broker(config=Config(bounds=BoundsConfig(**bounds)))


def _trickle_until_closed(sock: socket.socket, data: bytes, limit: float, received: list | None = None) -> float:
    """Send `data` a byte every TRICKLE seconds (reading whatever the broker says meanwhile, kept
    in `received` if given) until the broker closes the connection; the seconds that took. Fails
    after `limit`."""
    sock.setblocking(False)
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < limit:
        if i < len(data):
            try:
                sock.send(data[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
            i += 1
        deadline = time.monotonic() + TRICKLE
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            except ConnectionResetError:
                return time.monotonic() - started
            if not chunk:
                return time.monotonic() - started
            if received is not None:
                received.append(chunk)
    raise AssertionError(f"the connection was still open after {limit}s of trickled bytes")


def _connect(srv, listener: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port(listener)), timeout=10)


def _amqp091_start_ok(client_properties: dict) -> bytes:
    return pframe.marshal(commands.Connection.StartOk(client_properties=client_properties, mechanism="PLAIN",
                                                      response="\0guest\0guest", locale="en_US"), 0)


# --------------------------------------------------------------------------- handshake deadline


@pytest.mark.parametrize("protocol", ["amqp091", "mqtt", "amqp10"])
def test_handshake_deadline_is_absolute(threaded_broker, protocol):
    """A login trickled a byte at a time is cut off handshake_timeout after accept."""
    srv = _server(threaded_broker, handshake_timeout="1500ms", frame_timeout="30s")
    if protocol == "amqp091":
        data = AMQP091_HEADER + _amqp091_start_ok({"product": "slow" * 20})
    elif protocol == "mqtt":
        data = encode(Connect(client_id="slowpoke" * 10, keep_alive=60), 5)
    else:
        from fluxpg.protocols.amqp10 import sasl as sasl_codec
        data = sasl_codec.client_frames("PLAIN", "someone" * 10, "password" * 10)
    assert len(data) * TRICKLE > 6, "the trickle must outlast the deadline by far"
    with _connect(srv, "amqp091") as sock:
        took = _trickle_until_closed(sock, data, limit=20)
    assert 1.2 <= took < 6, took


def _read_http_head(sock: socket.socket, closed_message: str) -> bytes:
    """Bytes up to the end of an HTTP response head (and whatever came with it)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        assert chunk, closed_message
        answer += chunk
    return answer


def _ws_frame(payload: bytes) -> bytes:
    """One binary WebSocket frame as a client sends it (masked)."""
    return client_frame(payload)


WS_UPGRADE = ("GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
              "Sec-WebSocket-Protocol: mqtt\r\n\r\n").encode()


@pytest.mark.parametrize("listener,stage", [("http", "request"), ("http", "mqtt-connect"), ("ws", "request"),
                                            ("ws", "mqtt-connect")])
def test_http_and_websocket_handshake_deadline_is_absolute(threaded_broker, listener, stage):
    """HTTP and MQTT over WebSocket (the HTTP listener's /mqtt and the `ws` listener) are held to
    the same deadline from accept: request headers trickled a byte at a time, or a WebSocket
    upgrade done at once and then the CONNECT trickled, are cut off handshake_timeout after accept."""
    srv = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"},
                                        bounds=BoundsConfig(handshake_timeout="1500ms", frame_timeout="30s")))
    if stage == "request":
        data = (WS_UPGRADE if listener == "ws" else
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 40 + b"\r\n\r\n")
    else:
        data = _ws_frame(encode(Connect(client_id="slowpoke" * 10, keep_alive=60), 5))
    assert len(data) * TRICKLE > 6, "the trickle must outlast the deadline by far"
    with _connect(srv, listener) as sock:
        if stage == "mqtt-connect":
            sock.sendall(WS_UPGRADE)
            sock.settimeout(10)
            assert sock.recv(4096).startswith(b"HTTP/1.1 101")
        took = _trickle_until_closed(sock, data, limit=20)
    assert 1.0 <= took < 6, took


def test_http_keep_alive_outlives_the_handshake_deadline(threaded_broker):
    """The deadline covers the first request's headers only: a keep-alive connection that was
    answered goes on serving requests after it."""
    srv = threaded_broker(config=Config(bounds=BoundsConfig(handshake_timeout="1s")))
    with _connect(srv, "http") as sock:
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        for _ in range(2):
            sock.sendall(request)
            answer = _read_http_head(sock, "closed")
            assert answer.startswith(b"HTTP/1.1 200"), answer
            time.sleep(1.5)


# --------------------------------------------------------------------------- frame deadline


def test_amqp091_frame_deadline(threaded_broker):
    """A frame whose bytes trickle in is cut off frame_timeout after its first byte (the
    handshake deadline is far away here), with connection.close 501."""
    srv = _server(threaded_broker, handshake_timeout="60s", frame_timeout="1500ms")
    with _connect(srv, "amqp091") as sock:
        sock.sendall(AMQP091_HEADER)
        took = _trickle_until_closed(sock, _amqp091_start_ok({"product": "slow" * 20}), limit=20)
    assert 1.2 <= took < 6, took


def test_mqtt_packet_deadline(threaded_broker):
    srv = _server(threaded_broker, handshake_timeout="60s", frame_timeout="1500ms")
    with _connect(srv, "mqtt") as sock:
        sock.sendall(encode(Connect(client_id="trickler", keep_alive=60), 5))
        assert sock.recv(100)[:1] == b"\x20"   # CONNACK
        took = _trickle_until_closed(sock, encode(Publish("slow/topic", b"x" * 200, 0), 5), limit=20)
    assert 1.2 <= took < 6, took


def test_amqp10_frame_deadline(threaded_broker):
    srv = _server(threaded_broker, handshake_timeout="60s", frame_timeout="1500ms")
    perf = b"\x00\x53\x10\xc0\x13\x01\xa1\x10" + b"c" * 16       # open(container-id)
    frame = struct.pack(">IBBH", 8 + len(perf), 2, 0, 0) + perf
    with _connect(srv, "amqp") as sock:
        sock.sendall(AMQP10_HEADER)
        took = _trickle_until_closed(sock, frame * 3, limit=20)
    assert 1.2 <= took < 6, took


def test_complete_frames_keep_a_slow_connection_alive(threaded_broker):
    """Frames that each arrive within frame_timeout are fine, however long the connection lasts."""
    srv = _server(threaded_broker, handshake_timeout="60s", frame_timeout="1500ms")
    with _connect(srv, "mqtt") as sock:
        sock.sendall(encode(Connect(client_id="steady", keep_alive=60), 5))
        assert sock.recv(100)[:1] == b"\x20"
        for _ in range(4):    # 4 × 1 s > frame_timeout in total
            sock.sendall(b"\xc0\x00")                          # PINGREQ
            assert sock.recv(100) == b"\xd0\x00"               # PINGRESP
            time.sleep(1.0)


# --------------------------------------------------------------------------- decoder bounds


def _read_until_closed(sock: socket.socket, limit: float = 10) -> bytes:
    sock.settimeout(limit)
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_amqp091_deep_table_refused_before_decoding(threaded_broker):
    srv = _server(threaded_broker)
    nested: dict = {}
    for _ in range(40):
        nested = {"a": nested}
    with _connect(srv, "amqp091") as sock:
        sock.sendall(AMQP091_HEADER)
        started = time.monotonic()
        sock.sendall(_amqp091_start_ok({"capabilities": nested}))
        answer = _read_until_closed(sock)
    assert time.monotonic() - started < 5
    assert b"FRAME_ERROR" in answer and b"decoder_max_depth" in answer


def test_amqp10_zero_width_array_refused_before_decoding(threaded_broker):
    """An open frame whose properties hold an array32 of a million nulls (13 bytes): refused with
    amqp:decode-error before proton builds a million values; another client is served meanwhile."""
    srv = _server(threaded_broker)
    evil = b"\xf0" + struct.pack(">II", 5, 1_000_000) + b"\x40"
    # open: container-id "c", then nulls up to properties (field 10) = a map holding the array
    fields = b"\xa1\x01c" + b"\x40" * 9 + b"\xc1" + bytes([len(evil) + 4]) + b"\x02\xa3\x01k" + evil
    perf = b"\x00\x53\x10\xd0" + struct.pack(">II", len(fields) + 4, 11) + fields
    frame = struct.pack(">IBBH", 8 + len(perf), 2, 0, 0) + perf
    with _connect(srv, "amqp") as sock:
        sock.sendall(AMQP10_HEADER + frame)
        answer = _read_until_closed(sock)
    assert b"amqp:decode-error" in answer and b"decoder_max_elements" in answer
    # the broker still serves others
    with _connect(srv, "mqtt") as sock:
        sock.sendall(encode(Connect(client_id="after", keep_alive=60), 5))
        assert sock.recv(100)[:1] == b"\x20"


# --------------------------------------------------------------------------- inbound memory (AMQP 0-9-1)


class RawAmqp091:
    """Just enough of an AMQP 0-9-1 client over a raw socket to leave bodies half sent."""

    def __init__(self, srv):
        self.sock = _connect(srv, "amqp091")
        self.sock.sendall(AMQP091_HEADER)
        self.buf = b""
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0u\0p",
                                                 locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        self.send(0, commands.Connection.Open("/"))
        self.expect(commands.Connection.OpenOk)

    def send(self, channel: int, method) -> None:
        self.sock.sendall(pframe.marshal(method, channel))

    def next_frame(self, timeout: float = 10):
        self.sock.settimeout(timeout)
        while True:
            if self.buf:
                try:
                    used, channel, value = pframe.unmarshal(self.buf)
                except Exception:   # noqa: BLE001 - incomplete frame: read more
                    used = 0
                if used:
                    self.buf = self.buf[used:]
                    return channel, value
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the broker")
            self.buf += chunk

    def expect(self, cls):
        while True:
            _, value = self.next_frame()
            if isinstance(value, cls):
                return value
            if isinstance(value, commands.Connection.Close):
                raise AssertionError(f"connection closed: {value.reply_code} {value.reply_text}")

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def start_publish(self, channel: int, size: int, sent: int, queue: str) -> None:
        """basic.publish + a header announcing `size` bytes + the first `sent` bytes of the body."""
        from pamqp import body as pbody
        from pamqp import header as pheader
        self.send(channel, commands.Basic.Publish(exchange="", routing_key=f"$queue/{queue}/x"))
        self.sock.sendall(pframe.marshal(pheader.ContentHeader(0, size, commands.Basic.Properties()), channel))
        chunk = self.frame_max - 8
        for start in range(0, sent, chunk):
            self.sock.sendall(pframe.marshal(pbody.ContentBody(b"x" * min(chunk, sent - start)), channel))


def _broker_inbound(srv) -> int:
    from fluxpg import bounds
    found = srv.server.ctx.state.get(bounds.STATE_KEY)
    return found.used if found is not None else 0


def test_amqp091_partial_bodies_bounded_per_connection(threaded_broker, qname):
    """Channels announcing large bodies: refused with connection.close 506 RESOURCE_ERROR as soon
    as their sum would pass bounds.connection_inbound_bytes — before the bytes are buffered — and
    everything held is freed when the connection ends."""
    from fluxpg.config import QueueConfig
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=1_000_000)))
    client = RawAmqp091(srv)
    for ch in range(1, 4):
        client.open_channel(ch)
    client.start_publish(1, 400_000, 200_000, qname)
    client.start_publish(2, 400_000, 200_000, qname)
    wait = time.monotonic() + 5
    while _broker_inbound(srv) < 800_000 and time.monotonic() < wait:
        time.sleep(0.05)
    assert _broker_inbound(srv) == 800_000          # the two announced bodies are reserved
    client.start_publish(3, 400_000, 0, qname)        # 1.2 MB > 1 MB: refused at the header
    close = client.expect(commands.Connection.Close)
    assert close.reply_code == 506 and "connection_inbound_bytes" in close.reply_text
    client.send(0, commands.Connection.CloseOk())
    client.sock.close()
    wait = time.monotonic() + 5
    while _broker_inbound(srv) and time.monotonic() < wait:
        time.sleep(0.05)
    assert _broker_inbound(srv) == 0


def test_amqp091_broker_wide_bound(threaded_broker, qname):
    """Two connections, each within its own bound, together over bounds.broker_inbound_bytes:
    the one that would pass it is refused; the other goes on and completes its message."""
    from fluxpg.config import QueueConfig
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=1_000_000,
                                                            broker_inbound_bytes=1_000_000)))
    a, b = RawAmqp091(srv), RawAmqp091(srv)
    a.open_channel(1)
    b.open_channel(1)
    a.start_publish(1, 700_000, 100_000, qname)
    wait = time.monotonic() + 5
    while _broker_inbound(srv) < 700_000 and time.monotonic() < wait:
        time.sleep(0.05)
    b.start_publish(1, 700_000, 0, qname)
    close = b.expect(commands.Connection.Close)
    assert close.reply_code == 506 and "broker_inbound_bytes" in close.reply_text
    b.sock.close()
    # a finishes its message: stored
    from pamqp import body as pbody
    for start in range(100_000, 700_000, a.frame_max - 8):
        a.sock.sendall(pframe.marshal(pbody.ContentBody(b"x" * min(a.frame_max - 8, 700_000 - start)), 1))
    wait = time.monotonic() + 10
    while time.monotonic() < wait:
        depth = [r["depth"] for r in srv.call(srv.manager.queue_stats()) if r["queue"] == qname]
        if depth and depth[0] == 1:
            break
        time.sleep(0.05)
    assert depth == [1]
    assert _broker_inbound(srv) == 0
    a.sock.close()


def test_amqp091_over_the_bound_costs_no_confirmed_message(threaded_broker, qname):
    """A publisher that passes its bound loses its connection, never a message it had confirmed."""
    import pika
    import pika.exceptions
    from fluxpg.config import QueueConfig
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=300_000)))
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=srv.port("amqp091"),
                                                             connection_attempts=1, socket_timeout=10))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", f"$queue/{qname}/x", f"m{i}".encode() * 1000)   # confirmed
    with pytest.raises((pika.exceptions.ConnectionClosedByBroker, pika.exceptions.StreamLostError,
                        pika.exceptions.ChannelWrongStateError)) as err:
        ch.basic_publish("", f"$queue/{qname}/x", b"y" * 400_000)
    if isinstance(err.value, pika.exceptions.ConnectionClosedByBroker):
        assert err.value.reply_code == 506
    rows = [r for r in srv.call(srv.manager.queue_stats()) if r["queue"] == qname]
    assert rows[0]["depth"] == 5


def test_amqp10_multi_frame_message_charged_to_the_broker_wide_bound(threaded_broker, qname):
    """AMQP 1.0 messages being reassembled count toward bounds.broker_inbound_bytes too: over it
    the message is rejected (amqp:resource-limit-exceeded), the link and the connection go on,
    and the count returns to zero."""
    from proton import Delivery, Message
    from proton.utils import BlockingConnection

    from fluxpg.config import QueueConfig
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(broker_inbound_bytes=200_000)))
    conn = BlockingConnection(f"amqp://127.0.0.1:{srv.port('amqp')}", timeout=10)
    try:
        snd = conn.create_sender(f"$queue/{qname}")
        big = snd.send(Message(body=b"x" * 500_000), error_states=[])
        assert big.remote_state == Delivery.REJECTED
        assert big.remote.condition.name == "amqp:resource-limit-exceeded"
        assert "broker_inbound_bytes" in big.remote.condition.description
        assert snd.send(Message(body=b"small")).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert _broker_inbound(srv) == 0
    assert [r["depth"] for r in srv.call(srv.manager.queue_stats()) if r["queue"] == qname] == [1]


def test_mqtt_partial_packets_charged_to_the_broker_wide_bound(threaded_broker):
    """A PUBLISH announcing 900 kB whose bytes are still arriving counts toward
    bounds.broker_inbound_bytes; a second one that would pass it is disconnected with 0x97
    (quota exceeded) while the first goes on; the count returns to zero when both are gone."""
    from fluxpg.protocols.mqtt.codec import Decoder, Disconnect
    srv = threaded_broker(config=Config(bounds=BoundsConfig(broker_inbound_bytes=1_000_000)))
    big = encode(Publish("big/topic", b"x" * 900_000, 0), 5)
    a, b = _connect(srv, "mqtt"), _connect(srv, "mqtt")
    try:
        for i, sock in enumerate((a, b)):
            sock.sendall(encode(Connect(client_id=f"big{i}", keep_alive=60), 5))
            assert sock.recv(100)[:1] == b"\x20"
        a.sendall(big[:600_000])
        wait = time.monotonic() + 5
        while _broker_inbound(srv) < 600_000 and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) >= 600_000
        b.sendall(big[:600_000])
        answer = _read_until_closed(b)
        dec = Decoder(version=5)
        dec.feed(answer)
        packets = list(dec)
        assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == 0x97
        a.sendall(big[600_000:])          # the first completes: nothing held any more
        a.sendall(b"\xc0\x00")
        a.settimeout(10)
        assert a.recv(100) == b"\xd0\x00"
        wait = time.monotonic() + 5       # released once the read loop is past the decoded packets
        while _broker_inbound(srv) and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) == 0
    finally:
        a.close()
        b.close()


def test_amqp091_large_double_header_is_deliverable(threaded_broker, qname):
    """Found by the fuzz harness: a header holding a double above the 32-bit float range was
    stored but could not be delivered to an AMQP 0-9-1 consumer (a poison message)."""
    import pika

    from fluxpg.config import QueueConfig
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)]))
    # pika and pamqp write Python floats as 32-bit `f`: the `d` header is written by hand
    table = b"\x04huged" + struct.pack(">d", 1e300) + b"\x05smalld" + struct.pack(">d", 1.5)
    props_bytes = struct.pack(">HHQH", 60, 0, 3, 0x2000) + struct.pack(">I", len(table)) + table
    raw = RawAmqp091(srv)
    raw.open_channel(1)
    raw.send(1, commands.Basic.Publish(exchange="", routing_key=qname))
    raw.sock.sendall(struct.pack(">BHI", 2, 1, len(props_bytes)) + props_bytes + b"\xce"
                     + struct.pack(">BHI", 3, 1, 3) + b"big\xce")
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=srv.port("amqp091"),
                                                             connection_attempts=1, socket_timeout=10))
    try:
        ch = conn.channel()
        method, props, body = None, None, None
        deadline = time.monotonic() + 10
        while method is None and time.monotonic() < deadline:
            method, props, body = ch.basic_get(qname, auto_ack=True)
        assert body == b"big"
        assert float(props.headers["huge"]) == 1e300
    finally:
        conn.close()
        raw.sock.close()


def test_amqp091_transactional_publishes_are_charged_until_commit(threaded_broker, qname):
    """Publishes buffered in a transaction (tx.select … tx.commit) hold their bodies (and a
    per-message overhead) against bounds.connection_inbound_bytes until commit or rollback; a
    transaction that would pass the bound closes its channel with 406 PRECONDITION_FAILED (the
    transaction rolled back, as RabbitMQ refuses an oversized transaction), the connection and
    its other channels go on, and nothing stays counted."""
    import pika
    import pika.exceptions

    from fluxpg.config import QueueConfig
    from fluxpg.bounds import TX_MESSAGE_OVERHEAD
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)],
                                        bounds=BoundsConfig(connection_inbound_bytes=300_000)))
    conn = pika.BlockingConnection(pika.ConnectionParameters(host="127.0.0.1", port=srv.port("amqp091"),
                                                             connection_attempts=1, socket_timeout=10))
    body = b"t" * 50_000
    try:
        ch = conn.channel()
        ch.tx_select()
        for _ in range(3):
            ch.basic_publish("", qname, body)
        conn.process_data_events(0.2)
        wait = time.monotonic() + 5
        while _broker_inbound(srv) < 3 * (50_000 + TX_MESSAGE_OVERHEAD) and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) == 3 * (50_000 + TX_MESSAGE_OVERHEAD)     # held until commit
        ch.tx_commit()
        assert _broker_inbound(srv) == 0
        for _ in range(2):
            ch.basic_publish("", qname, body)
        ch.tx_rollback()
        assert _broker_inbound(srv) == 0
        # 6 × 50 kB in one transaction passes the 300 kB bound: the channel is closed
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            for _ in range(6):
                ch.basic_publish("", qname, body)
            ch.tx_commit()
        assert err.value.reply_code == 406 and "connection_inbound_bytes" in err.value.reply_text
        wait = time.monotonic() + 5     # released once the channel's close completed
        while _broker_inbound(srv) and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) == 0
        other = conn.channel()                                   # the connection goes on
        other.confirm_delivery()
        other.basic_publish("", qname, b"after")
    finally:
        conn.close()
    assert [r["depth"] for r in srv.call(srv.manager.queue_stats()) if r["queue"] == qname] == [4]


# --------------------------------------------------------------------------- MQTT over WebSocket: frames the library buffers


def _ws_frame_any(payload: bytes, fin: bool = True) -> bytes:
    """A binary WebSocket frame of any size as a client sends it (masked with a zero key, so the
    payload goes out as is)."""
    return client_frame(payload, fin=fin, mask=b"\x00\x00\x00\x00")


def _ws_mqtt_session(srv, listener: str, client_id: str) -> socket.socket:
    """Upgrade, CONNECT (v5) in one frame, CONNACK read: a connected MQTT-over-WebSocket client."""
    sock = _connect(srv, listener)
    sock.settimeout(10)
    sock.sendall(WS_UPGRADE)
    answer = _read_http_head(sock, "closed during the upgrade")
    assert answer.startswith(b"HTTP/1.1 101"), answer
    rest = answer.split(b"\r\n\r\n", 1)[1]
    sock.sendall(_ws_frame(encode(Connect(client_id=client_id, keep_alive=60), 5)))
    while len(rest) < 2 or len(rest) < 2 + rest[1]:
        chunk = sock.recv(4096)
        assert chunk, "closed before CONNACK"
        rest += chunk
    assert rest[0] == 0x82 and rest[2] == 0x20, rest     # a binary frame carrying CONNACK
    return sock


def _ws_mqtt_packets(data: bytes) -> list:
    """The MQTT packets in the server's (unmasked, small) binary frames; stops at anything else."""
    from fluxpg.protocols.mqtt.codec import Decoder
    dec = Decoder(version=5)
    while len(data) >= 2 and data[0] == 0x82 and data[1] < 126 and len(data) >= 2 + data[1]:
        dec.feed(data[2:2 + data[1]])
        data = data[2 + data[1]:]
    return list(dec)


@pytest.mark.parametrize("listener", ["ws", "http"])
def test_websocket_frame_deadline_after_connack(threaded_broker, listener):
    """A WebSocket frame trickled after CONNACK is cut off frame_timeout after its first byte, on the
    `ws` listener and the HTTP listener's /mqtt, though the WebSocket library shows MQTT nothing of
    it (it holds a frame until it is whole): DISCONNECT 0x8D, then the socket closes."""
    from fluxpg.protocols.mqtt.codec import Disconnect
    srv = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"},
                                        bounds=BoundsConfig(handshake_timeout="60s", frame_timeout="1500ms")))
    with _ws_mqtt_session(srv, listener, f"trickler-{listener}") as sock:
        data = _ws_frame_any(encode(Publish("slow/topic", b"x" * 200, 0), 5))
        assert len(data) * TRICKLE > 6, "the trickle must outlast the deadline by far"
        received: list[bytes] = []
        took = _trickle_until_closed(sock, data, limit=20, received=received)
    assert 1.2 <= took < 6, took
    packets = _ws_mqtt_packets(b"".join(received))
    assert packets and isinstance(packets[0], Disconnect) and packets[0].reason_code == 0x8D, packets


@pytest.mark.parametrize("listener", ["ws", "http"])
def test_websocket_message_being_received_is_charged(threaded_broker, listener):
    """The bytes of a WebSocket message the library is still assembling count toward the inbound
    bounds (broker-wide count: /metrics fluxpg_inbound_bytes) and are given back when it has been
    handed to MQTT; a connection whose partial message passes bounds.connection_inbound_bytes is
    disconnected with 0x97, and its count goes back as well."""
    srv = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"},
                                        bounds=BoundsConfig(connection_inbound_bytes=1_000_000)))
    big = _ws_frame_any(encode(Publish("big/topic", b"x" * 600_000, 0), 5))
    with _ws_mqtt_session(srv, listener, f"big-{listener}") as sock:
        sock.sendall(big[:400_000])
        wait = time.monotonic() + 5
        while _broker_inbound(srv) < 400_000 and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) >= 400_000
        sock.sendall(big[400_000:] + _ws_frame(b"\xc0\x00"))     # the rest, then PINGREQ
        answer = b""
        while b"\xd0\x00" not in answer:
            chunk = sock.recv(4096)
            assert chunk, "closed"
            answer += chunk
        wait = time.monotonic() + 5
        while _broker_inbound(srv) and time.monotonic() < wait:
            time.sleep(0.05)
        assert _broker_inbound(srv) == 0
    from fluxpg.protocols.mqtt.codec import Disconnect
    with _ws_mqtt_session(srv, listener, f"huge-{listener}") as sock:
        huge = _ws_frame_any(encode(Publish("big/topic", b"x" * 1_500_000, 0), 5))
        sock.sendall(huge[:1_100_000])
        packets = _ws_mqtt_packets(_read_until_closed(sock))
    assert packets and isinstance(packets[-1], Disconnect) and packets[-1].reason_code == 0x97, packets
    wait = time.monotonic() + 5
    while _broker_inbound(srv) and time.monotonic() < wait:
        time.sleep(0.05)
    assert _broker_inbound(srv) == 0


@pytest.mark.parametrize("listener", ["ws", "http"])
def test_complete_websocket_messages_keep_a_slow_connection_alive(threaded_broker, listener):
    """Whole WebSocket messages each within frame_timeout are fine, however long the connection lasts."""
    srv = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"},
                                        bounds=BoundsConfig(handshake_timeout="60s", frame_timeout="1500ms")))
    with _ws_mqtt_session(srv, listener, f"steady-{listener}") as sock:
        for _ in range(4):    # 4 × 1 s > frame_timeout in total
            sock.sendall(_ws_frame(b"\xc0\x00"))                        # PINGREQ
            assert sock.recv(100) == b"\x82\x02\xd0\x00"               # PINGRESP
            time.sleep(1.0)
