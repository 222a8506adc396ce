"""Benchmark: how long the run after an interrupted one takes to start, against a run in a process
started for it.

In one process on the local engine: a short SFT run interrupted at its first metrics (as Ctrl-C in
a notebook cell), then a two-step `smoke` run, timed from the call to its return; and a `smoke` run
after every kept training process was closed (the next one starts and imports the cookbook and the
SDK). Each pair is repeated; medians of the wall time. Where the training process forks a worker
for the run that follows an interrupted one (runner.RESTARTS), that run skips the imports.

    .venv/bin/python benchmarks/bench_restart.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-restart-"))
    # removed at exit after the local server has stopped (its exit handler, registered later, runs first)
    atexit.register(shutil.rmtree, root, True)
    for var in ("MACHINE_NB_DATA_DIR", "MACHINE_NB_CACHE_DIR", "HF_HUB_CACHE"):
        (root / var.lower()).mkdir()
        os.environ.setdefault(var, str(root / var.lower()))

    from machine_nb.data.corpus import make_corpus
    from machine_nb.training import runner
    from machine_nb.training.loop import _Runner
    from machine_nb.training.train import sft, smoke

    work = root / "work"
    corpus = make_corpus(work / "corpus", seed=0)
    smoke(corpus.train, log_dir=work / "warm", progress=False)  # the server and a training process, started

    def interrupt(rows) -> None:
        raise KeyboardInterrupt

    def close_all() -> None:
        while _Runner._idle:
            _Runner._idle.pop().close()

    after_interrupt, fresh = [], []
    for i in range(args.repeats):
        try:
            sft(corpus.train, log_dir=work / f"stopped-{i}", max_steps=20, progress=False, on_metrics=interrupt)
        except KeyboardInterrupt:
            pass
        t = time.perf_counter()
        smoke(corpus.train, log_dir=work / f"after-{i}", progress=False)
        after_interrupt.append(time.perf_counter() - t)
        close_all()
        t = time.perf_counter()
        smoke(corpus.train, log_dir=work / f"fresh-{i}", progress=False)
        fresh.append(time.perf_counter() - t)

    med = statistics.median
    print(f"runner.RESTARTS = {getattr(runner, 'RESTARTS', False)}; {args.repeats} repeats, {os.cpu_count()} CPUs")
    print(f"smoke after an interrupted run: median {med(after_interrupt):.2f} s "
          f"(min {min(after_interrupt):.2f}, max {max(after_interrupt):.2f})")
    print(f"smoke in a fresh training process: median {med(fresh):.2f} s (min {min(fresh):.2f}, max {max(fresh):.2f})")
    print(f"ratio (after an interrupt / fresh): {med(after_interrupt) / med(fresh):.2f}")


if __name__ == "__main__":
    main()
