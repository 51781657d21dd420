"""A node LISTENs on one connection (issue 17): PostgreSQL signals every LISTENing backend of a
database on every NOTIFY, whatever its channel, so each extra LISTEN connection cost a backend
wake-up per committed publish. The queue manager, the console's connection sync and the MQTT
router share the queue manager's connection; channels added later survive its reconnects."""
from __future__ import annotations

import asyncio

from fluxpg import db
from tests.helpers import until


async def _listen_backends(conn) -> set[int]:
    """Backends of this database whose last statement was a LISTEN (what a listener does last)."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND backend_type = 'client backend' AND query LIKE 'LISTEN %'")
    return {r["pid"] for r in rows}


async def test_a_node_with_every_protocol_listens_on_one_connection(broker, conn):
    before = await _listen_backends(conn)
    server = await broker()
    assert server.connection_sync is not None
    assert {"mqtt", "amqp", "amqp091"} <= set(server.listeners)
    assert len(await _listen_backends(conn) - before) == 1
    # ... and that one connection serves the console's fluxpg_close channel too: a close asked
    # for an unknown connection of this node is read (and ignored) without error.
    await conn.execute("SELECT pg_notify('fluxpg_close', $1)", f"{server.manager.node_id}:999999")
    await asyncio.sleep(0.1)


async def test_channels_added_later_are_listened_again_after_a_reconnect(dsn, conn):
    got: list[tuple[str, str | None]] = []
    listener = db.Listener(dsn, {"test_chan_a": lambda p: got.append(("a", p))})
    await listener.start()
    try:
        channels = db.Channels(listener, {"test_chan_b": lambda p: got.append(("b", p))})
        await channels.start()
        await conn.execute("SELECT pg_notify('test_chan_a', '1'), pg_notify('test_chan_b', '2')")
        await until(lambda: ("a", "1") in got and ("b", "2") in got)

        # The connection is lost: both channels hear None (re-check), then notifications again.
        pids = await _listen_backends(conn)
        await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", list(pids))
        await until(lambda: ("a", None) in got and ("b", None) in got)
        await asyncio.wait_for(listener.connected.wait(), 10)
        await conn.execute("SELECT pg_notify('test_chan_b', '3')")
        await until(lambda: ("b", "3") in got)

        # Taken back: no more callbacks for it; the other channel still hears.
        await channels.close()
        await conn.execute("SELECT pg_notify('test_chan_b', '4'), pg_notify('test_chan_a', '5')")
        await until(lambda: ("a", "5") in got)
        assert ("b", "4") not in got
    finally:
        await listener.close()


async def test_a_channel_is_listened_by_one_part_only(dsn):
    listener = db.Listener(dsn, {"test_chan_c": lambda p: None})
    await listener.start()
    try:
        try:
            await listener.listen({"test_chan_c": lambda p: None})
        except ValueError as exc:
            assert "test_chan_c" in str(exc)
        else:
            raise AssertionError("a second callback for one channel was accepted")
    finally:
        await listener.close()
