"""Peak memory of validating a 100,000-row chat JSONL file with the Inkling renderer (every row
rendered: shape, renderer, length, histogram and secret checks), against the file's size.

Each measurement runs in a fresh subprocess so ru_maxrss (peak resident set) belongs to it alone:
"baseline" loads the same imports and renderer and validates a 10-row file, "validate" the big file;
the difference is what validation itself costs. tracemalloc is run on a separate, shape-only pass
(model=None) to show the Python-heap peak without the renderer's native allocations.

Run: .venv/bin/python benchmarks/bench_validate_memory.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = "thinkingmachines/Inkling-Small"

CHILD = r"""
import json, os, resource, sys, time, tracemalloc
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["MACHINE_NB_PROGRESS"] = "0"
import torch; torch.set_num_threads(1)
from machine_nb.checks.validate import validate
path, model, trace = sys.argv[1], (None if sys.argv[2] == "none" else sys.argv[2]), sys.argv[3] == "1"
validate(sys.argv[4], model)  # imports (and renderer) first, as the baseline does
if trace: tracemalloc.start()
t0 = time.perf_counter()
r = validate(path, model, progress=False)
wall = time.perf_counter() - t0
peak_heap = tracemalloc.get_traced_memory()[1] if trace else None
print(json.dumps({"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "wall": wall, "heap": peak_heap,
                  "rows": r.summary["rows"], "errors": r.summary["errors"], "tokens": r.summary["tokens"],
                  "findings": len(r.findings), "hist": r.summary["histogram"]}))
"""


def make_file(path: Path, rows: int, seed: int = 0) -> None:
    """Rows like real training lines; every 1,000th has a problem (bad role / no target) to exercise findings."""
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(rows):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            msgs = [{"role": "system", "content": "You are terse. " * rng.randint(0, 20)},
                    {"role": "user", "content": f"What is {a} plus {b}? "
                     + "Please think. " * (rng.randint(0, 60) * (40 if i % 50 == 0 else 1))},
                    {"role": "assistant", "content": f"answer: {a + b}"}]
            if i % 1000 == 999:
                msgs[1]["role"] = "human" if i % 2000 == 999 else "user"
                msgs = msgs[:2] if i % 2000 != 999 else msgs
            fh.write(json.dumps({"messages": msgs}) + "\n")


def run(path: Path, model: str, small: Path, trace: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), model, "1" if trace else "0", str(small)],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "big.jsonl", Path(tmp) / "small.jsonl"
        make_file(big, args.rows)
        make_file(small, 10, seed=1)
        size = big.stat().st_size
        base = run(small, MODEL, small)
        full = run(big, MODEL, small)
        shape = run(big, "none", small, trace=True)
    mb = 1 / 1024
    print(f"file: {args.rows:,} rows, {size / 2**20:.1f} MiB")
    print(f"model: {MODEL} (every row rendered with its tinker-cookbook renderer), torch threads 1")
    print(f"baseline (imports + renderer + 10-row file): peak RSS {base['rss_kb'] * mb:.1f} MiB")
    print(f"validate {args.rows:,} rows: peak RSS {full['rss_kb'] * mb:.1f} MiB "
          f"({(full['rss_kb'] - base['rss_kb']) * mb:+.1f} MiB vs baseline, file is {size / 2**20:.1f} MiB); "
          f"wall {full['wall']:.1f} s ({args.rows / full['wall']:,.0f} rows/s)")
    print(f"  rows {full['rows']:,}, tokens {full['tokens']:,}, errors {full['errors']}, findings listed {full['findings']}, "
          f"histogram {full['hist']}")
    print(f"shape-only pass (model=None) Python-heap peak (tracemalloc): {shape['heap'] / 2**20:.2f} MiB; "
          f"peak RSS {shape['rss_kb'] * mb:.1f} MiB")


if __name__ == "__main__":
    main()
