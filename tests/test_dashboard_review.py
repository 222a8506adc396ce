"""The Dashboard and the CandidateView where their input is odd: secrets in event text and in run
files' bad fields, a training run whose loss or step is not a finite number or is read twice before
it is applied, a dashboard left open over midnight, event times with a UTC offset, events naming a
machine outside `machines/`, a commit that changes nothing else, runs of another workspace, a
versions.json that is a FIFO, a Commit click that meets a damaged versions.json."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_writer import write_run  # noqa: E402

SECRET = "dashboard-canary-secret-value-42"
KEY = "sk-" + "a1b2c3d4e5" * 3  # key-shaped, set nowhere


def utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def events_file(ws: Path, *records: object) -> Path:
    path = ws / ".machine" / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def test_secrets_in_event_text_never_reach_the_view_or_the_saved_notebook(tmp_path, monkeypatch):
    from machine_nb.widgets.dashboard import Dashboard

    monkeypatch.setenv("DASH_REVIEW_API_KEY", SECRET)
    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    events_file(ws, {"type": "tool.call", "machine": "support", "run": "r1", "args": f"token {SECRET} and {KEY}"},
                f"not json: {KEY} {SECRET}",
                {"type": "run.failed", "machine": "support", "run": "r1", "error": f"auth with {SECRET} failed"})
    d = Dashboard(ws, follow=False, file_events=False)
    try:
        events_file(ws, {"type": "tool.result", "machine": "support", "run": "r1", "out": f"{KEY}"})
        d.poll()
        html, saved = d.state.html(), d.static_bundle()["text/html"]
        for text in (html, saved):
            assert SECRET not in text and KEY not in text
            assert "[redacted]" in text and "tool.call" in text and "tool.result" in text  # the events stay shown
    finally:
        d.close()


def test_a_diverged_loss_keeps_its_curve_and_the_page_data_valid_json(tmp_path):
    from machine_nb.widgets.dashboard import DashboardState, sparkline

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    log = ws / ".machine" / "training" / "sft-a"
    log.mkdir(parents=True)
    (log / "metrics.jsonl").write_text('{"step": 0, "train_mean_nll": 2.0}\n{"step": 1, "train_mean_nll": 1.0}\n'
                                       '{"step": 2, "train_mean_nll": Infinity}\n{"step": 3, "train_mean_nll": NaN}\n')
    state = DashboardState(ws, log_dirs=[], file_events=False)
    points = re.search(r'points="([^"]*)"', sparkline([2.0, 1.0, float("inf"), float("nan"), 0.5])).group(1)
    assert len(points.split()) == 3 and "nan" not in points and "inf" not in points  # the finite points drawn
    curve = re.search(r'class="mnb-jobs".*?points="([^"]*)"', state.html()).group(1)
    assert len(curve.split()) == 2 and "nan" not in curve
    assert "<td style=\"" in state.html() and ">nan</td>" in state.html()  # the view says the loss went NaN
    snap = state.snapshot()
    assert snap["jobs"][0]["steps"] == 4
    json.dumps(snap, allow_nan=False)  # what the page's JSON.parse can read
    assert snap["jobs"][0]["last_loss"] is None


def test_a_metrics_line_with_a_step_or_progress_out_of_range_is_read_not_raised(tmp_path):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    log = ws / ".machine" / "training" / "sft-b"
    log.mkdir(parents=True)
    metrics = log / "metrics.jsonl"
    metrics.write_text('{"step": 0, "train_mean_nll": 2.0}\n')
    state = DashboardState(ws, log_dirs=[], file_events=False)
    with metrics.open("a") as f:
        f.write('{"step": Infinity, "train_mean_nll": 1.5}\n{"step": NaN, "train_mean_nll": 1.4}\n'
                '{"step": 3, "train_mean_nll": 1.2, "progress": 1e-320}\n'
                f'{{"step": 4, "train_mean_nll": 1{"0" * 400}, "progress": 1{"0" * 400}}}\n'
                '{"step": 5, "train_mean_nll": 1.0}\n')
    state.poll()  # no OverflowError / ValueError out of the poll (nor out of the loop that applies it)
    job = state.snapshot()["jobs"][0]
    assert job["steps"] == 6 and job["last_loss"] == 1.0 and job["total"] is None


def test_finished_and_failed_today_start_again_at_midnight_utc(tmp_path):
    import time

    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    events_file(ws, {"type": "run.failed", "machine": "support", "run": "r2", "time": stamp})
    now = [time.time()]
    state = DashboardState(ws, log_dirs=[], clock=lambda: now[0], file_events=False)
    m = state.snapshot()["machines"][0]
    assert (m["finished_today"], m["failed_today"], m["failed"]) == (1, 1, 1)
    now[0] += 86400  # the dashboard is still open the next day
    m = state.snapshot()["machines"][0]
    assert (m["finished_today"], m["failed_today"], m["failed"]) == (0, 0, 1)
    write_run(str(ws / ".machine" / "runs"), "support", "r3")
    state.poll()
    assert state.snapshot()["machines"][0]["finished_today"] == 0  # r3 finished yesterday by its own time


def test_failed_today_reads_an_event_time_with_an_offset_as_utc(tmp_path):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    events_file(ws,
                {"type": "run.failed", "machine": "a", "run": "1", "time": "2026-03-10T01:00:00+05:00"},  # 9th, UTC
                {"type": "run.failed", "machine": "b", "run": "2", "time": "2026-03-09T23:00:00-05:00"},  # 10th, UTC
                {"type": "run.failed", "machine": "c", "run": "3", "time": "2026-03-10T08:00:00.123Z"})
    state = DashboardState(ws, log_dirs=[], clock=lambda: utc("2026-03-10T12:00:00"), file_events=False)
    today = {m["name"]: m["failed_today"] for m in state.snapshot()["machines"]}
    assert today == {"a": 0, "b": 1, "c": 1}


def test_an_event_naming_a_machine_outside_machines_reads_no_versions_there(tmp_path):
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    (ws / "machines").mkdir()
    (ws / "outside").mkdir()
    (ws / "outside" / "versions.json").write_text(json.dumps([{"id": "not-a-machine", "live": True}]))
    events_file(ws, {"type": "run.started", "machine": "../outside", "run": "x"})
    state = DashboardState(ws, log_dirs=[], file_events=False)
    machines = {m["name"]: m for m in state.snapshot()["machines"]}
    assert machines["../outside"]["running"] == 1  # the event is counted, under the name it gives
    assert machines["../outside"]["live_version"] is None
    assert "not-a-machine" not in state.html()


# ---------------------------------------------------------------- CandidateView


def test_a_commit_click_that_meets_a_damaged_versions_file_says_so_in_the_view(tmp_path):
    import shutil

    import machine_nb as mnb
    from test_candidate_view import SAMPLE, make  # a candidate measured on the sample tutor machine

    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", ws / "machines" / "tutor")
    cand = make(ws, learned=8)
    assert cand.passed
    view = mnb.CandidateView(cand)
    versions = ws / "machines" / "tutor" / "versions.json"
    versions.write_text('[{"id": "v1", "model": ')  # torn by an editor or another tool
    view._button.click()
    assert view.committed is None and not view._button.disabled
    assert view.status.startswith("Not committed: ") and "versions.json" in view.status
    assert "versions.json" in view.static_html()
    assert versions.read_text() == '[{"id": "v1", "model": '  # nothing written


def test_run_files_with_bad_fields_are_notes_in_the_view_redacted_not_warnings_from_the_thread(tmp_path):
    """What the follower's thread parses is said in the view: a warning raised there would land in
    whichever cell ran last (and in the saved notebook), with the value it quotes."""
    import warnings

    from dashboard_writer import run_record
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    write_run(str(root), "support", "r1")
    state = DashboardState(ws, log_dirs=[], file_events=False)
    bad_time, bad_id = run_record("support", "t1"), run_record("support", "b1")
    bad_time["startedAt"], bad_id["id"] = KEY, KEY
    (root / "support" / "t1.json").write_text(json.dumps(bad_time))
    (root / "support" / "b1.json").write_text(json.dumps(bad_id))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = state.poll(full=True)
    assert [str(w.message) for w in caught] == []
    assert state.snapshot()["runs"] == 2  # t1 is counted (its time NaT), b1 is skipped
    notes = state.snapshot()["notes"]
    assert any("t1.json" in n and "started_at" in n for n in notes), notes
    assert any("b1.json" in n and "'id'" in n for n in notes), notes
    assert not any(KEY in n for n in [*notes, *res.notes]) and KEY not in state.html()


def test_a_commit_alone_redraws_the_live_version(tmp_path):
    """versions.json changing (a commit or revert) is a change of the view: the widget and the
    page (which asks by `version`) show the new live version without waiting for a run or event."""
    from machine_nb.widgets.dashboard import Dashboard

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    versions = ws / "machines" / "support" / "versions.json"
    versions.parent.mkdir(parents=True)
    (versions.parent / "instructions.md").write_text("Answer.\n")
    versions.write_text(json.dumps([{"id": "v1", "model": "m1", "live": True}]))
    d = Dashboard(ws, follow=False, file_events=False)
    try:
        assert ">v1<" in d._view.html
        before = d.state.version
        tmp = versions.with_name("versions.json.tmp")
        tmp.write_text(json.dumps([{"id": "v1", "model": "m1"}, {"id": "v2", "model": "m2", "live": True}]))
        tmp.replace(versions)
        res = d.poll()
        assert res.versions == 1 and d.state.version > before
        assert ">v2<" in d._view.html and ">v2<" in d.static_bundle()["text/html"]
        assert d.poll().versions == 0
    finally:
        d.close()


def test_a_new_training_run_read_twice_before_it_is_applied_counts_each_line_once(tmp_path):
    """While a cell runs (mnb.sft in the same notebook), the kernel's loop applies nothing, so the
    follower's reads pile up: a training log dir that appears meanwhile is read on from where the
    last read stopped, not again from its start by each read."""
    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    (ws / ".machine" / "runs").mkdir(parents=True)
    state = DashboardState(ws, log_dirs=[], file_events=False)
    log = ws / ".machine" / "training" / "sft-c"
    log.mkdir(parents=True)
    metrics = log / "metrics.jsonl"
    metrics.write_text('{"step": 0, "train_mean_nll": 2.0}\n{"step": 1, "train_mean_nll": 1.5}\n')
    first = state.read()
    with metrics.open("a") as f:
        f.write('{"step": 2, "train_mean_nll": 1.0}\n')
    second, third = state.read(), state.read()
    for batch in (first, second, third):
        state.apply(batch)
    job = state.jobs[str(log)]
    assert job.points == [(0, 2.0), (1, 1.5), (2, 1.0)] and job.steps == 3


def test_runs_of_another_workspace_are_refused_not_counted_as_this_ones(tmp_path):
    import machine_nb as mnb
    from machine_nb.widgets.dashboard import DashboardState

    a, b = tmp_path / "a", tmp_path / "b"
    write_run(str(a / ".machine" / "runs"), "support", "r1")
    write_run(str(b / ".machine" / "runs"), "coder", "r2")
    with pytest.raises(ValueError, match="runs of .*a.* not of .*b"):
        DashboardState(b, runs=mnb.load_runs(a), file_events=False)
    state = DashboardState(b, runs=mnb.load_runs(b), file_events=False)
    assert [m["name"] for m in state.snapshot()["machines"]] == ["coder"]


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
def test_a_versions_file_that_is_a_fifo_is_not_read(tmp_path):
    """Reading a FIFO waits for a writer: the dashboard (on the kernel's loop) would hang."""
    import os
    import threading

    from machine_nb.widgets.dashboard import DashboardState

    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    folder = ws / "machines" / "support"
    folder.mkdir(parents=True)
    (folder / "instructions.md").write_text("Answer.\n")
    os.mkfifo(folder / "versions.json")
    made = []
    t = threading.Thread(target=lambda: made.append(DashboardState(ws, log_dirs=[], file_events=False)), daemon=True)
    t.start()
    t.join(30)  # a hang, not a timing: a working read returns at once
    hung = t.is_alive()
    if hung:  # let the stuck read end, so the test process can
        with open(folder / "versions.json", "w"):
            pass
        t.join(10)
    assert not hung and made[0].snapshot()["machines"][0]["live_version"] is None
