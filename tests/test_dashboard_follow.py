"""Following files while another process writes them (store/follow.py), and the Dashboard's counts.

The writer is a real child process (tests/dashboard_writer.py) told what to write over a pipe
and answering when it has written it, so every step waits on the writer's reply, never on a sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machine_nb.store.follow import LineTail, RunFolderWatch

WRITER = Path(__file__).with_name("dashboard_writer.py")


class Writer:
    """A writer process: `do(op, **args)` returns once the child has done it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def do(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        assert reply.get("ok"), reply
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def writer():
    w = Writer()
    yield w
    w.close()


def test_partial_line_waits_for_its_newline(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    assert tail.read().lines == []  # no file yet
    writer.do("append", path=str(path), text='{"type": "run.started", "run": "a"}\n{"type": "run.fin')
    got = tail.read()
    assert [x.value["type"] for x in got.lines] == ["run.started"]
    assert tail.read().lines == []  # the partial line is not read, not even as an error
    writer.do("append", path=str(path), text='ished", "run": "a"}\n')
    got = tail.read()
    assert [(x.line, x.value["type"]) for x in got.lines] == [(2, "run.finished")]
    assert not got.reset


def test_bad_lines_are_kept_raw_with_their_error(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    writer.do("append", path=str(path), text='{"type": "x"}\nnot json\n')
    got = LineTail(path).read()
    assert got.lines[1].text == "not json" and got.lines[1].value is None
    assert "events.jsonl:2: invalid JSON" in got.lines[1].error


def test_truncated_file_is_read_again_from_the_start_with_a_note(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    writer.do("append", path=str(path), text="".join(f'{{"n": {i}}}\n' for i in range(5)))
    assert len(tail.read().lines) == 5
    writer.do("truncate", path=str(path))
    writer.do("append", path=str(path), text='{"n": 100}\n')
    got = tail.read()
    assert got.reset and "truncated" in got.notes[0]
    assert [x.value["n"] for x in got.lines] == [100]
    assert got.lines[0].line == 1


def test_file_rewritten_from_its_start_to_a_larger_size_is_noticed(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    writer.do("append", path=str(path), text='{"n": 1}\n')
    assert len(tail.read().lines) == 1
    writer.do("truncate", path=str(path))  # truncated and grown past the old size between two reads
    writer.do("append", path=str(path), text='{"n": 2}\n{"n": 3}\n')
    got = tail.read()
    assert got.reset and [x.value["n"] for x in got.lines] == [2, 3]


def test_replaced_file_is_read_again_from_the_start(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    writer.do("append", path=str(path), text='{"n": 1}\n{"n": 2}\n')
    assert len(tail.read().lines) == 2
    writer.do("replace", path=str(path), text='{"n": 1}\n{"n": 2}\n{"n": 3}\n')  # temp file + rename
    got = tail.read()
    assert got.reset and "replaced" in got.notes[0]
    assert [x.value["n"] for x in got.lines] == [1, 2, 3]


def test_burst_of_lines_is_read_once_each(tmp_path, writer):
    path = tmp_path / "events.jsonl"
    tail = LineTail(path)
    seen = []
    for k in range(5):
        writer.do("burst", path=str(path), start=k * 2000, n=2000)  # many appends between two reads
        seen += [x.value["n"] for x in tail.read().lines]
        if k == 2:
            writer.do("append", path=str(path), text='{"n": -1')  # a partial line across a burst
            seen += [x.value["n"] for x in tail.read().lines]
            writer.do("append", path=str(path), text='}\n')
    seen += [x.value["n"] for x in tail.read().lines]
    want = list(range(6000)) + [-1] + list(range(6000, 10000))
    assert seen == want


def added_until(watch: RunFolderWatch, n: int, events: bool) -> list[tuple[str, str]]:
    """What polls report as added until n files have come (file events arrive a moment after the
    write: this waits on them, and fails after 20 s rather than hang)."""
    got = [(d, name) for _, d, name in watch.poll(full=not events).added]
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got += [(d, name) for _, d, name in watch.poll().added]
    return got


@pytest.mark.parametrize("events", [False, True], ids=["listing", "file-events"])
def test_run_files_appear_once_as_they_are_renamed_into_place(tmp_path, writer, events):
    root = tmp_path / ".machine" / "runs"
    (root / "support").mkdir(parents=True)
    old = root / "support" / "r0.json"
    old.write_text("{}")
    watch = RunFolderWatch(root, known=[str(old)], events=events)
    try:
        assert watch.poll().added == []
        writer.do("run", root=str(root), machine="support", id="r1")
        writer.do("run", root=str(root), machine="chatbot/triage", id="t1")  # a new nested folder
        writer.do("tempfile", root=str(root), machine="support", id="r2")   # not renamed yet: not a run
        assert sorted(added_until(watch, 2, events)) == [("chatbot/triage", "t1.json"), ("support", "r1.json")]
        assert watch.poll(full=True).added == []  # each file once
        ids = [f"b{i}" for i in range(300)]
        writer.do("runs", root=str(root), machine="support", ids=ids)  # a burst between two polls
        assert sorted(n for _, n in added_until(watch, 300, events)) == sorted(f"{i}.json" for i in ids)
        assert watch.poll(full=True).added == [] and watch.files == 303
        os.unlink(old)
        assert watch.poll(full=True).removed == [str(old)]
    finally:
        watch.close()


def test_rewritten_unfinished_run_is_reported_as_changed(tmp_path, writer):
    root = tmp_path / ".machine" / "runs"
    writer.do("run", root=str(root), machine="support", id="r1", finished=False)
    watch = RunFolderWatch(root, events=False)
    (path, d, name), = watch.poll().added
    watch.watch(path, d, name)
    assert len(watch.poll().changed) == 1  # once, for the write that may have come before watch()
    assert watch.poll().changed == []
    writer.do("run", root=str(root), machine="support", id="r1", finished=True)
    assert [c[2] for c in watch.poll().changed] == ["r1.json"]


def test_dashboard_counts_match_the_writers_log(tmp_path, writer):
    """Runs and events written in bursts between polls are each counted once, and a replaced
    events file drops what was counted from the old one."""
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    root.mkdir(parents=True)
    events = ws / ".machine" / "events.jsonl"
    writer.do("run", root=str(root), machine="support", id="first", score=0.5)
    d = Dashboard(ws, follow=False, file_events=False)
    picker = d.picker
    assert picker.count_line().startswith("1 runs")
    written = 1
    for k in range(4):
        ids = [f"k{k}-{i}" for i in range(25)]
        writer.do("runs", root=str(root), machine="support" if k % 2 else "coder", ids=ids, events=str(events))
        written += len(ids)
        d.poll()
        snap = d.state.snapshot()
        assert snap["runs"] == written
        assert snap["events"] == 2 * (written - 1)
        assert snap["event_counts"] == {"run.started": written - 1, "run.finished": written - 1}
        assert len(picker.runs) == written and picker.count_line().startswith(f"{written} runs")
    assert picker.page_keys[0].startswith("k3-")  # newest at the top
    writer.do("append", path=str(events), text='{"type": "trial.scored", "machine": "coder", "extra": [1, 2]}\n')
    d.poll()
    assert any(e.get("raw", "").endswith('"extra": [1, 2]}') for e in d.state.events)  # unknown type, shown raw
    assert "trial.scored" in d.state.html()
    writer.do("replace", path=str(events), text='{"type": "run.failed", "machine": "coder", "run": "x"}\n')
    d.poll()
    snap = d.state.snapshot()
    assert snap["events"] == 1 and snap["event_counts"] == {"run.failed": 1}
    assert "replaced" in snap["notes"][-1]
    assert {m["name"]: m["failed"] for m in snap["machines"]}["coder"] == 1
    key = snap["latest"][0]["key"]
    d.open_run(key)
    assert d.opened == key and key in d.static_html() and "answer" in d.previewer.static_html()
    d.close()


def test_dashboard_counts_runs_from_file_events_once(tmp_path, writer):
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    writer.do("run", root=str(root), machine="support", id="first")
    d = Dashboard(ws, follow=False)
    try:
        ids = [f"e{i}" for i in range(200)]
        writer.do("runs", root=str(root), machine="coder", ids=ids)
        deadline = time.monotonic() + 20
        while d.state.snapshot()["runs"] < 201 and time.monotonic() < deadline:
            d.poll()  # each poll takes the file events that have arrived
        d.poll(full=True)  # a listing finds nothing the events missed, and counts nothing twice
        assert d.state.snapshot()["runs"] == 201 and len(d.picker.runs) == 201
    finally:
        d.close()


def test_a_bad_run_file_is_named_in_a_note(tmp_path, writer):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    writer.do("run", root=str(root), machine="support", id="ok")
    state = DashboardState(ws, file_events=False)
    writer.do("replace", path=str(root / "support" / "bad.json"), text='{"id": "bad", "machine": "support",\n  "input": 3')
    res = state.poll()
    assert res.runs == 1 and state.snapshot()["runs"] == 1  # seen, not counted
    assert any("bad.json" in n and ":2" in n for n in res.notes), res.notes
    assert "bad.json" in state.html()


def test_dashboard_html_keeps_dollars_out_of_math_and_escapes_names(tmp_path, writer):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    writer.do("run", root=str(root), machine="support", id="r1", cost=1.25)
    writer.do("append", path=str(ws / ".machine" / "events.jsonl"),
              text='{"type": "<b>odd</b>", "note": "$5 and $6"}\n')
    html = DashboardState(ws, file_events=False).html()
    assert "tex2jax_ignore" in html and "&#36;1.25" in html and "$" not in html
    assert "<b>odd</b>" not in html and "&lt;b&gt;odd&lt;/b&gt;" in html


def test_static_fallback_is_the_dashboard_as_it_stands(tmp_path, writer):
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    writer.do("run", root=str(root), machine="support", id="r1", cost=1.25)
    d = Dashboard(ws, follow=False, file_events=False)
    bundle = d.static_bundle()
    assert bundle["text/plain"] == "Dashboard of ws: 1 machines, 1 runs, 0 events"
    assert "support/r1" in bundle["text/html"] and "&#36;1.25" in bundle["text/html"]
    writer.do("run", root=str(root), machine="coder", id="r2")
    d.poll()
    assert "coder/r2" in d.static_bundle()["text/html"]
    d.close()


def test_training_job_shows_steps_loss_and_eta(tmp_path, writer):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    log = ws / ".machine" / "training" / "sft-a"
    log.mkdir(parents=True)
    (log / "machine_nb.json").write_text(json.dumps({"steps": 10}))
    now = [100.0]
    state = DashboardState(ws, log_dirs=[], clock=lambda: now[0], file_events=False)
    writer.do("append", path=str(log / "metrics.jsonl"), text='{"step": 0, "train_mean_nll": 2.0}\n')
    state.poll()
    now[0] = 102.0
    writer.do("append", path=str(log / "metrics.jsonl"),
              text='{"step": 1, "train_mean_nll": 1.5}\n{"step": 2, "train_mean_nll": 1.0}\n')
    state.poll()
    job = state.snapshot()["jobs"][0]
    assert (job["steps"], job["total"], job["last_loss"], job["done"]) == (3, 10, 1.0, False)
    assert job["eta_s"] == pytest.approx(7 * 2 / 2)  # 2 steps in 2 s, 7 to go
    writer.do("append", path=str(log / "checkpoints.jsonl"), text='{"name": "final", "sampler_path": "x"}\n')
    state.poll()
    assert state.snapshot()["jobs"][0]["done"] and "done" in state.html()


def test_run_folders_are_walked_as_load_runs_walks_them(tmp_path):
    """A symlink loop under runs/ is not walked round and round (each run file once, where load_runs
    finds it), and links to a file system's root or to a folder holding the workspace are not entered."""
    import machine_nb as mnb

    root = tmp_path / ".machine" / "runs"
    (root / "support").mkdir(parents=True)
    (root / "support" / "r1.json").write_text(json.dumps({"id": "r1", "machine": "support"}))
    (root / "support" / "loop").symlink_to(root / "support")
    watch = RunFolderWatch(root, events=False)
    assert [(d, n) for _, d, n in watch.poll().added] == [("support", "r1.json")]
    (root / "everything").symlink_to("/")
    (root / "up").symlink_to(tmp_path)
    assert watch.poll(full=True).added == []
    paths = mnb.load_runs(tmp_path, on_error="skip", index=False)["path"].tolist()
    assert [p for p, _, _ in RunFolderWatch(root, events=False).poll().added] == paths


def test_a_followed_path_that_is_not_a_regular_file_is_refused_with_one_note(tmp_path):
    """events.jsonl as a link to a device or as a FIFO is not read (a device never ends, a FIFO
    blocks the open until a writer comes): one note names it, later reads say nothing more, and a
    regular file put in its place is read from its start."""
    path = tmp_path / "events.jsonl"
    path.symlink_to("/dev/zero")
    tail = LineTail(path)
    got = tail.read()
    assert got.lines == [] and not got.more
    assert got.notes == [f"{path}: a character device, not a regular file: not read"]
    assert tail.read().notes == [] and tail.offset == 0
    path.unlink()
    os.mkfifo(path)
    got = tail.read()  # returns: the FIFO is never opened for a blocking read
    assert got.lines == [] and got.notes == [f"{path}: a FIFO (named pipe), not a regular file: not read"]
    assert tail.read().notes == []
    path.unlink()
    path.write_text('{"n": 1}\n')
    assert [x.value["n"] for x in tail.read().lines] == [1]
