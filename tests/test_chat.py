"""Chat rows: content as text, the shape rules for training, eval and probe rows, trainable flags.

Tag keys and train/eval overlap digests are computed from message text, so the text each caller
derives is pinned here to the exact strings (and digests) it gave before the rule had one home.
"""

from __future__ import annotations

import importlib

import pytest

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

# (content, what each caller's rule gave for it before content_text, keyed by caller)
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


# --------------------------------------------------------------------------- pinned before the move

@pytest.mark.parametrize("name", list(CONTENTS))
def test_callers_in_this_package_keep_their_text(name):
    content = CONTENTS[name]
    from machine_nb.widgets.cards import message_text

    assert message_text({"content": content}) == PINNED[name]["joined"]
    assert message_text({"content": content}, reasoning=True) == PINNED[name]["with reasoning"]
    assert module("evaluate").prompt_text([{"role": "user", "content": content}]) == PINNED[name]["joined"]


def test_overlap_digests_are_unchanged():
    """validate's train/eval overlap keys, pinned to the bytes they were before content_text."""
    prompt_keys = module("validate").prompt_keys
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
                       ("3432e24c90f9ddc08d70de22", "0bb48f2cb0aa28d33c3211bc"),
                       ("f374307286f7bb319cf34505", None)]


def test_prompt_text_is_the_last_user_message():
    prompt_text = module("evaluate").prompt_text
    assert prompt_text([{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "second"}, {"role": "assistant", "content": "b"}]) == "second"
    assert prompt_text([{"role": "system", "content": "no user here"}]) == "no user here"
    assert prompt_text([]) == ""


# --------------------------------------------------------------------------- content_text

@pytest.mark.parametrize("name", list(CONTENTS))
@pytest.mark.parametrize("rule", list(OPTIONS))
def test_content_text_gives_each_callers_text(name, rule):
    from machine_nb.chat import content_text

    assert content_text(CONTENTS[name], **OPTIONS[rule]) == PINNED[name][rule]


def test_content_text_on_odd_content():
    """What is not text adds nothing; a part-like object reads as its text (Machine's rule)."""
    from machine_nb.chat import content_text

    assert content_text([{"text": "no type"}, {"type": "text", "text": "typed"}]) == "typed"
    assert content_text([{"type": "text", "text": None}, "not a part", {"type": "text", "text": "y"}]) == "y"
    assert content_text({"text": " object "}, strip=True) == "object"
    assert content_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, sep="\n") == "a\nb"
    assert content_text(42) == "42"
    assert content_text([{"type": "thinking", "thinking": "only reasoning"}]) == ""
