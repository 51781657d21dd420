"""AMQP 0-9-1 consume + ack with acks carried by claims (fluxpg.ack_claim) and credit handed over
in half-window batches (channel.py ACK_DELAY / GRANT_DELAY): every message once and in order,
every ack written — carried, after the delay, when the channel closes or the connection drops,
and when the claim carrying it fails — and never more than the prefetch window outstanding."""
from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from fluxpg.config import QueueConfig
from fluxpg.errors import Unavailable
from fluxpg.queues import classic
from tests.helpers import nothing_pending, pending_count, until


async def _connect(server) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port('amqp091')}/")


async def _publish(server, queue: str, n: int) -> None:
    conn = await _connect(server)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=queue)
                               for i in range(n)))
    finally:
        await conn.close()


async def _consume(conn, queue: str, n: int, prefetch: int, on_each=None) -> tuple[list[str], aio_pika.abc.AbstractChannel]:
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=prefetch)
    q = await ch.get_queue(queue, ensure=False)
    got: list[str] = []
    done = asyncio.Event()

    async def on_message(msg: AbstractIncomingMessage) -> None:
        got.append(msg.body.decode())
        if on_each is None:
            await msg.ack()
        else:
            await on_each(msg)
        if len(got) >= n:
            done.set()

    await q.consume(on_message)
    await asyncio.wait_for(done.wait(), 30)
    return got, ch


async def test_acks_ride_in_claims_each_message_once_in_order(broker, qname, monkeypatch):
    server = await broker([QueueConfig(name=qname)])
    carried: list[int] = []
    real = classic.ack_claim

    async def counting(pool, queue, group, seqs, consumer, n):
        carried.append(len(seqs))
        return await real(pool, queue, group, seqs, consumer, n)

    monkeypatch.setattr(classic, "ack_claim", counting)
    n = 600
    await _publish(server, qname, n)
    conn = await _connect(server)
    try:
        got, _ch = await _consume(conn, qname, n, prefetch=100)
        assert got == [str(i) for i in range(n)]
        # Written within ACK_DELAY at the latest, without closing anything.
        await until(lambda: nothing_pending(server, qname), 3.0)
        assert carried and sum(carried) > 0     # acks went with claims
    finally:
        await conn.close()


async def test_last_acks_written_before_channel_close_ok(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    await _publish(server, qname, 50)
    conn = await _connect(server)
    try:
        got, ch = await _consume(conn, qname, 50, prefetch=100)
        await ch.close()          # at once: the last acks are still waiting for a claim
        assert await pending_count(server, qname) == 0
        again, _ = await _consume_for(conn, qname, 0.5)
        assert again == []        # nothing came back
    finally:
        await conn.close()


async def _consume_for(conn, queue: str, seconds: float) -> tuple[list[str], None]:
    ch = await conn.channel()
    q = await ch.get_queue(queue, ensure=False)
    got: list[str] = []

    async def on_message(msg: AbstractIncomingMessage) -> None:
        got.append(msg.body.decode())
        await msg.ack()

    await q.consume(on_message)
    await asyncio.sleep(seconds)
    await ch.close()
    return got, None


async def test_acks_written_when_the_connection_drops(broker, qname):
    server = await broker([QueueConfig(name=qname)])
    await _publish(server, qname, 80)
    conn = await _connect(server)
    got, _ch = await _consume(conn, qname, 80, prefetch=100)
    await asyncio.sleep(0.01)   # let the last ack leave the client
    # The client's socket goes away without channel.close / connection.close.
    # (aiormq keeps its StreamWriter only in its writer task; found there whatever the loop is,
    # asyncio's or uvloop's, whose transports gc.get_objects() does not list.)
    writer = conn.transport.connection._writer_task.get_coro().cr_frame.f_locals["writer"]
    assert writer.transport.get_extra_info("peername")[1] == server.port("amqp091")
    writer.transport.abort()
    try:
        await asyncio.wait_for(conn.close(), 2)
    except Exception:  # noqa: BLE001 - the socket is gone
        pass
    await until(lambda: nothing_pending(server, qname), 5.0)
    conn2 = await _connect(server)
    try:
        again, _ = await _consume_for(conn2, qname, 0.5)
        assert again == []
    finally:
        await conn2.close()


async def test_acks_of_a_failed_claim_are_written_on_their_own(broker, qname, monkeypatch):
    server = await broker([QueueConfig(name=qname)])
    failures = []
    real = classic.ack_claim

    async def failing_once(pool, queue, group, seqs, consumer, n):
        if not failures:
            failures.append(list(seqs))
            raise Unavailable("injected: the claim carrying acks failed")
        return await real(pool, queue, group, seqs, consumer, n)

    monkeypatch.setattr(classic, "ack_claim", failing_once)
    n = 300
    await _publish(server, qname, n)
    conn = await _connect(server)
    try:
        got, _ch = await _consume(conn, qname, n, prefetch=20)
        assert got == [str(i) for i in range(n)]    # the claim was retried, nothing lost or repeated
        assert failures and failures[0]
        await until(lambda: nothing_pending(server, qname), 3.0)   # the acks it carried were written anyway
    finally:
        await conn.close()


async def test_prefetch_bound_and_no_stall_with_lumped_multiple_acks(broker, qname):
    """A client that acks every third message with multiple=true: credit freed in lumps below
    half the window still reaches the consumer (GRANT_DELAY), never more than prefetch out."""
    server = await broker([QueueConfig(name=qname)])
    n = 90
    await _publish(server, qname, n)
    conn = await _connect(server)
    outstanding = 0
    peak = 0
    try:
        async def ack_every_third(msg: AbstractIncomingMessage) -> None:
            nonlocal outstanding, peak
            outstanding += 1
            peak = max(peak, outstanding)
            if int(msg.body) % 3 == 2:
                await msg.ack(multiple=True)
                outstanding = 0

        got, _ch = await _consume(conn, qname, n, prefetch=10, on_each=ack_every_third)
        assert got == [str(i) for i in range(n)]
        assert peak <= 10
        await until(lambda: nothing_pending(server, qname), 3.0)
    finally:
        await conn.close()
