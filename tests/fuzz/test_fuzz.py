"""Fuzzing every decoder on every CI run, for a bounded time (hypothesis; targets.py says what
each target covers and what it may raise).

- The corpus (tests/fuzz/corpus/<decoder>/: seeds plus every input that ever crashed or stalled
  a decoder) is replayed first: each must raise only the codec's own errors and take ≤ 5 ms.
- Then hypothesis generates inputs — random bytes, and corpus inputs with bytes flipped,
  inserted, deleted and spliced — for FLUXPG_FUZZ_SECONDS seconds per decoder (default 3; set
  it to 600 for the long run the security issue asks for, or use run_atheris.py for a
  coverage-guided run). FLUXPG_FUZZ_SEED fixes the random seed (printed on failure).

A failing input is printed; add it to the corpus (file name `crash-…` or `slow-…`) with the fix.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.fuzz import targets

CORPUS = Path(__file__).parent / "corpus"
SECONDS = float(os.environ.get("FLUXPG_FUZZ_SECONDS", "3"))
NAMES = sorted(targets.TARGETS)


def corpus(name: str) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted((CORPUS / name).iterdir()) if p.is_file()]


@pytest.mark.parametrize("name", NAMES)
def test_corpus(name):
    inputs = corpus(name)
    assert inputs, f"no corpus for {name}"
    for file_name, data in inputs:
        try:
            targets.timed(name, data)
        except targets.SlowInput as exc:
            pytest.fail(f"corpus file {file_name}: {exc}")


@st.composite
def mutated(draw, seeds: list[bytes]):
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(("flip", "set", "insert", "delete", "splice", "int")))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and data:
            del data[pos:pos + draw(st.integers(1, 16))]
        elif op == "splice":
            other = draw(st.sampled_from(seeds))
            start = draw(st.integers(0, len(other)))
            data[pos:] = other[start:]
        elif op == "int" and len(data) >= 4:
            # lengths and counts are where decoders go wrong: put an extreme one somewhere
            value = draw(st.sampled_from((0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF)))
            width = draw(st.sampled_from((1, 2, 4)))
            data[pos:pos + width] = value.to_bytes(4, "big")[-width:]
    # the first byte selects the target's mode: keep both modes reachable
    return bytes(data[:targets.MAX_INPUT])


@pytest.mark.parametrize("name", NAMES)
def test_fuzz(name):
    seeds = [data for _, data in corpus(name)]
    inputs = st.one_of(st.binary(max_size=targets.MAX_INPUT), mutated(seeds))
    run_seed = int(os.environ.get("FLUXPG_FUZZ_SEED", random.randrange(2 ** 32)))
    rng = random.Random(run_seed)
    stats = {"inputs": 0, "slowest": 0.0}

    def check(data: bytes) -> None:
        stats["inputs"] += 1
        stats["slowest"] = max(stats["slowest"], targets.timed(name, data))

    deadline = time.monotonic() + SECONDS
    rounds = 0
    while time.monotonic() < deadline or rounds == 0:
        rounds += 1
        # Rounds of a few hundred examples, each with its own seed, until the time is up
        # (hypothesis has no time budget of its own).
        test = seed(rng.randrange(2 ** 32))(settings(
            max_examples=200, deadline=None, database=None, derandomize=False,
            phases=(Phase.generate, Phase.shrink), print_blob=True,
            suppress_health_check=list(HealthCheck))(given(inputs)(check)))
        try:
            test()
        except Exception as exc:
            raise AssertionError(f"{name}: fuzz run (FLUXPG_FUZZ_SEED={run_seed}) failed: {exc}") from exc
    print(f"{name}: {stats['inputs']} inputs in {SECONDS:g}s, slowest {stats['slowest'] * 1000:.2f} ms")
