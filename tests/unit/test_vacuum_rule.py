"""Which of fluxpg's tables the broker vacuums (fluxpg.queues.vacuum.due): pure arithmetic."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fluxpg.queues.vacuum import DEAD_MIN, DEAD_SCALE, due


def test_dead_rows_past_the_floor_and_a_share_of_the_live_ones():
    stats = [("fluxpg.outbox", DEAD_MIN + 1, 0), ("fluxpg.pending", DEAD_MIN + 1, 100_000),
             ("fluxpg.cursors", DEAD_MIN, 0), ("fluxpg.outbox_commits", 5 * DEAD_MIN, 10)]
    # pending: 1,001 dead of 100,000 live is not yet a fifth; most dead rows first.
    assert due(stats, {}) == ["fluxpg.outbox_commits", "fluxpg.outbox"]


def test_what_the_last_vacuum_could_not_remove_does_not_count_again():
    # An open transaction kept 4,000 dead rows: only as many again on top make the table due.
    assert due([("fluxpg.outbox", 4000, 0)], {"fluxpg.outbox": 4000}) == []
    assert due([("fluxpg.outbox", 4000 + DEAD_MIN + 1, 0)], {"fluxpg.outbox": 4000}) == ["fluxpg.outbox"]


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 10**7), st.integers(-1, 10**7)),
                unique_by=lambda t: t[0]),
       st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 10**7)))
def test_a_table_is_due_exactly_when_its_new_dead_rows_pass_the_threshold(stats, floors):
    chosen = due(stats, floors)
    for table, dead, live in stats:
        assert (table in chosen) == (dead - floors.get(table, 0) > DEAD_MIN + DEAD_SCALE * max(live, 0))
    dead_of = {t: d for t, d, _ in stats}
    assert [dead_of[t] for t in chosen] == sorted((dead_of[t] for t in chosen), reverse=True)
