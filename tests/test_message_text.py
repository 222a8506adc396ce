"""Message content reads as text through one helper (chat.content_text), and every step that reads
it keeps the text it gave before on ordinary content: a string, text parts, reasoning parts beside
text, no content. Each step joins parts its own way (Machine's extractMessageText joins with
newlines and trims; a pair, a held-out check and the gate's training inputs join with nothing).
"""

from __future__ import annotations

import pytest

from machine_nb.core.chat import content_text

THINK_AND_TEXT = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": " Hello "},
                  {"type": "text", "text": "world"}]
CONTENTS = {  # content -> (joined with "\n" and trimmed, joined with "\n", joined with "")
    "plain": (" Hello world ", ("Hello world", " Hello world ", " Hello world ")),
    "parts": (THINK_AND_TEXT, ("Hello \nworld", " Hello \nworld", " Hello world")),
    "none": (None, ("", "", "")),
}


def run_with(user, answer) -> dict:
    return {"id": "r1", "machine": "m", "history": [],
            "trajectory": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


@pytest.mark.parametrize("name", CONTENTS)
def test_content_text_joins_as_each_caller_asks(name):
    content, (trimmed, newlines, plain) = CONTENTS[name]
    assert content_text(content, sep="\n", strip=True) == trimmed
    assert content_text(content, sep="\n") == newlines
    assert content_text(content) == plain


@pytest.mark.parametrize("name", ["plain", "parts"])
def test_the_tag_store_reads_turns_as_machine_does(tmp_path, name):
    from machine_nb.store.tags import tag, tagged

    content, (trimmed, _, _) = CONTENTS[name]
    row = tag(run_with(content, content), store=tmp_path, id="x", created_at="t")
    assert row["messages"] == [{"role": "user", "content": trimmed}, {"role": "assistant", "content": trimmed}]
    frame = tagged(tmp_path)
    assert frame.loc[0, "last_user"] == trimmed and frame.loc[0, "last_assistant"] == trimmed


@pytest.mark.parametrize("name", ["plain", "parts"])
def test_the_tagger_shows_turns_with_their_newlines(name):
    from machine_nb.widgets.tagger import row_user, split_turns

    content, (_, newlines, _) = CONTENTS[name]
    turn = split_turns([{"role": "user", "content": content}, {"role": "assistant", "content": content}])[-1]
    assert turn["user"] == newlines and turn["answer"] == newlines
    assert row_user({"messages": [{"role": "user", "content": content}]}) == newlines


@pytest.mark.parametrize("name", ["plain", "parts"])
def test_pairs_held_out_checks_and_the_gates_inputs_join_parts_with_nothing(name):
    from machine_nb.evaluation.candidate import _training_inputs
    from machine_nb.data.export import case_key, tagged_lines, without_thinking
    from machine_nb.training.pairs import split_reply

    content, (_, _, plain) = CONTENTS[name]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": content}]
    prompt, reply = split_reply(messages)
    assert prompt == [{"role": "user", "content": plain}] and reply == {"role": "assistant", "content": plain}
    assert without_thinking({"role": "assistant", "content": content})["content"] == plain
    assert _training_inputs([{"messages": messages}]) == [plain]
    row = {"id": "t1", "tag": "good", "messages": messages}
    from machine_nb.data.export import HeldOutExcluded

    with pytest.warns(HeldOutExcluded):
        kept = tagged_lines([row], exclude=[plain])
    assert kept.excluded == [row] and case_key(plain) == case_key(" hello  WORLD")


def test_a_failed_tool_result_is_read_from_its_text_parts():
    from machine_nb.data.export import default_failed

    assert default_failed({}, {"role": "tool", "content": [{"type": "text", "text": "Error: no such file"}]})
    assert not default_failed({}, {"role": "tool", "content": [{"type": "text", "text": "ok"}]})
