"""Wall time of each shipped notebook executed top to bottom from a fresh kernel, with its defaults,
and the final numbers the minimal-SFT notebook printed (baseline, checkpoint, delta, p-value).

Nothing is written back to the notebooks (scripts/refresh_notebooks.py does that); the run leaves
the notebooks' own scratch output under runs/ and data/ (git-ignored).

    .venv/bin/python benchmarks/bench_notebooks.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# appended to notebook 01 (in memory only) so its final numbers come back as one JSON line
_NUMBERS_CELL = """
import json as _json
print("BENCH_NUMBERS " + _json.dumps({
    "baseline": comparison.baseline_accuracy, "checkpoint": comparison.checkpoint_accuracy,
    "delta": comparison.delta, "p_value": comparison.p_value, "ci": [comparison.delta_ci_low, comparison.delta_ci_high],
    "wins_ties_losses": [comparison.wins, comparison.ties, comparison.losses], "n": comparison.n,
    "steps": result.steps, "loss": [result.first_loss, result.last_loss],
    "bled": int(probes["bled"].sum()), "shape": int(probes["took_shape"].sum()), "kept": int(probes["kept_fact"].sum()),
    "base_kept": int(probes["base_kept_fact"].sum()), "probes": len(probes)}))
"""


def run_once(name: str, timeout: float) -> tuple[float, dict | None]:
    """Execute notebooks/<name> in a fresh python3 kernel; returns (wall seconds, numbers or None)."""
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    if name.startswith("01"):
        nb.cells.append(nbformat.v4.new_code_cell(_NUMBERS_CELL))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    client.execute()  # includes the kernel's start and shutdown
    wall = time.monotonic() - start
    numbers = None
    for out in nb.cells[-1].get("outputs", []):
        for line in out.get("text", "").splitlines():
            if line.startswith("BENCH_NUMBERS "):
                numbers = json.loads(line.split(" ", 1)[1])
    return wall, numbers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="executions per notebook (default 1: each takes minutes)")
    parser.add_argument("--timeout", type=float, default=1800, help="per-cell timeout in seconds (default 1800)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(f"# bench_notebooks  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  python {platform.python_version()}  "
          f"{os.cpu_count()} CPUs  load avg {os.getloadavg()[0]:.1f} (machine shared with other work)")
    numbers = None
    for name in NOTEBOOKS:
        walls = []
        for _ in range(args.repeat):
            wall, got = run_once(name, args.timeout)
            walls.append(wall)
            numbers = got or numbers
        detail = "" if len(walls) == 1 else f"  (runs: {', '.join(f'{w:.1f}' for w in walls)})"
        print(f"{name:26s} wall {statistics.median(walls):7.1f} s  from a fresh kernel, default parameters{detail}")
    # the README's main command (`make report`): papermill execution plus the HTML export
    import tempfile

    from machine_nb.reports.notebook import run_report

    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        report = run_report(ROOT / "notebooks" / NOTEBOOKS[0], {}, Path(tmp) / "minimal_sft.html", progress=False)
        wall = time.monotonic() - start
        print(f"{'make report (01 -> HTML)':26s} wall {wall:7.1f} s  (execution {report.wall_s:.1f} s, "
              f"HTML {report.html.stat().st_size / 1e6:.2f} MB)")
    if numbers:
        n = numbers
        print(f"01_minimal_sft final numbers ({n['n']} held-out rows, {n['steps']} steps, loss "
              f"{n['loss'][0]:.3f} -> {n['loss'][1]:.3f}):")
        print(f"  baseline {n['baseline']:.1%}  checkpoint {n['checkpoint']:.1%}  delta {n['delta']:+.1%}  "
              f"(95% CI, Newcombe paired: {n['ci'][0]:+.1%} to {n['ci'][1]:+.1%})  McNemar p = {n['p_value']:.3g}  "
              f"wins/ties/losses {'/'.join(map(str, n['wins_ties_losses']))}")
        print(f"  probe: {n['bled']}/{n['probes']} took the answer: prefix, {n['shape']}/{n['probes']} the '<words>: <number>' "
              f"shape; facts kept base {n['base_kept']} -> "
              f"checkpoint {n['kept']} of {n['probes']}")
    print(f"load avg after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
