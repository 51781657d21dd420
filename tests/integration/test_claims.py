"""How a node's classic consumers of one group claim: one claim in flight per (queue, group) on a
node, and no claim on a wake-up when a claim of the group since that wake-up came back short
(nothing was committed after it). Real PostgreSQL, real queue managers; the claims are counted
by wrapping fluxpg.queues.classic.claim."""
from __future__ import annotations

import asyncio

from fluxpg.config import QueueConfig
from fluxpg.queues import classic
from fluxpg.queues import manager as manager_module


class Claims:
    """Wraps classic.claim: counts calls, what they returned, and the most in flight at once."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self.empty = 0
        self.in_flight = 0
        self.most_in_flight = 0
        real = classic.claim

        async def claim(*args, **kwargs):
            self.calls += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                got = await real(*args, **kwargs)
            finally:
                self.in_flight -= 1
            self.empty += not got
            return got

        monkeypatch.setattr(classic, "claim", claim)


async def parked(mgr, queue_id: int, subscriptions: int) -> None:
    """Until every subscription waits for the queue's next wake-up (the event's waiters)."""
    for _ in range(1000):
        ev = mgr._wakers.get(queue_id)
        if ev is not None and len(ev._waiters) == subscriptions:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the subscriptions never went back to waiting for a wake-up")


async def test_a_nodes_consumers_of_one_group_claim_one_at_a_time(manager_factory, qname, monkeypatch):
    claims = Claims(monkeypatch)
    mgr = await manager_factory([QueueConfig(name=qname)])
    await mgr.publish_many([(f"$queue/{qname}/k", b"%d" % i, None) for i in range(600)])
    got: list[int] = []
    subs = []

    def consumer(name):
        async def on_delivery(d):
            got.append(d.seq)
            await mgr.ack(qname, d.group, [d.seq])
            subs[name].grant(1)
        return on_delivery

    for i in range(4):
        subs.append(await mgr.subscribe(qname, "g", f"c{i}", on_delivery=consumer(i), credit=20))
    for _ in range(1000):
        if len(got) == 600:
            break
        await asyncio.sleep(0.02)
    assert sorted(got) == list(range(600))          # each message once
    assert claims.most_in_flight == 1               # 4 consumers, one claim at a time
    assert claims.calls >= 600 / 20                 # credit still bounds each claim


async def test_a_wake_up_makes_one_claim_on_a_node_not_one_per_consumer(manager_factory, qname, monkeypatch):
    """Four idle consumers of one group; each publish wakes all four. Before, each claimed, three
    of them for nothing (with the appender's handoff claiming for one of them in the publish's
    transaction, all three others). Now the first claim (or the handoff) comes back short and the
    others see that nothing was committed since the wake-up: no empty claims."""
    monkeypatch.setattr(manager_module, "CLASSIC_POLL", 3600.0)   # only NOTIFYs wake them here
    claims = Claims(monkeypatch)
    mgr = await manager_factory([QueueConfig(name=qname)])
    qid = mgr.queue_info(qname).id
    got: list[int] = []
    for i in range(4):
        await mgr.subscribe(qname, "g", f"c{i}", on_delivery=lambda d: got.append(d.seq), credit=100)
    await parked(mgr, qid, 4)
    start = claims.empty            # each consumer's first claim
    for i in range(10):
        await mgr.publish(f"$queue/{qname}/k", b"%d" % i)
        for _ in range(1000):
            if len(got) == i + 1:
                break
            await asyncio.sleep(0.01)
        await parked(mgr, qid, 4)
    assert got == list(range(10))
    assert claims.empty - start == 0      # three or four per publish before
    # A second group on the same node claims for itself: its consumers are not skipped.
    other: list[int] = []
    await mgr.subscribe(qname, "h", "d0", on_delivery=lambda d: other.append(d.seq), credit=100)
    for _ in range(1000):
        if len(other) == 10:
            break
        await asyncio.sleep(0.01)
    assert other == list(range(10))


async def test_a_skipped_consumer_still_gets_what_is_published_after(manager_factory, qname, monkeypatch):
    """The skip must never strand a message: a consumer whose credit ran out while another drained
    the group claims again on the next wake-up."""
    monkeypatch.setattr(manager_module, "CLASSIC_POLL", 3600.0)
    mgr = await manager_factory([QueueConfig(name=qname)])
    qid = mgr.queue_info(qname).id
    a: list[int] = []
    b: list[int] = []
    sub_a = await mgr.subscribe(qname, "g", "a", on_delivery=lambda d: a.append(d.seq), credit=1)
    await mgr.subscribe(qname, "g", "b", on_delivery=lambda d: b.append(d.seq), credit=100)
    await parked(mgr, qid, 2)
    await mgr.publish_many([(f"$queue/{qname}/k", b"%d" % i, None) for i in range(5)])
    for _ in range(1000):
        if len(a) + len(b) == 5:
            break
        await asyncio.sleep(0.01)
    assert sorted(a + b) == list(range(5))
    await mgr.ack(qname, "g", a)
    sub_a.grant(len(a))                 # credit back: nothing new was committed, so no claim yet
    await mgr.publish(f"$queue/{qname}/k", b"5")
    for _ in range(1000):
        if len(a) + len(b) == 6:
            break
        await asyncio.sleep(0.01)
    assert sorted(a + b) == list(range(6))
