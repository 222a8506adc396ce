"""Reading a Machine workspace at its edges: run files nested deeper than any reader walks or
holding NaN, a scorecard total JavaScript wrote as null, definition files saved by Windows editors
or linked to nothing, a folder of nested machines asked for as a machine, a link from one machine's
folder of runs to another's, copied session files and epoch times, and an event stream that is
large, damaged or private to another user."""

import json
import os
import warnings

import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.core.jsonl import MAX_DEPTH
from machine_nb.data.export import training_lines
from machine_nb.errors import MachineFormatError
from machine_nb.store.workspace import SkippedFiles, load_events, load_machine, read_run, resolve_machine

START = "2026-01-01T00:00:00.000Z"


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, caught


def _run(ws, machine, run_id, tool_input=None, **extra):
    """A small finished run with one tool call, written as Machine writes it."""
    traj = [{"role": "user", "content": "What is 47 plus 15?"},
            {"role": "assistant", "content": "", "name": "calc", "toolCallId": "c1",
             "toolInput": {"expr": "47+15"} if tool_input is None else tool_input},
            {"role": "tool", "content": "62", "name": "calc", "toolCallId": "c1"},
            {"role": "assistant", "content": "answer: 62"}]
    run = {"id": run_id, "machine": machine, "input": "What is 47 plus 15?", "output": "answer: 62",
           "startedAt": START, "finishedAt": START, "trajectory": traj, **extra}
    path = ws / ".machine" / "runs" / machine / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))
    return path


# ---------------------------------------------------------------------------------------------
# Nesting depth


def _deep_run(ws, run_id, depth):
    """A run whose tool input is an array nested `depth` levels deep."""
    path = _run(ws, "m", run_id, tool_input="@DEEP@")
    path.write_text(path.read_text().replace('"@DEEP@"', "[" * depth + "]" * depth))
    return path


@pytest.mark.parametrize("depth", [MAX_DEPTH + 100, 1000, 5000])
def test_a_run_nested_deeper_than_the_jsonl_limit_is_a_bad_file_naming_its_field(tmp_path, depth):
    path = _deep_run(tmp_path, "r1", depth)
    with pytest.raises(MachineFormatError) as err:
        read_run(path)
    assert "nested deeper than" in str(err.value) and err.value.field == "trajectory" and str(path) in str(err.value)


@pytest.mark.parametrize("index", [False, True])
def test_a_deeply_nested_run_is_skipped_so_training_lines_never_meets_a_recursion_error(tmp_path, index):
    """orjson reads 1,000 levels; json.dumps of that tool input in training_lines would not."""
    _run(tmp_path, "m", "good")
    bad = _deep_run(tmp_path, "deep", 1000)
    runs, caught = _caught(lambda: mnb.load_runs(tmp_path, index=index))
    assert runs["id"].tolist() == ["good"]
    said = "\n".join(str(w.message) for w in caught)
    assert str(bad) in said and "nested deeper than" in said
    assert len(training_lines(runs, {"name": "m"})) >= 1


def test_a_run_whose_strings_hold_many_brackets_is_read(tmp_path):
    """Brackets inside strings are text, not nesting: such a run reads as any other."""
    text = "[" * (MAX_DEPTH + 50)
    path = _run(tmp_path, "m", "r1", tool_input={"expr": text})
    assert read_run(path)["trajectory"][1]["toolInput"]["expr"] == text


# ---------------------------------------------------------------------------------------------
# instructions.md as editors save it


def _machine(ws, name="m", **files):
    d = ws / "machines" / name
    d.mkdir(parents=True, exist_ok=True)
    for fname, content in files.items():
        (d / fname.replace("_", ".")).write_bytes(content if isinstance(content, bytes) else content.encode())
    return d


def test_instructions_saved_with_a_utf8_byte_order_mark_start_with_their_first_word(tmp_path):
    """Notepad's "UTF-8 with BOM": the mark is not part of the system prompt a model is trained on."""
    _machine(tmp_path, instructions_md=b"\xef\xbb\xbfYou answer with a number.\n")
    assert load_machine(tmp_path, "m")["instructions"] == "You answer with a number.\n"


def test_instructions_saved_as_utf16_say_so_and_how_to_fix_it(tmp_path):
    d = _machine(tmp_path, instructions_md="You answer with a number.\n".encode("utf-16"))
    with pytest.raises(MachineFormatError) as err:
        load_machine(tmp_path, "m")
    said = str(err.value)
    assert str(d / "instructions.md") in said and "UTF-16" in said and "save it as UTF-8" in said


# ---------------------------------------------------------------------------------------------
# Event stream


def test_many_non_object_event_lines_give_one_warning_listing_them(tmp_path):
    path = tmp_path / ".machine" / "events.jsonl"
    path.parent.mkdir(parents=True)
    good = json.dumps({"type": "run.started", "time": START, "machine": "m", "run": "r1"})
    path.write_text("".join(f"{i}\n" for i in range(50)) + good + "\n[]\n{\"type\":\n")
    events, caught = _caught(lambda: load_events(tmp_path))
    assert events["line"].tolist() == [51] and events["type"].tolist() == ["run.started"]
    assert len(caught) == 1  # one warning, however many lines are bad
    said = str(caught[0].message)
    assert "skipped 52 event line(s)" in said and f"{path}:1:" in said and "… and 32 more" in said
    with pytest.raises(MachineFormatError) as err:
        load_events(tmp_path, on_error="raise")
    assert err.value.line == 1
    events, caught = _caught(lambda: load_events(tmp_path, on_error="skip"))
    assert len(events) == 1 and not caught


# ---------------------------------------------------------------------------------------------
# Machine definitions


def test_a_folder_of_nested_machines_is_not_itself_a_machine_with_an_empty_definition(tmp_path):
    """`chatbot/` holds only `chatbot/triage/`: asking for "chatbot" is an error listing the
    machines there are, not a definition without instructions, model or cases that training would
    use silently."""
    _machine(tmp_path, "chatbot/triage", instructions_md="Sort tickets.\n", model_json='{"model": "x"}')
    assert mnb.list_machines(tmp_path) == ["chatbot/triage"]
    with pytest.raises(MachineFormatError) as err:
        load_machine(tmp_path, "chatbot")
    assert "no machine 'chatbot'" in str(err.value) and "chatbot/triage" in str(err.value)
    assert resolve_machine("chatbot", tmp_path, undefined="name") == {"name": "chatbot"}
    assert load_machine(tmp_path, "chatbot/triage")["instructions"] == "Sort tickets.\n"


# ---------------------------------------------------------------------------------------------
# Runs as JavaScript writes them


def test_a_scorecard_whose_total_javascript_wrote_as_null_is_an_unscored_run_not_a_bad_file(tmp_path):
    """JSON.stringify writes NaN and Infinity as null: a total of 0/0 (no criterion graded) arrives
    as `"total": null`, and the run is still a run, with no score."""
    _run(tmp_path, "m", "scored", scorecard={"total": 0.5, "rubric": "rb-1"})
    _run(tmp_path, "m", "nan", scorecard={"total": None, "rubric": "rb-1", "criteria": {}})
    runs, caught = _caught(lambda: mnb.load_runs(tmp_path, index=False))
    assert not [w for w in caught if issubclass(w.category, SkippedFiles)]
    scores = dict(zip(runs["id"], runs["score"]))
    assert scores["scored"] == 0.5 and scores["nan"] != scores["nan"]  # NaN
    assert runs.set_index("id").loc["nan", "rubric"] == "rb-1"
    bad = _run(tmp_path, "m", "text", scorecard={"total": "0.5"})
    with pytest.raises(MachineFormatError, match="expected a number, got str") as err:
        read_run(bad)
    assert err.value.field == "scorecard.total"


# ---------------------------------------------------------------------------------------------
# Folder links inside the workspace


@pytest.mark.parametrize("link", ["aa-old-name", "zz-old-name"])  # sorted before and after the folder
def test_a_link_to_another_machine_folder_of_runs_loses_none_of_its_runs(tmp_path, link):
    """A machine renamed, its old name left as a symlink to the new folder: the runs are read
    once, under the folder they name, whichever name sorts first."""
    _run(tmp_path, "new-name", "r1")
    _run(tmp_path, "other", "r2")
    os.symlink("new-name", tmp_path / ".machine" / "runs" / link)
    for index in (False, True):
        runs, caught = _caught(lambda: mnb.load_runs(tmp_path, index=index))
        assert sorted(zip(runs["machine"], runs["id"])) == [("new-name", "r1"), ("other", "r2")], index
        said = "\n".join(str(w.message) for w in caught)
        assert link in said and "read under its own name" in said and "stored under" not in said


@pytest.mark.parametrize("encoding, said", [("utf-16", "UTF-16"), ("utf-8-sig", "byte-order mark")])
def test_a_holdout_file_saved_by_a_windows_editor_says_what_is_wrong_and_how_to_fix_it(tmp_path, encoding, said):
    d = _machine(tmp_path, instructions_md="Add.\n",
                 holdout_json=json.dumps(["What is 2 plus 2?"]).encode(encoding))
    with pytest.raises(MachineFormatError) as err:
        load_machine(tmp_path, "m")
    text = str(err.value)
    assert str(d / "holdout.json") in text and said in text and "save it as UTF-8" in text
    assert "not valid UTF-8" not in text


# ---------------------------------------------------------------------------------------------
# Sessions


def _session(ws, machine, fname, **record):
    path = ws / ".machine" / "sessions" / machine / fname
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "messages": [{"role": "user", "content": "hi"}],
                                "updatedAt": START, **record}))
    return path


def test_a_copied_session_file_is_named_not_listed_as_a_second_session_of_the_same_name(tmp_path):
    """Machine reads a session from `<name>.json`: "demo copy.json" saying name "demo" (a file
    manager's copy) is not a second "demo", as "r1 copy.json" is not a second run r1."""
    _session(tmp_path, "support", "demo.json", name="demo")
    copy = _session(tmp_path, "support", "demo copy.json", name="demo")
    _session(tmp_path, "chatbot/triage", "demo.json", name="demo")  # the same name, another machine: fine
    sessions, caught = _caught(lambda: mnb.load_sessions(tmp_path))
    assert sorted(zip(sessions["machine"], sessions["name"])) == [("chatbot/triage", "demo"), ("support", "demo")]
    said = "\n".join(str(w.message) for w in caught)
    assert str(copy) in said and "does not match its file name" in said
    with pytest.raises(MachineFormatError) as err:
        mnb.load_sessions(tmp_path, on_error="raise")
    assert err.value.field == "name" and err.value.path == str(copy)


def test_a_session_whose_updated_at_is_a_number_keeps_its_messages_with_no_time(tmp_path):
    """An epoch number (Date.now()) where an ISO string belongs loses the time, not the chat."""
    path = _session(tmp_path, "support", "demo.json", name="demo", updatedAt=1767225600000)
    _session(tmp_path, "support", "other.json", name="other")
    sessions, caught = _caught(lambda: mnb.load_sessions(tmp_path))
    assert sessions["name"].tolist() == ["other", "demo"]  # newest first, the one with no time last
    demo = sessions.iloc[1]
    assert demo["n_messages"] == 1 and demo["messages"][0]["content"] == "hi" and demo["updated_at"] is pd.NaT
    said = "\n".join(str(w.message) for w in caught)
    assert f"{path} (field 'updatedAt')" in said and "1767225600000 is not an ISO time string" in said


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_a_run_written_by_python_json_with_nan_names_the_value_and_the_fix(tmp_path, word):
    """Python's json.dump writes NaN where JavaScript writes null; JSON.parse refuses the file, and
    the error says which value and what to write instead."""
    path = _run(tmp_path, "m", "r1", scorecard={"total": float(word.replace("Infinity", "inf"))})
    assert word in path.read_text()
    with pytest.raises(MachineFormatError) as err:
        read_run(path)
    said = str(err.value)
    assert str(path) in said and f"{word} is not a JSON value" in said and "null" in said


@pytest.mark.parametrize("fname", ["holdout.json", "instructions.md", "model.json", "cases.json"])
def test_a_definition_file_that_is_a_dangling_link_is_an_error_not_an_absent_file(tmp_path, fname):
    """A holdout.json linked from a shared folder that is not there is not "no held-out cases" (the
    trainer would then see them), nor a dangling instructions.md "no system prompt"."""
    d = _machine(tmp_path, machine_ts="export default {}\n")
    os.symlink(tmp_path / "shared" / fname, d / fname)
    with pytest.raises(MachineFormatError) as err:
        load_machine(tmp_path, "m")
    assert str(d / fname) in str(err.value) and "does not exist" in str(err.value)


def test_an_event_stream_that_cannot_be_opened_is_skipped_with_a_warning_like_a_fifo(tmp_path, monkeypatch):
    """Machine keeps its files private to its user: a notebook run as another user cannot open
    events.jsonl. "warn" says so and gives no events, as for a run file it cannot read."""
    path = tmp_path / ".machine" / "events.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"type": "run.started", "time": START}) + "\n")
    real_open = os.open

    def private(p, *args, **kwargs):
        if os.fspath(p) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", private)
    events, caught = _caught(lambda: load_events(tmp_path))
    assert len(events) == 0 and list(events.columns) == ["line", "time", "type", "machine", "run", "event"]
    said = "\n".join(str(w.message) for w in caught)
    assert f"{path}: cannot read: Permission denied" in said
    events, caught = _caught(lambda: load_events(tmp_path, on_error="skip"))
    assert len(events) == 0 and not caught
    with pytest.raises(MachineFormatError, match="Permission denied"):
        load_events(tmp_path, on_error="raise")


def test_resolving_one_machine_reads_its_folder_not_every_machine_folder(tmp_path):
    """select_runs resolves the machine it is given: a loop in another machine's folder is that
    folder's business, not a warning on every selection of this one."""
    _machine(tmp_path, "coder", instructions_md="Fix tests.\n")
    other = _machine(tmp_path, "other", instructions_md="Other.\n")
    os.symlink(tmp_path / "machines", other / "loop")
    mdef, caught = _caught(lambda: resolve_machine("coder", tmp_path, undefined="name"))
    assert mdef["instructions"] == "Fix tests.\n" and not caught
    undefined, caught = _caught(lambda: resolve_machine("nowhere", tmp_path, undefined="name"))
    assert undefined == {"name": "nowhere"} and not caught
    _machine(tmp_path, "chatbot/triage", instructions_md="Sort.\n")
    assert resolve_machine("chatbot", tmp_path, undefined="name") == {"name": "chatbot"}
