"""Reading a Machine workspace: runs (nested machines, newest first, documented columns), messages,
sessions, events, machine definitions; misplaced files are reported, never silently dropped; the
sample workspace generator is deterministic."""

import filecmp
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.data.frames import MESSAGE_COLUMNS, RUN_COLUMNS
from machine_nb.store.workspace import SkippedFiles, name_segments

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


@pytest.fixture(scope="module")
def runs():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the committed sample has no bad file
        return mnb.load_runs(SAMPLE)


def test_sample_runs_table(runs):
    assert list(runs.columns) == RUN_COLUMNS
    assert len(runs) >= 300
    assert set(runs["machine"]) == {"support", "chatbot/triage", "coder", "tutor"}
    assert {"echo", "tinker", "openai", "scripted"} <= set(runs["harness"])
    assert runs["model"].nunique() >= 3
    made_up = runs[runs["machine"] != "tutor"]  # the tutor's runs are real replies, under one rubric
    assert made_up["rubric"].dropna().groupby(made_up["machine"]).nunique().min() == 2  # two fingerprints each
    # newest first
    assert runs["started_at"].is_monotonic_decreasing
    assert str(runs["started_at"].dtype).startswith("datetime64") and (runs["duration_s"] > 0).all()
    # tools, failures, conversations
    coder = runs[runs["machine"] == "coder"]
    assert (coder["n_tool_calls"] > 0).all() and coder["n_failed_tool_calls"].sum() > 0
    triage = runs[runs["machine"] == "chatbot/triage"]
    assert (~triage["final"]).any() and triage["final"].any()
    assert (triage["case"] != triage["input"]).any()  # follow-up turns belong to their opening case
    assert runs["cost_usd"].notna().all() and runs["score"].isna().any()  # some runs unscored
    row = runs.iloc[0]
    assert row["run"]["id"] == row["id"] and row["path"].endswith(f"{row['id']}.json")
    assert runs.attrs["workspace"] == str(SAMPLE)


def test_one_machine_and_tags_column(runs):
    coder = mnb.load_runs(SAMPLE, "coder")
    assert len(coder) == (runs["machine"] == "coder").sum()
    assert len(mnb.load_runs(SAMPLE / ".machine", "chatbot")) == (runs["machine"] == "chatbot/triage").sum()
    tagged = mnb.load_runs(SAMPLE, store=SAMPLE / ".machine-store")
    assert "tags" in tagged.columns and "tags" not in runs.columns
    flat = [t for tags in tagged["tags"] for t in tags]
    assert {"good", "bad", "observed"} <= set(flat)
    assert len(flat) == len(mnb.tagged(SAMPLE / ".machine-store"))


def test_messages_rows(runs):
    coder = runs[runs["machine"] == "coder"]
    msgs = mnb.messages(coder)
    assert list(msgs.columns) == MESSAGE_COLUMNS
    assert len(msgs) == coder["n_messages"].sum()
    calls = msgs[msgs["is_tool_call"]]
    assert len(calls) == coder["n_tool_calls"].sum()
    assert calls["failed"].sum() == coder["n_failed_tool_calls"].sum() > 0
    assert calls["tool_name"].isin(["read_file", "edit_file", "run_tests"]).all()
    assert msgs["reasoning"].notna().any()
    one = mnb.messages(coder.iloc[0])
    assert list(one["index"]) == list(range(len(one)))
    triage = mnb.messages(runs[runs["machine"] == "chatbot/triage"])
    assert triage["in_history"].any()
    # a user predicate decides failure
    never = mnb.messages(coder, failed=lambda call, result: False)
    assert not never["failed"].any()


def test_sessions_events_machines():
    sessions = mnb.load_sessions(SAMPLE)
    assert len(sessions) == 3 and set(sessions["machine"]) == {"support", "chatbot/triage"}
    assert sessions["updated_at"].is_monotonic_decreasing and (sessions["n_messages"] > 0).all()
    events = mnb.load_events(SAMPLE)
    assert set(events["type"]) == {"run.started", "run.finished"}
    assert len(events) == 2 * len(list((SAMPLE / ".machine" / "runs").rglob("*.json")))
    assert mnb.list_machines(SAMPLE) == ["chatbot/triage", "coder", "support", "tutor"]
    coder = mnb.load_machine(SAMPLE, "coder")
    assert coder["rubric"].startswith("rb-") and [t["name"] for t in coder["tools"]] == ["read_file", "edit_file", "run_tests"]
    assert coder["cases"] and coder["holdout"] and coder["live_version"] == "v2"
    assert coder["instructions"].startswith("You fix failing tests")
    triage = mnb.load_machine(SAMPLE, "chatbot/triage")
    assert triage["model"] == "Qwen/Qwen3.6-35B-A3B" and all(isinstance(c["input"], str) for c in triage["cases"])
    with pytest.raises(MachineFormatError, match="no machine 'nope'"):
        mnb.load_machine(SAMPLE, "nope")


def _ws(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / ".machine" / "runs" / "support", ws / ".machine" / "runs" / "support")
    return ws


def test_hidden_folders_such_as_jupyterlabs_checkpoints_are_not_read(tmp_path):
    """JupyterLab keeps a copy of each file opened and saved in it in `.ipynb_checkpoints/` beside
    the file: such hidden folders are not Machine's (a machine name segment never starts with a
    "."), so, like hidden files, they are left alone, never read nor reported, by every reader of
    runs and sessions (the direct load, the run index and the dashboard's folder watch)."""
    from machine_nb.store.follow import RunFolderWatch

    ws = _ws(tmp_path)
    runs = ws / ".machine/runs/support"
    good = sorted(runs.glob("*.json"))
    for folder in (runs / ".ipynb_checkpoints", ws / ".machine/runs/.ipynb_checkpoints"):
        folder.mkdir()
        shutil.copy(good[0], folder / (good[0].stem + "-checkpoint.json"))
    sessions = ws / ".machine/sessions/support"
    (sessions / ".ipynb_checkpoints").mkdir(parents=True)
    (sessions / ".ipynb_checkpoints" / "s-checkpoint.json").write_text("[]")
    for folder in (runs, runs.parent):  # settled an hour ago: a reload takes the index's list of their folders
        os.utime(folder, (time.time() - 3600,) * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFiles)
        assert len(mnb.load_runs(ws, index=False)) == len(good)
        assert len(mnb.load_runs(ws, index=True)) == len(good)
        assert len(mnb.load_runs(ws, index=True)) == len(good)  # the index's reload, too
        mnb.load_sessions(ws)
    # an index written when hidden folders were listed: its unchanged folders' lists name them
    from machine_nb.store import index as index_mod

    ipath = index_mod.run_index_path(ws)
    table, meta, why = index_mod.read_index(ipath, os.path.realpath(ws / ".machine/runs"))
    assert why is None and ".ipynb_checkpoints" not in meta["dirs"]["support"][2]
    meta["dirs"]["support"][2].append(".ipynb_checkpoints")
    index_mod.write_index(ipath, table, meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFiles)
        assert len(mnb.load_runs(ws, index=True)) == len(good)
    watch = RunFolderWatch(ws / ".machine/runs", events=False)
    try:
        changes = watch.poll()
        assert sorted(a[0] for a in changes.added) == [str(p) for p in good] and not changes.notes
    finally:
        watch.close()


def test_misplaced_and_bad_files_are_reported(tmp_path):
    ws = _ws(tmp_path)
    good = len(list((ws / ".machine/runs/support").glob("*.json")))
    some = sorted((ws / ".machine/runs/support").glob("*.json"))[0]
    run = json.loads(some.read_text())
    # wrong folder for its machine, a bad folder segment, a file directly under runs/, bad JSON
    (ws / ".machine/runs/coder").mkdir()
    (ws / ".machine/runs/coder" / some.name).write_text(json.dumps(run))
    (ws / ".machine/runs/Bad_Name").mkdir()
    (ws / ".machine/runs/Bad_Name/x1.json").write_text(json.dumps({**run, "id": "x1", "machine": "Bad_Name"}))
    (ws / ".machine/runs/loose.json").write_text("{}")
    (ws / ".machine/runs/support/broken.json").write_text('{"id": "broken", "machine": "supp')
    with pytest.warns(SkippedFiles) as rec:
        df = mnb.load_runs(ws)
    assert len(df) == good
    text = str(rec[0].message)
    assert "skipped 4 run file(s)" in text
    assert "but is stored under runs/coder/" in text and "'Bad_Name' is not a valid" in text
    assert "loose.json" in text and "broken.json:1" in text
    with pytest.raises(MachineFormatError) as exc:
        mnb.load_runs(ws, on_error="raise")
    assert exc.value.path and exc.value.path.endswith(".json")
    # "skip" leaves them out without a word
    from machine_nb.store.workspace import iter_runs

    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFiles)
        assert len(mnb.load_runs(ws, on_error="skip")) == good
        skipped: list = []
        assert len(list(iter_runs(ws, "support", on_error="skip", skipped=skipped))) == good
        assert [os.path.basename(e.path) for e in skipped] == ["broken.json"]
    with pytest.warns(SkippedFiles, match="skipped 1 run file"):
        list(iter_runs(ws, "support"))
    with pytest.raises(ValueError, match="on_error must be one of"):
        mnb.load_runs(ws, on_error="strict")
    (ws / ".machine/sessions/support").mkdir(parents=True, exist_ok=True)
    (ws / ".machine/sessions/support/bad.json").write_text("[]")
    with pytest.raises(MachineFormatError, match="bad.json"):
        mnb.load_sessions(ws, on_error="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedFiles)
        mnb.load_sessions(ws, on_error="skip")


def test_mistyped_fields_name_the_field(tmp_path):
    ws = _ws(tmp_path)
    path = sorted((ws / ".machine/runs/support").glob("*.json"))[0]
    run = json.loads(path.read_text())
    for mutate, field in [(lambda r: r["scorecard"].update(total="1"), "scorecard.total"),
                          (lambda r: r["trajectory"][0].update(role="robot"), "trajectory[0].role"),
                          (lambda r: r.update(usage={"costUsd": "free"}), "usage.costUsd"),
                          (lambda r: r.pop("machine"), "machine"),
                          (lambda r: r.update(id="other"), "id")]:
        bad = json.loads(json.dumps(run))
        mutate(bad)
        path.write_text(json.dumps(bad))
        with pytest.raises(MachineFormatError) as exc:
            mnb.load_runs(ws, on_error="raise")
        assert exc.value.field == field and str(path) in str(exc.value)


def test_bad_timestamps_kept_with_nat(tmp_path):
    ws = _ws(tmp_path)
    path = sorted((ws / ".machine/runs/support").glob("*.json"))[0]
    run = json.loads(path.read_text())
    path.write_text(json.dumps({**run, "startedAt": "yesterday"}))
    with pytest.warns(SkippedFiles, match="unparseable started_at"):
        df = mnb.load_runs(ws)
    assert df["started_at"].isna().sum() == 1 and pd.isna(df.iloc[-1]["started_at"])  # NaT sorts last


def test_segment_rule():
    assert name_segments("chatbot/triage") == ["chatbot", "triage"]
    for bad in ["", "Chatbot", "a//b", "-a", "a/.b", "a b", "chatbot\n", "chatbot/triage\n"]:  # a newline too
        with pytest.raises(ValueError, match="Invalid"):
            name_segments(bad)


def test_empty_workspace(tmp_path):
    with pytest.warns(UserWarning, match="is this a Machine workspace"):
        df = mnb.load_runs(tmp_path)
    with pytest.raises(MachineFormatError, match="no such workspace"):
        mnb.load_runs(tmp_path / "missing")
    (tmp_path / ".machine" / "runs").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(mnb.load_runs(tmp_path)) == 0  # a workspace that has not run yet: empty, no warning
    assert list(df.columns) == RUN_COLUMNS and len(df) == 0
    assert len(mnb.load_events(tmp_path)) == 0 and len(mnb.load_sessions(tmp_path)) == 0
    assert mnb.messages(df).columns.tolist() == MESSAGE_COLUMNS


def test_sample_generator_is_deterministic_and_matches_commit(tmp_path):
    from machine_nb.tools.sample_workspace import generate

    out = generate(tmp_path / "a")
    cmp = filecmp.dircmp(out, SAMPLE)

    def diffs(c):
        found = c.left_only + c.right_only + c.diff_files + c.funny_files
        for sub in c.subdirs.values():
            found += diffs(sub)
        return found

    assert diffs(cmp) == []
    for f in (SAMPLE / ".machine" / "runs").rglob("*.json"):
        assert filecmp.cmp(f, out / f.relative_to(SAMPLE), shallow=False)
    total = sum(f.stat().st_size for f in SAMPLE.rglob("*") if f.is_file())
    assert total < 3_000_000


def _tree(root):
    """Every file under root (symlinks as links) with its bytes."""
    return {p.relative_to(root).as_posix(): (os.readlink(p) if p.is_symlink() else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


def test_sample_generator_refuses_a_workspace_it_did_not_write(tmp_path, capsys):
    from machine_nb.tools.sample_workspace import generate, main

    ws = tmp_path / "mine"
    shutil.copytree(SAMPLE / ".machine", ws / ".machine")  # a real workspace: Machine wrote these, not the generator
    (ws / "machines" / "bot").mkdir(parents=True)
    (ws / "machines" / "bot" / "instructions.md").write_text("my own machine\n")
    before = _tree(ws)
    with pytest.raises(FileExistsError, match=r"\.machine-nb-sample\.json") as e:
        generate(ws)
    assert str(ws / ".machine") in str(e.value)
    assert main([str(ws)]) != 0
    assert str(ws / ".machine") in capsys.readouterr().err
    assert _tree(ws) == before  # nothing deleted, nothing written
    only_store = tmp_path / "store-only"
    (only_store / ".machine-store").mkdir(parents=True)
    (only_store / ".machine-store" / "tags.jsonl").write_text('{"tag": "good"}\n')
    with pytest.raises(FileExistsError, match="machine-store"):
        generate(only_store)
    assert (only_store / ".machine-store" / "tags.jsonl").read_text() == '{"tag": "good"}\n'


@pytest.mark.parametrize("change", ["added run", "changed tag row", "symlink", "foreign marker"])
def test_sample_generator_replaces_only_its_own_unchanged_files(tmp_path, change):
    from machine_nb.tools.sample_workspace import generate

    ws = generate(tmp_path / "ws", n_runs=40)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the generator's\n")
    store = next((ws / ".machine-store").glob("*.jsonl"))
    if change == "added run":  # e.g. Machine ran in the sample workspace afterwards
        culprit = ws / ".machine" / "runs" / "support" / "my-run.json"
        culprit.write_text('{"id": "my-run"}\n')
    elif change == "changed tag row":  # e.g. /good written into the sample's store
        culprit = store
        with store.open("a") as f:
            f.write('{"tag": "good", "id": "mine"}\n')
    elif change == "symlink":
        culprit = ws / "machines" / "support" / "notes.txt"
        culprit.symlink_to(outside)
    else:  # a file of the marker's name that the generator did not write
        culprit = ws / ".machine-nb-sample.json"
        culprit.write_text("my notes\n")
    before = _tree(ws)
    with pytest.raises(FileExistsError) as e:
        generate(ws, n_runs=40)
    assert str(culprit) in str(e.value)
    assert _tree(ws) == before and outside.read_text() == "not the generator's\n"


def test_sample_generator_replaces_its_own_output_whole(tmp_path):
    from machine_nb.tools.sample_workspace import generate

    ws = generate(tmp_path / "ws", n_runs=80, seed=3)
    (ws / "README.txt").write_text("beside the generated folders: kept\n")
    generate(ws, n_runs=40, seed=0)  # fewer runs: the first one's extra files must go
    fresh = generate(tmp_path / "fresh", n_runs=40, seed=0)
    assert {k: v for k, v in _tree(ws).items() if k != "README.txt"} == _tree(fresh)
    assert (ws / "README.txt").read_text() == "beside the generated folders: kept\n"
    generate(ws)  # the committed sample's shape over it, twice
    generate(ws)
    assert {k: v for k, v in _tree(ws).items() if k != "README.txt"} == _tree(SAMPLE)


def test_symlinked_machine_folder_is_followed_and_loops_are_reported(tmp_path):
    ws = _ws(tmp_path)
    n = len(list((ws / ".machine/runs/support").glob("*.json")))
    elsewhere = tmp_path / "elsewhere" / "coder"
    shutil.copytree(SAMPLE / ".machine" / "runs" / "coder", elsewhere)
    (ws / ".machine/runs/coder").symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(ws / ".machine" / "runs", target_is_directory=True)  # back up the tree
    with pytest.warns(SkippedFiles) as rec:
        df = mnb.load_runs(ws)
    assert (df["machine"] == "coder").sum() == len(list(elsewhere.glob("*.json"))) > 0
    assert (df["machine"] == "support").sum() == n
    text = "\n".join(str(r.message) for r in rec)
    assert "loop" in text and "symlink" in text  # said, not silently dropped
    with pytest.warns(SkippedFiles, match="loop"):  # the same loop, seen from inside the machine
        assert len(mnb.load_runs(ws, "coder")) == (df["machine"] == "coder").sum()


def test_session_and_event_times_that_do_not_parse_are_named(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / ".machine" / "sessions", ws / ".machine" / "sessions")
    path = sorted((ws / ".machine/sessions/support").glob("*.json"))[0]
    s = json.loads(path.read_text())
    path.write_text(json.dumps({**s, "updatedAt": "last tuesday"}))
    with pytest.warns(SkippedFiles, match=r"(?s)updatedAt.*last tuesday") as rec:
        sessions = mnb.load_sessions(ws)
    assert str(path) in str(rec[0].message) and sessions["updated_at"].isna().sum() == 1
    (ws / ".machine" / "events.jsonl").write_text(
        '{"type": "run.started", "time": "2026-11-02T09:00:00Z"}\n{"type": "run.finished", "time": "soon"}\n'
        '{"type": "x", "at": 12}\n')
    with pytest.warns(SkippedFiles) as rec:
        events = mnb.load_events(ws)
    text = str(rec[0].message)
    assert "events.jsonl:2" in text and "'time'" in text and "soon" in text and "events.jsonl:3" in text
    assert events["time"].isna().tolist() == [False, True, True]


def test_symlinked_machine_definition_is_listed(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "support", ws / "machines" / "support")
    shutil.copytree(SAMPLE / "machines" / "coder", tmp_path / "shared" / "coder")
    (ws / "machines" / "coder").symlink_to(tmp_path / "shared" / "coder", target_is_directory=True)
    (tmp_path / "shared" / "coder" / "up").symlink_to(ws / "machines", target_is_directory=True)  # a loop
    with pytest.warns(SkippedFiles, match="loop"):
        assert mnb.list_machines(ws) == ["coder", "support"]
    assert mnb.load_machine(ws, "coder")["tools"]
