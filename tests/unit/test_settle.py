"""The one settle path of the front-ends (fluxpg/protocols/settle.py), against a queue manager
that records its calls and answers when the test lets it: batching, ordering, one call in
flight, futures resolved only after their call returned, failures, requeue accounting."""
from __future__ import annotations

import asyncio
import logging

import pytest

from fluxpg.errors import Unavailable
from fluxpg.protocols.settle import Settler


class Manager:
    """Records (verb, queue, group, seqs, partition, reason); each call waits for `gate`."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail: Exception | None = None

    async def _call(self, *call):
        self.calls.append(call)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return len(call[3])
        finally:
            self.in_flight -= 1

    async def ack(self, queue, group, seqs, partition=0):
        return await self._call("ack", queue, group, seqs, partition, None)

    async def nack(self, queue, group, seqs, partition=0):
        return await self._call("nack", queue, group, seqs, partition, None)

    async def release(self, queue, group, seqs, partition=0):
        return await self._call("release", queue, group, seqs, partition, None)

    async def reject(self, queue, group, seqs, reason=None, partition=0):
        return await self._call("reject", queue, group, seqs, partition, reason)


async def test_settlements_arriving_during_a_call_go_together_in_the_next():
    m = Manager()
    s = Settler(m, "test")
    m.gate.clear()
    first = s.submit("ack", "q", "g", 1)
    await asyncio.sleep(0)                       # the first call is in flight, held
    futs = [s.submit("ack", "q", "g", 2), s.submit("reject", "q", "g", 3, reason="bad"),
            s.submit("ack", "q", "g", 4), s.submit("ack", "q", "g@#", 5, partition=0),
            s.submit("nack", "q", "g", 6), s.submit("ack", "q", "g", 7)]
    assert m.calls == [("ack", "q", "g", [1], 0, None)]
    assert not first.done()                       # answered only after its call returned
    m.gate.set()
    assert await first == 1
    assert await asyncio.gather(*futs) == [3, 1, 3, 1, 1, 3]
    # One array per (verb, queue, group, partition, reason), keys in order of first arrival,
    # offsets in arrival order; never two calls at once.
    assert m.calls[1:] == [("ack", "q", "g", [2, 4, 7], 0, None), ("reject", "q", "g", [3], 0, "bad"),
                           ("ack", "q", "g@#", [5], 0, None), ("nack", "q", "g", [6], 0, None)]
    assert m.most_in_flight == 1


async def test_a_failed_call_fails_its_futures_and_is_logged_when_nobody_waits(caplog):
    m = Manager()
    s = Settler(m, "test conn")
    m.fail = Unavailable("database down")
    fut = s.submit("ack", "q", "g", 1)
    with pytest.raises(Unavailable):
        await fut
    assert not caplog.records                     # the caller was told: it answers its client
    with caplog.at_level(logging.WARNING, logger="fluxpg.settle"):
        s.settle("release", "q", "g", 2)
        await s.flush()
    assert "test conn: release of q/g [2] failed: database down" in caplog.text
    m.fail = None
    s.settle("ack", "q", "g", 3)                  # the settler goes on after a failure
    await s.flush()
    assert m.calls[-1] == ("ack", "q", "g", [3], 0, None)


async def test_flush_waits_for_what_arrives_while_it_waits():
    m = Manager()
    s = Settler(m, "test")
    m.gate.clear()
    s.settle("ack", "q", "g", 1)
    flushed = asyncio.ensure_future(s.flush())
    await asyncio.sleep(0)
    s.settle("ack", "q", "g", 2)                  # after flush started
    await asyncio.sleep(0)
    assert not flushed.done()
    m.gate.set()
    await flushed
    assert [c[3] for c in m.calls] == [[1], [2]]
    await s.flush()                               # nothing left: returns at once


async def test_requeues_are_counted_until_written():
    m = Manager()
    s = Settler(m, "test")
    assert s.requeues == 0 and s.requeued.is_set()
    m.gate.clear()
    s.settle("release", "q", "g", 1)
    s.settle("nack", "q", "g", 2)
    s.settle("ack", "q", "g", 3)                   # not a requeue
    assert s.requeues == 2 and not s.requeued.is_set()
    m.gate.set()
    await asyncio.wait_for(s.requeued.wait(), 5)
    assert s.requeues == 0
    m.fail = Unavailable("down")
    s.settle("release", "q", "g", 4)               # a failed requeue is not waited for forever
    await s.flush()
    assert s.requeues == 0 and s.requeued.is_set()


async def test_close_gives_up_after_its_timeout(caplog):
    m = Manager()
    s = Settler(m, "test conn")
    m.gate.clear()
    s.settle("ack", "q", "g", 1)
    with caplog.at_level(logging.WARNING, logger="fluxpg.settle"):
        await s.close(0.05)
    assert "could not apply the last acknowledgements" in caplog.text


def test_unknown_verbs_are_refused():
    s = Settler(Manager(), "test")
    with pytest.raises(ValueError):
        s.settle("commit", "q", "g", 1)


async def test_linger_gathers_fire_and_forget_acks_and_anything_else_ends_it():
    m = Manager()
    s = Settler(m, "test", linger=30.0, linger_max=5)
    for seq in (1, 2):
        s.settle("ack", "q", "g", seq)
    await asyncio.sleep(0.05)
    assert m.calls == []                           # waiting for more (up to `linger`)
    fut = s.submit("ack", "q", "g", 3)             # somebody waits: written at once
    assert await asyncio.wait_for(fut, 5) == 3
    assert m.calls == [("ack", "q", "g", [1, 2, 3], 0, None)]
    s.settle("ack", "q", "g", 4)
    s.settle("release", "q", "g", 5)               # a requeue is not held back either
    await asyncio.wait_for(s.requeued.wait(), 5)
    assert m.calls[1:] == [("ack", "q", "g", [4], 0, None), ("release", "q", "g", [5], 0, None)]
    for seq in range(6, 11):                       # linger_max entries: written without waiting
        s.settle("ack", "q", "g", seq)
    for _ in range(50):
        if len(m.calls) == 4:
            break
        await asyncio.sleep(0.01)
    assert m.calls[3] == ("ack", "q", "g", [6, 7, 8, 9, 10], 0, None)
    s.settle("ack", "q", "g", 11)
    await asyncio.wait_for(s.flush(), 5)           # flush does not wait for the linger
    assert m.calls[4] == ("ack", "q", "g", [11], 0, None)


async def test_linger_ends_after_its_time():
    m = Manager()
    s = Settler(m, "test", linger=0.02)
    s.settle("ack", "q", "g", 1)
    s.settle("ack", "q", "g", 2)
    await asyncio.sleep(0)
    assert m.calls == []
    for _ in range(100):
        if m.calls:
            break
        await asyncio.sleep(0.01)
    assert m.calls == [("ack", "q", "g", [1, 2], 0, None)]
