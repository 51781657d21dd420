"""Long, coverage-guided fuzzing of one decoder with atheris (libFuzzer), when it is installed
(`pip install atheris`; CI runs the quick hypothesis harness in test_fuzz.py instead).

    python -m tests.fuzz.run_atheris mqtt -max_total_time=600 [libFuzzer options…]

Seeds are the decoder's corpus (tests/fuzz/corpus/<decoder>/); new coverage goes to a scratch
directory (FLUXPG_FUZZ_WORKDIR, default /tmp/fluxpg-fuzz/<decoder>), not the repository. An input
that raises anything but the codec's own errors stops the run: libFuzzer writes it as
crash-<sha1> (see -artifact_prefix) — copy it into the corpus with the fix. An input over 5 ms
(under 1 KiB) is kept in <workdir>-slow/ and the run goes on, because instrumented code is
several times slower than the real thing; at the end those candidates are re-measured without
instrumentation (tests/fuzz/recheck.py) and the ones still slow are listed.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from tests.fuzz import targets

CORPUS = Path(__file__).parent / "corpus"


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.run_atheris {{{','.join(targets.TARGETS)}}} [libFuzzer options]")
    name = sys.argv[1]
    work = Path(os.environ.get("FLUXPG_FUZZ_WORKDIR", f"/tmp/fluxpg-fuzz/{name}"))
    work.mkdir(parents=True, exist_ok=True)
    for seed in (CORPUS / name).iterdir():
        shutil.copy(seed, work / seed.name)
    stats = {"inputs": 0, "slowest": 0.0, "slowest_input": b"", "started": time.monotonic()}

    slow_dir = work.parent / f"{work.name}-slow"
    slow_dir.mkdir(exist_ok=True)

    def one_input(data: bytes) -> None:
        seconds = targets.run_once(name, data)
        if seconds > targets.MAX_SECONDS and len(data) <= targets.MAX_INPUT:
            # Instrumented code runs several times slower than the broker's: keep the input
            # and re-measure it uninstrumented at the end instead of stopping here.
            (slow_dir / hashlib.sha1(data).hexdigest()).write_bytes(data)
        stats["inputs"] += 1
        if seconds > stats["slowest"]:
            stats["slowest"], stats["slowest_input"] = seconds, data

    def summary() -> None:
        print(f"\n{name}: {stats['inputs']} inputs in {time.monotonic() - stats['started']:.0f}s; slowest "
              f"(instrumented) {stats['slowest'] * 1000:.2f} ms ({len(stats['slowest_input'])} bytes)", flush=True)
        # The candidates, re-measured in a fresh uninstrumented interpreter: those still over
        # the bound are real findings.
        subprocess.run([sys.executable, "-m", "tests.fuzz.recheck", name, str(slow_dir)], check=False)

    atexit.register(summary)   # (libFuzzer may end the process without atexit: run recheck.py then)
    args = [sys.argv[0], *sys.argv[2:], f"-max_len={targets.MAX_INPUT}", str(work)]
    atheris.Setup(args, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
