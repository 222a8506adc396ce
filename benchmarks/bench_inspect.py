"""Benchmark: an Inspect AI task on the local engine against evaluate() on the same 24 rows.

The rows are notebook 01's held-out rows (make_corpus, seed 0); the models are the shipped base
model (its replies scored by exact match, and by the last number in them against the bare answer,
which gives a mixed score) and notebook 01's 60-step SFT checkpoint of it, all served by the local
engine. The Inspect task is
`eval_task(rows)` (evaluate()'s scoring as an Inspect scorer), run through tinker-cookbook's
Tinker-backed Inspect model API by `inspect_eval`, greedy, seed 0, as evaluate() runs.

Targets: on every model the Inspect run's replies, scores and accuracy equal evaluate()'s; on the
base model its wall time is at most 2x evaluate()'s (the median of a few alternating runs of each,
measured in one process after one warm-up of each path, so both see the same warm server). The
checkpoints' ratios are printed too: their replies are a few tokens, so sampling is quick and Inspect's
fixed cost per run (task set-up, sample events, the log written) is a larger share.
Run: .venv/bin/python benchmarks/bench_inspect.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import machine_nb as mnb  # noqa: E402
from machine_nb.evaluation.inspect_bridge import eval_task, inspect_eval  # noqa: E402

REPEATS = 5


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    corpus = mnb.make_corpus(tmp / "corpus", seed=0)
    tuned = mnb.sft(corpus.train, epochs=10, max_steps=60, log_dir=tmp / "sft", progress=False)  # notebook 01's run
    # the same rows scored on the last number of the reply: the base model's "47 + 15 = 62." is then
    # often right, so the two paths must agree on a mixed score, not only on all-wrong or all-right
    by_number = [{**row, "match": "number", "expected": row["expected"].split(": ")[-1]}
                 for row in mnb.read_jsonl(corpus.eval)]
    ok = True
    for label, checkpoint, rows in (("base model, exact match", None, corpus.eval),
                                    ("base model, number match", None, by_number),
                                    ("checkpoint (60 steps), exact match", tuned.checkpoint, corpus.eval)):
        task = eval_task(rows, name="held_out")
        ev = mnb.evaluate(rows, checkpoint=checkpoint, save=False, progress=False)  # warm-up, and the reference
        run = inspect_eval(task, checkpoint=checkpoint, log_dir=tmp / "logs")
        res = run[0]
        same_replies = res.rows["output"].tolist() == ev.rows["output"].tolist()
        same_scores = res.rows["correct"].tolist() == ev.rows["correct"].tolist()
        t_eval, t_inspect = [], []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            mnb.evaluate(rows, checkpoint=checkpoint, save=False, progress=False)
            t_eval.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            inspect_eval(task, checkpoint=checkpoint, log_dir=tmp / "logs")
            t_inspect.append(time.perf_counter() - t0)
        ratio = statistics.median(t_inspect) / statistics.median(t_eval)
        same = same_replies and same_scores and res.accuracy == ev.accuracy
        gated = checkpoint is None  # the 2x target: the base model, whose replies use the 32-token budget
        good = same and (ratio <= 2.0 or not gated)
        ok &= good
        print(f"{label}: {len(ev.rows)} rows; accuracy evaluate {ev.accuracy:.3f}, Inspect {res.accuracy:.3f}; "
              f"same replies {same_replies}, same scores {same_scores}  {'PASS' if same else 'FAIL'}")
        print(f"  wall (median of {REPEATS}): evaluate {statistics.median(t_eval):.2f} s, Inspect "
              f"{statistics.median(t_inspect):.2f} s: Inspect / evaluate = {ratio:.2f}x "
              + ("(target <= 2x)  " + ("PASS" if ratio <= 2.0 else "FAIL") if gated else
                 "(information: replies of a few tokens, so Inspect's fixed cost per run weighs more)"))
    cmp = mnb.compare(mnb.evaluate(corpus.eval, save=False, progress=False),
                      inspect_eval(eval_task(corpus.eval), checkpoint=tuned.checkpoint, log_dir=tmp / "logs"))
    print(f"compare(evaluate base, Inspect checkpoint): n={cmp.n}, delta {cmp.delta:+.3f}, "
          f"W/T/L {cmp.wins}/{cmp.ties}/{cmp.losses}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
