"""Held-out accuracy while training and sweeps, on the local engine, measured.

1. The minimal-SFT run (48 rows, batch 8, 10 epochs = 60 steps, local defaults) with
   `eval_every=6`: held-out exact match at every eval step, on eval.jsonl and on valid.jsonl,
   and the first step at which it reaches 0.8 (seeds 0, 1, 2); the run's wall time with and
   without the evals (the evals do not change the losses: checked).
2. A small sweep (learning rate 3e-3 x epochs 5, 10 x seeds 0, 1) sequential and with
   max_parallel=2: wall times and whether the numbers agree.
3. notebooks/04_sweep.ipynb executed top to bottom in a fresh kernel with its defaults (the
   3 x 2 grid x 3 seeds = 18 runs): wall time, and the numbers it reports.

Nothing is written back to the notebook (scripts/refresh_notebooks.py does that); runs go to a
temporary folder, the notebook's own to runs/ (git-ignored).

    .venv/bin/python benchmarks/bench_sweep.py [--skip-notebook]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from common import run_notebook

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_NUMBERS_CELL = """
import json as _json
print("BENCH_NUMBERS " + _json.dumps({
    "runs": len(frame), "sweep_s": sweep_s, "best": [float(best["learning_rate"]), int(best["epochs"])],
    "valid_mean": float(best["mean"]), "valid_ci": [float(best["ci_low"]), float(best["ci_high"])],
    "eval": reported.checkpoint_accuracy, "eval_ci": [reported.checkpoint_ci_low, reported.checkpoint_ci_high],
    "baseline": reported.baseline_accuracy, "delta_text": reported.delta_text}))
"""


def first_reaching(curve, threshold: float = 0.8):
    hit = curve[curve["accuracy"] >= threshold]
    return None if hit.empty else int(hit["step"].iloc[0])


def bench_eval_every(tmp: Path) -> None:
    import machine_nb as mnb

    corpus = mnb.make_corpus(tmp / "corpus", seed=0)
    mnb.sft(corpus.train, log_dir=tmp / "warm", max_steps=1, progress=False)  # the training process's imports
    t0 = time.perf_counter()
    plain = mnb.sft(corpus.train, log_dir=tmp / "plain", epochs=10, progress=False)
    plain_s = time.perf_counter() - t0
    print("## 1. minimal-SFT run (60 steps), held-out exact match every 6 steps")
    for name, path in (("eval.jsonl", corpus.eval), ("valid.jsonl", corpus.valid)):
        for seed in (0, 1, 2):
            t0 = time.perf_counter()
            res = mnb.sft(corpus.train, log_dir=tmp / f"{name}-{seed}", epochs=10, seed=seed, eval_data=path,
                          eval_every=6, progress=False)
            wall = time.perf_counter() - t0
            curve = mnb.heldout_curve(res.log_dir)
            same = (list(mnb.training_metrics(res.log_dir)["train_mean_nll"].dropna())
                    == list(mnb.training_metrics(plain.log_dir)["train_mean_nll"].dropna())) if seed == 0 else None
            points = " ".join(f"{int(s)}:{a:.2f}" for s, a in zip(curve["step"], curve["accuracy"]))
            print(f"{name:11s} seed {seed}: first step >= 0.8: {first_reaching(curve)}; best {res.best_accuracy:.3f} "
                  f"at step {res.best_step}; final {res.heldout_accuracy:.3f}; wall {wall:.1f} s"
                  + ("" if same is None else f" (without evals {plain_s:.1f} s; same losses: {same})"))
            print(f"    step:accuracy {points}")


def bench_parallel(tmp: Path) -> None:
    import machine_nb as mnb

    corpus = mnb.make_corpus(tmp / "corpus", seed=0)
    grid = {"learning_rate": [3e-3], "epochs": [5, 10]}
    print("## 2. sweep of 4 runs (lr 3e-3 x epochs 5, 10 x seeds 0, 1; valid.jsonl every 6 steps)")
    frames = {}
    for par in (1, 2):
        t0 = time.perf_counter()
        frames[par] = mnb.sweep(corpus.train, grid, seeds=[0, 1], eval_data=corpus.valid, eval_every=6,
                                sweep_dir=tmp / f"par{par}", max_parallel=par, progress=False)
        print(f"max_parallel={par}: {time.perf_counter() - t0:.1f} s")
    agree = (list(frames[1]["final_loss"]) == list(frames[2]["final_loss"])
             and list(frames[1]["heldout_accuracy"]) == list(frames[2]["heldout_accuracy"]))
    print(f"same losses and held-out accuracies: {agree}")
    t0 = time.perf_counter()
    again = mnb.sweep(corpus.train, grid, seeds=[0, 1], eval_data=corpus.valid, eval_every=6,
                      sweep_dir=tmp / "par1", progress=False)
    print(f"the same sweep dir again: {time.perf_counter() - t0:.1f} s, statuses {sorted(set(again['status']))}")


def bench_notebook(timeout: float) -> None:
    wall, numbers = run_notebook("04_sweep.ipynb", timeout, _NUMBERS_CELL)  # the kernel's start and shutdown included
    print("## 3. notebooks/04_sweep.ipynb, fresh kernel, default parameters")
    print(f"wall {wall:.1f} s (target under 300 s); the sweep cell {numbers['sweep_s']:.1f} s for {numbers['runs']} runs")
    lr, ep = numbers["best"]
    print(f"chosen on valid.jsonl: lr {lr:g}, {ep} epochs, {numbers['valid_mean']:.3f} "
          f"(95% interval over questions {numbers['valid_ci'][0]:.3f}-{numbers['valid_ci'][1]:.3f})")
    print(f"reported on eval.jsonl: {numbers['eval']:.3f} (95% CI {numbers['eval_ci'][0]:.3f}-{numbers['eval_ci'][1]:.3f})"
          f", base model {numbers['baseline']:.3f}, delta {numbers['delta_text']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-notebook", action="store_true", help="leave out part 3 (the notebook)")
    parser.add_argument("--timeout", type=float, default=1800, help="the notebook's per-cell timeout (default 1800 s)")
    args = parser.parse_args()
    print(f"# bench_sweep  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  python {platform.python_version()}  "
          f"{os.cpu_count()} CPUs  load avg {os.getloadavg()[0]:.1f} (machine shared with other work)")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MACHINE_NB_DATA_DIR", str(Path(tmp) / "server"))
        bench_eval_every(Path(tmp) / "a")
        bench_parallel(Path(tmp) / "b")
    if not args.skip_notebook:
        bench_notebook(args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
