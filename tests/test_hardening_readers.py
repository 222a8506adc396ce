"""Every JSONL reader meets a deeply nested line (100,000 `[`) the way it meets any other bad line:
one MachineFormatError naming file and line, or skipped with a warning naming them, never a bare
RecursionError. And a torn line reads "invalid JSON: … at column N", with the word "at" once."""

import json
import warnings

import pytest

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.core.jsonl import MAX_DEPTH, iter_jsonl, parse_json

INKLING = "thinkingmachines/Inkling-Small"
GOOD = json.dumps({"messages": [{"role": "user", "content": "What is 47 plus 15?"},
                                {"role": "assistant", "content": "answer: 62"}]})
DEEP = "[" * 100_000  # the parser's recursion limit, not a syntax error, is what it hits first


def _file(path, middle=DEEP):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{GOOD}\n{middle}\n{GOOD}\n")
    return path


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, "\n".join(str(w.message) for w in caught)


def test_read_jsonl_names_file_and_line(tmp_path):
    path = _file(tmp_path / "deep.jsonl")
    with pytest.raises(MachineFormatError) as err:
        mnb.read_jsonl(path)
    assert err.value.line == 2 and f"{path}:2" in str(err.value) and "nested deeper than" in str(err.value)
    rows, said = _caught(lambda: mnb.read_jsonl(path, on_error="warn"))
    assert len(rows) == 2 and f"{path}:2" in said and "nested deeper than" in said


def test_a_line_just_deeper_than_the_limit_is_refused_the_same_at_any_stack_depth(tmp_path):
    # parseable by json.loads from a shallow stack, but not from a deep one: the rule is a fixed depth
    deep = '{"messages": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}"
    ok = '{"x": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"  # exactly MAX_DEPTH levels
    path = _file(tmp_path / "edge.jsonl", deep)
    (tmp_path / "ok.jsonl").write_text(ok + "\n")

    def nested(n):
        return nested(n - 1) if n else (list(iter_jsonl(path, on_error="skip", skipped=(errs := []))), errs)

    for frames in (0, 300):
        rows, errs = nested(frames)
        assert [n for n, _ in rows] == [1, 3] and [e.line for e in errs] == [2]
    assert len(mnb.read_jsonl(tmp_path / "ok.jsonl")) == 1
    with pytest.raises(MachineFormatError, match="nested deeper than"):
        parse_json(DEEP)


def test_tagged_skips_it_with_a_warning(tmp_path):
    _file(tmp_path / "store" / "train.jsonl")
    df, said = _caught(lambda: mnb.tagged(store=tmp_path / "store"))
    assert len(df) == 2 and f"{tmp_path / 'store' / 'train.jsonl'}:2" in said and "nested deeper than" in said


def test_load_events_skips_with_a_warning_or_raises(tmp_path):
    path = _file(tmp_path / ".machine" / "events.jsonl")
    df, said = _caught(lambda: mnb.load_events(tmp_path))
    assert len(df) == 2 and f"{path}:2" in said
    with pytest.raises(MachineFormatError) as err:
        mnb.load_events(tmp_path, on_error="raise")
    assert err.value.line == 2


def test_validate_reports_a_finding_on_its_line(tmp_path):
    from machine_nb.checks.validate import validate  # once imported, `mnb.validate` names the module

    path = _file(tmp_path / "train.jsonl")
    r = validate(path, INKLING)
    bad = r.findings[r.findings["code"] == "bad_json"]
    assert not r.ok and bad["line"].tolist() == [2] and "nested deeper than" in bad["message"].iloc[0]
    assert r.summary["rows"] == 2


def test_count_tokens_and_estimate_cost_raise_naming_the_line(tmp_path):
    path = _file(tmp_path / "train.jsonl")
    for call in (lambda: mnb.count_tokens(path, INKLING),
                 lambda: mnb.estimate_cost(path, "thinkingmachines/Inkling", epochs=1)):
        with pytest.raises(MachineFormatError) as err:
            call()
        assert err.value.line == 2 and str(path) in str(err.value)
    counts, said = _caught(lambda: mnb.count_tokens(path, INKLING, on_error="warn"))
    assert len(counts) == 2 and f"{path}:2" in said


def test_sft_refuses_before_writing_a_log_dir(tmp_path):
    path = _file(tmp_path / "train.jsonl")
    with pytest.raises(MachineFormatError) as err:
        mnb.sft(path, engine="local", log_dir=tmp_path / "run", progress=False)
    assert err.value.line == 2 and str(path) in str(err.value)
    assert not (tmp_path / "run").exists()


def test_eval_rows_and_probe_prompts(tmp_path):
    row = json.dumps({"messages": [{"role": "user", "content": "q"}], "expected": "a"})
    path = tmp_path / "eval.jsonl"
    path.write_text(f"{row}\n{DEEP}\n")
    with pytest.raises(MachineFormatError) as err:
        mnb.load_eval_rows(path)
    assert err.value.line == 2 and str(path) in str(err.value)
    probe_path = tmp_path / "probe.jsonl"
    probe_path.write_text(f"{GOOD}\n{DEEP}\n")
    with pytest.raises(MachineFormatError) as err:  # before any sampling: the stand-ins are never called
        mnb.probe(probe_path, INKLING, engine="tinker", baseline_client=object(), checkpoint_client=object())
    assert err.value.line == 2 and str(probe_path) in str(err.value)


def test_a_torn_line_says_at_column_once(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "train.jsonl").write_text(GOOD + '\n{"id": "b", "messages": [{"role": "user", "content": "tor\n' + GOOD + "\n")
    df, said = _caught(lambda: mnb.tagged(store=store))
    assert len(df) == 2 and "at at" not in said
    assert f"{store / 'train.jsonl'}:2: invalid JSON: invalid control character at column " in said
    for text, words in (('{"a": "x', "unterminated string starting at column 7"),
                        ('{"a" 1}\n', "expecting ':' delimiter at column 6")):
        with pytest.raises(MachineFormatError) as err:
            parse_json(text)
        assert words in str(err.value).lower() and "at at" not in str(err.value)


def test_errors_that_carry_a_key_are_redacted_in_eval_rows_and_on_the_terminal(monkeypatch, capsys):
    """A request error that quotes the key lands in an eval's per-row `error` (and its results
    JSON) and a CLI error line: both are redacted by the same rule as reports."""
    import tinker

    from machine_nb.cli import main
    from machine_nb.errors import EngineError
    from machine_nb.evaluation.evaluate import evaluate
    from machine_nb.checks.render import get_renderer

    key = "tml-canary-for-redaction-tests-00000000"  # a fake key
    monkeypatch.setenv("TINKER_API_KEY", key)
    reply = get_renderer("local/arith-tiny").tokenizer.encode(" answer: 3<|end|>")

    class HalfLeaky:
        calls = 0

        async def sample_async(self, prompt, num_samples, sampling_params):
            type(self).calls += 1
            if type(self).calls % 2:
                raise RuntimeError(f"upstream said: bad key {key}")
            import numpy as np

            return tinker.SampleResponse(sequences=[tinker.SampledSequence(
                stop_reason="stop", sequence_id="s", tokens_np=np.asarray(reply, dtype=np.int32),
                logprobs_np=np.zeros(len(reply), dtype=np.float32))])

    rows = [{"messages": [{"role": "user", "content": "What is 1 plus 2?"}], "expected": "answer: 3"}] * 2
    with pytest.warns(UserWarning, match="failed"):
        df = evaluate(rows, model="local/arith-tiny", sampling_client=HalfLeaky(), save=False, concurrency=1).rows
    assert df["error"].notna().sum() == 1 and key not in " ".join(df["error"].dropna())
    assert "[redacted]" in " ".join(df["error"].dropna())

    class Leaky:
        async def sample_async(self, prompt, num_samples, sampling_params):
            raise RuntimeError(f"upstream said: bad key {key}")

    with pytest.raises(EngineError) as info:
        evaluate(rows, model="local/arith-tiny", sampling_client=Leaky(), save=False)
    assert key not in str(info.value)
    assert main(["validate", "/no/such/file-" + key + ".jsonl"]) != 0
    assert key not in capsys.readouterr().err


def test_a_deeply_nested_tool_input_string_is_text_not_a_recursion_error():
    """Export lines and the previewer's cards parse tool-call arguments that arrive as JSON strings;
    a hostile one nested 100,000 deep is kept as text."""
    from machine_nb.data.export import to_chat
    from machine_nb.widgets.cards import message_card

    deep = "[" * 100_000
    chat, _ = to_chat([{"role": "user", "content": "go"},
                    {"role": "assistant", "content": "", "name": "t", "toolCallId": "c", "toolInput": deep}])
    call = next(m for m in chat if m.get("tool_calls"))
    import json

    assert call["tool_calls"][0]["function"]["arguments"] == json.dumps(deep)  # text, as any non-JSON input
    html = message_card(call, index=1, trained=True)
    assert "[[[" in html


def test_a_role_from_a_training_line_is_text_in_a_card_short_or_folded():
    """A message's role comes from the user's file: in a card it is escaped in the header, the
    CSS class, and the fold's summary line of a long text."""
    from machine_nb.widgets.cards import message_card

    role = '<img src=x onerror="alert(1)">'
    for text in ("short", "line\n" * 200):
        html = message_card({"role": role, "content": text}, index=1, trained=False)
        assert "<img" not in html and "&lt;img src=x" in html
