"""Hypothesis strategies for MQTT topic filters and topics/routing keys, shared by the pure tests
(TopicTree vs brute force) and the SQL ones (fluxpg.filter_regex vs the Python matcher)."""
from __future__ import annotations

from hypothesis import strategies as st

# Levels drawn from a small alphabet so that generated filters and keys actually collide, with
# the regex metacharacters and `$` in the mix.
literal_levels = st.sampled_from(["a", "b", "", "$x", "a.b", "(", "[x]", "\\", "^", "*?", "{1}", "é", "a\nb", " "])
filter_levels = st.one_of(literal_levels, st.just("+"))


@st.composite
def topic_filters(draw):
    levels = draw(st.lists(filter_levels, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    joined = "/".join(levels)
    # A lone empty level is the empty string, which is not a valid filter.
    return joined or "+"


topics = st.lists(literal_levels, min_size=1, max_size=5).map("/".join)
