"""Re-execute the shipped notebooks in place so the committed copies carry fresh, clean outputs.

Each notebook runs top to bottom in a fresh kernel with its default parameters, from the notebooks/
folder (as Jupyter and nbval run it). Then it is cleaned the way a report is (report.clean_notebook:
widget views replaced by their static fallback, no widget-state metadata; report.scrub_notebook:
secret-looking environment values redacted, absolute paths into this checkout written relative to
notebooks/ as the notebooks' own cells name them, other paths under the home folder as `~/…`) and
stripped of per-run noise (timings, papermill metadata), so a diff shows only what changed and the
committed outputs do not carry this machine's layout. A notebook that fails is left untouched and
the script exits 1.

    .venv/bin/python scripts/refresh_notebooks.py                 # every shipped notebook
    .venv/bin/python scripts/refresh_notebooks.py notebooks/02_explore_runs.ipynb
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [ROOT / "notebooks" / "01_minimal_sft.ipynb", ROOT / "notebooks" / "02_explore_runs.ipynb",
             ROOT / "notebooks" / "03_tag_train_promote.ipynb",
             ROOT / "notebooks" / "04_sweep.ipynb", ROOT / "notebooks" / "05_preference.ipynb",
             ROOT / "notebooks" / "06_real_model.ipynb", ROOT / "notebooks" / "07_inspect.ipynb"]
# Cell metadata that records one execution, not the notebook (timings, papermill's bookkeeping).
_RUN_METADATA = ("execution", "papermill", "collapsed", "scrolled")


def strip_run_metadata(nb: dict[str, Any]) -> dict[str, Any]:
    """Drop per-execution metadata from the notebook and its cells (pure).

    Args:
        nb: the notebook (nbformat 4 JSON), changed in place.

    Returns:
        The same notebook.
    """
    nb.get("metadata", {}).pop("papermill", None)
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {})
        for key in _RUN_METADATA:
            meta.pop(key, None)
    return nb


def clean(nb: dict[str, Any], folder: Path, home: str | None = None) -> tuple[dict[str, Any], int]:
    """An executed notebook made fit to commit, in place (the module docstring's rules).

    Args:
        nb: the executed notebook.
        folder: the notebook's folder (paths under it are written relative to it).
        home: the home folder (default None: `~`).

    Returns:
        (nb, number of secret values redacted).
    """
    from machine_nb.reports.notebook import clean_notebook, scrub_notebook, secret_values

    return scrub_notebook(strip_run_metadata(clean_notebook(nb)), secret_values(), folder, home)


def execute(path: Path, timeout: float) -> dict[str, Any]:
    """Run a notebook in a fresh python3 kernel from its own folder.

    Args:
        path: the notebook.
        timeout: the per-cell limit in seconds.

    Returns:
        The executed notebook's JSON.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return json.loads(nbformat.writes(nb))


def refresh(path: Path, timeout: float = 1800) -> float:
    """Execute, clean and rewrite one notebook atomically.

    Args:
        path: the notebook.
        timeout: the per-cell limit in seconds (default 1800).

    Returns:
        The wall time in seconds.
    """
    from machine_nb.core.jsonl import atomic_write_text

    start = time.monotonic()
    nb, redactions = clean(execute(path, timeout), path.parent)
    if redactions:
        print(f"  {redactions} secret value(s) redacted from {path.name}: check which cell prints them", file=sys.stderr)
    atomic_write_text(path, json.dumps(nb, indent=1, ensure_ascii=False) + "\n", mode=0o644)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    """Refresh the notebooks named (default: every shipped one).

    Args:
        argv: the arguments (default None: sys.argv's).

    Returns:
        The exit status: 0, or 1 when a notebook failed (it is left untouched).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to refresh (default: every shipped one)")
    parser.add_argument("--timeout", type=float, default=1800,
                        help="per-cell timeout in seconds (default 1800: the training cell on a busy 2-core machine)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the kernel inherits it: never a hub lookup
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    failed = 0
    for path in [p.resolve() for p in args.notebooks] or NOTEBOOKS:
        print(f"executing {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} …", flush=True)
        try:
            wall = refresh(path, args.timeout)
        except Exception as exc:  # keep the committed copy; say which cell failed
            failed += 1
            print(f"  FAILED, left unchanged: {type(exc).__name__}: {str(exc)[-2000:]}", file=sys.stderr)
            continue
        print(f"  refreshed in {wall:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
