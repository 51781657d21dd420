"""Property-based test of the classic claim/ack state machine against a simple in-memory model.

Random sequences of publish / claim / ack / nack / reject run against the real SQL functions and
against the model; after every step the pending list, cursor, committed offset and dead-letter
queue must agree. Nacks and releases requeue at once (no retry.nack_backoff) and come back
lowest offset first, the visibility timeout is an hour (nothing times out during a run),
max_retries is 2 (the third delivery is the last).
"""
from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fluxpg import db

MAX_DELIVERIES = 3     # 1 + max_retries
CONSUMERS = ["a", "b", "c"]


class ClassicModel:
    def __init__(self):
        self.log: list[str] = []           # routing key per offset
        self.cursor = 0
        self.pending: dict[int, dict] = {}  # seq → {consumer, count, due}
        self.dead: list[tuple[int, str]] = []
        self.clock = 0                      # orders nacks (due time)


class ClassicMachine(RuleBasedStateMachine):
    loop: asyncio.AbstractEventLoop
    dsn: str

    def __init__(self):
        super().__init__()
        self.conn = self.run(db.connect(self.dsn))
        self.queue = "prop_" + uuid.uuid4().hex[:10]
        self.group = "g@keep/#"             # filter: only routing keys under keep/ are delivered
        self.run(self.conn.fetchval(
            "SELECT fluxpg.declare_queue($1, 'classic', NULL, $2)", self.queue,
            {"retry": {"max_retries": MAX_DELIVERIES - 1, "initial_backoff": "0s", "max_backoff": "0s"},
             "delivery": {"visibility_timeout": "1h"}, "limits": {"message_ttl": "0", "max_depth": 0}}))
        self.run(self.conn.execute("SELECT fluxpg._group(fluxpg._queue($1), $2)", self.queue, self.group))
        self.model = ClassicModel()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self):
        self.run(self.conn.close())

    @rule(keys=st.lists(st.sampled_from(["keep/a", "keep/b/c", "drop", "keep"]), min_size=1, max_size=6))
    def publish(self, keys):
        qid = self.run(self.conn.fetchval("SELECT id FROM fluxpg.queues WHERE name = $1", self.queue))
        self.run(self.conn.fetch("SELECT * FROM fluxpg.append_batch($1, $2, $3)", [qid] * len(keys),
                                 [f"$queue/{self.queue}/{k}" for k in keys], [b"x"] * len(keys)))
        self.model.log += keys

    @rule(consumer=st.sampled_from(CONSUMERS), n=st.integers(1, 5))
    def claim(self, consumer, n):
        rows = self.run(self.conn.fetch("SELECT seq, delivery_count FROM fluxpg.claim($1, $2, $3, $4)",
                                        self.queue, self.group, consumer, n))
        got = [(r["seq"], r["delivery_count"]) for r in rows]
        m = self.model
        # Redeliveries first: the n lowest due (nacked or released) entries, in offset order (the
        # original order); those already delivered MAX_DELIVERIES times are dead-lettered
        # instead, the rest are delivered again.
        due = sorted((seq, seq) for seq, e in m.pending.items() if e["due"] is not None)[:n]
        expected = []
        for seq in sorted(seq for _, seq in due):
            entry = m.pending[seq]
            if entry["count"] >= MAX_DELIVERIES:
                m.dead.append((seq, "max-deliveries"))
                del m.pending[seq]
            else:
                entry.update(consumer=consumer, count=entry["count"] + 1, due=None)
                expected.append((seq, entry["count"]))
        # Then new messages from the cursor, skipping those the filter does not match.
        while len(expected) < n and m.cursor < len(m.log):
            seq = m.cursor
            m.cursor += 1
            if m.log[seq] == "keep" or m.log[seq].startswith("keep/"):
                m.pending[seq] = {"consumer": consumer, "count": 1, "due": None}
                expected.append((seq, 1))
        if len(expected) < n:
            m.cursor = len(m.log)           # the scan reached the head
        assert got == expected

    @precondition(lambda self: self.model.pending)
    @rule(data=st.data())
    def ack(self, data):
        seq = data.draw(st.sampled_from(sorted(self.model.pending)))
        assert self.run(self.conn.fetchval("SELECT fluxpg.ack($1, $2, $3)", self.queue, self.group, [seq])) == 1
        del self.model.pending[seq]

    @rule(seq=st.integers(0, 40))
    def ack_unknown(self, seq):
        expected = 1 if seq in self.model.pending else 0
        assert self.run(self.conn.fetchval("SELECT fluxpg.ack($1, $2, $3)", self.queue, self.group, [seq])) == expected
        self.model.pending.pop(seq, None)

    @precondition(lambda self: self.model.pending)
    @rule(data=st.data())
    def nack(self, data):
        seq = data.draw(st.sampled_from(sorted(self.model.pending)))
        self.run(self.conn.fetchval("SELECT fluxpg.nack($1, $2, $3)", self.queue, self.group, [seq]))
        entry = self.model.pending[seq]
        if entry["count"] >= MAX_DELIVERIES:
            self.model.dead.append((seq, "max-deliveries"))
            del self.model.pending[seq]
        else:
            self.model.clock += 1
            entry["due"] = self.model.clock

    @precondition(lambda self: self.model.pending)
    @rule(data=st.data())
    def release(self, data):
        # A consumer went away: requeued now, delivery count kept, no dead-lettering here.
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.model.pending)), min_size=1, unique=True))
        assert self.run(self.conn.fetchval("SELECT fluxpg.release($1, $2, $3)", self.queue, self.group,
                                           seqs)) == len(seqs)
        for seq in seqs:
            self.model.clock += 1
            self.model.pending[seq]["due"] = self.model.clock

    @precondition(lambda self: self.model.pending)
    @rule(data=st.data())
    def reject(self, data):
        seq = data.draw(st.sampled_from(sorted(self.model.pending)))
        self.run(self.conn.fetchval("SELECT fluxpg.reject($1, $2, $3, 'bad')", self.queue, self.group, [seq]))
        del self.model.pending[seq]
        self.model.dead.append((seq, "bad"))

    @invariant()
    def state_agrees(self):
        rows = self.run(self.conn.fetch(
            "SELECT seq, consumer, delivery_count FROM fluxpg.pending_entries WHERE queue = $1 ORDER BY seq",
            self.queue))
        assert [(r["seq"], r["consumer"], r["delivery_count"]) for r in rows] == \
            [(s, e["consumer"], e["count"]) for s, e in sorted(self.model.pending.items())]
        st_row = self.run(self.conn.fetchrow(
            "SELECT cursor, committed FROM fluxpg.group_status WHERE queue = $1", self.queue))
        if st_row is not None:
            committed = min(self.model.pending, default=self.model.cursor)
            assert (st_row["cursor"], st_row["committed"]) == (self.model.cursor, committed)
        dead = self.run(self.conn.fetch(
            "SELECT (headers->>'_dlq_original_offset')::bigint AS original, headers->>'_dlq_reason' AS reason "
            "FROM fluxpg.log l WHERE queue_id = (SELECT id FROM fluxpg.queues WHERE name = $1) ORDER BY l.seq",
            f"$dlq/{self.queue}"))
        assert [(r["original"], r["reason"]) for r in dead] == self.model.dead


def test_classic_state_machine_matches_model(dsn):
    loop = asyncio.new_event_loop()
    ClassicMachine.loop = loop
    ClassicMachine.dsn = dsn
    try:
        from hypothesis.stateful import run_state_machine_as_test

        run_state_machine_as_test(ClassicMachine, settings=settings(
            max_examples=40, stateful_step_count=30, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        loop.close()
