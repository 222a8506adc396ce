"""Chat rows at their edges: DataFrames and JSONL text given as data, unpaired surrogates, rows
whose flags train nothing, tool calls with arguments no renderer can read, and token counts that
must agree with what training sees."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from machine_nb.core import chat
from machine_nb.core.jsonl import write_jsonl
from machine_nb.errors import MachineFormatError

INKLING = "thinkingmachines/Inkling-Small"
QWEN = "Qwen/Qwen3-8B"  # its tokenizer needs the hub: counted by the 2.5-characters estimate offline


def qa(q, a, **extra):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}], **extra}


def call(cid, arguments='{"cmd":"ls"}', name="bash"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


# --------------------------------------------------------------------------- DataFrames and text as data

def test_probe_rows_of_a_dataframe_are_its_rows_not_its_column_names():
    df = pd.DataFrame([{"messages": [{"role": "user", "content": "What is 2+2?"}], "format": r"^\d+$"},
                       {"messages": [{"role": "user", "content": "Name a colour."}]}])
    rows = chat.probe_rows(df)
    assert [r["messages"][0]["content"] for r in rows] == ["What is 2+2?", "Name a colour."]
    # the second row's missing format is NaN in the frame, which is no regular expression
    assert [r["format"] for r in rows] == [r"^\d+$", None] and [r["line"] for r in rows] == [1, 2]


def test_eval_rows_of_a_dataframe_are_checked_rows():
    df = pd.DataFrame([{"messages": [{"role": "user", "content": "2+2?"}], "expected": "4", "match": "exact"},
                       {"messages": [{"role": "user", "content": "3+3?"}], "expected": "6", "format": r"\d"}])
    rows, path = chat.eval_rows(df)
    assert path is None and [r["expected"] for r in rows] == ["4", "6"]
    assert [r["format"] for r in rows] == [None, r"\d"] and [r["match"] for r in rows] == ["exact", "exact"]
    with pytest.raises(MachineFormatError, match="an eval row must be a JSON object"):
        chat.eval_rows(["2+2?"])


@pytest.mark.parametrize("lines", [1, 400])
def test_jsonl_text_given_as_data_is_refused_with_the_way_out(lines):
    text = "\n".join(json.dumps(qa("2+2?", "4", expected="4")) for _ in range(lines))
    for load in (chat.prepare_data, chat.eval_rows):
        with pytest.raises(ValueError, match="got JSONL text, not a file path") as err:
            load(text)
        assert len(str(err.value)) < 600  # the message quotes the start of the text, not all of it


def test_a_dataframe_read_back_from_parquet_or_arrow_gives_plain_rows():
    """pyarrow (pd.read_parquet, datasets' to_pandas) gives list cells as numpy arrays and fills
    every struct key some message has into every message, as None."""
    messages = np.array([
        {"role": "user", "content": "2+2?", "trainable": None, "tool_calls": None},
        {"role": "assistant", "content": np.array([{"type": "text", "text": "4", "thinking": None}], dtype=object),
         "trainable": None, "tool_calls": None},
    ], dtype=object)
    df = pd.DataFrame({"messages": [messages], "whole_run": [None]})
    (row,) = list(chat.frame_rows(df))
    assert row == {"messages": [{"role": "user", "content": "2+2?"},
                                {"role": "assistant", "content": [{"type": "text", "text": "4", "thinking": None}]}]}
    rows, mode = chat.prepare_data(df)
    assert mode == "last_assistant_message" and rows[0]["messages"][1] == row["messages"][1]


# --------------------------------------------------------------------------- text no file or tokenizer holds

def test_an_unpaired_surrogate_is_a_finding_naming_its_field(tmp_path):
    """A harness that cuts text at a UTF-16 length leaves half an emoji ("\\ud83d" in JSON): no UTF-8
    file can hold it, so sft's train.jsonl could not be written."""
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(qa("q", "ok")) + "\n"
                    + '{"messages":[{"role":"user","content":[{"type":"text","text":"cut \\ud83d"}]},'
                      '{"role":"assistant","content":"ok"}]}\n', encoding="utf-8")
    with pytest.raises(MachineFormatError) as err:
        chat.prepare_data(path)
    assert err.value.line == 2 and err.value.field == "messages.0.content.0.text"
    assert "surrogate" in str(err.value) and "U+D83D" in str(err.value)
    (finding,) = chat.row_findings({"messages": [{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": None,
                                                  "tool_calls": [call("c", '{"t":"\udcff"}')]}]}, "train")
    assert finding.code == "bad_text" and finding.field == "messages.1.tool_calls.0.function.arguments"
    # a field no step reads may hold one
    assert chat.row_findings({**qa("q", "ok"), "note": "cut \ud83d"}, "train") == []
    # a pair written as two escapes is one character, and fine
    assert chat.row_findings(json.loads('{"messages":[{"role":"user","content":"\\ud83d\\ude00"},'
                                        '{"role":"assistant","content":"ok"}]}'), "train") == []


def test_count_tokens_estimates_a_row_with_an_unpaired_surrogate():
    from machine_nb.checks.tokens import count_prompt_tokens, count_tokens

    row = qa("cut \ud83d", "ok")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = count_tokens([row, qa("q", "ok")], QWEN)
        prompts = count_prompt_tokens([{"messages": row["messages"][:1]}], QWEN)
    assert (df["tokens"] > 0).all() and not df["exact"].any()
    assert df["tokens"][0] > df["tokens"][1]
    assert prompts["prompt_tokens"][0] > 0


# --------------------------------------------------------------------------- rows sft would refuse

@pytest.mark.parametrize("row", [
    qa("q", "a", whole_run=True),  # a whole run trains only flagged messages: none is
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "trainable": False}]},
], ids=["whole run without flags", "last reply flagged false"])
def test_a_flagged_row_with_nothing_trainable_is_a_finding(row):
    findings = [f for f in chat.row_findings(row, "train") if f.severity == "error"]
    assert [f.code for f in findings] == ["no_trainable_tokens"] and findings[0].field == "messages"
    with pytest.raises(MachineFormatError, match="no trainable assistant message"):
        chat.prepare_data([row])
    # the same row with its reply flagged is fine
    fixed = {**row, "messages": [row["messages"][0], {**row["messages"][1], "trainable": True}]}
    assert chat.row_findings(fixed, "train") == []


@pytest.mark.parametrize("arguments", ['{"cmd": "ls"', "ls -la", ""])
def test_tool_call_arguments_that_are_not_json_are_a_finding(arguments):
    row = {"messages": [{"role": "user", "content": "list files"},
                        {"role": "assistant", "content": None, "tool_calls": [call("c1", arguments)]}]}
    (finding,) = chat.row_findings(row, "train")
    assert finding.code == "bad_tool_call" and finding.field == "messages.1.tool_calls.0.function.arguments"
    assert "not valid JSON" in finding.message
    with pytest.raises(MachineFormatError, match="not valid JSON"):
        chat.check_row(row, "train", path="t.jsonl", line=3)
    ok = {"messages": [row["messages"][0], {**row["messages"][1], "tool_calls": [call("c1", '"ls -la"')]}]}
    assert chat.row_findings(ok, "train") == []


# --------------------------------------------------------------------------- counts and what training sees

def test_estimated_counts_are_not_reused_once_the_renderer_is_there(tmp_path, monkeypatch):
    """An estimate made while the hub was off is not served from the cache after it comes back."""
    from machine_nb.checks import tokens
    from machine_nb.checks.render import get_renderer

    path = write_jsonl([qa("What is 47 plus 15?", "answer: 62")], tmp_path / "train.jsonl")
    with pytest.warns(tokens.TokenEstimateWarning):
        first = tokens.count_tokens(path, QWEN)
    assert not first["exact"].any()
    monkeypatch.setattr(tokens, "renderer_or_reason", lambda model: (get_renderer(INKLING), None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tokens.TokenEstimateWarning)
        again = tokens.count_tokens(path, QWEN)
    assert again["exact"].all() and again.attrs["note"] == ""


# --------------------------------------------------------------------------- Machine messages as chat

def test_an_empty_tool_call_id_still_links_the_call_to_its_result():
    """Some endpoints give tool calls an empty id: the exported row must still pair call and result."""
    from machine_nb.store.messages import to_chat

    machine = [{"role": "user", "content": "list files"},
               {"role": "assistant", "content": "", "name": "bash", "toolCallId": "", "toolInput": {"cmd": "ls"}},
               {"role": "assistant", "content": "", "name": "bash", "toolCallId": "", "toolInput": {"cmd": "pwd"}},
               {"role": "tool", "name": "bash", "toolCallId": "", "content": "a.txt"},
               {"role": "tool", "name": "bash", "toolCallId": "", "content": "Error: no such dir"},
               {"role": "assistant", "content": "a.txt"}]
    messages, flags = to_chat(machine)
    ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert len(set(ids)) == 2 and all(ids)
    assert [messages[2]["tool_call_id"], messages[3]["tool_call_id"]] == ids
    assert chat.row_findings({"messages": messages}, "train") == []
    assert flags == [False] * 5  # one of the two calls succeeded


def test_dropping_reasoning_keeps_images():
    from machine_nb.store.messages import without_thinking

    content = [{"type": "thinking", "thinking": "look"}, {"type": "text", "text": "this:"},
               {"type": "image", "image": "https://example.com/cat.png"}]
    assert without_thinking({"role": "user", "content": content})["content"] == content[1:]
    text_only = [{"type": "thinking", "thinking": "add"}, {"type": "text", "text": "62"}]
    assert without_thinking({"role": "assistant", "content": text_only})["content"] == "62"


def test_a_whole_number_answer_read_as_a_float_is_written_as_the_number():
    """pd.read_json gives a column of 4 and 2.5 as floats: expected 4 must still read "4" (as
    Machine's JavaScript writes 4.0), or an exact match against the reply "4" fails."""
    df = pd.DataFrame([{"messages": [{"role": "user", "content": "2+2?"}], "expected": 4},
                       {"messages": [{"role": "user", "content": "5/2?"}], "expected": 2.5}])
    assert df["expected"].dtype == "float64"
    rows, _ = chat.eval_rows(df)
    assert [r["expected"] for r in rows] == ["4", "2.5"]
    assert chat.check_row({"messages": [{"role": "user", "content": "big?"}], "expected": 1e16})["expected"] \
        == "10000000000000000"
    (finding,) = [f for f in chat.row_findings({"messages": [{"role": "user", "content": "q"}],
                                                "expected": float("nan"), "match": "exact"}, "eval")]
    assert finding.code == "bad_expected" and "finite" in finding.message


def test_a_hub_behind_a_proxy_is_reachable_when_the_proxy_answers(monkeypatch):
    """The hub client goes through HTTPS_PROXY; the bounded check must ask the proxy, not the hub
    directly (which a firewalled network never answers), or counts stay estimates for good."""
    import socket

    from machine_nb.checks import render

    real = socket.getaddrinfo

    def no_dns_for_the_hub(host, *args, **kwargs):  # the hub's name resolves only through the proxy
        if str(host).endswith(".invalid"):
            raise socket.gaierror("no network")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", no_dns_for_the_hub)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy",
                 "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(1)
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        render._HUB_CHECKS.clear()
        try:
            assert render.hub_reachable()
            monkeypatch.setenv("NO_PROXY", "hub.invalid")  # not through the proxy: the hub itself is asked
            render._HUB_CHECKS.clear()
            assert not render.hub_reachable()
        finally:
            render._HUB_CHECKS.clear()


def test_training_rows_mixing_text_and_parts_load_as_the_cookbook_loads_them(tmp_path):
    """Machine makes content uniform per line, not per file: a file where one reply is a string and
    another carries reasoning parts must still load in `datasets`, one type per field."""
    import datasets

    from machine_nb.checks.render import get_renderer
    from machine_nb.checks.tokens import render_row

    parts = {"messages": [{"role": "user", "content": "5/2?"},
                          {"role": "assistant", "content": [{"type": "thinking", "thinking": "halve"},
                                                            {"type": "text", "text": "2.5"}]}]}
    plain = {"messages": [{"role": "system", "content": ""}, *qa("2+2?", "4")["messages"]]}
    path = write_jsonl([plain, parts], tmp_path / "train.jsonl")
    rows, mode = chat.prepare_data(path)
    loaded = datasets.Dataset.from_list(rows).to_list()  # what FromConversationFileBuilder does
    assert [m["content"] for m in loaded[0]["messages"]] == [[{"type": "text", "text": "", "thinking": None}],
                                                            [{"type": "text", "text": "2+2?", "thinking": None}],
                                                            [{"type": "text", "text": "4", "thinking": None}]]
    renderer = get_renderer(INKLING)  # the same tokens as the rows as written
    for row, original in zip(rows, [plain, parts]):
        assert render_row(renderer, row["messages"], mode) == render_row(renderer, original["messages"])


def test_the_estimate_note_names_the_offline_switch_that_is_set(monkeypatch):
    from machine_nb.checks import render
    from machine_nb.checks.tokens import TokenEstimateWarning, count_tokens

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    render.get_tokenizer.cache_clear()
    render.get_renderer.cache_clear()
    with pytest.warns(TokenEstimateWarning) as caught:
        df = count_tokens([qa("q", "a")], QWEN)
    note = df.attrs["note"]
    assert "TRANSFORMERS_OFFLINE is set" in note and "HF_HUB_OFFLINE" not in note
    assert str(caught[0].message) == note
    with pytest.raises(render.EngineError, match="TRANSFORMERS_OFFLINE is set"):
        render.get_tokenizer(QWEN)


def test_a_probe_path_that_is_not_there_is_named(tmp_path):
    """A Path is a file to read whatever its suffix: a missing one is named, not iterated over."""
    missing = tmp_path / "probes.txt"
    with pytest.raises(MachineFormatError, match="file not found") as err:
        chat.probe_rows(missing)
    assert err.value.path == str(missing)
