"""The group commit holds a pipelining producer's next batch for more rows (LINGER), never a
publisher that waits for each confirm."""
from __future__ import annotations

import asyncio

import pytest

from fluxpg.queues import appender as appender_mod
from fluxpg.queues.appender import Appender, AppendRow


class _Conn:
    def __init__(self, log: list):
        self.log = log
        self.seq = 0

    def is_closed(self) -> bool:
        return False

    async def fetch(self, _query, queue_ids, *_args):
        await asyncio.sleep(0.005)   # a round trip (longer than the trickle below: it arrives during commits)
        self.log.append((asyncio.get_running_loop().time(), len(queue_ids)))
        out = []
        for i, qid in enumerate(queue_ids):
            self.seq += 1
            out.append({"ord": i + 1, "queue_id": qid, "partition": 0, "seq": self.seq})
        return out


class _Pool:
    def __init__(self):
        self.log: list = []
        self.conn = _Conn(self.log)

    async def acquire(self):
        return self.conn

    async def release(self, _conn):
        return None


def _row(i: int) -> list[AppendRow]:
    return [AppendRow(1, "$queue/q", b"m%d" % i, None)]


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(appender_mod, "queries", lambda: {"append_batch": "append_batch"})
    return _Pool()


async def test_one_at_a_time_is_never_held(pool, monkeypatch):
    monkeypatch.setattr(appender_mod, "LINGER", 5.0)
    a = Appender(pool)
    a.start()
    loop = asyncio.get_running_loop()
    for i in range(5):
        t0 = loop.time()
        assert (await a.submit(_row(i)))[0][2] == i + 1
        assert loop.time() - t0 < 1.0
    await a.close()
    assert [n for _t, n in pool.log] == [1] * 5


async def test_a_stream_is_gathered_in_order(pool, monkeypatch):
    monkeypatch.setattr(appender_mod, "LINGER", 0.5)
    monkeypatch.setattr(appender_mod, "LINGER_ROWS", 20)
    a = Appender(pool)
    a.start()
    futs = [a.submit(_row(i)) for i in range(appender_mod.STREAM_ROWS)]   # one batch of STREAM_ROWS
    await asyncio.sleep(0)
    for i in range(60):              # then a trickle while it commits: held until 20 wait (or LINGER)
        futs.append(a.submit(_row(100 + i)))
        await asyncio.sleep(0.002)   # (uvloop's timers count whole milliseconds)
    results = await asyncio.wait_for(asyncio.gather(*futs), 3)
    seqs = [r[0][2] for r in results]
    assert seqs == list(range(1, len(futs) + 1))            # offsets in submit order
    sizes = [n for _t, n in pool.log]
    assert sizes[0] == appender_mod.STREAM_ROWS and sum(sizes) == len(futs)
    assert len(sizes) >= 3 and all(n >= 20 for n in sizes[1:-1]), sizes   # the tail: after LINGER
    await a.close()


async def _after_a_stream_batch(pool, monkeypatch, linger: float):
    """An appender with LINGER = linger whose first batch (STREAM_ROWS rows, returned) is taken:
    the next publish is held."""
    monkeypatch.setattr(appender_mod, "LINGER", linger)
    a = Appender(pool)
    a.start()
    first = [a.submit(_row(i)) for i in range(appender_mod.STREAM_ROWS)]
    await asyncio.sleep(0)                                  # taken: that batch commits now
    return a, first


async def test_a_stream_tail_waits_at_most_linger(pool, monkeypatch):
    # LINGER 0.5 s, so that "not held" (well under it) cannot be confused with a pause of the
    # machine or the collector (a 35 ms one would have failed the 40 ms bound of a 50 ms LINGER).
    a, first = await _after_a_stream_batch(pool, monkeypatch, 0.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    fut = a.submit(_row(99))                                # held (the batch before was a stream) ...
    await asyncio.wait_for(fut, 5)
    assert 0.45 <= loop.time() - t0 < 5.0                   # ... for LINGER, not longer
    assert all(f.done() for f in first)
    t0 = loop.time()
    await a.submit(_row(100))                               # the queue ran dry since: not held
    assert loop.time() - t0 < 0.4
    await a.close()


async def test_close_ends_a_linger(pool, monkeypatch):
    a, first = await _after_a_stream_batch(pool, monkeypatch, 30.0)
    fut = a.submit(_row(99))
    await asyncio.sleep(0.01)                               # held: LINGER is 30 s
    assert all(f.done() for f in first) and not fut.done()
    await asyncio.wait_for(a.close(), 2)
    assert fut.done() and fut.result()[0][2] == appender_mod.STREAM_ROWS + 1
