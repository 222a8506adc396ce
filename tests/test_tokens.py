"""Exact token counts come from the real renderer (the cookbook's SFT path); others are labelled estimates."""

import json
import math

import pytest

from machine_nb.errors import EngineError, MachineFormatError
from machine_nb.core.jsonl import write_jsonl
from machine_nb.checks.render import get_renderer
from machine_nb.checks.tokens import TokenEstimateWarning, count_prompt_tokens, count_tokens

INKLING = "thinkingmachines/Inkling-Small"


def qa(q, a):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def test_exact_counts_match_the_cookbooks_datum(tmp_path):
    from tinker_cookbook.supervised.data import conversation_to_datum

    data = [qa("What is 47 plus 15?", "answer: 62"),
            qa("Who wrote Hamlet?", "William Shakespeare wrote Hamlet, around 1600, in London.")]
    path = write_jsonl(data, tmp_path / "train.jsonl")
    df = count_tokens(path, INKLING)
    assert list(df.columns) == ["line", "tokens", "trained_tokens", "exact", "error"]
    assert df["line"].tolist() == [1, 2] and df["exact"].all() and df["error"].isna().all()
    renderer = get_renderer(INKLING)
    for row, (_, got) in zip(data, df.iterrows()):
        datum = conversation_to_datum(row["messages"], renderer, max_length=None)
        # the datum is shifted by one (inputs = tokens[:-1], targets = tokens[1:])
        assert got["tokens"] == datum.model_input.length + 1
        assert got["trained_tokens"] == int((datum.loss_fn_inputs["weights"].to_torch() > 0).sum())
    assert 0 < df["trained_tokens"][0] < df["trained_tokens"][1] < df["tokens"][1]
    # rows in memory count the same as the file
    assert count_tokens(data, INKLING)[["tokens", "trained_tokens"]].equals(df[["tokens", "trained_tokens"]])


def test_trained_tokens_are_what_sft_trains():
    from tinker_cookbook.renderers import TrainOnWhat

    from machine_nb.core.chat import prepare_data

    turns = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hello there, friend!"},
             {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Hi."}]
    partly = [dict(m) for m in turns]
    partly[3]["trainable"] = True  # message 1 unflagged: not trained
    whole = {"messages": [dict(m) for m in turns], "whole_run": True}
    whole["messages"][1]["trainable"] = True
    renderer = get_renderer(INKLING)
    for rows in ([{"messages": turns}, qa("q", "a")], [{"messages": turns}, {"messages": partly}, whole]):
        prepared, mode = prepare_data(rows)
        sft = [int((renderer.build_supervised_example(r["messages"], TrainOnWhat(mode))[1] > 0).sum())
               for r in prepared]
        assert count_tokens(rows, INKLING)["trained_tokens"].tolist() == sft
    every = count_tokens([{"messages": turns}], INKLING, train_on_what="all_assistant_messages")
    last = count_tokens([{"messages": turns}], INKLING)
    assert every["trained_tokens"][0] > last["trained_tokens"][0] and every["tokens"][0] == last["tokens"][0]


def test_hub_only_model_is_estimated_at_once_and_says_why():
    row = qa("What is 47 plus 15?", "answer: 62")
    with pytest.warns(TokenEstimateWarning, match="Qwen/Qwen3-8B: tokenizer needs the Hugging Face hub"):
        df = count_tokens([row], "Qwen/Qwen3-8B")
    chars = len(json.dumps(row["messages"], separators=(",", ":"), ensure_ascii=False))
    assert df["tokens"][0] == math.ceil(chars / 2.5) and not df["exact"][0]
    assert "2.5-chars-per-token" in df.attrs["note"]


def test_a_row_the_renderer_rejects_falls_back_with_its_reason():
    df = count_tokens([qa("q", "a"), {"messages": [{"role": "user", "content": [{"type": "bogus"}]},
                                                   {"role": "assistant", "content": "x"}]}], INKLING)
    assert df["exact"].tolist() == [True, False]
    assert df["error"][1].startswith("renderer failed") and df["tokens"][1] > 0


def test_bad_rows_name_file_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(qa("q", "a")) + "\n" + json.dumps({"text": "no messages"}) + "\n")
    with pytest.raises(MachineFormatError) as info:
        count_tokens(path, INKLING)
    assert info.value.line == 2 and info.value.field == "messages" and str(path) in str(info.value)
    path.write_text(json.dumps(qa("q", "a")) + "\n{not json\n" + json.dumps(qa("r", "b")) + "\n")
    with pytest.raises(MachineFormatError, match=":2"):
        count_tokens(path, INKLING)
    assert count_tokens(path, INKLING, on_error="skip")["line"].tolist() == [1, 3]


def test_prompt_tokens_are_the_generation_prompt():
    row = {"messages": [{"role": "user", "content": "What is 47 plus 15?"}], "expected": "answer: 62"}
    df = count_prompt_tokens([row], INKLING)
    assert df["prompt_tokens"][0] == get_renderer(INKLING).build_generation_prompt(row["messages"]).length


def test_local_engine_model_counts_exactly():
    from machine_nb.engines.local import DEFAULT_MODEL
    df = count_tokens([qa("What is 47 plus 15?", "answer: 62")], DEFAULT_MODEL)
    assert df["exact"][0] and 0 < df["trained_tokens"][0] < df["tokens"][0]


def test_file_counts_are_cached_until_the_file_changes(tmp_path):
    path = write_jsonl([qa("What is 47 plus 15?", "answer: 62")], tmp_path / "t.jsonl")
    first = count_tokens(path, INKLING)
    first.loc[0, "tokens"] = -1  # a caller's edit must not leak into the cache
    assert count_tokens(path, INKLING)["tokens"][0] > 0
    write_jsonl([qa("What is 47 plus 15?", "answer: 62"), qa("Who wrote Hamlet?", "Shakespeare")], path)
    assert len(count_tokens(path, INKLING)) == 2


def test_estimates_follow_the_export_rule_for_non_ascii():
    from machine_nb.data.export import estimate_tokens

    row = qa("Wie viel ist 47 plus 15? 🙂", "answer: 62 — ça va")
    with pytest.warns(TokenEstimateWarning):
        df = count_tokens([row], "Qwen/Qwen3-8B")
    assert df["tokens"][0] == estimate_tokens([row])


def test_unreachable_hub_is_not_waited_on(monkeypatch):
    """No offline flag and no network: the tokenizer lookup gives up at once (a bounded check) and
    counts fall back to labelled estimates, instead of the hub's ~47 s of retries."""
    import socket
    import threading

    from machine_nb.checks import render

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    render.get_tokenizer.cache_clear()
    render.get_renderer.cache_clear()
    render._HUB_CHECKS.clear()
    release = threading.Event()
    real = socket.getaddrinfo

    def hanging_dns(host, *args, **kwargs):  # a resolver that never answers, as with no network
        if "invalid" in str(host):
            release.wait(120)
            raise socket.gaierror("no network")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging_dns)
    outcome = {}

    def count():
        try:
            outcome["df"] = count_tokens([qa("What is 47 plus 15?", "answer: 62")], "Qwen/Qwen3-8B")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=count, daemon=True)
    with pytest.warns(TokenEstimateWarning, match="cannot be reached"):
        worker.start()
        worker.join(60)  # a deadline, not a timing: the lookup must not wait for the resolver
        still_blocked = not release.is_set()
        release.set()
        worker.join(10)
    assert still_blocked and "df" in outcome, outcome
    df = outcome["df"]
    assert not df["exact"][0] and "2.5-chars-per-token" in df.attrs["note"]
    # the answer is fast again (the check's result is remembered for a while)
    with pytest.raises(EngineError, match="cannot be reached"):
        render.get_tokenizer("Qwen/Qwen3-8B")
    render._HUB_CHECKS.clear()


def test_estimated_trained_tokens_come_from_the_trained_messages():
    """For a model counted by estimate, trained tokens are those of the messages sft trains (the
    last assistant message, or the flagged ones), not every token of the row."""
    long_prompt = "Please add these two numbers for me, carefully and showing no work at all: " * 4
    row = {"messages": [{"role": "system", "content": "You add."}, {"role": "user", "content": long_prompt},
                        {"role": "assistant", "content": "answer: 1"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": "answer: 2"}]}
    with pytest.warns(TokenEstimateWarning):
        df = count_tokens([row], "Qwen/Qwen3-8B")
    last = json.dumps([row["messages"][-1]], separators=(",", ":"), ensure_ascii=False)
    assert df["trained_tokens"][0] == math.ceil(len(last) / 2.5)
    assert 0 < df["trained_tokens"][0] < df["tokens"][0] / 5
    whole = {"whole_run": True, "messages": [dict(m) for m in row["messages"]]}
    whole["messages"][2]["trainable"] = True  # the first answer only
    with pytest.warns(TokenEstimateWarning):
        flagged = count_tokens([whole], "Qwen/Qwen3-8B")
    first = json.dumps([{**row["messages"][2], "trainable": True}], separators=(",", ":"), ensure_ascii=False)
    assert flagged["trained_tokens"][0] == math.ceil(len(first) / 2.5)
    with pytest.warns(TokenEstimateWarning):
        every = count_tokens([row], "Qwen/Qwen3-8B", train_on_what="all_assistant_messages")
    assert df["trained_tokens"][0] < every["trained_tokens"][0] < every["tokens"][0]


def test_a_secret_the_renderer_quotes_in_its_error_is_redacted_in_the_error_column(monkeypatch):
    """The per-row `error` a notebook shows: a renderer error quoting the row (a media part's path)
    has the key redacted, as validate's finding does."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "image": key}]},
                          {"role": "assistant", "content": "a"}]}]
    df = count_tokens(rows, INKLING)
    assert df["error"].iloc[0].startswith("renderer failed") and key not in df["error"].iloc[0]
    assert "[redacted]" in df["error"].iloc[0]
