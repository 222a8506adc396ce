"""Concurrent tagging: 4 processes × 500 `tag()` calls into one store, several rounds.

Target: exactly 2,000 intact rows every time: every line parses, ids are unique, and
each writer's 500 rows are all there. Rows carry a ~2 kB answer so that a torn or interleaved
write would show. Run: .venv/bin/python benchmarks/bench_concurrent_tags.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

WRITERS, PER_WRITER = 4, 500


def writer(store: str, k: int, start) -> None:
    import machine_nb as mnb

    start.wait()  # all four begin together
    for i in range(PER_WRITER):
        mnb.tag([{"role": "user", "content": f"writer {k} question {i}"},
                 {"role": "assistant", "content": f"{k}:{i} " + "x" * 2000}], "good", store=store)


def one_round() -> tuple[int, bool, float]:
    with tempfile.TemporaryDirectory() as store:
        ctx = mp.get_context("spawn")
        start = ctx.Event()
        procs = [ctx.Process(target=writer, args=(store, k, start)) for k in range(WRITERS)]
        for p in procs:
            p.start()
        time.sleep(1.0)  # let the interpreters start, so the writes overlap
        t = time.perf_counter()
        start.set()
        for p in procs:
            p.join()
        took = time.perf_counter() - t
        assert all(p.exitcode == 0 for p in procs)
        lines = Path(store, "train.jsonl").read_bytes().split(b"\n")
        assert lines[-1] == b""  # ends with a newline: no half-written last row
        rows = [json.loads(line) for line in lines[:-1]]  # raises on any torn line
        seen = sorted(r["messages"][0]["content"] for r in rows)
        want = sorted(f"writer {k} question {i}" for k in range(WRITERS) for i in range(PER_WRITER))
        intact = (seen == want and len({r["id"] for r in rows}) == len(rows)
                  and all(r["messages"][1]["content"].endswith("x" * 2000) for r in rows))
        return len(rows), intact, took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    ok = True
    for r in range(a.rounds):
        n, intact, took = one_round()
        ok &= n == WRITERS * PER_WRITER and intact
        print(f"round {r + 1}: {n:,} rows, intact={intact}, {took:.1f} s ({n / took:,.0f} tags/s)")
    print("all rounds: exactly 2,000 intact rows" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
