"""What validate and `machine-nb validate` tell a user about files as editors and other tools write
them: a held-out prompt is found however its text is spelled, and the line it shares is named; a
held-out file that cannot be read whole says so; a file saved with a byte order mark or in UTF-16
says how to save it; one secret is one error; estimated counts estimate the trained tokens too; and
a bad argument is refused the way the rest of the toolkit refuses it."""

import json
import unicodedata

import pandas as pd
import pytest

from machine_nb.checks.validate import preflight, prompt_keys, validate

# fake canaries shaped like keys, so the detector must find them; none is a real credential
TML = "tml-FAKEcanaryNOTaREALkey0000"
BOM = b"\xef\xbb\xbf"


def qa(q="What is 2 plus 2?", a="answer: 4"):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def ev(q, expected="4"):
    return {"messages": [{"role": "user", "content": q}], "expected": expected, "match": "exact"}


def write(path, rows, *, prefix=b""):
    path.write_bytes(prefix + "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode())
    return path


def codes(result):
    lines = [None if str(v) == "<NA>" else int(v) for v in result.findings["line"]]
    return list(zip(lines, result.findings["code"]))


# --------------------------------------------------------------------------- held-out overlap

QUESTION = "What is the café's ﬁnal price, Straße 5?"


@pytest.mark.parametrize("spelled", [
    unicodedata.normalize("NFD", QUESTION),  # é as e + combining accent (macOS file names, some editors)
    unicodedata.normalize("NFKC", QUESTION),  # the ﬁ ligature as "fi"
    QUESTION.replace(" ", " \u200b"),  # zero-width spaces pasted from a web page
    QUESTION.upper(),  # ß upper-cases to SS
    QUESTION.replace("price", "ｐｒｉｃｅ"),  # full-width letters
])
def test_a_held_out_prompt_spelled_another_unicode_way_is_still_an_overlap(tmp_path, spelled):
    evals = write(tmp_path / "eval.jsonl", [ev(QUESTION)])
    train = write(tmp_path / "train.jsonl", [qa("a different question?"), qa(spelled)])
    r = validate(train, None, eval_data=evals)
    assert codes(r)[-1] == (2, "eval_overlap") and not r.ok
    assert prompt_keys(qa(spelled)["messages"]) == prompt_keys(ev(QUESTION)["messages"])


def test_the_same_question_about_another_image_is_not_an_overlap(tmp_path):
    def about(image, row):
        return {**row, "messages": [{"role": "user", "content": [
            {"type": "image", "image": image}, {"type": "text", "text": "What animal is this?"}]},
            *row["messages"][1:]]}

    evals = write(tmp_path / "eval.jsonl", [about("https://example.com/cat.png", ev("x", "cat"))])
    train = write(tmp_path / "train.jsonl", [about("https://example.com/dog.png", qa("x", "dog")),
                                              about("https://example.com/cat.png", qa("x", "cat"))])
    r = validate(train, None, eval_data=evals)
    overlaps = [(line, code) for line, code in codes(r) if code.startswith("eval_overlap")]
    # the dog photo asks the same words of another picture: another question, no finding
    assert overlaps == [(2, "eval_overlap")]
    # a string prompt and the same text as one text part are still one prompt
    assert prompt_keys([{"role": "user", "content": "hi there"}]) == \
        prompt_keys([{"role": "user", "content": [{"type": "text", "text": "hi there"}]}])


def test_a_held_out_file_with_a_bom_or_a_broken_line_says_its_prompts_went_unchecked(tmp_path):
    train = write(tmp_path / "train.jsonl", [qa("What is 7 times 6?"), qa("What is 2 plus 2?")])
    bom = write(tmp_path / "bom.jsonl", [ev("What is 7 times 6?"), ev("What is 9 minus 1?")], prefix=BOM)
    r = validate(train, None, eval_data=bom)
    unread = r.findings[r.findings["code"] == "eval_unreadable"]
    assert len(unread) == 1 and unread["severity"].iloc[0] == "warning" and pd.isna(unread["line"].iloc[0])
    assert str(bom) in unread["message"].iloc[0] and "line 1" in unread["message"].iloc[0]
    broken = write(tmp_path / "broken.jsonl", [ev("What is 9 minus 1?"), '{"messages": [', ev("What is 1 plus 1?")])
    message = validate(train, None, eval_data=broken).findings.set_index("code").loc["eval_unreadable", "message"]
    assert "line 2" in message and "1 line" in message
    empty = write(tmp_path / "empty.jsonl", [])
    r = validate(train, None, eval_data=empty)
    assert "eval_unreadable" in r.findings["code"].tolist()
    assert "no rows" in r.findings.set_index("code").loc["eval_unreadable", "message"]


def test_held_out_rows_in_memory_are_checked_as_a_file_is(tmp_path):
    train = write(tmp_path / "train.jsonl", [qa("What is 7 times 6?"), qa("What is 2 plus 2?")])
    rows = [ev("What is 2 plus 2?")]
    for given in (rows, pd.DataFrame(rows)):
        r = validate(train, None, eval_data=given)
        assert codes(r)[-1] == (2, "eval_overlap") and not r.ok
        assert "[" not in r.findings["message"].iloc[-1]  # named in words, not as the rows' repr
    assert preflight([qa("What is 2 plus 2?")], None, eval_data=rows, raise_errors=False).summary["errors"] == 1


# --------------------------------------------------------------------------- reading the file

def test_a_file_saved_with_a_bom_is_an_error_that_says_how_to_save_it(tmp_path):
    path = write(tmp_path / "t.jsonl", [qa(), qa("What is 3 plus 3?")], prefix=BOM)
    r = validate(path, None)
    bad = r.findings[r.findings["code"] == "bad_json"]
    assert bad["line"].tolist() == [1] and not r.ok
    assert "byte order mark" in bad["message"].iloc[0] and "without" in bad["message"].iloc[0]
    assert "utf-8-sig" not in bad["message"].iloc[0]


# --------------------------------------------------------------------------- secrets

def test_the_tinker_key_in_a_row_is_one_error_not_two(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", TML)
    path = write(tmp_path / "t.jsonl", [qa("my key?", f"it is {TML}"), qa("and again?", f"{TML} and {TML}")])
    r = validate(path, None)
    assert codes(r)[1:] == [(1, "secret"), (2, "secret"), (2, "secret")]
    assert r.summary["errors"] == 3
    assert TML not in "\n".join(r.findings["message"])


def test_the_tinker_key_inside_a_longer_token_is_still_found(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tk_FAKE_canary_value_0000")
    r = validate([qa("key?", "x_tk_FAKE_canary_value_0000_y")], None)
    assert codes(r)[1:] == [(1, "secret")] and "TINKER_API_KEY" in r.findings["message"].iloc[1]


# --------------------------------------------------------------------------- arguments

def test_an_unknown_kind_is_refused_for_a_missing_file_too(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        validate(tmp_path / "missing.jsonl", None, kind="Train")
    r = validate(tmp_path / "missing.jsonl", None)
    assert codes(r) == [(None, "no_file")] and r.summary["kind"] in ("train", "eval")
    assert "(train, None)" in r._repr_html_() or "(eval, None)" in r._repr_html_()


def test_a_negative_max_length_is_a_usage_error_naming_the_flag(tmp_path, capsys):
    from machine_nb.cli import main

    path = write(tmp_path / "t.jsonl", [qa()])
    with pytest.raises(SystemExit) as exited:
        main(["validate", str(path), "--max-length", "-3"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--max-length" in err and "Traceback" not in err
    assert main(["validate", str(path), "--max-length", "0"]) == 0  # 0 drops the limit, as documented


def test_a_prompt_cut_inside_a_character_is_a_finding_with_a_held_out_file_too(tmp_path):
    half = '{"messages": [{"role": "user", "content": "half \\ud800 char"}, {"role": "assistant", "content": "x"}]}'
    train = write(tmp_path / "train.jsonl", [half, qa()])
    evals = write(tmp_path / "eval.jsonl", [ev("What is 2 plus 2?")])
    r = validate(train, None, eval_data=evals)
    assert codes(r)[1:] == [(1, "bad_text"), (2, "eval_overlap")]
    held = write(tmp_path / "held.jsonl", [half.replace(', {"role": "assistant", "content": "x"}', ""), ev("q")])
    assert validate(train, None, eval_data=held).summary["rows"] == 2


def test_epochs_on_an_eval_file_prices_no_training_it_cannot_start(tmp_path, capsys):
    from machine_nb.cli import main

    path = write(tmp_path / "eval.jsonl", [ev(f"What is {i} plus {i}?", str(2 * i)) for i in range(10)])
    assert main(["validate", str(path), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 10 eval rows") and "$" not in out and "eval rows are not trained on" in out
    assert main(["validate", str(path), "--epochs", "2", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["cost"]
    assert set(cost) == {"error"} and "eval rows are not trained on" in cost["error"]


def test_estimated_counts_estimate_the_trained_tokens_too_as_count_tokens_does(tmp_path, capsys):
    """Without the tokenizer offline the counts are estimates; "0 trained" would read as a file
    that trains nothing."""
    import warnings

    from machine_nb.checks.tokens import count_tokens
    from machine_nb.cli import main

    rows = [qa("What is 2 plus 2?", "answer: 4"), {"whole_run": True, "messages": [
        {"role": "user", "content": "list"}, {"role": "assistant", "content": "a.txt b.txt", "trainable": True},
        {"role": "user", "content": "first?"}, {"role": "assistant", "content": "a.txt", "trainable": False}]}]
    path = write(tmp_path / "t.jsonl", rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counted = count_tokens(path, "Qwen/Qwen3-8B")
    for model in ("Qwen/Qwen3-8B", None):
        r = validate(path, model)
        assert not r.summary["exact"] and r.summary["tokens"] == counted["tokens"].sum()
        assert r.summary["trained_tokens"] == counted["trained_tokens"].sum() > 0
    assert main(["validate", str(path), "-m", "Qwen/Qwen3-8B"]) == 0
    assert f", {counted['trained_tokens'].sum()} trained;" in capsys.readouterr().out


@pytest.mark.parametrize("encoding,name", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_file_is_one_error_that_names_its_encoding(tmp_path, encoding, name):
    """Windows PowerShell's `>` writes UTF-16 with a byte order mark: every line would otherwise be
    a puzzle of its own ("not UTF-8 (byte 0xff …)", "invalid JSON …")."""
    text = "".join(json.dumps(r) + "\r\n" for r in [qa(), qa("What is 3 plus 3?")])
    path = tmp_path / "t.jsonl"
    path.write_bytes(("\ufeff" + text).encode(encoding))
    r = validate(path, None)
    errors = r.errors()
    assert errors["code"].tolist() == ["bad_encoding"] and pd.isna(errors["line"].iloc[0])
    assert name in errors["message"].iloc[0] and "UTF-8" in errors["message"].iloc[0] and str(path) in \
        errors["message"].iloc[0]


def test_an_overlap_names_the_held_out_line_it_shares_a_prompt_with(tmp_path):
    """The trainer's refusal names the held-out row; validate's finding names it too, so the user
    knows which of 500 eval rows to drop or rewrite."""
    evals = write(tmp_path / "eval.jsonl", [ev("What is 9 minus 1?"), "", ev("What is 2 plus 2?")])
    train = write(tmp_path / "train.jsonl", [
        qa("What is 2 plus 2?"),
        {"messages": [{"role": "system", "content": "be terse"}, *qa("What is 9 minus 1?")["messages"]]}])
    r = validate(train, None, eval_data=evals)
    messages = dict(zip(codes(r), r.findings["message"]))
    assert f"line 3 of the eval file {evals}" in messages[(1, "eval_overlap")]
    assert f"line 1 of the eval file {evals}" in messages[(2, "eval_overlap_question")]
    memory = validate(train, None, eval_data=[ev("x"), ev("What is 2 plus 2?")])
    assert codes(memory)[-1] == (1, "eval_overlap")
    assert "row 2 of the eval rows given" in memory.findings["message"].iloc[-1]


def test_a_numpy_whole_number_is_a_max_length(tmp_path):
    """A limit computed from a frame (`counts["tokens"].quantile(...)`, `.max()`) is a numpy integer."""
    import numpy as np

    path = write(tmp_path / "t.jsonl", [qa(), qa("word " * 200)])
    for limit in (np.int64(40), np.int32(40)):
        r = validate(path, None, max_length=limit)
        assert r.summary["max_length"] == 40 and type(r.summary["max_length"]) is int
        assert codes(r)[-1] == (2, "too_long")
        assert json.loads(json.dumps(r.to_dict()))["summary"]["max_length"] == 40
    with pytest.raises(TypeError):
        validate(path, None, max_length=np.float64(40.5))


def test_epochs_on_a_file_with_errors_says_why_there_is_no_cost(tmp_path, capsys):
    from machine_nb.cli import main

    path = write(tmp_path / "t.jsonl", [qa(), {"messages": [{"role": "user", "content": "q"}]}])
    assert main(["validate", str(path), "--epochs", "1"]) == 1
    assert "cost: not estimated" in capsys.readouterr().out
    assert main(["validate", str(path), "--epochs", "1", "--json"]) == 1
    assert "error finding" in json.loads(capsys.readouterr().out)["cost"]["error"]
    assert main(["validate", str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["cost"] is None  # no --epochs: no cost asked for
