"""ExamplePreviewer: cards, trained marks, navigation, and the token view through real renderers.

Inkling's renderer (offline) draws the token view; tinker-cookbook's real qwen3_disable_thinking
renderer, over a tokenizer that gives Qwen's special tokens single ids, shows the PR #885 case:
reasoning trained on that the generation prompt never shows.
"""

import json
import re

import pytest

from machine_nb.errors import MachineFormatError
from machine_nb.widgets.previewer import ExamplePreviewer, load_lines, trained_indices

INKLING = "thinkingmachines/Inkling-Small"

STEP = {"machine": "calc", "run": "r1", "score": 1.0, "messages": [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "2 plus 2 is 4"},
                                      {"type": "text", "text": "answer: 4"}]}]}

WHOLE = {"machine": "calc", "run": "r2", "score": 1.0, "whole_run": True, "messages": [
    {"role": "user", "content": "List files"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "use ls"}],
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}],
     "trainable": True},
    {"role": "tool", "tool_call_id": "c1", "content": "\n".join(f"file{i}.txt" for i in range(40))},
    {"role": "assistant", "content": "Forty files.", "trainable": False},
    {"role": "assistant", "content": "Done: forty files.", "trainable": True}]}


def test_trained_indices_are_what_sft_trains():
    assert trained_indices(STEP) == [2]
    assert trained_indices(WHOLE) == [1, 4]
    # as machine_nb.sft trains: a whole run's assistant message without a flag is not trained
    unflagged = {**WHOLE, "messages": WHOLE["messages"][:4] + [{"role": "assistant", "content": "ok"}]}
    assert trained_indices(unflagged) == [1]
    from machine_nb.core.chat import prepare_data

    rows, mode = prepare_data([unflagged])
    assert mode == "customized" and [i for i, m in enumerate(rows[0]["messages"]) if m["trainable"]] == [1]
    assert trained_indices({"messages": [{"role": "user", "content": "hi"}]}) == []  # refused by the trainer
    two = {**STEP, "messages": STEP["messages"] + [{"role": "user", "content": "and?"},
                                                   {"role": "assistant", "content": "done"}]}
    assert trained_indices(two) == [4]
    assert trained_indices(two, "all_assistant_messages") == [2, 4]
    with pytest.raises(ValueError, match="all_tokens"):
        trained_indices(two, "all_tokens")


def test_what_the_previewer_says_sft_refuses_is_what_sft_refuses():
    """trainer_refusal runs sft's own checks: the row rules, the flags, then validate.preflight."""
    from machine_nb.core.chat import prepare_data
    from machine_nb.checks.validate import preflight
    from machine_nb.widgets.previewer import trainer_refusal

    local = "local/arith-tiny"  # a 128-token context: a long reply does not fit
    lines = [
        STEP, WHOLE,
        {"messages": [{"role": "user", "content": "hi"}]},                                     # no reply
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "trainable": False}]},
        {"messages": [{"role": "user", "content": "my key tml-ABCDEFGHIJKLMNOPQRSTUVWX"},
                      {"role": "assistant", "content": "noted"}]},                              # a secret
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "and 1 " * 60}]},  # too long
        {"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": "y"}]},  # unknown role
    ]
    for line in lines:
        try:
            rows, mode = prepare_data([line])
            accepted = preflight(rows, local, train_on_what=mode, raise_errors=False).ok
        except MachineFormatError:
            accepted = False
        assert (trainer_refusal(line, local) == "") is accepted, line
    # the whole run's 40-line tool output is too long for this model as well
    assert [bool(trainer_refusal(line, local)) for line in lines] == [False, True, True, True, True, True, True]
    assert "context of 128 tokens" in trainer_refusal(lines[5], local)
    assert trainer_refusal(lines[5]) == trainer_refusal(WHOLE) == ""  # no model: nothing to measure the length with
    assert "no assistant message to train on" in trainer_refusal(lines[2])
    assert "no trainable assistant message" in trainer_refusal(lines[3])
    assert "tml-" in trainer_refusal(lines[4]) and "ABCDEFGHIJKLMNOPQRSTUVWX" not in trainer_refusal(lines[4])


def test_cards_mark_trained_fold_tool_output_and_collapse_reasoning():
    p = ExamplePreviewer([STEP, WHOLE], index=1)
    html = p.static_html()
    assert html.count('class="mnb-trained"') == 2
    assert "context only" in html  # the untrained assistant message
    assert '<details class="mnb-reasoning">' in html
    assert "bash" in html and "&quot;cmd&quot;" in html  # the call and its arguments
    assert "result: 40 lines" in html  # 40-line tool output folded under its call
    assert "file39.txt" in html  # folded, not lost
    assert "example 2/2 · run r2" in p.summary()


def test_navigation_and_jump(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [STEP, WHOLE, {**STEP, "run": "r3"}]) + "\n")
    p = ExamplePreviewer(path)
    assert p.current == 0 and p.line["run"] == "r1"
    p._next.click()
    assert p.line["run"] == "r2"
    p._prev.click(); p._prev.click()
    assert p.current == 0  # clamped
    p._jump.value = "r3"  # typed and Enter, as in the browser
    assert p.current == 2
    p.show(0)
    assert p.jump("r3") and p.current == 2
    assert not p.jump("nope") and p.current == 2
    assert "no example of run nope" in p._status.value


def test_bad_line_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(STEP) + "\n" + json.dumps({"messages": "hi"}) + "\n")
    with pytest.raises(MachineFormatError) as err:
        load_lines(path)
    assert "bad.jsonl:2" in str(err.value) and "messages" in str(err.value)


def test_inkling_token_view_weights_only_the_trained_messages():
    p = ExamplePreviewer([WHOLE], model=INKLING)
    assert not p.token_error, p.token_error
    toks = p.tokens
    assert list(toks.columns) == ["position", "token_id", "text", "weight"]
    trained_text = "".join(toks.loc[toks.weight > 0, "text"])
    context_text = "".join(toks.loc[toks.weight == 0, "text"])
    assert "Done: forty files." in trained_text and "use ls" in trained_text
    assert "Forty files." not in trained_text  # trainable False → context
    assert "List files" in context_text
    # every message the cards mark as trained has its tokens weighted, and only those
    assert p.summary().endswith("5 messages, 2 trained")
    html = p.static_html()
    assert "mnb-tok-trained" in html and "weight 0 (context)" in html
    # Inkling keeps reasoning in its prompts: every trained message's prompt is a prefix.
    assert p.diffs["matches"].all(), p.diffs
    assert "is a prefix of the training tokens" in html


class SpecialTokens:
    """Inkling's tokenizer with extra strings given single ids (Qwen's chat markers), for qwen3 renderers."""

    def __init__(self, base, specials):
        self.base = base
        self.ids = {s: 300_000 + i for i, s in enumerate(specials)}
        self.rev = {v: k for k, v in self.ids.items()}
        self.pattern = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
        self.eos_token_id = self.ids["<|im_end|>"]
        self.name_or_path = "qwen-markers-over-inkling"

    def encode(self, text, add_special_tokens=False, split_special_tokens=False):
        if split_special_tokens:  # user text: markers inside it stay plain text
            return self.base.encode(text, add_special_tokens=False)
        out = []
        for piece in self.pattern.split(text):
            if piece in self.ids:
                out.append(self.ids[piece])
            elif piece:
                out.extend(self.base.encode(piece, add_special_tokens=False))
        return out

    def decode(self, ids, **_):
        out, run = [], []
        for t in ids:
            if t in self.rev:
                out.append(self.base.decode(run)); run = []
                out.append(self.rev[t])
            else:
                run.append(t)
        out.append(self.base.decode(run))
        return "".join(out)


def test_disable_thinking_renderer_is_flagged_for_unseen_reasoning():
    from tinker_cookbook import renderers

    from machine_nb.checks.render import get_tokenizer

    tok = SpecialTokens(get_tokenizer(INKLING), ["<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                                 "<tool_call>", "</tool_call>", "<|endoftext|>"])
    renderer = renderers.get_renderer("qwen3_disable_thinking", tok)
    # A two-turn whole run whose last message reasons: the prompt closes an empty think block,
    # training shows the reasoning after the same header.
    line = {"run": "r9", "whole_run": True, "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "answer: 4", "trainable": True},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "3 plus 3 is 6"},
                                          {"type": "text", "text": "answer: 6"}], "trainable": True}]}
    p = ExamplePreviewer([line], renderer=renderer, tokenizer=tok)
    assert not p.token_error, p.token_error
    d = p.diffs.set_index("message")
    # No reasoning in message 1: its empty think block in the prompt is a context difference only.
    assert "reasoning" not in d.loc[1, "flag"] and d.loc[1, "trained_unseen"] == 0
    assert not d.loc[3, "matches"]
    assert "</think>" in d.loc[3, "sampling_only_text"]
    assert d.loc[3, "flag"].startswith("trained on reasoning the model never sees at sampling time")
    assert "mnb-flag" in p.static_html()
    trained = "".join(p.tokens.loc[p.tokens.weight > 0, "text"])
    assert "3 plus 3 is 6" in trained  # the reasoning is indeed trained on
    # The cards' trained marks and the token weights agree under another trainer setting too.
    every = ExamplePreviewer([{**STEP, "messages": STEP["messages"][:2] + [
        {"role": "assistant", "content": "answer: 4"}, {"role": "user", "content": "again"},
        {"role": "assistant", "content": "answer: 4 again"}]}], renderer=renderer, tokenizer=tok,
        train_on_what="all_assistant_messages")
    assert every.static_html().count('class="mnb-trained"') == 2
    trained_every = "".join(every.tokens.loc[every.tokens.weight > 0, "text"])
    assert "answer: 4" in trained_every and "answer: 4 again" in trained_every
    # tinker-cookbook itself refuses the single-step form of this line: shown, not raised.
    step = ExamplePreviewer([STEP], renderer=renderer, tokenizer=tok)
    assert "thinking turned off" in step.token_error
    assert "Could not render this example" in step.static_html()


def test_an_example_with_nothing_trained_is_flagged():
    line = {"run": "r0", "whole_run": True, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "trainable": False}]}
    p = ExamplePreviewer([line], model=INKLING)
    assert not p.token_error and not (p.tokens.weight > 0).any()
    html = p.static_html()
    assert "no token of this example carries loss weight" in html and "sft refuses it" in html
    assert 'class="mnb-trained"' not in html  # cards and tokens agree


def test_unrenderable_model_shows_error_not_traceback():
    p = ExamplePreviewer([STEP], model="Qwen/Qwen3-8B")  # needs the HF hub; offline in tests
    assert p.token_error and "Qwen/Qwen3-8B" in p.token_error
    assert "Could not render this example" in p.static_html()


def test_runs_from_the_sample_workspace_whole_runs_on_inkling():
    from pathlib import Path

    import machine_nb as mnb

    workspace = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"  # committed
    sel = mnb.select_runs(mnb.load_runs(workspace), "coder")
    steps = ExamplePreviewer(sel)  # a runs DataFrame goes through training_lines
    assert len(steps.lines) > len(sel) and {x["run"] for x in steps.lines} <= set(sel["id"])
    whole = [x for x in mnb.training_lines(sel, base_model=INKLING) if x.get("whole_run")]
    assert whole
    p = ExamplePreviewer(whole[:1], model=INKLING)
    assert not p.token_error, p.token_error
    # Machine's claim for Inkling: every step's prompt is a token prefix of the whole run.
    assert len(p.diffs) == len(trained_indices(whole[0])) > 1
    assert p.diffs["matches"].all(), p.diffs


def picker_runs(n=6):
    import pandas as pd

    def run(i):
        return {"id": f"run{i:03d}", "machine": "arith", "history": [],
                "trajectory": [{"role": "user", "content": f"What is {i} + {i}?"},
                               {"role": "assistant", "content": f"The answer is {2 * i}."}]}

    return pd.DataFrame({"id": [f"run{i:03d}" for i in range(n)], "machine": "arith",
                         "input": [f"What is {i} + {i}?" for i in range(n)],
                         "output": [f"The answer is {2 * i}." for i in range(n)], "run": [run(i) for i in range(n)]})


def test_previewer_follows_a_run_picker():
    import machine_nb as mnb

    picker = mnb.RunPicker(picker_runs())
    p = ExamplePreviewer(picker)
    assert p.lines == [] and "Select runs in the picker" in p.static_html()
    picker.click("run002")
    assert p.line["run"] == "run002" and "What is 2 + 2?" in p.static_html()
    assert p.jump("run002") and not p.jump("run004")  # only picked runs are there
    picker.click("run004", toggle=True)  # a newly picked run is shown first
    assert {x["run"] for x in p.lines} == {"run002", "run004"} and p.line["run"] == "run004"
    picker.click("run002", toggle=True)  # unpick run002: run004 stays on screen
    assert p.line["run"] == "run004" and len(p.lines) == 1
    picker.clear_selection()
    assert p.line is None and "Select runs in the picker" in p.summary()
    # .link() on a previewer built from other data, and unlink()
    q = ExamplePreviewer([STEP])
    q.link(picker)
    picker.click("run001")
    assert q.line["run"] == "run001" and p.line["run"] == "run001"
    q.unlink()
    picker.click("run003")
    assert q.line["run"] == "run001" and p.line["run"] == "run003"


def test_a_closed_previewer_stops_following_its_picker():
    import machine_nb as mnb

    picker = mnb.RunPicker(picker_runs())
    p = ExamplePreviewer(picker)
    picker.click("run001")
    p.close()
    assert p.picker is None
    picker.click("run003")
    assert p.line["run"] == "run001"


def test_text_filter_keeps_matching_examples_and_navigation_stays_inside():
    lines = [{**STEP, "run": f"r{i}", "messages": [{"role": "user", "content": f"question {i} about {topic}"},
                                                      {"role": "assistant", "content": f"answer {i}"}]}
             for i, topic in enumerate(["cats", "dogs", "cats and dogs", "fish"])]
    p = ExamplePreviewer(lines)
    assert "(Enter)" in p._filter.placeholder and not p._filter.continuous_update
    assert "(Enter)" in p._jump.placeholder and not p._jump.continuous_update
    p._filter.value = "CATS"  # typed, then Enter
    assert p.matches == [0, 2] and p.line["run"] == "r0"
    p.next()
    assert p.line["run"] == "r2" and p._next.disabled and not p._prev.disabled
    p.next()
    assert p.line["run"] == "r2"  # stays on the last match
    assert "filter 'CATS': 2 of 2 matching" in p.summary()
    p.set_filter("cats dogs")  # every word must appear
    assert p.matches == [2]
    p.set_filter("zebra")
    assert p.line is None and "No example contains" in p.static_html() and p._next.disabled and p._prev.disabled
    assert p.jump("r3") and p.filter_text == "" and p.line["run"] == "r3"  # a jump clears the filter hiding it


def test_prev_and_next_are_disabled_at_the_ends_and_arrow_keys_page():
    p = ExamplePreviewer([STEP, WHOLE, {**STEP, "run": "r3"}])
    assert p._prev.disabled and not p._next.disabled
    p._keys._handle_custom_msg({"event": "key", "key": "ArrowRight"}, [])  # as the browser sends it
    assert p.current == 1 and not p._prev.disabled and not p._next.disabled
    p._keys._handle_custom_msg({"event": "key", "key": "End"}, [])
    assert p.current == 2 and p._next.disabled
    p._keys._handle_custom_msg({"event": "key", "key": "ArrowRight"}, [])
    assert p.current == 2
    p._keys._handle_custom_msg({"event": "key", "key": "ArrowLeft"}, [])
    assert p.current == 1
    p._keys._handle_custom_msg({"event": "key", "key": "Home"}, [])
    assert p.current == 0 and p._prev.disabled
    assert "(→ key)" in p._next.tooltip


def test_status_line_leaves_out_fields_a_line_lacks():
    bare = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    line = ExamplePreviewer([bare]).summary()
    assert "?" not in line and "run " not in line and "machine " not in line
    assert line.startswith("ExamplePreviewer: example 1/1 · step · 2 messages")
    full = ExamplePreviewer([{**bare, "run": "r1", "machine": "calc"}]).summary()
    assert "example 1/1 · run r1 · machine calc · step" in full


def test_a_renderer_error_quoting_a_secret_is_shown_redacted(monkeypatch):
    """The previewer shows why a line cannot be rendered; a renderer error quoting the row (a media
    part's path) shows the key redacted, in the widget and in its static HTML."""
    key = "tk_live_0123456789abcdefXYZ"
    monkeypatch.setenv("TINKER_API_KEY", key)
    line = {"messages": [{"role": "user", "content": [{"type": "image", "image": key}]},
                         {"role": "assistant", "content": "a"}]}
    p = ExamplePreviewer([line], model=INKLING)
    assert p.token_error and key not in p.token_error and "[redacted]" in p.token_error
    assert "Could not render this example" in p.static_html() and "[redacted]" in p.static_html()
