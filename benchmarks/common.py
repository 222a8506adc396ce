"""What several benchmarks share: executing a shipped notebook in a fresh kernel, a plain os-level
file read (the floor a reader is measured against), a process's peak resident memory, and another
commit's tree beside this checkout (for one-sitting comparisons of fresh processes).

Benchmarks run as scripts from the repository root (`python benchmarks/bench_x.py`), so this
folder is on their import path and they `import common`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def run_notebook(name: str, timeout: float, extra_cell: str | None = None) -> tuple[float, dict | None]:
    """Execute notebooks/<name> top to bottom in a fresh python3 kernel, with its defaults, in
    memory (nothing is written back).

    Args:
        name: the notebook's file name.
        timeout: seconds a cell may take.
        extra_cell: code run after the last cell; a line it prints as "BENCH_NUMBERS <json>"
            comes back (default None).

    Returns:
        (wall seconds, the kernel's start and shutdown included; the numbers, or None).
    """
    import nbformat
    from nbclient import NotebookClient

    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    if extra_cell:
        nb.cells.append(nbformat.v4.new_code_cell(extra_cell))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    client.execute()
    wall = time.monotonic() - start
    numbers = None
    if extra_cell:
        for out in nb.cells[-1].get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith("BENCH_NUMBERS "):
                    numbers = json.loads(line.split(" ", 1)[1])
    return wall, numbers


def read_bytes(path: str) -> bytes:
    """A file's bytes through os-level calls (the fastest plain read; load_runs reads so too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, os.fstat(fd).st_size + 1)
    finally:
        os.close(fd)


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, which starts afresh at exec (ru_maxrss keeps
    the parent's peak across fork + exec on Linux, so it would count the generator's memory)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    import sys

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024 * 1024)


@contextlib.contextmanager
def trees(rev: str) -> Iterator[dict[str, Path]]:
    """{"this checkout": the repository, rev: a temporary worktree of that commit}, each with its
    package's bytecode compiled (so no process compiles modules as it imports them); the worktree
    is removed afterwards. A process started with `tree_env(tree, ...)` imports that tree's package."""
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(other), rev], check=True)
        try:
            found = {"this checkout": ROOT, rev: other}
            for tree in found.values():
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "machine_nb")], check=True)
            yield found
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)


def tree_env(tree: Path, tmp: str) -> dict[str, str]:
    """The environment of a process that is to import `tree`'s package, offline, with one compute
    thread and its data, caches and hub cache under `tmp`. Run it from `tmp` (cwd): a script's own
    folder (-c: the working directory) comes first on the import path."""
    return {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "MACHINE_NB_DATA_DIR": f"{tmp}/server-data", "MACHINE_NB_CACHE_DIR": f"{tmp}/cache",
            "HF_HUB_CACHE": f"{tmp}/hub"}


def alternating(both: Mapping[str, T], rounds: int) -> Iterator[tuple[str, T]]:
    """(name, value) for each of `rounds` rounds over `both` (the trees from `trees`, or any two
    things to measure), the order reversed every other round, so neither always runs first (on a
    warmer cache, or a quieter machine)."""
    items = list(both.items())
    for i in range(rounds):
        yield from (items if i % 2 == 0 else items[::-1])
