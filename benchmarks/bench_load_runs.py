"""`load_runs` over 10,000 generated runs (about 100 MB) against bare orjson parsing of the same files.

Target: load_runs within 2x of parsing alone. All read the same files from a warm page cache.
Two floors: parse and discard each file, and parse and keep every record (what a loader that
holds records must hold; collector off, as load_runs runs it). Two loaders: `index=False`
(parse everything, hold the records) and `index=True` with no index yet (parse everything, write
the run index, hold no records; its index is removed before each try). Each is timed 5 times,
interleaved, and the best kept, in wall time and in process CPU time (on a shared machine other
processes only add wall time; CPU time is the steadier figure). Reloads from the index are
measured by bench_run_index.py.
Run: .venv/bin/python benchmarks/bench_load_runs.py [--runs 10000] [--pad 24000] [--dir /tmp/…]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def _read(path: str) -> bytes:
    """A file's bytes through os-level calls (the fastest plain read; load_runs reads so too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, os.fstat(fd).st_size + 1)
    finally:
        os.close(fd)


def bare_parse(root: Path) -> int:
    """The floor: walk the run folders and orjson-parse every file, nothing else."""
    import orjson

    n = 0
    for dirpath, _, files in os.walk(root / ".machine" / "runs"):
        for name in files:
            if name.endswith(".json"):
                orjson.loads(_read(os.path.join(dirpath, name)))
                n += 1
    return n


def bare_parse_keep(root: Path) -> int:
    """The floor for a loader: parse every file and keep the records (collector off)."""
    import gc

    import orjson

    kept = []
    gc.disable()
    try:
        for dirpath, _, files in os.walk(root / ".machine" / "runs"):
            for name in files:
                if name.endswith(".json"):
                    kept.append(orjson.loads(_read(os.path.join(dirpath, name))))
        return len(kept)
    finally:
        gc.enable()


def timed(fn) -> tuple[float, float, object]:
    w, c = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w, time.process_time() - c, result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--pad", type=int, default=24_000, help="extra characters per coder run's tool output")
    p.add_argument("--dir", default=None, help="where to generate (default: a temp dir, removed after)")
    a = p.parse_args()
    import machine_nb as mnb
    from machine_nb.tools.sample_workspace import generate

    tmp = tempfile.TemporaryDirectory() if a.dir is None else None
    root = Path(a.dir or tmp.name)
    t = time.perf_counter()
    generate(root, n_runs=a.runs, pad=a.pad, tags=False)
    files = list((root / ".machine" / "runs").rglob("*.json"))
    size = sum(f.stat().st_size for f in files)
    print(f"generated {len(files):,} run files, {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f} s "
          f"(median file {sorted(f.stat().st_size for f in files)[len(files) // 2] / 1e3:.1f} kB)")
    bare_parse(root)  # warm the page cache
    from machine_nb.store.index import remove_index

    os.environ["MACHINE_NB_CACHE_DIR"] = str(root / "cache")  # outside .machine/: not a run file

    def first_indexed():
        remove_index(root)
        return mnb.load_runs(root, index=True)

    fns = {"orjson parse, discard": lambda: bare_parse(root), "orjson parse, keep": lambda: bare_parse_keep(root),
           "load_runs": lambda: mnb.load_runs(root, index=False), "load_runs, index built": first_indexed}
    best = {k: [float("inf"), float("inf")] for k in fns}
    for _ in range(5):
        for k, fn in fns.items():
            wall, cpu, result = timed(fn)
            best[k] = [min(best[k][0], wall), min(best[k][1], cpu)]
            n = result if isinstance(result, int) else len(result)
            assert n == len(files), (k, n, len(files))
            del result
    print(f"{'':24s} {'wall s':>8s} {'cpu s':>8s}")
    for k, (wall, cpu) in best.items():
        print(f"{k:24s} {wall:8.3f} {cpu:8.3f}   ({len(files) / wall:,.0f} runs/s wall)")
    for loader in ("load_runs", "load_runs, index built"):
        lw, lc = best[loader]
        for k in ("orjson parse, discard", "orjson parse, keep"):
            w, c = best[k]
            print(f"ratio {loader:22s} / {k:22s}: wall {lw / w:.2f}x, cpu {lc / c:.2f}x  (target <= 2x)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
