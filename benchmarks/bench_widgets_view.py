"""Benchmark: how long the E2 widgets take to redraw after a user action (median and worst).

    .venv/bin/python benchmarks/bench_widgets_view.py

ExamplePreviewer: next example, with the token view and the prompt-vs-training check, on the
sample workspace's whole-run lines (Inkling's renderer). CostMeter: moving the epochs slider
(token counts cached) and switching model (counts re-rendered) on the minimal-SFT train file.
LossPlot: one redraw of 3 runs x 1,000 steps. One thread; a shared 2-core machine, so ratios and
orders of magnitude matter, not the last millisecond.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
REPO = Path(__file__).resolve().parents[1]
INKLING = "thinkingmachines/Inkling"


def timed(fn, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return f"median {statistics.median(out):7.1f} ms · worst {max(out):7.1f} ms (n={n})"


def main() -> None:
    import torch

    torch.set_num_threads(1)
    import machine_nb as mnb
    from machine_nb.widgets.cost_meter import CostMeter
    from machine_nb.widgets.loss_plot import LossPlot
    from machine_nb.widgets.previewer import ExamplePreviewer

    sel = mnb.select_runs(mnb.load_runs(REPO / "data" / "sample_workspace"), "coder")
    lines = [x for x in mnb.training_lines(sel, base_model=INKLING) if x.get("whole_run")]
    p = ExamplePreviewer(lines, model=INKLING)  # loads the tokenizer once
    sizes = []

    def next_example():
        p.show((p.current + 1) % len(p.lines))
        sizes.append(len(p.tokens))

    print(f"ExamplePreviewer next (whole runs, {len(lines)} lines): {timed(next_example, 20)}; "
          f"tokens per example {min(sizes)}-{max(sizes)}")

    train = REPO / "data" / "minimal_sft" / "train.jsonl"
    if not train.exists():
        mnb.make_corpus(REPO / "data" / "minimal_sft")
    m = CostMeter(train, model=INKLING, epochs=1)
    epochs = iter(range(2, 100))
    print(f"CostMeter epochs change (cached counts, {m.estimate.rows} rows): "
          f"{timed(lambda: setattr(m, 'epochs', next(epochs) % 19 + 1), 20)}")
    models = iter(["local/arith-tiny", INKLING] * 10)  # each call a real change

    def switch():
        m._counts.clear()  # as for a model not seen before
        m.model = next(models)

    print(f"CostMeter model change (re-count {m.estimate.rows} rows): {timed(switch, 6)}; now: {m.summary()}")

    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for r in range(3):
            d = Path(tmp) / f"run{r}"
            d.mkdir()
            with open(d / "metrics.jsonl", "w") as fh:
                for s in range(1000):
                    fh.write(json.dumps({"step": s, "learning_rate": 1e-4 * (1 - s / 1000),
                                         "train_mean_nll": 2.0 / (1 + s / 50) + 0.01 * r}) + "\n")
            dirs.append(d)
        plot = LossPlot(dirs, live=False)
        print(f"LossPlot refresh (3 runs x 1,000 steps, read + draw + PNG): {timed(plot.refresh, 5)}")


if __name__ == "__main__":
    main()
