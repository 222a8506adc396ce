"""A hostile workspace cannot hang or exhaust the readers: a FIFO named like a run file, a symlink
to /dev/zero, a symlink to / or to a system folder inside `.machine/runs`, a file past the size
cap, a FIFO as the event stream or a session. Each is skipped with the bad-file warning, and the
good runs load. Every load runs in a child process with a deadline, so a reader that blocks
fails the test instead of hanging it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero are POSIX")

LOAD = """
import json, sys, warnings
import machine_nb as mnb
import machine_nb.store.workspace as workspace
workspace.MAX_FILE_BYTES = 20_000  # the cap, small enough for a test file to pass it
ws, index = sys.argv[1], {"index": True, "plain": False}[sys.argv[2]]
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    runs = mnb.load_runs(ws, index=index)
    sessions = mnb.load_sessions(ws)
    events = mnb.load_events(ws)
print(json.dumps({"runs": runs.groupby("machine").size().to_dict(), "sessions": len(sessions),
                  "events": len(events), "warnings": [str(w.message) for w in rec]}))
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    ws = tmp / "ws"
    shutil.copytree(SAMPLE / ".machine", ws / ".machine")
    runs = ws / ".machine" / "runs"
    support = runs / "support"
    os.mkfifo(support / "fifo.json")  # opening it for reading would wait for a writer
    (support / "zero.json").symlink_to("/dev/zero")  # reads until memory runs out
    run = json.loads(next(support.glob("*.json")).read_text())
    (support / "big.json").write_text(json.dumps({**run, "id": "big", "output": "x" * 30_000}))
    (runs / "root").symlink_to("/", target_is_directory=True)  # would walk /proc without end
    (runs / "etc").symlink_to("/etc", target_is_directory=True)  # a system folder, not a machine's
    os.unlink(ws / ".machine" / "events.jsonl")
    os.mkfifo(ws / ".machine" / "events.jsonl")
    os.mkfifo(ws / ".machine" / "sessions" / "support" / "stuck.json")
    import warnings

    import machine_nb as mnb

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        good = mnb.load_runs(SAMPLE, index=False).groupby("machine").size().to_dict()
    return ws, good


@pytest.mark.parametrize("how", ["plain", "index"])
def test_a_hostile_workspace_loads_its_good_runs_and_names_every_bad_entry(hostile, how, tmp_path):
    ws, good = hostile
    env = {**os.environ, "MACHINE_NB_CACHE_DIR": str(tmp_path / "cache")}
    try:
        proc = subprocess.run([sys.executable, "-c", LOAD, str(ws), how], capture_output=True, text=True,
                              timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_runs(index={how == 'index'}) did not finish within 60 s on a hostile workspace")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["runs"] == good  # every good run, nothing from / or /etc
    said = "\n".join(got["warnings"])
    assert "fifo.json" in said and "a FIFO (named pipe), not a regular file" in said
    assert "zero.json" in said and "a character device, not a regular file" in said
    assert "big.json" in said and "larger than the 20,000 bytes" in said
    assert "symlink 'root' leads to /, a file system's root or mount point" in said
    assert "holds " in said and "/etc" in said  # outside the workspace and not a machine's folder
    assert "stuck.json" in said and "events.jsonl" in said  # the session and the event stream
    assert got["events"] == 0 and got["sessions"] == len(list((SAMPLE / ".machine" / "sessions").rglob("*.json")))


def test_a_symlink_loop_through_a_folder_outside_is_read_once(tmp_path):
    """Two links to one machine folder outside, and a link from it back to its parent: each real
    folder is read once."""
    import warnings

    import machine_nb as mnb

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    shutil.copytree(SAMPLE / ".machine" / "runs" / "coder", tmp_path / "shared" / "coder")
    (ws / ".machine" / "runs" / "coder").symlink_to(tmp_path / "shared" / "coder", target_is_directory=True)
    (tmp_path / "shared" / "coder" / "again").symlink_to(tmp_path / "shared" / "coder", target_is_directory=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        runs = mnb.load_runs(ws)
    assert len(runs) == len(list((SAMPLE / ".machine" / "runs" / "coder").glob("*.json")))
    assert any("loop" in str(w.message) for w in rec)
