"""`machine-nb runs | tagged | export` on the sample workspace: what a terminal user sees and gets."""

import json
from pathlib import Path

import machine_nb as mnb
from machine_nb.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


def test_runs_table_and_json(capsys):
    assert main(["runs", str(SAMPLE), "--limit", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["id", "machine", "model", "harness"] and len(out) == 6
    assert main(["runs", str(SAMPLE), "--machine", "chatbot/triage", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["machine"] for r in rows} == {"chatbot/triage"}
    assert rows[0]["started_at"] >= rows[-1]["started_at"]  # newest first, ISO strings
    assert {"id", "input", "output", "score", "rubric", "final"} <= set(rows[0])


def test_tagged(capsys):
    assert main(["tagged", "--store", str(SAMPLE / ".machine-store"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["tag"] for r in rows} == {"good", "bad", "observed"} and {r["kind"] for r in rows} == {"final", "trace"}


def test_export_writes_what_the_api_gives(tmp_path, capsys):
    out = tmp_path / "coder.jsonl"
    assert main(["export", str(SAMPLE), "--machine", "coder", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    runs = mnb.load_runs(SAMPLE)
    expected = mnb.training_lines(mnb.select_runs(runs, "coder"))
    assert mnb.read_jsonl(out) == expected
    assert f"{len(expected)} lines" in said and "estimate" in said
    # options reach the selection: a held-out-style exclude file, a model filter, whole runs
    excl = tmp_path / "exclude.txt"
    excl.write_text("Fix the failing test tests/test_math.py::test_add\n")
    assert main(["export", str(SAMPLE), "--machine", "coder", "--exclude-file", str(excl), "--best-of", "1",
                 "--min-score", "0.5", "--model", "thinkingmachines/Inkling-Small", "--whole-runs",
                 "--base-model", "thinkingmachines/Inkling-Small", "--out", str(out)]) == 0
    lines = mnb.read_jsonl(out)
    assert lines and all(line["whole_run"] for line in lines)
    chosen = runs.set_index("id").loc[[line["run"] for line in lines]]
    assert "test_add" not in " ".join(chosen["case"]) and chosen["case"].is_unique
    assert (chosen["model"] == "thinkingmachines/Inkling-Small").all() and (chosen["score"] >= 0.5).all()


def test_errors_are_one_line_not_tracebacks(tmp_path, capsys):
    assert main(["export", str(SAMPLE), "--machine", "coder", "--whole-runs", "--base-model", "Qwen/Qwen3.6-35B-A3B",
                 "--out", str(tmp_path / "x.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb export:") and "Inkling" in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()
    bad = tmp_path / "ws" / ".machine" / "runs" / "m"
    bad.mkdir(parents=True)
    (bad / "r1.json").write_text("{")
    assert main(["runs", str(tmp_path / "ws"), "--strict"]) == 1
    assert "r1.json" in capsys.readouterr().err


def test_runs_with_and_without_the_index(tmp_path, monkeypatch, capsys):
    import shutil

    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", str(tmp_path / "cache"))
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / ".machine", ws / ".machine")
    assert main(["runs", str(ws), "--json", "--no-index"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert not (tmp_path / "cache").exists()  # nothing written
    mnb.load_runs(ws, index=True)
    assert main(["runs", str(ws), "--json", "--check", "files"]) == 0
    assert json.loads(capsys.readouterr().out) == plain
