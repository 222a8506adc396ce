"""What the checks and the CLI tell a user must match what happens: a key is found however its
JSON line spells it, an estimate prices the run sft would actually start (or refuse), and a
script can tell "fix your command line" from "add --yes to spend" by the exit status alone."""

import json
import re
from pathlib import Path

import pytest

from machine_nb.checks.pricing import estimate_cost, estimate_dpo_cost
from machine_nb.checks.validate import validate

LOCAL = "local/arith-tiny"
INKLING = "thinkingmachines/Inkling"
# fake canaries shaped like keys, so the detector must find them; none is a real credential
KEY = "sk-ant-api03-FAKEcanaryNOTaREALkey0000"
TML = "tml-FAKEcanaryNOTaREALkey0000"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def qa(q="What is 2 plus 2?", a="answer: 4"):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def escaped(text):
    """Every character of `text` as a JSON \\uXXXX escape."""
    return "".join(f"\\u{ord(c):04x}" for c in text)


def secret_lines(result):
    found = result.findings[result.findings["code"].isin(["secret", "password"])]
    return [(int(line), code) for line, code in zip(found["line"], found["code"])]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- secrets however JSON spells them

def test_a_key_written_with_json_escapes_is_found_once_and_shown_masked(tmp_path):
    plain = json.dumps(qa("my key is KEY", "noted"))
    lines = [
        plain.replace("KEY", KEY.replace("FAKE", "\\u0046AKE")),  # one character escaped
        plain.replace("KEY", escaped(KEY)),  # every character escaped
        plain.replace("KEY", escaped(TML)),
        plain.replace("KEY", KEY),  # a plain key: one finding, not one per spelling
        json.dumps(qa("caf\u00e9 first line\nsecond", f"key: {KEY}")),  # escapes elsewhere on the line
        json.dumps(qa("fine", "fine")),
    ]
    r = validate(write_lines(tmp_path / "t.jsonl", lines), None)
    assert secret_lines(r) == [(1, "secret"), (2, "secret"), (3, "secret"), (4, "secret"), (5, "secret")]
    messages = r.findings.loc[r.findings["code"] == "secret", "message"].tolist()
    assert [m for m in messages if f"sk-a…({len(KEY)} chars)" in m] == messages[:2] + messages[3:]
    assert f"tml-…({len(TML)} chars)" in messages[2]
    text = "\n".join(r.findings["message"])
    for spelled in (KEY, TML, escaped(KEY), escaped(TML), KEY[13:], TML[4:]):
        assert spelled not in text


def test_a_key_at_the_start_of_a_line_inside_a_message_is_found(tmp_path):
    """`\\n` before the key is the letter n in the line's text: the key must still start a word."""
    rows = [qa("What is 2 plus 2?", f"answer: 4\n{KEY}"), qa("x", f"tab\t{TML}"), qa("aws", "id\nAKIAFAKECANARY000000")]
    r = validate(write_lines(tmp_path / "t.jsonl", [json.dumps(row) for row in rows]), None)
    assert secret_lines(r) == [(1, "secret"), (2, "secret"), (3, "secret")]
    in_memory = validate(rows, None)  # rows in memory are scanned as their JSON text, with the same escapes
    assert secret_lines(in_memory) == secret_lines(r)


def test_the_api_key_and_a_url_password_written_with_json_escapes_are_found(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tk_FAKE_canary_value_0000")
    lines = [
        json.dumps(qa("env?", "the key: KEYVALUE")).replace("KEYVALUE", escaped("tk_FAKE_canary_value_0000")),
        # `\/` is how some JSON writers spell "/": the URL's password is still a URL's password
        json.dumps(qa("db?", "URL")).replace("URL", "postgres:\\/\\/admin:FAKEcanaryPW99@db.example\\/app"),
    ]
    r = validate(write_lines(tmp_path / "t.jsonl", lines), None)
    assert secret_lines(r) == [(1, "secret"), (2, "password")]
    messages = "\n".join(r.findings["message"])
    assert "TINKER_API_KEY" in messages and "tk_F…(25 chars)" in messages and "FAKE…(14 chars)" in messages
    assert "tk_FAKE_canary_value_0000" not in messages and "FAKEcanaryPW99" not in messages


def test_each_key_written_plainly_is_one_finding():
    r = validate([qa("my key", KEY), qa("two keys", f"{KEY} and {KEY}")], None)
    assert secret_lines(r) == [(1, "secret"), (2, "secret"), (2, "secret")]


# --------------------------------------------------------------------------- fewer rows than a batch

def _rows(n):
    return [qa(f"What is {10 + i} plus {20 + i}?", f"answer: {30 + 2 * i}") for i in range(n)]


def test_fewer_rows_than_a_batch_cost_nothing_and_say_that_sft_refuses_them(tmp_path):
    from machine_nb.training.train import sft

    est = estimate_cost(_rows(3), INKLING, epochs=5, batch_size=8)
    assert est.steps == 0 and est.usd == 0.0 and est.rows == 3 and est.tokens > 0
    assert "3 rows make no full batch of 8" in est.note and "refuse" in est.note
    with pytest.raises(ValueError, match="no full batch of 8") as refused:
        sft(_rows(3), LOCAL, epochs=5, batch_size=8, log_dir=tmp_path / "run", progress=False)
    assert "no full batch" in str(refused.value) and not (tmp_path / "run").exists()
    enough = estimate_cost(_rows(8), INKLING, epochs=5, batch_size=8)
    assert enough.steps == 5 and enough.usd > 0 and "no full batch" not in enough.note

    pair = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}]}
    dpo = estimate_dpo_cost([pair, pair], INKLING, batch_size=8)
    assert dpo.steps == 0 and dpo.usd == dpo.train_usd == dpo.forward_usd == dpo.reference_usd == 0.0
    assert "2 pairs make no full batch of 8" in dpo.note


def test_the_cost_meter_warns_of_a_run_that_trains_nothing_and_prices_it_at_nothing():
    from machine_nb.widgets.cost_meter import CostMeter

    few = CostMeter(_rows(3), model=INKLING, batch_size=8)
    assert few.estimate.steps == 0 and few.estimate.usd == 0.0
    assert few.warnings()[0].startswith("3 rows make no full batch of 8: sft refuses this run")
    assert few.static_html().count("make no full batch") == 1  # said once, among the warnings


def test_the_cli_refuses_fewer_rows_than_a_batch_as_sft_does_and_validate_says_so(tmp_path, capsys, monkeypatch):
    from machine_nb.cli import main

    monkeypatch.setenv("TINKER_API_KEY", "tml-FAKEcanaryNOTaREALkey0000")
    data = write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in _rows(3)])
    assert main(["sft", str(data), "--engine", "tinker", "--model", INKLING, "--batch-size", "8"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb sft: 3 rows make no full batch of 8") and "--yes" not in err
    pair = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}]}
    pairs = write_lines(tmp_path / "pairs.jsonl", [json.dumps(pair)] * 2)
    assert main(["dpo", str(pairs), "--engine", "tinker", "--model", INKLING, "--batch-size", "8"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("machine-nb dpo: 2 pairs make no full batch of 8: dpo refuses") and "--yes" not in err
    # validate judges the data: the estimate for a schedule sft refuses says so, at $0
    assert main(["validate", str(data), "-m", INKLING, "--epochs", "2", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "cost: $0.0000 for 2 epoch(s), 0 steps" in out and "note: 3 rows make no full batch of 8" in out
    assert main(["validate", str(data), "-m", INKLING, "--epochs", "2", "--batch-size", "8", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert cost["steps"] == 0 and cost["usd"] == 0.0 and "sft refuses" in cost["note"]
    assert main(["validate", str(data), "-m", INKLING, "--epochs", "2", "--batch-size", "3"]) == 0
    out = capsys.readouterr().out
    assert "2 steps" in out and "no full batch" not in out


# --------------------------------------------------------------------------- exit statuses

def test_a_refused_spend_has_its_own_exit_status_apart_from_a_usage_error(tmp_path, capsys, monkeypatch):
    from machine_nb.cli import _flags, main

    monkeypatch.setenv("TINKER_API_KEY", "tml-FAKEcanaryNOTaREALkey0000")
    data = write_lines(tmp_path / "t.jsonl", [json.dumps(r) for r in _rows(8)])
    assert _flags.REFUSED_SPEND == 4 and _flags.USAGE == 2
    assert main(["sft", str(data), "--engine", "tinker", "--model", INKLING]) == _flags.REFUSED_SPEND
    assert "Re-run with --yes to spend." in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["sft", str(data), "--batch-size", "x"])
    assert usage.value.code == _flags.USAGE
    capsys.readouterr()
    # no model to price is a command line to fix, not a spend --yes would allow
    assert main(["sft", str(data), "--engine", "tinker"]) == _flags.USAGE
    assert "--engine tinker needs --model" in capsys.readouterr().err
    assert main(["dpo", str(data), "--engine", "tinker"]) == _flags.USAGE
    assert main(["sweep", str(data), "--grid", "epochs=1,2", "--engine", "tinker"]) == _flags.USAGE
    assert "exit 4" in " ".join(_help("sft").split())


@pytest.mark.parametrize("command,flag,bad", [("sft", "--batch-size", "0"), ("sft", "--epochs", "0"),
                                               ("sft", "--steps", "-1"), ("sft", "--lr", "nan"),
                                               ("sft", "--eval-every", "-2"), ("dpo", "--epochs", "0"),
                                               ("dpo", "--lora-rank", "-1")])
def test_a_schedule_the_trainer_refuses_is_a_usage_error_naming_the_flag(command, flag, bad, tmp_path, capsys):
    from machine_nb.cli import _flags, main

    with pytest.raises(SystemExit) as usage:
        main([command, str(tmp_path / "never-read.jsonl"), flag, bad])
    assert usage.value.code == _flags.USAGE and flag in capsys.readouterr().err


def _help(command):
    from machine_nb.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command].format_help()


def test_the_cli_page_lists_every_exit_status_the_cli_returns():
    from machine_nb.cli import PIPE_CLOSED, _flags, cases

    page = (DOCS / "cli.md").read_text()
    section = page.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    listed = {int(n) for n in re.findall(r"^\|\s*`?(\d+)`?\s*\|", section, flags=re.M)}
    assert listed == {0, 1, _flags.USAGE, cases.REFUSED, _flags.REFUSED_SPEND, 130, PIPE_CLOSED}
    assert "--yes" in section and "usage" in section.lower() and "Ctrl-C" in section
