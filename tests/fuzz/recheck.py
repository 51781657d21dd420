"""Re-measure inputs a fuzz run flagged as slow, without instrumentation:

    python -m tests.fuzz.recheck amqp10 /tmp/fluxpg-fuzz/amqp10-slow

Prints each input's CPU time (min of several runs) and the ones over the 5 ms bound; exit
status 1 when any is.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tests.fuzz import targets


def main() -> int:
    name, directory = sys.argv[1], Path(sys.argv[2])
    files = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    over = []
    worst = 0.0
    for path in files:
        data = path.read_bytes()
        best = min(targets.run_once(name, data) for _ in range(5))
        worst = max(worst, best)
        if best > targets.MAX_SECONDS and len(data) <= targets.MAX_INPUT:
            over.append((path.name, best, data))
    print(f"{name}: {len(files)} inputs flagged while instrumented; slowest uninstrumented "
          f"{worst * 1000:.2f} ms; over {targets.MAX_SECONDS * 1000:.0f} ms: {len(over)}")
    for file_name, best, data in over:
        print(f"  {file_name}: {best * 1000:.2f} ms, {len(data)} bytes: {data[:120]!r}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
