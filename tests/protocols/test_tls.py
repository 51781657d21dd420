"""TLS on the listeners: a throwaway CA and server certificate (openssl), every protocol inside
TLS on one port, a plain-TCP client refused, client certificates required when configured."""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading

import paho.mqtt.client as mqtt
import pytest
from proton import Message, SSLDomain
from proton.utils import BlockingConnection

from fluxpg.config import Config, ConfigError, QueueConfig, TlsConfig

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]


def _run(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """ca.pem, server.pem/server.key (CN/SAN localhost, 127.0.0.1), client.pem/client.key."""
    d = tmp_path_factory.mktemp("tls")
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "2", "-subj", "/CN=fluxpg test CA", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={'localhost' if name == 'server' else 'test-client'}", cwd=d)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", "san.cnf", cwd=d)
    return d


def _client_context(certs, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if with_cert:
        ctx.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
    return ctx


def test_tls_round_trip_amqp10_and_mqtt(threaded_broker, certs, qname):
    tls = TlsConfig(cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"))
    srv = threaded_broker(config=Config(queues=[QueueConfig(name=qname)], tls=tls))
    port = srv.port("amqp")

    # AMQP 1.0 (proton) over TLS, verifying the server against our CA
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(certs / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    conn = BlockingConnection(f"amqps://localhost:{port}", timeout=10, ssl_domain=domain)
    try:
        conn.create_sender(f"$queue/{qname}").send(Message(body="secret"))
        rcv = conn.create_receiver(qname)
        assert rcv.receive(timeout=10).body == "secret"
        rcv.accept()
    finally:
        conn.close()

    # MQTT (paho) over TLS on the same port: the protocol is sniffed inside the TLS session
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-client", protocol=mqtt.MQTTv5)
    client.tls_set_context(_client_context(certs))
    connected = threading.Event()
    codes = []
    client.on_connect = lambda c, u, f, rc, p: (codes.append(rc), connected.set())
    client.connect("localhost", port)
    client.loop_start()
    try:
        assert connected.wait(10)
        assert not codes[0].is_failure
    finally:
        client.loop_stop()
        client.disconnect()

    # a plain-TCP client gets no AMQP answer: the TLS listener does not speak cleartext
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x01\x00\x00")
        try:
            data = sock.recv(100)
        except (ConnectionResetError, socket.timeout):
            data = b""
        assert not data.startswith(b"AMQP")


def test_tls_only_on_the_named_listeners(threaded_broker, certs):
    tls = TlsConfig(cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"), listeners=["amqp"])
    srv = threaded_broker(config=Config(tls=tls))
    with socket.create_connection(("127.0.0.1", srv.port("amqp")), timeout=5) as raw:
        with _client_context(certs).wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"XXXXXXXX")   # unknown protocol inside TLS: AMQP 0-9-1 header back
            assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"
    with socket.create_connection(("127.0.0.1", srv.port("amqp091")), timeout=5) as sock:
        sock.sendall(b"XXXXXXXX")       # plain TCP there
        assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"


def test_client_certificate_required(threaded_broker, certs):
    tls = TlsConfig(cert_file=str(certs / "server.pem"), key_file=str(certs / "server.key"),
                    ca_file=str(certs / "ca.pem"), require_client_cert=True)
    srv = threaded_broker(config=Config(tls=tls))
    port = srv.port("mqtt")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with _client_context(certs, with_cert=True).wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"XXXXXXXX")
            assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with _client_context(certs).wrap_socket(raw, server_hostname="localhost") as sock:
                # TLS 1.3 reports the missing certificate on the first read
                sock.sendall(b"XXXXXXXX")
                if not sock.recv(8):
                    raise ConnectionResetError("closed")


def test_bad_certificate_paths_are_config_errors(tmp_path):
    tls = TlsConfig(cert_file=str(tmp_path / "missing.pem"), key_file=str(tmp_path / "missing.key"))
    with pytest.raises(ConfigError, match="cert_file"):
        tls.ssl_context()
    with pytest.raises(ValueError, match="ca_file"):
        TlsConfig(cert_file="a", key_file="b", require_client_cert=True)
