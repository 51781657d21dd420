"""db.json_dumps (the json/jsonb parameter encoder) writes what json.dumps writes, or fails alike."""
from __future__ import annotations

import datetime as dt
import decimal
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fluxpg.db import json_dumps

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2 ** 63, max_value=2 ** 80),
                    st.floats(), st.text(), st.sampled_from(["é", "\u2028", "\x00", "\"\\", "\ud800"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=20)
odd = st.one_of(st.builds(decimal.Decimal, st.integers()), st.just(dt.datetime(2026, 1, 1)), st.just(b"x"),
                st.just((1, 2)), st.just({1: "int key"}), st.just({None: 1, True: 2, 1.5: 3}), st.just({(1,): 2}))


def _both(v):
    def run(f):
        try:
            return f(v)
        except Exception as exc:  # noqa: BLE001 - both must fail alike
            return (type(exc), str(exc))
    return run(json.dumps), run(json_dumps)


@settings(max_examples=500, deadline=None)
@given(values)
def test_same_text_as_json_dumps(v):
    a, b = _both(v)
    assert a == b


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.one_of(odd, values), max_size=4))
def test_same_errors_and_odd_keys(v):
    a, b = _both(v)
    assert a == b


def test_cycles_and_depth_fail_as_json_dumps_does():
    d: dict = {}
    d["self"] = d
    assert _both(d)[0] == _both(d)[1] and _both(d)[1][0] is ValueError
    deep: list = []
    for _ in range(100000):
        deep = [deep]
    a, b = _both(deep)
    assert a[0] is b[0] is RecursionError


# --- db.json_loads (the json/jsonb column decoder): json.loads' value or error ---------------------

from fluxpg.db import json_loads  # noqa: E402


def _loads_both(text):
    def run(f):
        try:
            v = f(text)
        except Exception as exc:  # noqa: BLE001 - both must fail alike
            return (type(exc), str(exc))
        return (json.dumps(v, sort_keys=False), repr(v))   # NaN != NaN: compare text and repr
    return run(json.loads), run(json_loads)


@settings(max_examples=500, deadline=None)
@given(values, st.sampled_from(["", " ", "\n", "\ufeff", "x", ",", " 1"]), st.sampled_from(["", " ", "\t\n"]),
       st.data())
def test_loads_like_json_loads(v, tail, head, data):
    try:
        text = json.dumps(v)
    except Exception:  # noqa: BLE001
        return
    for t in (text, head + text, text + tail, text[:data.draw(st.integers(0, len(text)))]):
        a, b = _loads_both(t)
        assert a == b, t
