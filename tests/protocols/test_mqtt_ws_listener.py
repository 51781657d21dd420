"""MQTT over WebSocket (issue 16): the `ws` listener with real clients -- paho-mqtt's websockets
transport (v5 and 3.1.1, QoS 0/1/2, counted) and a raw `websockets` client that splits and joins
MQTT packets across binary frames arbitrarily; a handshake without the `mqtt` subprotocol and a
text frame are refused."""
from __future__ import annotations

import asyncio

import paho.mqtt.client as mqtt
import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect

from fluxpg.config import Config
from fluxpg.protocols.mqtt.codec import (Connack, Connect, Decoder, Puback, Publish, Suback, Subscribe,
                                         Subscription, encode)

from test_mqtt_paho import TIMEOUT, V5, V311, Paho, uid


class WsPaho(Paho):
    """The shared Paho helper over paho's WebSocket transport (subprotocol `mqtt`, path /mqtt)."""

    def __init__(self, port: int, **kw):
        self._ws = True
        super().__init__(port, connect=False, **kw)
        kwargs = {}
        if self.version != V5:
            kwargs["clean_session"] = self.clean
        old = self.c
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=self.version,
                             transport="websockets", **kwargs)
        for name in ("on_connect", "on_message", "on_subscribe", "on_unsubscribe", "on_publish", "on_disconnect"):
            setattr(self.c, name, getattr(old, name))
        self.c.ws_set_options(path="/mqtt")
        self.connect()


def ws_config() -> Config:
    return Config(listeners={"ws": "127.0.0.1:0"})


@pytest.mark.parametrize("version", [V5, V311])
def test_paho_over_websocket_qos_0_1_2(threaded_broker, version):
    server = threaded_broker(config=ws_config())
    ws_port = server.port("ws")
    tcp_port = server.port("mqtt")
    topic = f"ws/{uid()}"
    sub = WsPaho(ws_port, version=version)
    assert [int(getattr(c, "value", c)) for c in sub.subscribe(f"{topic}/#", qos=2)] == [2]
    tcp_pub = Paho(tcp_port, version=version)
    ws_pub = WsPaho(ws_port, version=version)
    n = 30
    for i in range(n):
        (tcp_pub if i % 2 else ws_pub).publish(f"{topic}/{i}", f"m{i}".encode(), qos=i % 3)
    got = [sub.get() for _ in range(n)]
    # Two publishers: every message exactly once with its QoS; order holds per publisher and QoS
    # (MQTT 5 §4.6 orders messages of one QoS; a QoS 2 message may overtake or trail the
    # publisher's later QoS 1 one — seen once in a few hundred runs under load).
    assert sorted(m.payload for m in got) == sorted(f"m{i}".encode() for i in range(n))
    assert {m.payload: m.qos for m in got} == {f"m{i}".encode(): i % 3 for i in range(n)}
    for parity in (0, 1):
        for qos in (0, 1, 2):
            seq = [int(m.payload[1:]) for m in got if int(m.payload[1:]) % 2 == parity and m.qos == qos]
            assert seq == sorted(seq)
    sub.nothing(0.3)
    for c in (sub, tcp_pub, ws_pub):
        c.close()


async def _read_packets(ws, decoder: Decoder, count: int) -> list:
    out = []
    while len(out) < count:
        while (pkt := decoder.next_packet()) is not None:
            out.append(pkt)
        if len(out) >= count:
            break
        decoder.feed(await asyncio.wait_for(ws.recv(), TIMEOUT))
    return out


def test_packets_split_and_joined_across_frames(threaded_broker):
    server = threaded_broker(config=ws_config())
    url = f"ws://127.0.0.1:{server.port('ws')}/mqtt"
    topic = f"ws/{uid()}"

    async def scenario():
        async with ws_connect(url, subprotocols=["mqtt"]) as ws:
            assert ws.subprotocol == "mqtt"
            data = encode(Connect(client_id=uid("raw"), protocol_level=5), 5)
            data += encode(Subscribe(1, [Subscription(topic, 1)]), 5)
            data += b"".join(encode(Publish(topic, f"p{i}".encode(), 1, False, False, 10 + i), 5) for i in range(5))
            # One byte per frame for the first 20 bytes, then frames of 7 bytes: packets split and
            # joined at every possible place.
            pieces = [data[i:i + 1] for i in range(20)] + [data[i:i + 7] for i in range(20, len(data), 7)]
            for piece in pieces:
                await ws.send(piece)
            dec = Decoder(version=5)
            pkts = await _read_packets(ws, dec, 1 + 1 + 5 + 5)
            kinds = [type(p).__name__ for p in pkts]
            assert isinstance(pkts[0], Connack) and pkts[0].reason_code == 0
            assert kinds.count("Suback") == 1 and kinds.count("Puback") == 5 and kinds.count("Publish") == 5
            assert [p.packet_id for p in pkts if isinstance(p, Puback)] == [10, 11, 12, 13, 14]
            assert [p.payload for p in pkts if isinstance(p, Publish)] == [f"p{i}".encode() for i in range(5)]

    asyncio.run(scenario())


def test_handshake_without_mqtt_subprotocol_and_text_frames_refused(threaded_broker):
    server = threaded_broker(config=ws_config())
    url = f"ws://127.0.0.1:{server.port('ws')}/mqtt"

    async def scenario():
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            async with ws_connect(url):
                pass
        assert info.value.response.status_code == 400
        async with ws_connect(url, subprotocols=["mqtt"]) as ws:
            await ws.send("not binary")
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), TIMEOUT)
            assert closed.value.rcvd.code == 1003

    asyncio.run(scenario())


def test_wss_with_the_listener_tls_settings(threaded_broker, tmp_path_factory):
    """`tls:` applies to the ws listener too (wss); paho connects with the test CA."""
    import shutil
    if shutil.which("openssl") is None:
        pytest.fail("the wss test needs the openssl command (installed in CI)")
    from fluxpg.config import TlsConfig
    from test_tls import certs as make_certs
    certs = make_certs.__wrapped__(tmp_path_factory)
    tls = TlsConfig(cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"), listeners=["ws"])
    server = threaded_broker(config=Config(listeners={"ws": "127.0.0.1:0"}, tls=tls))
    topic = f"wss/{uid()}"
    c = WsPaho.__new__(WsPaho)
    Paho.__init__(c, server.port("ws"), connect=False)
    old = c.c
    c.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=c.client_id, protocol=V5, transport="websockets")
    for name in ("on_connect", "on_message", "on_subscribe", "on_unsubscribe", "on_publish", "on_disconnect"):
        setattr(c.c, name, getattr(old, name))
    c.c.tls_set(ca_certs=str(certs / "ca.pem"))
    c.connect()
    c.subscribe(topic, qos=1)
    c.publish(topic, b"secure", qos=1)
    assert c.get().payload == b"secure"
    # The plain TCP MQTT listener is not under TLS here (tls.listeners = [ws]).
    plain = Paho(server.port("mqtt"))
    plain.publish(topic, b"plain", qos=1)
    assert c.get().payload == b"plain"
    c.close()
    plain.close()
