"""Benchmark: what the local engine keeps of its samplers' work (compute.KEPT_PROMPT_PASSES,
compute.KEPT_SAMPLES) against computing everything, in one process, the two alternating.

Two jobs, each timed as this process's CPU (the local server runs in it, in threads; a DPO run's
training loop runs in a child process, whose CPU does not change with the stores and is left out):

- a default DPO run on the sample tutor's preference pairs (50 steps; each asks for the reference
  log-probabilities of 16 sequences, the same 88 every epoch), from empty stores;
- `evaluate` of the base model on the minimal-SFT corpus's held-out rows, twice in a row (the
  second as a baseline cell run again), from empty stores.

Each round checks that both ways give the same numbers (DPO losses, replies). Medians of the rounds
and their ratio are printed.

    .venv/bin/python benchmarks/bench_kept_samples.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from common import alternating

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "data" / "sample_workspace"


def cpu(fn, *args, **kwargs):
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn(*args, **kwargs)
    return out, time.process_time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each way (default 3)")
    args = ap.parse_args()

    import machine_nb as mnb
    from machine_nb.engines.local import compute

    limits = {store: store.limit for store in (compute.KEPT_PROMPT_PASSES, compute.KEPT_SAMPLES)}

    def set_kept(on: bool) -> None:
        compute.clear_kept()
        for store, limit in limits.items():
            store.limit = limit if on else 0

    tmp = Path(tempfile.mkdtemp(prefix="bench-kept-"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pairs = mnb.preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor")
        corpus = mnb.make_corpus(tmp / "corpus", seed=0)
        mnb.evaluate(corpus.eval, save=False, progress=False)  # the server and the SDK started: not timed
        times: dict[str, dict[str, list[float]]] = {"kept": {"dpo": [], "eval": []}, "computed": {"dpo": [], "eval": []}}
        seen: dict[str, tuple] = {}
        for i, (way, on) in enumerate(alternating({"kept": True, "computed": False}, args.rounds)):
            set_kept(on)
            run, t_dpo = cpu(mnb.dpo, pairs, log_dir=tmp / f"dpo-{i}", progress=False)
            losses = tuple(mnb.training_metrics(run.log_dir)["dpo_loss"])
            set_kept(on)
            t_eval = 0.0
            replies = []
            for _ in range(2):
                result, t = cpu(mnb.evaluate, corpus.eval, save=False, progress=False)
                t_eval += t
                replies.append(tuple(result.rows["output"]))
            times[way]["dpo"].append(t_dpo)
            times[way]["eval"].append(t_eval)
            numbers = (losses, replies[0], replies[1])
            if seen.setdefault("numbers", numbers) != numbers:
                print(f"round {i} ({way}): the numbers differ from the first round's")
                return 1
            print(f"round {i + 1} {way:8s}: DPO {run.steps} steps {t_dpo:.2f} CPU-s; evaluate x2 "
                  f"({len(replies[0])} rows) {t_eval:.2f} CPU-s")
        print(f"\nthis process's CPU, median of {args.rounds} rounds (machine: {os.cpu_count()} CPUs):")
        for job, label in (("dpo", "default DPO run (50 steps)"), ("eval", "evaluate of the base model, twice")):
            kept, computed = (statistics.median(times[w][job]) for w in ("kept", "computed"))
            print(f"  {label:34s} computed {computed:6.2f} s, kept {kept:6.2f} s: {kept / computed:.2f} of the CPU")
        print("every round gave the same DPO losses and the same replies")
        return 0
    finally:
        compute.clear_kept()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
