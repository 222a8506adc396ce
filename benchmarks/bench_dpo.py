"""Benchmark: DPO from tags on the sample's tutor machine, local engine: SFT vs DPO vs SFT→DPO.

From the committed sample (read only): the tutor's `/good --as "answer: N"` rewrites become
preference pairs (`preference_pairs`: the rewrite over the reply it replaced, rebuilt from the
tagged runs; held-out cases left out). Held-out pairs are the 20 held-out cases, with the expected
answer chosen and the live version's own reply rejected (`pairs_from_results`). Then, with every
setting at its default (nothing here is tuned on the held-out cases):

- SFT on the good rows (`tagged_lines`), DPO from the base model on the pairs, and DPO from the
  SFT checkpoint (SFT→DPO);
- held-out pair accuracy (chosen log-probability above rejected, `score_pairs`) of each: target
  ≥ 0.9 after DPO;
- held-out exact match of each (`evaluate_cases`), with the paired comparison (`compare`) between
  every two of them; at several seeds for the spread.

`--calibrate` re-measures the grid the local DPO learning rates were chosen on: a validation split
of the *training* pairs (their last 10 by file order), never the held-out cases. `--corpus` runs the
minimal-SFT corpus variant (the base model's own answers rejected). `--notebook` times
notebooks/05_preference.ipynb top to bottom in a fresh kernel (nothing is written back).

    .venv/bin/python benchmarks/bench_dpo.py [--seeds 0 1 2] [--calibrate] [--corpus] [--notebook]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
# evaluate's sampler resolves a client future inside its event loop, which the SDK logs with a stack dump
logging.getLogger("tinker.lib.sync_only").setLevel(logging.ERROR)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "data" / "sample_workspace"


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = quiet(fn, *args, **kwargs)
    return out, time.perf_counter() - t0


def line(cmp) -> str:
    return (f"delta {cmp.delta:+.2f}, W/T/L {cmp.wins}/{cmp.ties}/{cmp.losses}, exact McNemar p = {cmp.p_value:.3g}")


def tutor(mnb, tmp: Path, seeds: list[int]) -> bool:
    from machine_nb.evaluation.cases import live_version

    store = SAMPLE / ".machine-store"
    pairs = quiet(mnb.preference_pairs, store, workspace=SAMPLE, machine="tutor")
    lines = quiet(mnb.tagged_lines, mnb.tagged(store), "tutor", workspace=SAMPLE)
    live, t_live = timed(mnb.evaluate_cases, SAMPLE, "tutor", progress=False)
    held = mnb.pairs_from_results(live, instructions=live_version(SAMPLE, "tutor")["instructions"], machine="tutor")
    sources = {k: int(v) for k, v in pairs["source"].value_counts().items()}
    print(f"tutor: {len(pairs)} training pairs ({sources}), {len(pairs.excluded)} left "
          f"out as held-out; {len(lines)} SFT rows; {len(held)} held-out pairs (expected answer over the live reply)")
    print(f"live v1 on the 20 held-out cases: exact match {live.rows['correct'].mean():.2f} [{t_live:.1f} s]")
    base_pairs = mnb.score_pairs(held)
    print(f"base model held-out pair accuracy {base_pairs['correct'].mean():.2f} "
          f"(median margin {base_pairs['margin'].median():+.1f} nats)")
    ok = True
    table = []
    for seed in seeds:
        sft, t_sft = timed(mnb.sft, lines, seed=seed, log_dir=tmp / f"sft-{seed}", progress=False)
        dpo, t_dpo = timed(mnb.dpo, pairs, seed=seed, log_dir=tmp / f"dpo-{seed}", progress=False)
        both, t_both = timed(mnb.dpo, pairs, load_checkpoint=sft, seed=seed, log_dir=tmp / f"sft-dpo-{seed}",
                             progress=False)
        runs = {"SFT": sft, "DPO": dpo, "SFT→DPO": both}
        print(f"\nseed {seed}: SFT {sft.steps} steps {sft.first_loss:.3f} -> {sft.last_loss:.3f} "
              f"[{t_sft:.1f} s, {t_sft / sft.steps * 1000:.0f} ms/step]; DPO {dpo.steps} steps dpo_loss "
              f"{dpo.first_loss:.3f} -> {dpo.last_loss:.4f} [{t_dpo:.1f} s, {t_dpo / dpo.steps * 1000:.0f} ms/step]; "
              f"SFT→DPO {both.steps} steps {both.first_loss:.3f} -> {both.last_loss:.4f} [{t_both:.1f} s]")
        exact, acc = {}, {}
        for name, result in runs.items():
            scored = mnb.score_pairs(held, checkpoint=result.checkpoint)
            acc[name] = scored["correct"].mean()
            exact[name] = quiet(mnb.evaluate_cases, SAMPLE, "tutor", checkpoint=result.checkpoint,
                                progress=False, name=name)
            outs = exact[name].rows["output"].head(3).tolist()
            print(f"  {name:8s} held-out pair accuracy {acc[name]:.2f} (median margin {scored['margin'].median():+.1f});"
                  f" exact match {exact[name].rows['correct'].mean():.2f}; first replies {outs}")
        for a, b in (("SFT", "DPO"), ("SFT", "SFT→DPO"), ("DPO", "SFT→DPO")):
            print(f"  compare {a} -> {b}: {line(mnb.compare(exact[a], exact[b]))}")
        print(f"  compare live -> SFT→DPO: {line(mnb.compare(live, exact['SFT→DPO']))}")
        table.append((seed, acc["DPO"], acc["SFT→DPO"], *(exact[n].rows["correct"].mean() for n in runs)))
        ok = ok and acc["DPO"] >= 0.9
    print("\nseed | pair acc DPO | pair acc SFT→DPO | exact SFT | exact DPO | exact SFT→DPO")
    for row in table:
        print(" | ".join([f"{row[0]:4d}"] + [f"{v:.2f}" for v in row[1:]]))
    print(f"target (held-out pair accuracy after DPO >= 0.9 at every seed): {'met' if ok else 'NOT met'}")
    return ok


def calibrate(mnb, tmp: Path) -> None:
    """The grid behind LOCAL_DPO_LEARNING_RATE and LOCAL_DPO_FROM_CHECKPOINT_LEARNING_RATE."""
    store = SAMPLE / ".machine-store"
    pairs = quiet(mnb.preference_pairs, store, workspace=SAMPLE, machine="tutor")
    train, val = pairs.iloc[:34], pairs.iloc[34:]
    cases = [{"input": p["input"], "expected": p["chosen"][0]["content"], "match": "exact"} for p in val.to_dict("records")]
    holdout = list(mnb.load_cases(SAMPLE, "tutor", "holdout")["input"])
    lines = quiet(mnb.tagged_lines, mnb.tagged(store), "tutor", workspace=SAMPLE, exclude=holdout + list(val["input"]))
    print(f"\ncalibration: {len(train)} training pairs, validation on the other {len(val)} (training cases only)")

    def measure(label: str, result) -> None:
        acc = mnb.score_pairs(val, checkpoint=result.checkpoint)["correct"].mean()
        exact = quiet(mnb.evaluate_cases, SAMPLE, "tutor", checkpoint=result.checkpoint, cases=cases,
                      progress=False).rows["correct"].mean()
        print(f"  {label:28s} validation pair accuracy {acc:.2f}, exact match {exact:.2f}")

    for lr in (1e-3, 2e-3, 3e-3, 5e-3):
        measure(f"DPO lr {lr:g}", quiet(mnb.dpo, train, learning_rate=lr, log_dir=tmp / f"cal-dpo-{lr}", progress=False))
    sft = quiet(mnb.sft, lines, log_dir=tmp / "cal-sft", progress=False)
    measure("SFT", sft)
    for lr in (1e-4, 3e-4, 1e-3):
        measure(f"SFT→DPO lr {lr:g}", quiet(mnb.dpo, train, load_checkpoint=sft, learning_rate=lr,
                                            log_dir=tmp / f"cal-sd-{lr}", progress=False))


def corpus(mnb, tmp: Path) -> None:
    """The minimal-SFT corpus, with the base model's own answers as the rejected side."""
    import json

    made = mnb.make_corpus(tmp / "corpus", seed=0)
    train_rows = [json.loads(x) for x in Path(made.train).read_text().splitlines()]
    as_eval = [{"messages": r["messages"][:-1], "expected": r["messages"][-1]["content"], "match": "exact"}
               for r in train_rows]
    quiet(mnb.evaluate, as_eval, out=tmp / "corpus-train-base.json", progress=False)
    quiet(mnb.evaluate, made.eval, out=tmp / "corpus-eval-base.json", progress=False)
    train = mnb.pairs_from_results(tmp / "corpus-train-base.json")
    held = mnb.pairs_from_results(tmp / "corpus-eval-base.json")
    result, t = timed(mnb.dpo, train, log_dir=tmp / "corpus-dpo", progress=False)
    before = mnb.score_pairs(held)["correct"].mean()
    after = mnb.score_pairs(held, checkpoint=result.checkpoint)["correct"].mean()
    exact = quiet(mnb.evaluate, made.eval, checkpoint=result.checkpoint, save=False, progress=False)
    print(f"\nminimal-SFT corpus: {len(train)} training pairs, {len(held)} held-out pairs (eval.jsonl); DPO {result.steps} "
          f"steps [{t:.1f} s]: held-out pair accuracy {before:.2f} -> {after:.2f}; exact match "
          f"{exact.rows['correct'].mean():.2f}; first replies {exact.rows['output'].head(3).tolist()}")


def time_notebook(timeout: float = 900) -> float:
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / "05_preference.ipynb"
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2; the notebook runs 0)")
    ap.add_argument("--calibrate", action="store_true", help="re-measure the learning-rate grid on the validation split")
    ap.add_argument("--corpus", action="store_true", help="also the minimal-SFT corpus variant")
    ap.add_argument("--notebook", action="store_true", help="time notebooks/05_preference.ipynb in a fresh kernel")
    args = ap.parse_args()

    import machine_nb as mnb

    tmp = Path(tempfile.mkdtemp(prefix="bench-dpo-"))
    try:
        ok = tutor(mnb, tmp, args.seeds)
        if args.calibrate:
            calibrate(mnb, tmp)
        if args.corpus:
            corpus(mnb, tmp)
        if args.notebook:
            wall = time_notebook()
            print(f"\nnotebooks/05_preference.ipynb top to bottom, fresh kernel, {os.cpu_count()} cores: {wall:.1f} s")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
