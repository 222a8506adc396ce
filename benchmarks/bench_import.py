"""`import machine_nb` in a fresh process: wall time, and which heavy libraries it pulls in.

Target: under 0.5 s. Measures `python -c "import machine_nb"` against `python -c pass`
(the interpreter's own start-up) 7 times each and reports the medians; then checks in one more
fresh process that pandas, torch, transformers, tinker and tinker_cookbook were not imported.
Run: .venv/bin/python benchmarks/bench_import.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

HEAVY = ["pandas", "numpy", "torch", "transformers", "tinker", "tinker_cookbook", "orjson", "matplotlib"]


def wall(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t


def main() -> int:
    wall("import machine_nb")  # warm the file cache
    base = statistics.median(wall("pass") for _ in range(7))
    full = statistics.median(wall("import machine_nb") for _ in range(7))
    probe = ("import sys, json, time; t = time.perf_counter(); import machine_nb; "
             f"d = time.perf_counter() - t; print(json.dumps([d, [m for m in {HEAVY!r} if m in sys.modules]]))")
    inside, loaded = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                               text=True).stdout)
    print(f"python -c pass                : {base:.3f} s (median of 7)")
    print(f"python -c 'import machine_nb' : {full:.3f} s (median of 7; target < 0.5 s)")
    print(f"import itself (in-process)    : {inside * 1000:.1f} ms")
    print(f"heavy modules loaded          : {loaded or 'none'}")
    return 0 if full < 0.5 and not loaded else 1


if __name__ == "__main__":
    sys.exit(main())
