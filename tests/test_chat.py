"""Chat rows: content as text, the shape rules for training, eval and probe rows, trainable flags.

Tag keys and train/eval overlap digests are computed from message text, so the text each caller
derives is pinned here to the exact strings (and digests) it gave before the rule had one home.
"""

from __future__ import annotations

import importlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine_nb.errors import MachineFormatError

# Realistic message contents: what Machine's runs, export lines and eval files hold.
CONTENTS = {
    "string": "  What is 47 plus 15?  ",
    "none": None,
    "text parts": [{"type": "text", "text": "Look at"}, {"type": "text", "text": "THIS"}],
    "reasoning then text": [{"type": "thinking", "thinking": "add them"}, {"type": "text", "text": " answer: 62 "}],
    "image between text": [{"type": "text", "text": "caption:"}, {"type": "image", "image": "u"},
                           {"type": "text", "text": "a cat"}],
    "no parts": [],
}

# (content, the text each caller's rule gives for it, keyed by caller)
PINNED = {
    "string": {"joined": "  What is 47 plus 15?  ", "spaced": "  What is 47 plus 15?  ",
               "lines": "  What is 47 plus 15?  ", "lines stripped": "What is 47 plus 15?",
               "with reasoning": "  What is 47 plus 15?  "},
    "none": {"joined": "", "spaced": "", "lines": "", "lines stripped": "", "with reasoning": ""},
    "text parts": {"joined": "Look atTHIS", "spaced": "Look at THIS", "lines": "Look at\nTHIS",
                   "lines stripped": "Look at\nTHIS", "with reasoning": "Look atTHIS"},
    "reasoning then text": {"joined": " answer: 62 ", "spaced": " answer: 62 ", "lines": " answer: 62 ",
                            "lines stripped": "answer: 62", "with reasoning": "add them answer: 62 "},
    "image between text": {"joined": "caption:a cat", "spaced": "caption: a cat", "lines": "caption:\na cat",
                           "lines stripped": "caption:\na cat", "with reasoning": "caption:a cat"},
    "no parts": {"joined": "", "spaced": "", "lines": "", "lines stripped": "", "with reasoning": ""},
}
# The options that give each caller's rule:
#   joined: evaluate's prompt text, pairs, export's plain text, cards.message_text
#   spaced: validate's overlap digests
#   lines: the tagger's run text; lines stripped: the tag store's keys (Machine's extractMessageText)
#   with reasoning: cards.message_text(reasoning=True), what the previewer's filter searches
OPTIONS = {"joined": {}, "spaced": {"sep": " "}, "lines": {"sep": "\n"}, "lines stripped": {"sep": "\n", "strip": True},
           "with reasoning": {"reasoning": True}}


def module(name):
    return importlib.import_module(f"machine_nb.{name}")


# --------------------------------------------------------------------------- each caller's text, pinned

@pytest.mark.parametrize("name", list(CONTENTS))
def test_callers_in_this_package_keep_their_text(name):
    content = CONTENTS[name]
    from machine_nb.widgets.cards import message_text

    assert message_text({"content": content}) == PINNED[name]["joined"]
    assert message_text({"content": content}, reasoning=True) == PINNED[name]["with reasoning"]
    assert module("evaluation.evaluate").prompt_text([{"role": "user", "content": content}]) == PINNED[name]["joined"]


def test_overlap_digests_are_unchanged():
    """validate's train/eval overlap keys, pinned: a text prompt's keys are the bytes they were
    before content_text; a prompt with an image keys the image too (the same question about
    another picture is another prompt)."""
    prompt_keys = module("checks.validate").prompt_keys
    rows = [
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is  47 plus 15?"},
         {"role": "assistant", "content": "answer: 62"}],
        [{"role": "user", "content": [{"type": "text", "text": "Look at"}, {"type": "image", "image": "u"},
                                      {"type": "text", "text": "THIS"}]},
         {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}, {"type": "text", "text": "ok"}]}],
        [{"role": "system", "content": "no user here"}],
    ]
    digests = [(full.hex(), last and last.hex()) for full, last in map(prompt_keys, rows)]
    assert digests == [("68d32729135391849c4acc24", "c31c4108e312626ed0a72f95"),
                       ("68f3bfe8e75c31bef6b03233", "eb2974b33657c9063ea81193"),
                       ("f374307286f7bb319cf34505", None)]


def test_prompt_text_is_the_last_user_message():
    prompt_text = module("evaluation.evaluate").prompt_text
    assert prompt_text([{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "second"}, {"role": "assistant", "content": "b"}]) == "second"
    assert prompt_text([{"role": "system", "content": "no user here"}]) == "no user here"
    assert prompt_text([]) == ""


# --------------------------------------------------------------------------- content_text

@pytest.mark.parametrize("name", list(CONTENTS))
@pytest.mark.parametrize("rule", list(OPTIONS))
def test_content_text_gives_each_callers_text(name, rule):
    from machine_nb.core.chat import content_text

    assert content_text(CONTENTS[name], **OPTIONS[rule]) == PINNED[name][rule]


def test_content_text_on_odd_content():
    """What is not text adds nothing; a part-like object reads as its text (Machine's rule)."""
    from machine_nb.core.chat import content_text

    assert content_text([{"text": "no type"}, {"type": "text", "text": "typed"}]) == "typed"
    assert content_text([{"type": "text", "text": None}, "not a part", {"type": "text", "text": "y"}]) == "y"
    assert content_text({"text": " object "}, strip=True) == "object"
    assert content_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, sep="\n") == "a\nb"
    assert content_text(42) == "42"
    assert content_text([{"type": "thinking", "thinking": "only reasoning"}]) == ""


# --------------------------------------------------------------------------- row shapes

def user(text="What is 47 plus 15?"):
    return {"role": "user", "content": text}


def reply(text="answer: 62", **extra):
    return {"role": "assistant", "content": text, **extra}


def test_validate_trainers_and_evals_share_one_rule():
    """validate's findings are chat.row_findings'; check_row raises the first error of the same list."""
    from machine_nb.core.chat import check_row, row_findings
    from machine_nb.checks.validate import shape_findings

    rows = [
        ({"messages": [{"role": "bot", "content": "hi"}, reply()]}, "train", "unknown_role", "messages.0.role"),
        ({"messages": [user(), reply(trainable="yes")]}, "train", "bad_trainable", "messages.1.trainable"),
        ({"messages": [user(), reply()], "whole_run": "no"}, "train", "bad_whole_run", "whole_run"),
        ({"messages": [user(), {"role": "tool", "tool_call_id": "c9", "content": "x"}, reply()]}, "train",
         "orphan_tool_result", "messages.1.tool_call_id"),
        ({"messages": [user()], "expected": "62", "match": "number", "format": 5}, "eval", "bad_format", "format"),
        ({"messages": [user()], "expected": "sixty", "match": "number"}, "eval", "bad_number", "expected"),
        ({"messages": [user()], "expected": " . ", "match": "contains"}, "eval", "empty_expected", "expected"),
        ({"messages": [user()], "expected": ["62"]}, "eval", "bad_expected", "expected"),
        ({"messages": [user(), reply()], "format": "["}, "probe", "bad_format", "format"),
        ({"messages": [reply()]}, "probe", "empty_messages", "messages"),
    ]
    for row, kind, code, field in rows:
        findings = row_findings(row, kind)
        assert [f.code for f in findings if f.severity == "error"] == [code], (row, findings)
        if kind != "probe":
            assert shape_findings(row, kind) == [(f.severity, f.code, f.message) for f in findings]
        with pytest.raises(MachineFormatError) as err:
            check_row(row, kind, path="rows.jsonl", line=7)
        assert err.value.field == field and err.value.line == 7 and err.value.reason == findings[0].message
        assert str(err.value).startswith(f"rows.jsonl:7 (field {field!r}): ")


def test_validate_the_trainer_and_the_eval_hold_rows_to_one_rule():
    """A row validate rejects is refused by the trainer and the eval too (and the other way round)."""
    from machine_nb.core.chat import check_row, row_findings
    from machine_nb.core.chat import prepare_data

    # training: the assistant's reply must come last (what follows it would never be learned)
    tool_last = {"messages": [user(), reply(), {"role": "tool", "content": "x"}]}
    with pytest.raises(MachineFormatError, match=r"<data>:1 \(field 'messages.2.role'\): the last message is 'tool'"):
        prepare_data([tool_last])
    with pytest.raises(MachineFormatError, match="no assistant message to train on"):
        prepare_data([{"messages": [user()]}])
    # eval: the prompt ends with the user's question, not a system or tool message
    with pytest.raises(MachineFormatError, match="the last message is 'system'"):
        check_row({"messages": [user(), {"role": "system", "content": "be terse"}], "expected": "62"})
    # eval: an expected answer its match mode cannot score is a finding of validate too
    assert [f.code for f in row_findings({"messages": [user()], "expected": "many", "match": "number"}, "eval")] \
        == ["bad_number"]


def test_check_row_fills_in_eval_and_probe_rows():
    from machine_nb.core.chat import check_row, probe_rows

    row = check_row({"messages": [user()], "expected": 62, "id": "r1"}, line=3)
    assert row == {"messages": [user()], "expected": "62", "match": "exact", "format": None, "line": 3, "id": "r1"}
    assert check_row({"messages": [user()], "expected": "62", "match": None})["match"] == "exact"
    assert check_row({"messages": [user(), reply()], "format": "answer: .*"}, "probe", line=2) == \
        {"messages": [user()], "format": "answer: .*", "line": 2}
    assert probe_rows(["Name a colour.", {"messages": [user("Who wrote Hamlet?"), reply()]}]) == [
        {"messages": [user("Name a colour.")], "format": None, "line": 1},
        {"messages": [user("Who wrote Hamlet?")], "format": None, "line": 2}]
    with pytest.raises(MachineFormatError, match=r"<data>:1: a probe row must be a prompt string or an object"):
        probe_rows([5])



def test_a_prompt_longer_than_a_file_name_can_be_is_one_probe_prompt():
    """A prompt past the file system's name limit (255 bytes) is a prompt, not a path the check for
    a file fails on."""
    from machine_nb.core.chat import probe_rows

    prompt = "Explain, in one paragraph, " + "why the sky looks blue " * 20
    assert probe_rows(prompt) == [{"messages": [user(prompt)], "format": None, "line": 1}]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.sampled_from(["role", "content", "messages", "tool_calls",
                                                              "function", "id", "tool_call_id", "expected",
                                                              "match", "format", "type", "text", "trainable",
                                                              "tools", "name", "arguments", "thinking"]),
                                             children, max_size=5),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(row=json_values, kind=st.sampled_from(["train", "eval", "probe"]))
def test_any_json_is_a_list_of_findings_or_a_checked_row(row, kind):
    from machine_nb.core.chat import check_row, row_findings

    findings = row_findings(row, kind)
    for severity, code, message, field in findings:
        assert severity in ("error", "warning") and code and message
        assert field is None or isinstance(field, str)
    try:
        checked = check_row(row, kind, path="x.jsonl", line=1)
    except MachineFormatError as exc:
        assert any(f.severity == "error" for f in findings)
        assert exc.reason == next(f.message for f in findings if f.severity == "error")
    else:
        assert not any(f.severity == "error" for f in findings)
        json.dumps(checked)  # still plain JSON


# --------------------------------------------------------------------------- trainable flags

def test_a_row_with_nothing_to_train_is_refused_on_its_line():
    from machine_nb.core.chat import prepare_data

    good = {"messages": [user(), reply()]}
    whole = {"whole_run": True, "messages": [user(), reply(), user("and?"), reply("done")]}  # no flag: none trained
    with pytest.raises(MachineFormatError) as err:
        prepare_data([good, whole])
    assert err.value.line == 2 and err.value.field == "messages" and "no trainable assistant message" in str(err.value)


FLAG_ROWS = [
    {"messages": [user(), reply()]},                                                          # a step
    {"messages": [user(), reply("think"), user("and?"), reply("done")]},                       # two turns
    {"whole_run": True, "messages": [user(), reply("a", trainable=True), user("b"), reply("c")]},  # unflagged: not
    {"messages": [user(), reply("a", trainable=False), user("b"), reply("c")]},                # partly flagged
    {"messages": [user(), reply("a", trainable=True), user("b"), reply("c", trainable=False)]},
    {"messages": [{"role": "user", "content": "q", "trainable": True}, reply()]},                # a user flag: no
]


def test_sft_tokens_and_the_previewer_train_the_same_messages():
    from machine_nb.core.chat import trained_indices
    from machine_nb.checks.tokens import sft_view
    from machine_nb.core.chat import prepare_data
    from machine_nb.widgets.previewer import trained_indices as previewed

    expected = [[1], [3], [1], [3], [1], [1]]
    for row, want in zip(FLAG_ROWS, expected):
        whole = bool(row.get("whole_run"))
        assert trained_indices(row["messages"], whole_run=whole) == want, row
        assert previewed(row) == want, row
        rows, mode = prepare_data([row])
        flags = [m.get("trainable") for m in rows[0]["messages"]]
        if mode == "customized":
            assert [i for i, f in enumerate(flags) if f] == want, row
        else:
            assert flags == [None] * len(flags) and want == trained_indices(row["messages"], mode)
        msgs, view_mode = sft_view(row["messages"], whole_run=whole)
        assert str(view_mode.value) == mode and [i for i, m in enumerate(msgs) if m.get("trainable")] == \
            (want if mode == "customized" else [])
    # one flagged row makes the whole file state its flags (the cookbook's `datasets` unifies keys)
    rows, mode = prepare_data(FLAG_ROWS[:3])
    assert mode == "customized" and [[i for i, m in enumerate(r["messages"]) if m["trainable"]] for r in rows] \
        == [[1], [3], [1]]


def test_trained_indices_for_every_mode():
    from machine_nb.core.chat import trained_indices

    messages = [{"role": "system", "content": "s"}, user(), reply("a"), user("b"), reply("c"), reply("d")]
    assert trained_indices(messages, "last_assistant_message") == [5]
    assert trained_indices(messages, "last_assistant_turn") == [4, 5]
    assert trained_indices(messages, "all_assistant_messages") == [2, 4, 5]
    assert trained_indices(messages, "all_user_and_system_messages") == [0, 1, 3]
    assert trained_indices(messages, "all_messages") == trained_indices(messages, "all_tokens") == list(range(6))
    assert trained_indices(messages, "customized") == [5]  # no flags: the last assistant message
    with pytest.raises(ValueError, match="unknown train_on_what"):
        trained_indices(messages, "everything")


def test_a_frame_of_rows_that_lack_some_keys_is_prepared_as_the_rows_are():
    """pd.DataFrame(rows) fills every key some row has into every row (NaN): a plain row then read
    as a whole run (its NaN whole_run set) and was refused for having no trainable message."""
    import pandas as pd

    from machine_nb.core.chat import prepare_data

    rows = [{"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "trainable": True},
                          {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}],
             "whole_run": True},
            {"messages": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "a3"}]}]
    assert prepare_data(pd.DataFrame(rows)) == prepare_data(rows)
