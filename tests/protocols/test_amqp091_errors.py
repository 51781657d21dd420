"""Bad input gets the right AMQP 0-9-1 error (channel or connection exception, code and text) and
disturbs nothing else; confirms stay honest when the database connections are killed."""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import asyncpg
import pytest
from pamqp import commands, frame as pframe, header as pheader

from fluxpg.auth import AuthError
from fluxpg.config import QueueConfig
from fluxpg.protocols.amqp091 import framing

Conn, Chan, Basic = commands.Connection, commands.Channel, commands.Basic


class RawClient:
    """A hand-driven AMQP 0-9-1 client that can send what real clients never would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.decoder = framing.FrameDecoder(0)
        self.frames: list[framing.Frame] = []

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(framing.PROTOCOL_HEADER)
        return cls(reader, writer)

    @classmethod
    async def open(cls, port: int, *, heartbeat: int = 0, user: str = "guest") -> RawClient:
        c = await cls.connect(port)
        assert isinstance(await c.method(), Conn.Start)
        c.send(0, Conn.StartOk({"capabilities": {"consumer_cancel_notify": True}}, "PLAIN", f"\0{user}\0pw"))
        assert isinstance(await c.method(), Conn.Tune)
        c.send(0, Conn.TuneOk(2047, 131072, heartbeat))
        c.send(0, Conn.Open("/"))
        assert isinstance(await c.method(), Conn.OpenOk)
        return c

    def send(self, channel: int, method) -> None:
        self.writer.write(pframe.marshal(method, channel))

    def raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self, timeout: float = 20.0) -> framing.Frame | None:  # generous: a loaded CI machine
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    async def method(self, timeout: float = 20.0):
        while True:
            f = await self.frame(timeout)
            if f is None:
                return None
            if f.type == framing.FRAME_METHOD:
                return framing.decode_method(f.payload)

    async def expect_connection_close(self, code: int):
        m = await self.method()
        assert isinstance(m, Conn.Close), m
        assert m.reply_code == code, m.reply_text
        self.send(0, Conn.CloseOk())
        # The server hangs up after close-ok.
        assert await self.method() is None
        return m

    def close(self) -> None:
        self.writer.close()


async def _ignore(message) -> None:
    return None


async def _healthy(server) -> None:
    """Another connection publishes and reads back: unaffected by whatever just failed."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    try:
        ch = await conn.channel()
        q = await ch.declare_queue("healthcheck", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"ok"), routing_key="healthcheck")
        msg = await q.get(timeout=5, no_ack=True)
        assert msg is not None
    finally:
        await conn.close()


async def test_frame_on_unknown_channel_is_504(broker):
    server = await broker()
    bystander = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    try:
        c = await RawClient.open(server.port("amqp091"))
        c.send(3, Basic.Qos(0, 1, False))
        m = await c.expect_connection_close(504)
        assert "channel.open" in m.reply_text and (m.class_id, m.method_id) == (60, 10)
        # A channel opened twice is a channel error too.
        c = await RawClient.open(server.port("amqp091"))
        c.send(1, Chan.Open())
        assert isinstance(await c.method(), Chan.OpenOk)
        c.send(1, Chan.Open())
        await c.expect_connection_close(504)
        ch = await bystander.channel()   # the other connection goes on
        await ch.declare_queue("bystander", durable=True)
        await _healthy(server)
    finally:
        await bystander.close()


async def test_wrong_state_methods_are_503(broker):
    server = await broker()
    c = await RawClient.open(server.port("amqp091"))
    c.send(0, Conn.Open("/"))            # already open
    m = await c.expect_connection_close(503)
    assert (m.class_id, m.method_id) == (10, 40)
    c = await RawClient.connect(server.port("amqp091"))
    assert isinstance(await c.method(), Conn.Start)
    c.send(1, Chan.Open())               # before start-ok
    await c.expect_connection_close(503)
    c = await RawClient.open(server.port("amqp091"))
    c.send(1, Chan.Open())
    await c.method()
    c.send(1, Basic.Deliver("x", 1, False, "", "k"))   # a server-to-client method
    await c.expect_connection_close(503)
    await _healthy(server)


async def test_garbage_and_malformed_frames(broker):
    server = await broker()
    c = await RawClient.open(server.port("amqp091"))
    c.raw(b"\x01\x00\x00\x00\x00\x00\x05hello\x00")   # frame-end byte is not 0xCE
    m = await c.method()
    assert isinstance(m, Conn.Close) and m.reply_code == 501
    assert await c.method() is None       # the stream is beyond repair: the server hangs up
    c = await RawClient.open(server.port("amqp091"))
    c.raw(b"\x03\x00\x01" + (200000).to_bytes(4, "big") + b"\x00" * 200000 + b"\xce")   # > frame_max
    m = await c.method()
    assert isinstance(m, Conn.Close) and m.reply_code == 501 and "frame-max" in m.reply_text
    c = await RawClient.open(server.port("amqp091"))
    c.send(1, Chan.Open())
    await c.method()
    c.raw(b"\x03\x00\x01\x00\x00\x00\x01x\xce")
    m = await c.expect_connection_close(505)   # a body with no basic.publish before it
    c = await RawClient.connect(server.port("amqp091"))
    c.raw(b"\xde\xad\xbe\xef" * 4)           # garbage where start-ok should be
    m = await c.method()
    assert isinstance(m, Conn.Start)
    m = await c.method()
    assert isinstance(m, Conn.Close) and m.reply_code == 501
    await _healthy(server)


async def test_heartbeat_then_bad_frame_end_is_501(broker):
    # Issue 12: a heartbeat followed by a frame whose end byte is wrong raised IndexError in the
    # decoder and dropped the connection without a word; it is connection.close 501.
    server = await broker()
    c = await RawClient.open(server.port("amqp091"))
    c.raw(bytes.fromhex("08000000000000ce01000100000006003c0028000000"))
    m = await c.method()
    assert isinstance(m, Conn.Close) and m.reply_code == 501, m
    assert "frame-end" in m.reply_text
    assert await c.method() is None
    await _healthy(server)


async def test_content_larger_than_any_queue_accepts_is_311(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    c = await RawClient.open(server.port("amqp091"))
    c.send(1, Chan.Open())
    await c.method()
    c.send(1, Basic.Publish(exchange="", routing_key=qname))
    # Announce 64 MiB (more than limits.max_message_size of every queue) and never send it.
    c.raw(pframe.marshal(pheader.ContentHeader(0, 64 * 2 ** 20, Basic.Properties()), 1))
    m = await c.method()
    assert isinstance(m, Chan.Close) and m.reply_code == 311
    c.send(1, Chan.CloseOk())
    c.send(1, Chan.Open())                # the channel number is free again; the connection lives
    assert isinstance(await c.method(), Chan.OpenOk)
    c.close()


async def test_channel_errors_close_only_the_channel(broker, qname):
    small = f"{qname}small"
    server = await broker([QueueConfig(name=qname), QueueConfig(name=small, limits={"max_message_size": 100})])
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    try:
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity, match="NOT_FOUND"):
            await ch.declare_queue(f"{qname}-missing", passive=True)
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await (await ch.get_queue(f"{qname}-missing", ensure=False)).consume(_ignore)
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="x-queue-type"):
            await ch.declare_queue(qname, durable=True, arguments={"x-queue-type": "stream"})
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="x-max-age"):
            await ch.declare_queue(f"{qname}bad", arguments={"x-max-age": "soon"})
        ch = await conn.channel()
        purged = await (await ch.get_queue(qname, ensure=False)).purge()   # works (issue 12); nothing waits
        assert purged.message_count == 0
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed, match="config file"):
            await (await ch.get_queue(qname, ensure=False)).delete(if_unused=False, if_empty=False)
        ch = await conn.channel()
        with pytest.raises((aio_pika.exceptions.ChannelPreconditionFailed, aio_pika.exceptions.ChannelInvalidStateError)):
            await ch.default_exchange.publish(aio_pika.Message(b"x" * 1000), routing_key=small)
            await asyncio.sleep(0.5)
            await ch.default_exchange.publish(aio_pika.Message(b"y"), routing_key=small)
        ch = await conn.channel()
        await ch.default_exchange.publish(aio_pika.Message(b"z"), routing_key=qname)
        msg = await (await ch.get_queue(qname, ensure=False)).get(timeout=5)
        await msg.ack()
        with pytest.raises((aio_pika.exceptions.ChannelPreconditionFailed, aio_pika.exceptions.ChannelInvalidStateError)):
            await msg.channel.basic_ack(9999)   # unknown delivery tag → 406
            await ch.declare_queue(qname, passive=True)
        # After all that, the connection itself is fine.
        ch = await conn.channel()
        q = await ch.declare_queue(qname, passive=True)
        assert q.name == qname
    finally:
        await conn.close()


class _Refusing:
    enabled = True

    async def authenticate(self, username, password, *, protocol, peer=None):
        assert protocol == "amqp091"
        if (username, password) != ("alice", "secret"):
            raise AuthError("bad credentials")
        from fluxpg.auth import Principal
        return Principal(username=username, permissions=(("publish", "$queue/allowed/#"), ("consume", "allowed")))


async def test_access_refused(broker):
    server = await broker([QueueConfig(name="allowed"), QueueConfig(name="forbidden")])
    server.ctx.auth = _Refusing()
    port = server.port("amqp091")
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    c = await RawClient.connect(port)
    await c.method()
    c.send(0, Conn.StartOk({}, "PLAIN", "\0mallory\0x"))
    m = await c.expect_connection_close(403)
    assert "ACCESS_REFUSED" in m.reply_text
    conn = await aio_pika.connect(f"amqp://alice:secret@127.0.0.1:{port}/")
    try:
        ch = await conn.channel()
        await ch.default_exchange.publish(aio_pika.Message(b"ok"), routing_key="allowed")
        with pytest.raises((aiormq.exceptions.ChannelAccessRefused, aio_pika.exceptions.ChannelInvalidStateError)):
            await ch.default_exchange.publish(aio_pika.Message(b"no"), routing_key="forbidden")
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await (await ch.get_queue("forbidden", ensure=False)).consume(_ignore)
        ch = await conn.channel()
        msg = await (await ch.get_queue("allowed", ensure=False)).get(timeout=5, no_ack=True)
        assert msg.body == b"ok"
    finally:
        await conn.close()


async def test_missed_heartbeats_close_the_connection(broker):
    server = await broker()
    c = await RawClient.open(server.port("amqp091"), heartbeat=1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    beats = 0
    while True:   # stay silent: the server sends heartbeats, then gives up on us
        f = await c.frame(timeout=6)
        if f is None:
            break
        beats += f.type == framing.FRAME_HEARTBEAT
    elapsed = loop.time() - start
    assert beats >= 1
    assert 1.5 <= elapsed <= 4.0


async def test_confirms_stay_honest_when_database_connections_die(broker, qname, dsn):
    server = await broker([QueueConfig(name=qname)])
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    killer = await asyncpg.connect(dsn)
    confirmed: set[int] = set()
    failed: set[int] = set()
    killed = 0
    try:
        ch = await conn.channel()

        async def publish(i: int) -> None:
            try:
                await asyncio.wait_for(ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname), 30)
            except (aio_pika.exceptions.DeliveryError, aio_pika.exceptions.AMQPError, asyncio.TimeoutError):
                failed.add(i)
            else:
                confirmed.add(i)

        n, wave = 600, 30
        for start in range(0, n, wave):
            batch = [asyncio.ensure_future(publish(i)) for i in range(start, start + wave)]
            if start % 120 == 60:
                await asyncio.sleep(0.005)
                killed += await killer.fetchval(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()) t")
            await asyncio.gather(*batch)
        assert killed > 0
        assert confirmed | failed == set(range(n))
        assert confirmed, "the broker recovered and confirmed publishes after the kills"
        rows = await killer.fetch("SELECT l.payload FROM fluxpg.log l JOIN fluxpg.queues q ON q.id = l.queue_id "
                                  "WHERE q.name = $1", qname)
        stored = {int(bytes(r["payload"])) for r in rows}
        missing = confirmed - stored
        assert not missing, f"confirmed but not in the log: {sorted(missing)[:10]}"
        print(f"killed {killed} backends; {len(confirmed)} confirmed, {len(failed)} nacked/failed")
    finally:
        await killer.close()
        await conn.close()


async def test_consumer_cancelled_by_server_when_queue_goes_away(broker, qname, dsn):
    server = await broker([QueueConfig(name=qname)])
    c = await RawClient.open(server.port("amqp091"))   # announces consumer_cancel_notify
    c.send(1, Chan.Open())
    await c.method()
    c.send(1, Basic.Consume(queue=qname, consumer_tag="watcher"))
    assert isinstance(await c.method(), Basic.ConsumeOk)
    db = await asyncpg.connect(dsn)
    try:
        # An operator drops the queue (no AMQP way to do so: queue.delete of durable queues is refused).
        # Consumers lock in the cascade's order, so this never meets the claim in a deadlock
        # (tests/integration/test_delete_lock_order.py).
        await db.execute("DELETE FROM fluxpg.queues WHERE name = $1", qname)
    finally:
        await db.close()
    m = await c.method(timeout=10)
    assert isinstance(m, Basic.Cancel) and m.consumer_tag == "watcher"
    c.send(1, Chan.Close(200, "bye", 0, 0))
    assert isinstance(await c.method(), Chan.CloseOk)
    c.close()


async def test_full_queue_nacks_and_pipeline_backpressure(broker, qname, monkeypatch):
    from fluxpg.protocols.amqp091 import channel as channel_module

    # A tiny in-flight limit: the reader must wait for the oldest publish instead of queueing more.
    monkeypatch.setattr(channel_module, "MAX_PIPELINE", 3)
    server = await broker([QueueConfig(name=qname, limits={"max_depth": 20})])
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")
    try:
        ch = await conn.channel()
        results = await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(b"%d" % i), routing_key=qname)
                                         for i in range(30)), return_exceptions=True)
        acked = [i for i, r in enumerate(results) if isinstance(r, Basic.Ack)]
        nacked = [i for i, r in enumerate(results) if isinstance(r, aio_pika.exceptions.DeliveryError)]
        assert len(acked) == 20 and acked == list(range(20))   # in order, up to max_depth
        assert nacked == list(range(20, 30))                    # then refused: nack, never a false ack
        ch2 = await conn.channel()
        await ch2.declare_queue(qname, passive=True)           # the connection is fine
    finally:
        await conn.close()


def _publish_frames(channel: int, rk: str, body: bytes, *, exchange: str = "", size: int | None = None,
                    class_id: int = 60) -> bytes:
    """basic.publish + content header + body, as one write (what Connection.fast_frame takes)."""
    hdr = pheader.ContentHeader(0, len(body) if size is None else size, Basic.Properties(delivery_mode=2))
    payload = bytearray(hdr.marshal())
    payload[0:2] = class_id.to_bytes(2, "big")
    return (pframe.marshal(Basic.Publish(exchange=exchange, routing_key=rk), channel)
            + framing._frame(framing.FRAME_HEADER, channel, bytes(payload))
            + framing._frame(framing.FRAME_BODY, channel, body))


async def test_publishes_in_one_read_take_the_fast_path_with_the_same_errors(broker, qname):
    # Connection.fast_frame handles publish, header and body without handle_frame's coroutines:
    # confirms, order and every error must be what the general path gives.
    server = await broker([QueueConfig(name=qname)])
    port = server.port("amqp091")
    c = await RawClient.open(port)
    c.send(1, Chan.Open())
    assert isinstance(await c.method(), Chan.OpenOk)
    c.send(1, commands.Confirm.Select())
    assert isinstance(await c.method(), commands.Confirm.SelectOk)
    c.raw(b"".join(_publish_frames(1, qname, b"m%d" % i) for i in range(5)))
    last = 0
    while last < 5:
        m = await c.method()
        assert isinstance(m, Basic.Ack), m
        assert m.delivery_tag > last and (m.multiple or m.delivery_tag == last + 1)
        last = m.delivery_tag
    # Unknown exchange: channel.close 404; the content frames that follow are discarded.
    c.raw(_publish_frames(1, qname, b"lost", exchange="nope") + _publish_frames(1, qname, b"lost too"))
    m = await c.method()
    assert isinstance(m, Chan.Close) and m.reply_code == 404, m
    c.send(1, Chan.CloseOk())
    c.send(1, Chan.Open())
    assert isinstance(await c.method(), Chan.OpenOk)
    # A content header of another class: connection.close 505.
    c.raw(_publish_frames(1, qname, b"x", class_id=61))
    await c.expect_connection_close(505)
    # A body larger than its header announced: connection.close 501.
    c = await RawClient.open(port)
    c.send(1, Chan.Open())
    assert isinstance(await c.method(), Chan.OpenOk)
    c.raw(_publish_frames(1, qname, b"0123456789", size=4))
    m = await c.expect_connection_close(501)
    assert "larger than its header" in m.reply_text
    # What was confirmed is there, in order; nothing else is.
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    try:
        ch = await conn.channel()
        q = await ch.get_queue(qname, ensure=False)
        got = []
        while (msg := await q.get(timeout=5, fail=False)) is not None:
            got.append(msg.body)
            await msg.ack()
        assert got == [b"m%d" % i for i in range(5)]
    finally:
        await conn.close()
    await _healthy(server)
