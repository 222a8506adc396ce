"""Validation: every problem is a finding on its line, nothing hides the rest, secrets never print whole."""

import json

from machine_nb.cli import main
from machine_nb.checks.tokens import count_tokens
from machine_nb.checks.validate import BUCKETS, FINDING_COLUMNS, ValidationResult, validate

INKLING = "thinkingmachines/Inkling-Small"


def qa(q, a):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


TOOL_ROW = {"messages": [
    {"role": "user", "content": "list files"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "ls", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "ls", "content": "a.txt"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "one file"}, {"type": "text", "text": "a.txt"}]}]}


def codes(result):
    """(line, code) pairs; file-level findings have line None."""
    lines = [None if str(v) == "<NA>" else int(v) for v in result.findings["line"]]
    return list(zip(lines, result.findings["code"]))


def test_every_bad_row_is_a_finding_on_its_line(tmp_path):
    path = write(tmp_path / "train.jsonl", [
        qa("What is 20 plus 52?", "answer: 72"),                                          # 1 fine
        {"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}]},  # 2
        "{not json",                                                                      # 3
        {"messages": [{"role": "user", "content": "hi"}]},                                # 4 no target
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c9", "content": "r"}, {"role": "assistant", "content": "ok"}]},  # 5
        [1, 2],                                                                           # 6
        {"messages": []},                                                                 # 7
        {"messages": [{"role": "user", "content": [{"type": "bogus"}]}, {"role": "assistant", "content": "x"}]},  # 8
        {"text": "no messages"},                                                          # 9
        TOOL_ROW,                                                                         # 10 fine
        {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]},  # 11
    ])
    r = validate(path, INKLING)
    assert isinstance(r, ValidationResult) and not r.ok
    assert list(r.findings.columns) == FINDING_COLUMNS
    assert codes(r) == [(2, "unknown_role"), (3, "bad_json"), (4, "last_not_assistant"), (5, "orphan_tool_result"),
                        (5, "unanswered_tool_call"), (6, "not_object"), (7, "empty_messages"), (8, "bad_content"),
                        (9, "no_messages"), (11, "bad_content")]
    assert r.summary["rows"] == 10 and r.summary["errors"] == 9 and r.summary["warnings"] == 1
    # the two good rows were rendered and counted exactly
    good = count_tokens([qa("What is 20 plus 52?", "answer: 72"), TOOL_ROW], INKLING)
    assert r.summary["tokens"] == good["tokens"].sum() and r.summary["trained_tokens"] == good["trained_tokens"].sum()
    assert r.summary["exact"] and r.summary["histogram"]["<=512"] == 2
    assert "messages[0].role is 'bot'" in r.findings["message"][0]
    assert len(r.errors()) == 9 and "error(s)" in r._repr_html_()


def test_renderer_failures_length_and_histogram(tmp_path):
    long_answer = "word " * 700
    path = write(tmp_path / "t.jsonl", [qa("short?", "yes"), qa("long?", long_answer),
                                        {"messages": [{"role": "user", "content": "x"},
                                                      {"role": "assistant", "content": "y", "trainable": False}]}])
    r = validate(path, INKLING, max_length=600)
    assert (2, "too_long") in codes(r)
    assert (3, "render_failed") in codes(r) or (3, "no_trainable_tokens") in codes(r)
    hist = r.summary["histogram"]
    assert list(hist) == [f"<={b}" for b in BUCKETS] + [">65536"]
    assert hist["<=512"] == 1 and hist["<=2048"] == 1
    assert validate(path, INKLING, max_length=None).summary["errors"] == r.summary["errors"] - 1


def test_zero_trainable_tokens_on_the_local_engine(tmp_path):
    from machine_nb.engines.local import DEFAULT_MODEL
    path = write(tmp_path / "t.jsonl", [{"messages": [{"role": "user", "content": "x"},
                                                      {"role": "assistant", "content": "y", "trainable": False}]},
                                        qa("What is 47 plus 15?", "answer: 62")])
    r = validate(path, DEFAULT_MODEL)
    assert codes(r) == [(None, "trainable_flags"), (1, "no_trainable_tokens")] and r.summary["exact"]
    assert r.findings["code"][0] == "trainable_flags" and "1 row(s)" in r.findings["message"][0]


def test_eval_rows(tmp_path):
    path = write(tmp_path / "eval.jsonl", [
        {"messages": [{"role": "user", "content": "What is 1 plus 2?"}], "expected": "answer: 3", "match": "exact",
         "format": "^answer: -?\\d+$"},
        {"messages": [{"role": "user", "content": "q"}], "match": "exact"},
        {"messages": [{"role": "user", "content": "q"}], "expected": "a", "match": "fuzzy"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "expected": "a"},
        {"messages": [{"role": "user", "content": "q"}], "expected": "(", "match": "regex", "format": "["},
    ])
    r = validate(path, INKLING)
    assert r.summary["kind"] == "eval"
    assert codes(r) == [(2, "no_expected"), (3, "unknown_match"), (4, "last_not_user"), (4, "no_match"),
                        (5, "bad_regex"), (5, "bad_format")]
    assert r.summary["tokens"] > 0 and r.summary["trained_tokens"] == 0


def test_overlap_with_the_eval_file(tmp_path):
    evals = write(tmp_path / "eval.jsonl", [
        {"messages": [{"role": "user", "content": "What is 47 plus 15?"}], "expected": "answer: 62", "match": "exact"}])
    train = write(tmp_path / "train.jsonl", [
        qa("What is 10 plus 11?", "answer: 21"),
        qa("what is 47  plus 15?", "answer: 62"),  # same prompt up to case and spacing
        {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "What is 47 plus 15?"},
                      {"role": "assistant", "content": "answer: 62"}]},
    ])
    r = validate(train, INKLING, eval_data=evals)
    assert codes(r) == [(2, "eval_overlap"), (3, "eval_overlap_question")]
    assert not r.ok


def test_secrets_are_found_and_redacted(tmp_path, monkeypatch):
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    # fake canary values shaped like real keys: the detector must find them; none is a real credential
    secrets = ["sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123", "tml-ABCDEFGHIJKLMNOPQRSTUVWX", "AKIAIOSFODNN7EXAMPLE",
               "ghp_" + "a1B2" * 9, "xoxb-123456789012-abcdefghij"]
    rows = [qa(f"my token is {s}", "noted") for s in secrets]
    rows.append(qa("key?", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"))
    rows.append({**qa("fine", "fine"), "tools": [{"name": "t", "description": f"uses {key}", "parameters": {}}]})
    path = write(tmp_path / "t.jsonl", rows)
    r = validate(path, None)
    found = r.findings[r.findings["code"] == "secret"]
    assert found["line"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    text = "\n".join(r.findings["message"])
    for s in secrets + [key, "b3BlbnNzaC1rZXktdjEAAAAA"]:
        assert s not in text
    assert "TINKER_API_KEY" in found["message"].iloc[-1] and "tk_l…(27 chars)" in found["message"].iloc[-1]
    assert r.findings["code"].tolist()[0] == "no_model"
    # one rule for secrets: validate shows them as redact.mask does, and the report redacts what redact does
    import importlib

    from machine_nb.core import redact
    from machine_nb.reports import notebook as report

    validate_module = importlib.import_module("machine_nb.checks.validate")

    assert redact.mask(key) == "tk_l…(27 chars)" and validate_module.mask is redact.mask
    assert report.secret_values is redact.secret_values and report.scrub is redact.scrub


def test_empty_missing_and_estimated(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert codes(validate(empty, INKLING))[-1][1] == "empty_file"
    assert codes(validate(tmp_path / "nope.jsonl", INKLING))[0][1] == "no_file"
    path = write(tmp_path / "t.jsonl", [qa("q", "a")])
    r = validate(path, "Qwen/Qwen3-8B")
    assert r.ok and not r.summary["exact"] and r.findings["code"].tolist() == ["estimated_tokens"]
    assert "Hugging Face hub" in r.findings["message"][0]


def test_a_length_from_the_estimate_is_a_warning_that_says_so(tmp_path):
    """Without the model's tokenizer offline the count is the deliberately high estimate: a row it
    puts over max_length is a warning saying the count is estimated, not an error that fails a file
    the model may hold. With the tokenizer, the same row is counted exactly."""
    path = write(tmp_path / "t.jsonl", [qa("long?", "word " * 700)])
    r = validate(path, "Qwen/Qwen3-8B", max_length=600)
    (severity, message), = [(f.severity, f.message) for f in r.findings.itertuples() if f.code == "too_long"]
    assert severity == "warning" and "estimated" in message and r.ok
    exact = validate(path, INKLING, max_length=600)
    assert [f.severity for f in exact.findings.itertuples() if f.code == "too_long"] == ["error"]


def test_cli_exit_codes_and_output(tmp_path, capsys):
    bad = write(tmp_path / "bad.jsonl", [qa("q", "a"), {"messages": [{"role": "user", "content": "q"}]}])
    good = write(tmp_path / "good.jsonl", [qa("q", "a")])
    assert main(["validate", str(bad), "-m", INKLING]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:2: error last_not_assistant" in out and "FAILED" in out
    assert main(["validate", str(good), "-m", "thinkingmachines/Inkling", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 1 train rows") and "cost: $" in out
    assert main(["validate", str(bad), "-m", INKLING, "--json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is False and payload["findings"][0]["line"] == 2


def test_streaming_memory_does_not_grow_with_the_file(tmp_path):
    """Measured in a fresh process: tracemalloc in this one, beside the local server's threads and
    pyarrow's native pool, risks a crash in CPython's allocator hooks. The imports are warmed on a
    one-row file. Ten thousand rows (2.8 MB) suffice: the peak, the same at any length of file, is
    about half the bound of a tenth of the file, and anything kept per row past about 13 bytes
    crosses it."""
    import subprocess
    import sys

    path = tmp_path / "big.jsonl"
    row = json.dumps(qa("What is 47 plus 15? " + "pad " * 40, "answer: 62")) + "\n"
    path.write_text(row * 10_000)
    warm = tmp_path / "one.jsonl"
    warm.write_text(row)
    code = ("import json, sys, tracemalloc\n"
            "from machine_nb.checks.validate import validate\n"
            "validate(sys.argv[2], None)  # warm imports\n"
            "tracemalloc.start()\n"
            "r = validate(sys.argv[1], None, progress=False)\n"
            "print(json.dumps([r.summary['rows'], r.ok, tracemalloc.get_traced_memory()[1]]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(warm)], capture_output=True, text=True,
                         check=True).stdout
    rows, ok, peak = json.loads(out.strip().splitlines()[-1])
    assert rows == 10_000 and ok
    assert peak < path.stat().st_size / 10, (peak, path.stat().st_size)


def test_validate_is_made_of_steps_a_user_can_call(tmp_path):
    """Settings, preparation, per-row problems (pure) and counting are steps of their own;
    validate() is their composition, and its old keyword names still work."""
    from machine_nb.checks.validate import Tally, count_row, prepare, resolve_settings, row_problems

    evals = write(tmp_path / "eval.jsonl", [{"messages": [{"role": "user", "content": "What is 2 + 2?"}],
                                            "expected": "4", "match": "exact"}])
    settings = resolve_settings(None, 5, "train", eval_data=evals)
    assert (settings.max_length, settings.kind) == (5, "train")
    prepared = prepare(settings)
    assert [f[2] for f in prepared.findings] == ["no_model"] and prepared.renderer is None
    row = qa("What is 2 + 2?", "It is 4, my key is sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123")  # a fake key
    raw = json.dumps(row)
    assert [c for _, c, _ in row_problems(row, raw, settings, prepared)] == ["secret", "eval_overlap"]
    tokens, trained, problems = count_row(row, settings, prepared)
    assert tokens > 5 and trained == 0 and [c for _, c, _ in problems] == ["too_long"]
    tally = Tally(tmp_path / "t.jsonl", settings, prepared)
    tally.row(1, row, raw, prepared)
    by_steps = tally.result()
    path = write(tmp_path / "t.jsonl", [row])
    whole = validate(path, None, 5, evals)
    assert by_steps.findings.equals(whole.findings) and by_steps.summary == whole.summary
    assert validate(data=path, max_length=5, eval_data=evals).findings.equals(whole.findings)
    plain = whole.to_dict()
    assert plain["path"] == str(path) and plain["ok"] is False and plain["summary"] == whole.summary
    assert [(f["line"], f["code"]) for f in plain["findings"]][:2] == [(None, "no_model"), (1, "secret")]
    assert json.loads(json.dumps(plain)) == plain


def test_a_secret_the_renderer_quotes_in_its_error_is_redacted(tmp_path, monkeypatch, capsys):
    """A renderer error may quote the row (a media part's path); the render_failed finding and the
    CLI line show the key redacted, as the secret finding masks it."""
    env_key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", env_key)
    shaped = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123"  # fake canaries, not real credentials
    path = write(tmp_path / "t.jsonl", [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": env_key}]},
                      {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": [{"type": "audio", "audio": shaped}]},
                      {"role": "assistant", "content": "a"}]}])
    r = validate(path, INKLING)
    assert [(line, code) for line, code in codes(r) if code == "render_failed"] == [(1, "render_failed"),
                                                                                   (2, "render_failed")]
    text = "\n".join(r.findings["message"])
    assert env_key not in text and shaped not in text
    assert main(["validate", str(path), "-m", INKLING]) == 1
    out = capsys.readouterr().out
    assert f"{path}:1: error render_failed" in out and env_key not in out and shaped not in out
