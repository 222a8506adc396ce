"""CPU of a report's kernel with and without the preload (reports.notebook.kernel_arguments): notebook
01 run top to bottom by papermill, in a kernel started as `run_report` starts it and in a plain one.

    .venv/bin/python benchmarks/bench_report_kernel.py [--rounds 4] [--max-steps 30]

Each round runs both, in alternating order, each in a fresh kernel, with notebook 01's defaults but
`--max-steps` training steps, its data and runs in a temporary folder. A last cell, added to the
copy that runs, prints the kernel's own CPU seconds (user + system, its child processes not
included) and the collections the garbage collector ran. Prints the median of each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from common import NOTEBOOKS, alternating

PROBE = ("import os as _os, gc as _gc\n_t = _os.times()\n"
         "print('BENCH', _t.user + _t.system, sum(s['collections'] for s in _gc.get_stats()))")


def run(preload: bool, max_steps: int) -> tuple[float, int, float]:
    import nbformat
    import papermill

    from machine_nb.reports.notebook import kernel_arguments

    with tempfile.TemporaryDirectory() as tmp:
        nb = nbformat.read(NOTEBOOKS / "01_minimal_sft.ipynb", as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
        source = f"{tmp}/in.ipynb"
        nbformat.write(nb, source)
        start = time.monotonic()
        done = papermill.execute_notebook(
            source, f"{tmp}/out.ipynb", cwd=str(NOTEBOOKS), progress_bar=False,
            parameters={"data_dir": f"{tmp}/data", "log_root": f"{tmp}/runs", "max_steps": max_steps},
            extra_arguments=kernel_arguments() if preload else [])
        wall = time.monotonic() - start
    (line,) = [ln for o in done.cells[-1].outputs for ln in o.get("text", "").splitlines() if ln.startswith("BENCH")]
    _, cpu, collections = line.split()
    return float(cpu), int(collections), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=30)
    args = ap.parse_args()

    found: dict[str, list[tuple[float, int, float]]] = {"preloaded (run_report)": [], "plain kernel": []}
    run(False, args.max_steps)  # the file cache warm
    for name, runs in alternating(found, args.rounds):
        runs.append(run(name.startswith("preloaded"), args.max_steps))

    print(f"notebook 01, {args.max_steps} steps, {args.rounds} rounds; the kernel's own CPU")
    med = {}
    for name, runs in found.items():
        med[name] = [statistics.median(r[k] for r in runs) for k in range(3)]
        cpu, coll, wall = med[name]
        print(f"{name:>24}: kernel {cpu:.2f} CPU-s, {coll:.0f} collections, notebook wall {wall:.1f} s   "
              f"(all CPU-s: {json.dumps([round(r[0], 2) for r in runs])})")
    a, b = med["preloaded (run_report)"], med["plain kernel"]
    print(f"ratio preloaded/plain: kernel CPU {a[0] / b[0]:.2f}, wall {a[2] / b[2]:.2f}")


if __name__ == "__main__":
    main()
