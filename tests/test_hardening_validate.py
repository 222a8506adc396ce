"""validate() judges rows against the model they are for: by default max_length is the model's context
(128 tokens for the local model), and `preflight` runs the very same checks on in-memory rows, so a
trainer can refuse what validate would reject."""

import json

import pytest

from machine_nb.cli import main
from machine_nb.errors import MachineFormatError, ValidationFailed
from machine_nb.checks.tokens import count_tokens
from machine_nb.checks.validate import DEFAULT_MAX_LENGTH, ValidationResult, model_context, preflight, validate

LOCAL = "local/arith-tiny"
INKLING = "thinkingmachines/Inkling-Small"


def row(n: int) -> dict:
    """A training row of 21 + 3n local tokens (checked below)."""
    return {"messages": [{"role": "user", "content": "What is 47 plus 15?"},
                         {"role": "assistant", "content": "answer: 62 " + "and 1 " * n}]}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def codes(result):
    return [(None if str(v) == "<NA>" else int(v), c) for v, c in zip(result.findings["line"], result.findings["code"])]


def test_the_default_max_length_is_the_local_models_context(tmp_path):
    assert model_context(LOCAL) == 128 and model_context(INKLING) is None
    rows = [row(0), row(30), row(40)]
    assert count_tokens(rows, LOCAL)["tokens"].tolist() == [21, 111, 141]
    r = validate(write(tmp_path / "t.jsonl", rows), LOCAL)
    assert codes(r) == [(3, "too_long")] and not r.ok
    assert "141 tokens" in r.findings["message"][0] and "context of 128" in r.findings["message"][0]
    assert r.summary["max_length"] == 128
    # a larger max_length cannot make the model hold more; None drops the max_length check only
    assert codes(validate(tmp_path / "t.jsonl", LOCAL, max_length=1000)) == [(3, "too_long")]
    assert codes(validate(tmp_path / "t.jsonl", LOCAL, max_length=None)) == [(3, "too_long")]
    r = validate(tmp_path / "t.jsonl", LOCAL, max_length=100)
    assert codes(r) == [(2, "too_long"), (3, "too_long")] and "max_length 100" in r.findings["message"][0]


def test_tinker_models_keep_the_cookbook_default(tmp_path):
    r = validate(write(tmp_path / "t.jsonl", [row(40)]), INKLING)
    assert r.ok and r.summary["max_length"] == DEFAULT_MAX_LENGTH == 32768


def test_eval_prompts_longer_than_the_context_are_errors(tmp_path):
    long_q = "What is 47 plus 15? " + "please " * 200
    path = write(tmp_path / "e.jsonl", [{"messages": [{"role": "user", "content": "What is 1 plus 2?"}],
                                         "expected": "answer: 3", "match": "exact"},
                                        {"messages": [{"role": "user", "content": long_q}],
                                         "expected": "answer: 62", "match": "exact"}])
    assert codes(validate(path, LOCAL)) == [(2, "too_long")]


def test_cli_uses_the_models_context_by_default(tmp_path, capsys):
    path = write(tmp_path / "t.jsonl", [row(0), row(40)])
    assert main(["validate", str(path), "-m", LOCAL]) == 1
    assert f"{path}:2: error too_long" in capsys.readouterr().out
    assert main(["validate", str(path), "-m", INKLING]) == 0
    capsys.readouterr()


def test_preflight_rejects_exactly_what_validate_rejects(tmp_path):
    rows = [row(0), row(40), {"messages": [{"role": "user", "content": "q"}]},
            {"messages": [{"role": "user", "content": "key tml-ABCDEFGHIJKLMNOPQRSTUVWX"},
                          {"role": "assistant", "content": "ok"}]},
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "trainable": False}]}]
    on_file = validate(write(tmp_path / "t.jsonl", rows), LOCAL)
    in_memory = preflight(rows, LOCAL, raise_errors=False)
    assert isinstance(in_memory, ValidationResult) and not in_memory.ok
    assert codes(in_memory) == codes(on_file) == [(None, "trainable_flags"), (2, "too_long"), (3, "last_not_assistant"),
                                                  (4, "secret"), (5, "no_trainable_tokens")]
    assert in_memory.summary["rows"] == 5 and in_memory.summary["tokens"] == on_file.summary["tokens"]
    with pytest.raises(ValidationFailed) as err:
        preflight(rows, LOCAL)
    exc = err.value
    assert isinstance(exc, MachineFormatError) and exc.line == 2 and exc.result.summary["errors"] == 4
    assert "4 error(s)" in str(exc) and "line 2: too_long" in str(exc) and "tml-ABCDEFGHIJKLMNOPQRSTUVWX" not in str(exc)


def test_preflight_passes_good_rows_and_reads_frames(tmp_path):
    import pandas as pd

    rows = [row(0), row(10)]
    assert preflight(rows, LOCAL).ok
    assert preflight(pd.DataFrame(rows), LOCAL).summary["rows"] == 2
    short, long = count_tokens(rows, INKLING)["tokens"].tolist()
    assert short < long and preflight(rows, INKLING, max_length=short, raise_errors=False).summary["errors"] == 1


def test_a_max_length_below_one_is_refused(tmp_path):
    path = write(tmp_path / "t.jsonl", [row(0)])
    for bad in (0, -5):
        with pytest.raises(ValueError, match="at least 1"):
            validate(path, LOCAL, max_length=bad)
    with pytest.raises(TypeError):
        validate(path, LOCAL, max_length="128")
    assert "in-memory rows" in repr(preflight([row(0)], LOCAL)) and "in-memory rows" in preflight([row(0)], LOCAL)._repr_html_()


@pytest.mark.parametrize("reply", ["", "  \n ", [{"type": "text", "text": " "}]])
def test_an_empty_assistant_reply_is_an_error_in_validate_and_preflight(tmp_path, reply):
    rows = [row(0), {"messages": [{"role": "user", "content": "What is 1 plus 1?"},
                                  {"role": "assistant", "content": reply}]}]
    r = validate(write(tmp_path / "t.jsonl", rows))
    assert errors(r) == [(2, "empty_reply")] and not r.ok
    with pytest.raises(ValidationFailed, match="empty_reply"):
        preflight(rows)
    # a tool call with no text is a reply
    call = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}
    assert errors(validate([call])) == []


def errors(result):
    return [(line, c) for (line, c), sev in zip(codes(result), result.findings["severity"]) if sev == "error"]


def test_validate_takes_a_list_of_rows_and_a_frame():
    import pandas as pd

    good, bad = row(0), {"messages": [{"role": "user", "content": "hi"}]}
    r = validate([good, bad])
    assert isinstance(r, ValidationResult) and errors(r) == [(2, "last_not_assistant")]
    assert r.summary["rows"] == 2
    assert errors(validate(pd.DataFrame([good, good]))) == []
    ev = validate([{"messages": [{"role": "user", "content": "1+1?"}], "expected": "2"}])
    assert ev.summary["kind"] == "eval" and ev.ok
    assert errors(validate([])) == [(None, "empty_file")]


def test_a_connection_string_password_in_a_row_is_a_warning():
    rows = [{"messages": [{"role": "user", "content": "connect me"},
                          {"role": "assistant", "content": f"psql 'host=db user=u password={pw}'"}]}
            for pw in ("CANARYpw123", "None")]
    rows.append({"messages": [{"role": "user", "content": "url?"},
                              {"role": "assistant", "content": "postgres://u:p@ss-CANARY@db/app"}]})
    r = validate(rows)
    found = r.findings[r.findings["code"] == "password"]
    assert found["line"].tolist() == [1, 3] and set(found["severity"]) == {"warning"}
    assert "CANARYpw123" not in " ".join(r.findings["message"]) and "p@ss-CANARY" not in " ".join(r.findings["message"])
