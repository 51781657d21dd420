"""connection._ReadDeadline: asyncio.timeout for a connection's reads with one timer."""
from __future__ import annotations

import asyncio

import pytest

from fluxpg.protocols.amqp091.connection import _ReadDeadline


async def _read(watch: _ReadDeadline, timeout, fut) -> str:
    watch.arm(timeout)
    try:
        await fut
        return "data"
    except asyncio.CancelledError:
        if not watch.expired():
            raise
        return "timeout"
    finally:
        watch.reading = False


async def test_deadline_cancels_only_the_read_it_belongs_to():
    loop = asyncio.get_running_loop()

    async def conn():
        watch = _ReadDeadline(loop)
        out = []
        for _ in range(5):   # each read within its 0.2 s: the timer moves on, never fires a read
            f = loop.create_future()
            loop.call_later(0.05, f.set_result, b"x")
            out.append(await _read(watch, 0.2, f))
        f = loop.create_future()
        t0 = loop.time()
        out.append(await _read(watch, 0.1, f))          # nothing comes: timeout after ~0.1 s
        took = loop.time() - t0
        watch.arm(0.05)                                  # a shorter deadline than the timer's
        watch.reading = False                            # not reading when it fires: nothing happens
        await asyncio.sleep(0.1)
        f = loop.create_future()
        loop.call_later(0.02, f.set_result, b"x")
        out.append(await _read(watch, None, f))          # no deadline
        watch.close()
        return out, took

    out, took = await asyncio.wait_for(asyncio.create_task(conn()), 5)
    assert out == ["data"] * 5 + ["timeout", "data"]
    assert 0.08 <= took < 1.0


async def test_another_cancellation_is_not_taken_for_the_deadline():
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    async def conn():
        watch = _ReadDeadline(loop)
        started.set()
        return await _read(watch, 30.0, loop.create_future())

    task = asyncio.create_task(conn())
    await started.wait()
    await asyncio.sleep(0.01)
    task.cancel()                                        # e.g. server shutdown
    with pytest.raises(asyncio.CancelledError):
        await task
