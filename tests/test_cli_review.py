"""What a terminal user gets from `machine-nb` at the edges: a setting given twice or one the command
cannot take, a `~` the shell left alone (`--out=~/x`), a flag value no command can use, and the
warnings a command prints on its way: each a clear line naming the flag, never a traceback, a silently
dropped value or a file somewhere unexpected."""

import subprocess
import sys

import pytest

from machine_nb.cli import main

from scratch import SAMPLE, usage_error


@pytest.fixture
def parse_only(monkeypatch):
    """Flags are parsed as usual, but no command runs: a value that passes starts nothing."""
    import machine_nb.cli

    monkeypatch.setattr(machine_nb.cli, "_run", lambda args, program=False: 0)


@pytest.fixture
def no_sweep(monkeypatch):
    """sweep and estimate_sweep record that they were called instead of running anything."""
    import machine_nb.training.sweeps as sweeps

    called = []
    monkeypatch.setattr(sweeps, "sweep", lambda *a, **k: called.append(k) or pytest.fail("sweep ran"))
    monkeypatch.setattr(sweeps, "estimate_sweep", lambda *a, **k: called.append(k) or pytest.fail("estimate ran"))
    return called


# --------------------------------------------------------------------------- sweep settings

@pytest.mark.parametrize("setting,named", [("foo=1", "foo"), ("seed=3", "--seeds"), ("model=local/arith-tiny", "--model"),
                                           ("eval_every=2", "--eval-every"), ("progress=0", "progress")])
def test_sweep_set_of_a_setting_it_cannot_take_is_one_line_naming_it(setting, named, tmp_path, capsys):
    """`--set foo=1` or `--set seed=3` ended in sweep()'s TypeError and a traceback; `--set model=…`
    in "got multiple values for keyword argument"."""
    out = tmp_path / "sweep"
    assert main(["sweep", str(tmp_path / "train.jsonl"), "--grid", "epochs=1", "--set", setting,
                 "--sweep-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb sweep: --set") and err.count("\n") == 1, err
    assert named in err
    assert not out.exists()


def test_sweep_set_of_a_grid_axis_is_refused_naming_both_flags(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "train.jsonl"), "--grid", "epochs=1,2", "--set", "epochs=3",
                 "--sweep-dir", str(tmp_path / "sweep")]) == 1
    err = capsys.readouterr().err
    assert "--set" in err and "--grid" in err and "epochs" in err and "Traceback" not in err


@pytest.mark.parametrize("flag,first,second", [("--grid", "epochs=1", "epochs=2"),
                                               ("--set", "batch_size=4", "batch_size=8")])
def test_a_setting_given_twice_is_refused_not_silently_overwritten(flag, first, second, tmp_path, capsys, no_sweep):
    """`--grid epochs=1 --grid epochs=2` swept epochs=2 alone, the first values dropped without a word."""
    extra = ["--grid", "learning_rate=1e-3"] if flag == "--set" else []
    assert main(["sweep", str(tmp_path / "train.jsonl"), *extra, flag, first, flag, second]) == 1
    err = capsys.readouterr().err
    assert flag in err and first.split("=")[0] in err and "twice" in err, err
    assert no_sweep == []


# --------------------------------------------------------------------------- ~ in paths

def test_a_tilde_the_shell_left_alone_is_the_home_folder(tmp_path, monkeypatch, capsys):
    """`--out=~/x.jsonl` (bash expands no `~` after `--out=`) wrote into a folder named "~" under the
    working directory while saying "in ~/x.jsonl"."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["export", str(SAMPLE), "--machine", "coder", "--out=~/coder.jsonl"]) == 0
    assert (home / "coder.jsonl").is_file()
    assert not (cwd / "~").exists()
    assert str(home / "coder.jsonl") in capsys.readouterr().out


def test_tagged_store_with_a_tilde_reads_the_store_under_home(tmp_path, monkeypatch, capsys):
    import json
    import shutil

    home = tmp_path / "home"
    shutil.copytree(SAMPLE / ".machine-store", home / "store")
    monkeypatch.setenv("HOME", str(home))
    assert main(["tagged", "--store=~/store", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) > 0


def test_tagged_with_a_project_folder_that_is_not_there_is_an_error(tmp_path, capsys):
    """A mistyped --project printed `[]` and exit 0, as if nothing had been tagged."""
    assert main(["tagged", "--project", str(tmp_path / "no-such-project"), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--project" in captured.err and "no-such-project" in captured.err


# --------------------------------------------------------------------------- values no command can use

@pytest.mark.parametrize("argv,flag,bad", [
    (["eval", "compare", "a.json", "b.json"], "--seed", "-1"),  # numpy's "expected non-negative integer"
    (["sft", "train.jsonl"], "--seed", "-1"),
    (["smoke", "train.jsonl"], "--seed", "-1"),
    (["dpo", "pairs.jsonl"], "--seed", "-1"),
    (["dpo", "pairs.jsonl"], "--beta", "nan"),  # on Tinker: an estimate and exit 4, then refused with --yes
    (["dpo", "pairs.jsonl"], "--beta", "0"),
    (["pairs"], "--min-gap", "nan"),
    (["pairs"], "--min-gap", "0"),
    (["sft", "train.jsonl"], "--max-usd", "nan"),
    (["dpo", "pairs.jsonl"], "--max-usd", "-1"),
    (["eval", "baseline"], "--max-usd", "inf"),
    (["sweep", "train.jsonl", "--grid", "epochs=1"], "--max-usd", "nan"),
    (["report", "x.ipynb"], "--timeout", "nan"),
    (["report", "x.ipynb"], "--timeout", "0"),  # read as "no limit"
    (["report", "x.ipynb"], "--timeout", "-5"),
])
def test_values_no_command_can_use_are_usage_errors_naming_the_flag(argv, flag, bad, capsys, parse_only):
    err = usage_error(capsys, [*argv, flag, bad])
    assert flag in err and repr(bad) in err


@pytest.mark.parametrize("text,value", [("1e3", 1000), ("1_000", 1000), (" 5 ", 5), ("10.0", 10), ("0x10", 16)])
def test_whole_number_flags_take_the_ways_a_whole_number_is_written(text, value, capsys, monkeypatch):
    """`--steps 1e3` was refused as "must be a whole number", which 1e3 is."""
    import machine_nb.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "_run", lambda args, program=False: seen.update(steps=args.steps) or 0)
    assert main(["sft", "train.jsonl", "--steps", text]) == 0
    assert seen["steps"] == value and isinstance(seen["steps"], int)


@pytest.mark.parametrize("bad", ["1.5", "1e400", "nan", "ten"])
def test_whole_number_flags_still_refuse_what_is_not_a_whole_number(bad, capsys, parse_only):
    assert "--steps" in usage_error(capsys, ["sft", "train.jsonl", "--steps", bad])


# --------------------------------------------------------------------------- warnings

def test_a_commands_warning_is_one_line_naming_the_command(tmp_path):
    """A warning printed as `<frozen runpy>:88: UserWarning: …` (or the entry script's path and line):
    a place in no file of the user's."""
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "runs", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert proc.stderr.startswith("machine-nb runs: warning: no runs in"), proc.stderr
    assert "runpy" not in proc.stderr and proc.stderr.count("\n") == 1


# --------------------------------------------------------------------------- report

@pytest.mark.parametrize("content", ["{}", '{"cells": "x", "nbformat": 4, "nbformat_minor": 5, "metadata": {}}',
                                     b"\xff\xfe", "[1, 2]", "not json"])
def test_report_of_a_file_that_is_no_notebook_is_one_line_naming_it(content, tmp_path, capsys):
    """A damaged .ipynb ended in a traceback (jsonschema's ValidationError, an AttributeError) or
    in "'utf-8' codec can't decode byte 0xff", naming no file."""
    nb = tmp_path / "damaged.ipynb"
    nb.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out.html"
    assert main(["report", str(nb), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb report: ") and str(nb) in err and err.count("\n") == 1, err
    assert not out.exists() and not out.with_suffix(".ipynb").exists()


# --------------------------------------------------------------------------- the estimate before spending

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from machine_nb.data.corpus import make_corpus

    return make_corpus(tmp_path_factory.mktemp("corpus") / "minimal_sft").out_dir


@pytest.mark.parametrize("command,data", [("sft", "train.jsonl"), ("dpo", None)])
def test_eval_every_0_is_priced_as_the_final_eval_alone(command, data, corpus, tmp_path, capsys):
    """`--eval-every 0` (no evals while training, the final checkpoint scored) was priced as the
    default once an epoch: more held-out evals than the run makes."""
    if data is None:
        from machine_nb.core.jsonl import write_jsonl

        pair = {"comparison": {"prompt_conversation": [{"role": "user", "content": "2+2?"}],
                               "completion_A": [{"role": "assistant", "content": "answer: 4"}],
                               "completion_B": [{"role": "assistant", "content": "five"}]},
                "label": "A"}
        write_jsonl([pair] * 16, tmp_path / "pairs.jsonl")
        source = str(tmp_path / "pairs.jsonl")
    else:
        source = str(corpus / data)
    assert main([command, source, "--engine", "tinker", "--model", "thinkingmachines/Inkling", "--epochs", "1", "--eval",
                 str(corpus / "valid.jsonl"), "--eval-every", "0"]) == 4
    assert "Held-out evals: 1 x 24 rows" in capsys.readouterr().err


# --------------------------------------------------------------------------- a terminal that is not UTF-8

def test_a_stdout_that_cannot_write_every_character_still_gets_the_whole_output(tmp_path, capsys):
    """On a cp1252 stdout (a Windows console or redirect) `export` wrote its file, then failed (exit 1)
    on the "→" of its summary; `runs --json` printed nothing but "'charmap' codec can't encode"."""
    import json
    import os

    env = {**os.environ, "PYTHONIOENCODING": "cp1252"}
    out = tmp_path / "coder.jsonl"
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "export", str(SAMPLE), "--machine", "coder",
                           "--out", str(out)], capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and b"lines in" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "runs", str(SAMPLE), "--json"],
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.decode("cp1252"))
    assert any(not r["output"].isascii() for r in rows if isinstance(r["output"], str))
    assert main(["runs", str(SAMPLE), "--json"]) == 0
    assert rows == json.loads(capsys.readouterr().out)  # the same records as on a UTF-8 stdout


# --------------------------------------------------------------------------- pairs

def test_pairs_from_a_store_that_is_not_there_is_an_error_not_zero_pairs(tmp_path, capsys):
    """A mistyped --store printed "0 pair(s)", exit 0, and with -o wrote an empty pairs file to train on."""
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "--store", str(tmp_path / "no-such-store"), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert "--store" in captured.err and "no-such-store" in captured.err and captured.out == ""
    assert not out.exists()


def test_pairs_passes_on_the_warning_that_held_out_cases_were_not_checked(capsys):
    """Every warning but PairsSkipped was recorded and dropped: without --workspace no held-out case is
    left out, and the command said nothing of it."""
    with pytest.warns(UserWarning, match="held-out cases were not checked"):
        assert main(["pairs", "--store", str(SAMPLE / ".machine-store"), "--machine", "tutor"]) == 0
    assert "pair(s)" in capsys.readouterr().out


# --------------------------------------------------------------------------- flags that exclude each other

@pytest.mark.parametrize("argv,one,other", [
    (["sft", "train.jsonl", "--log-dir", "a", "--workspace", "w"], "--log-dir", "--workspace"),  # w ignored
    (["sft", "train.jsonl", "--resume", "r", "--log-dir", "a"], "--resume", "--log-dir"),  # a ignored
    (["dpo", "pairs.jsonl", "--resume", "r", "--workspace", "w"], "--resume", "--workspace"),
    (["smoke", "train.jsonl", "--workspace", "w", "--log-dir", "a"], "--log-dir", "--workspace"),
    (["tagged", "--store", "s", "--project", "p"], "--store", "--project"),  # p ignored
])
def test_flags_of_which_one_would_be_ignored_are_refused_together(argv, one, other, capsys, parse_only):
    """The run went to --log-dir (or continued --resume's dir) and --workspace was dropped without a
    word, so Machine's dashboard never showed it; `tagged` read --store and ignored --project."""
    err = usage_error(capsys, argv)
    assert one in err and other in err and "not allowed" in err


# --------------------------------------------------------------------------- export

def test_export_of_a_machine_the_workspace_does_not_have_names_the_ones_it_has(tmp_path, capsys):
    """`--machine codr` ended in "no rubric fingerprint known …: pass rubric='<fingerprint>' … or
    rubric=None", Python arguments a terminal user has no way to pass; with `--rubric any` it wrote an
    empty training file."""
    out = tmp_path / "x.jsonl"
    for extra in ([], ["--rubric", "any"]):
        assert main(["export", str(SAMPLE), "--machine", "codr", "--out", str(out), *extra]) == 1
        err = capsys.readouterr().err
        assert "'codr'" in err and "coder" in err and "rubric=" not in err, err
        assert not out.exists()


def test_sweep_values_written_with_spaces_after_the_commas_are_the_values(tmp_path, monkeypatch, capsys):
    """`--grid "lr_schedule=linear, cosine"` swept the schedule " cosine", a name no run accepts."""
    import pandas as pd

    import machine_nb.training.sweeps as sweeps

    seen = {}

    def fake_sweep(data, grid, **kw):
        seen.update(grid=grid, settings={k: v for k, v in kw.items() if k == "batch_size"})
        return pd.DataFrame([{"run": "a", "status": "ran", "log_dir": str(tmp_path / "a")}])

    monkeypatch.setattr(sweeps, "sweep", fake_sweep)
    main(["sweep", "train.jsonl", "--grid", "lr_schedule=linear, cosine", "--grid", "learning_rate=1e-3, 3e-3",
          "--set", "batch_size= 4", "--json"])
    assert seen["grid"] == {"lr_schedule": ["linear", "cosine"], "learning_rate": [1e-3, 3e-3]}
    assert seen["settings"] == {"batch_size": 4}


@pytest.mark.parametrize("grid", ["epochs=1,,2", "epochs=1,", "epochs= ,2"])
def test_sweep_grid_with_an_empty_value_is_refused(grid, tmp_path, capsys, no_sweep):
    """`--grid epochs=1,,2` swept an epochs of "" beside 1 and 2: a run that could only fail."""
    assert main(["sweep", str(tmp_path / "train.jsonl"), "--grid", grid]) == 1
    err = capsys.readouterr().err
    assert "--grid" in err and "empty" in err
    assert no_sweep == []


# --------------------------------------------------------------------------- an extra not installed

def test_an_inspect_task_without_inspect_installed_is_one_line_saying_how_to_install_it(corpus, tmp_path, capsys,
                                                                                          monkeypatch):
    """The ImportError that says `pip install "machine_nb[inspect]"` reached the terminal as a traceback."""
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # `import inspect_ai` raises ImportError
    log_dir = tmp_path / "run"
    assert main(["sft", str(corpus / "train.jsonl"), "--inspect-task", "tasks.py@t", "--log-dir", str(log_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb sft: ") and "machine_nb[inspect]" in err and err.count("\n") == 1, err
    assert not log_dir.exists()


# --------------------------------------------------------------------------- JSON a parser reads

def _strict(text: str):
    import json

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def results_without_expected(tmp_path):
    """Two results files over the same rows, the first row scored by a regex alone (no expected
    answer) and won by the checkpoint."""
    import json

    def rows(correct):
        return [{"row": i, "prompt": f"q{i}", "expected": None if i == 0 else f"answer: {i}", "match": "regex" if i == 0
                 else "exact", "output": "answer: 0" if (i == 0 and correct) else f"answer: {i}" if i else "no",
                 "correct": bool(i) or correct, "format_ok": True, "error": None} for i in range(4)]

    paths = []
    for name, checkpoint, correct in (("baseline", None, False), ("ck", "tinker://x/sampler_weights/final", True)):
        summary = {"name": name, "model": "local/arith-tiny", "checkpoint": checkpoint, "engine": "local",
                   "n": 4, "correct": 3 + correct, "accuracy": (3 + correct) / 4, "format_rate": 1.0,
                   "parameters": {"max_tokens": 32, "temperature": 0.0, "seed": 0}, "rows": rows(correct)}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(summary))
        paths.append(str(path))
    return paths


def test_compare_json_is_strict_json_when_a_changed_row_has_no_expected_answer(results_without_expected, capsys):
    """A row scored by its regex alone has no expected answer: the flip's "expected" printed as NaN,
    which no strict JSON parser (jq, json.loads(strict)) reads."""
    a, b = results_without_expected
    assert main(["eval", "compare", a, b, "--json"]) == 0
    result = _strict(capsys.readouterr().out)
    assert result["flips"][0]["expected"] is None and result["wins"] == 1


def test_compare_table_says_a_row_has_no_expected_answer_rather_than_nan(results_without_expected, capsys):
    a, b = results_without_expected
    assert main(["eval", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "row 0" in out and "nan" not in out.lower().split("row 0")[1].split("\n")[0], out


def test_report_output_named_ipynb_is_refused_before_the_page_replaces_the_notebook(tmp_path, capsys):
    """`-o out.ipynb` wrote the HTML page and the executed notebook to the one path: the notebook was
    lost and a file named .ipynb held HTML that Jupyter cannot open."""
    import json

    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    out = tmp_path / "out" / "report.ipynb"
    assert main(["report", str(nb), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "-o" in err and ".html" in err and err.count("\n") == 1, err
    assert not out.parent.exists()


# --------------------------------------------------------------------------- the model a refusal suggests

@pytest.mark.parametrize("command", [["sft"], ["smoke"], ["sweep", "--grid", "epochs=1"]])
def test_the_model_suggested_for_tinker_can_be_priced_for_training(command, corpus, tmp_path, capsys):
    """`--engine tinker needs --model (e.g. thinkingmachines/Inkling-Small)`: that model has no training
    price, so following the suggestion ended in "No training price is known"."""
    import re

    data = str(corpus / "train.jsonl")
    argv = [command[0], data, *command[1:], "--engine", "tinker", "--sweep-dir" if command[0] == "sweep" else
            "--log-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    suggested = re.search(r"e\.g\. (\S+?)\)", capsys.readouterr().err).group(1)
    assert main([*argv, "--model", suggested]) == 4  # the estimate, and --yes to spend
    assert "--yes" in capsys.readouterr().err
