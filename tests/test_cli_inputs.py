"""What a terminal user gets from `machine-nb` for a bad flag value or a reader that stops early:
a one-line usage error naming the flag (exit 2) before anything runs, never a traceback, a
silently different value, or output that is not what the flag promised."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from machine_nb.cli import main

from scratch import SAMPLE, usage_error
CHECKPOINT = "tinker://local-x/sampler_weights/final"


@pytest.fixture
def parse_only(monkeypatch):
    """Flags are parsed as usual, but no command runs: a value that passes starts no server or eval."""
    import machine_nb.cli

    monkeypatch.setattr(machine_nb.cli, "_run", lambda args: 0)


# --------------------------------------------------------------------------- output read by `| head`

@pytest.mark.parametrize("argv,read", [
    (["runs", str(SAMPLE), "--json"], 10),  # `| head -c 10`: more than a pipe holds, a write fails
    (["tagged", "--store", str(SAMPLE / ".machine-store"), "--json", "--limit", "1"], 0),  # a reader gone
    # before the command wrote: its one buffered line fails when stdout is flushed
])
def test_a_reader_that_stops_early_ends_the_command_quietly(argv, read):
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.read(read)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=30) == 141, err  # 128 + SIGPIPE, as a shell reports `seq 1e6 | head -1`
    assert err == "", err


# --------------------------------------------------------------------------- ports

@pytest.mark.parametrize("argv", [["serve", "--port", "70000"], ["dashboard", str(SAMPLE), "--port", "70000"],
                                  ["serve", "--port", "-1"]])
def test_a_port_outside_0_to_65535_is_refused_before_anything_starts(argv, capsys, parse_only):
    err = usage_error(capsys, argv)
    assert "--port" in err and "65535" in err


def test_dashboard_interval_must_be_a_positive_number(capsys, parse_only):
    for bad in ("-1", "nan", "inf"):
        assert "--interval" in usage_error(capsys, ["dashboard", str(SAMPLE), "--interval", bad])


# --------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("flag,bad", [("--max-tokens", "0"), ("--max-tokens", "-3"), ("--temperature", "-1"),
                                      ("--temperature", "nan"), ("--temperature", "inf"), ("--concurrency", "0")])
@pytest.mark.parametrize("command", [["eval", "baseline"], ["eval", "checkpoint", CHECKPOINT],
                                     ["eval", "probe", CHECKPOINT]])
def test_sampling_flags_refuse_values_no_sampler_can_use(command, flag, bad, capsys, parse_only):
    err = usage_error(capsys, [*command, flag, bad])
    assert flag in err and repr(bad) in err


def test_candidate_sampling_flags_refuse_values_no_sampler_can_use(capsys, parse_only):
    base = ["candidate", str(SAMPLE), "--machine", "tutor", "--checkpoint", CHECKPOINT]
    assert "--max-tokens" in usage_error(capsys, [*base, "--max-tokens", "0"])
    assert "--temperature" in usage_error(capsys, [*base, "--temperature", "nan"])
    assert "--trials" in usage_error(capsys, [*base, "--trials", "0"])


# --------------------------------------------------------------------------- listing and export

@pytest.mark.parametrize("argv", [["runs", str(SAMPLE)], ["tagged", "--store", str(SAMPLE / ".machine-store")]])
def test_a_negative_limit_is_refused_rather_than_dropping_rows(argv, capsys, parse_only):
    assert "--limit" in usage_error(capsys, [*argv, "--limit", "-1"])


@pytest.mark.parametrize("flag,bad", [("--best-of", "0"), ("--best-of", "-1"), ("--min-score", "nan")])
def test_export_refuses_selection_values_that_select_nothing(flag, bad, tmp_path, capsys, parse_only):
    out = tmp_path / "x.jsonl"
    err = usage_error(capsys, ["export", str(SAMPLE), "--machine", "coder", flag, bad, "--out", str(out)])
    assert flag in err and not out.exists()


# --------------------------------------------------------------------------- sweep --json

def test_sweep_json_lines_are_strict_json_when_a_run_failed(tmp_path, capsys, monkeypatch):
    """A failed run beside a finished one leaves NaN in the frame's number columns; each printed line
    must still parse as JSON (null there), as `jq` and json.loads(strict) read it."""
    import machine_nb.training.sweeps as sweeps

    frame = pd.DataFrame([
        {"run": "a", "status": "finished", "first_loss": 2.0, "final_loss": 0.5, "heldout_accuracy": None,
         "log_dir": str(tmp_path / "a"), "error": None},
        {"run": "b", "status": "failed", "first_loss": None, "final_loss": None, "heldout_accuracy": None,
         "log_dir": str(tmp_path / "b"), "error": "boom"},
    ])
    assert frame["first_loss"].isna().any()
    monkeypatch.setattr(sweeps, "sweep", lambda *a, **k: frame)
    assert main(["sweep", "train.jsonl", "--grid", "epochs=1,2", "--json"]) == 1
    lines = capsys.readouterr().out.splitlines()

    def strict(token):
        raise ValueError(f"not JSON: {token}")

    rows = [json.loads(line, parse_constant=strict) for line in lines]
    assert [r["first_loss"] for r in rows] == [2.0, None]


def test_a_broken_pipe_that_is_not_stdout_is_an_error_of_one_line(capsys, monkeypatch):
    import machine_nb.cli.corpus as corpus

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (the kernel's)")

    monkeypatch.setattr(corpus, "_run", broken)
    assert main(["corpus"]) == 1
    assert capsys.readouterr().err == "machine-nb corpus: [Errno 32] Broken pipe (the kernel's)\n"


@pytest.mark.parametrize("flag,bad", [("--seeds", "0,a"), ("--seeds", ""), ("--seeds", "0,,1"), ("--max-parallel", "0")])
def test_sweep_flags_that_name_no_run_are_refused_naming_the_flag(flag, bad, tmp_path, capsys, parse_only):
    """`--seeds 0,a` ended in "invalid literal for int()", naming no flag; --max-parallel 0 ran nothing."""
    err = usage_error(capsys, ["sweep", str(tmp_path / "train.jsonl"), "--grid", "learning_rate=1e-3", flag, bad])
    assert flag in err


def test_smoke_steps_must_be_at_least_one(tmp_path, capsys, parse_only):
    assert "--steps" in usage_error(capsys, ["smoke", str(tmp_path / "train.jsonl"), "--steps", "0"])


def test_report_keeps_a_secret_named_parameter_as_the_text_given(tmp_path, monkeypatch, capsys):
    """`-p db_pass 1e5` reached the notebook as 100000.0 and `-p pin 0012`-like values changed form:
    a password is text, never a number; other parameters are still read as JSON."""
    import machine_nb.reports.notebook as notebook

    given = {}

    def fake_run_report(path, params, output, **kw):
        given.update(params)
        raise ValueError("stop here")

    monkeypatch.setattr(notebook, "run_report", fake_run_report)
    main(["report", str(tmp_path / "x.ipynb"), "-p", "db_pass", "1e5", "-p", "api_token", "12345678",
          "-p", "lr", "3e-3", "-p", "name", "hello"])
    assert given == {"db_pass": "1e5", "api_token": "12345678", "lr": 3e-3, "name": "hello"}
