"""The MQTT read loop without a StreamReader (fluxpg/protocols/reads.py): packets handled inside
data_received while the loop is parked, the loop woken for partial packets and awaited answers.
Whatever way the client's bytes are cut into TCP writes, every publish is answered and delivered
once, in order."""
from __future__ import annotations

import random
import socket
import time

from fluxpg.protocols.mqtt.codec import (Connect, Decoder, Puback, Publish, Suback, Subscribe, Subscription,
                                         encode, encode_ack_ok)
from fluxpg.protocols.mqtt.properties import Properties


def _client(srv, cid: str) -> tuple[socket.socket, Decoder]:
    sock = socket.create_connection(("127.0.0.1", srv.port("mqtt")), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(encode(Connect(client_id=cid, keep_alive=60), 5))
    dec = Decoder(version=5)
    assert _packets(sock, dec, 1)[0].reason_code == 0     # CONNACK
    return sock, dec


def _packets(sock: socket.socket, dec: Decoder, n: int, limit: float = 20) -> list:
    out: list = []
    deadline = time.monotonic() + limit
    while len(out) < n:
        while (p := dec.next_packet()) is not None:
            out.append(p)
        if len(out) >= n:
            break
        assert time.monotonic() < deadline, f"{len(out)} of {n} packets"
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        data = sock.recv(65536)
        assert data, f"closed after {len(out)} of {n} packets"
        dec.feed(data)
    return out


def test_publishes_cut_anywhere_are_answered_and_delivered_in_order(threaded_broker):
    srv = threaded_broker()
    sub, sdec = _client(srv, "inline-sub")
    sub.sendall(encode(Subscribe(1, [Subscription("inline/t", qos=1)]), 5))
    assert isinstance(_packets(sub, sdec, 1)[0], Suback)
    pub, pdec = _client(srv, "inline-pub")
    n = 300
    rng = random.Random(17)
    stream = b"".join(
        encode(Publish("inline/t", i.to_bytes(4, "big") * rng.randint(1, 60), 1, False, False, i + 1,
                       Properties(user_properties=[("k", str(i))]) if i % 7 == 0 else Properties()), 5)
        + (b"\xc0\x00" if i % 50 == 0 else b"")                     # a PINGREQ now and then
        for i in range(n))
    # Cut into writes of 1 byte .. several packets, pausing now and then so that the broker's
    # loop parks between them (and gets partial packets to wait for).
    pos = 0
    while pos < len(stream):
        step = rng.choice([1, 2, 3, 7, 40, 300, 2000])
        pub.sendall(stream[pos:pos + step])
        pos += step
        if rng.random() < 0.05:
            time.sleep(0.01)
    answers = _packets(pub, pdec, n + n // 50)
    acks = [p.packet_id for p in answers if isinstance(p, Puback)]
    assert acks == list(range(1, n + 1))
    got = _packets(sub, sdec, n)
    assert [p.payload[:4] for p in got] == [i.to_bytes(4, "big") for i in range(n)]
    for p in got:
        sub.sendall(encode_ack_ok(0x40, p.packet_id))
    for s in (pub, sub):
        s.sendall(b"\xe0\x00")                                         # DISCONNECT
        s.close()
