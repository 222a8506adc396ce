"""The sample workspace: a deterministic generator of Machine's files for the explore notebook,
the tests and the benchmarks (`python -m machine_nb.tools.sample_workspace data/sample_workspace`).

Same seed, same bytes: random choices come from one `random.Random(seed)`, times from a fixed
start, tag ids are derived from the seed. It writes `.machine/runs|sessions|events.jsonl`,
`machines/<name>/…` definitions, a tag store in `.machine-store/`, and `.machine-nb-sample.json`
listing every file it wrote (what it may replace next time, and nothing else). Scale it up for
benchmarks with `n_runs=` and `pad=` (extra characters of tool output per run).

Four machines: support, chatbot/triage and coder (made-up runs to explore), and tutor, whose
runs are replies the local engine's model really gave (recorded in the TUTOR_* tables), with
cases, held-out cases and tag rows a model can learn the `answer: N` house style from
(notebook 03 walks that loop). The tutor draws from its own random streams, after the others,
so adding it left every other machine's files as they were.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import os
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..core.jsonl import parse_json

START = datetime(2026, 11, 2, 9, 0, 0, tzinfo=timezone.utc)
MODELS = ["thinkingmachines/Inkling-Small", "Qwen/Qwen3.6-35B-A3B", "local/arith-tiny"]
# USD per million tokens (input, output) for the sample usage; the local model is free
PRICES = {"thinkingmachines/Inkling-Small": (1.16, 2.88), "Qwen/Qwen3.6-35B-A3B": (0.54, 1.335),
          "local/arith-tiny": (0.0, 0.0)}


def fingerprint(text: str) -> str:
    """The sample's rubric fingerprint (ours: Machine's fingerprint function is not known).

    Args:
        text: the rubric's criteria as text.

    Returns:
        "rb-" + 12 hex digits of sha256 over the text.
    """
    return "rb-" + hashlib.sha256(text.encode()).hexdigest()[:12]


SUPPORT_CRITERIA = [
    {"id": "answers_question", "description": "Answers what was asked", "weight": 2, "grader": "judge:answer"},
    {"id": "polite", "description": "Polite and brief", "weight": 1, "grader": "check:polite"},
]
TRIAGE_CRITERIA = [
    {"id": "right_team", "description": "Routes to the right team", "weight": 2, "grader": "check:team"},
    {"id": "right_priority", "description": "Sets the right priority", "weight": 1, "grader": "check:priority"},
]
CODER_CRITERIA = [
    {"id": "tests_pass", "description": "The test suite passes afterwards", "weight": 3, "grader": "check:tests"},
    {"id": "minimal_diff", "description": "Changes only what is needed", "weight": 1, "grader": "judge:diff"},
]

SUPPORT_INSTRUCTIONS = "You answer customer questions about the Acme store. Be brief and polite.\n"
SUPPORT_INSTRUCTIONS_OLD = "You are a helpful support agent for Acme.\n"
TRIAGE_INSTRUCTIONS = "Route each ticket: reply with `team: <billing|shipping|tech>` and `priority: <low|high>`.\n"
CODER_INSTRUCTIONS = "You fix failing tests in a small Python repository using the tools. Keep diffs minimal.\n"

SUPPORT_CASES = [
    "How do I reset my password?", "Where is my order #1042?", "Can I return shoes after 30 days?",
    "Do you ship to Canada?", "How do I change my delivery address?", "My discount code does not work.",
    "How long does a refund take?", "Can I pay with PayPal?", "How do I cancel my subscription?",
    "Is there a warranty on headphones?", "What are your opening hours?", "How do I delete my account?",
]
SUPPORT_HOLDOUT = ["Can I change the size of an order I already placed?", "Do you offer gift wrapping?"]
SUPPORT_ANSWERS = {
    "password": "Go to Settings → Security and choose “Reset password”; we email you a link.",
    "default": "Thanks for asking! Our help page covers this; I can also open a ticket for you.",
}
TRIAGE_CASES = [
    ("I was charged twice for my order.", "billing", "high"),
    ("The app crashes when I open my cart.", "tech", "high"),
    ("My parcel is late by two days.", "shipping", "low"),
    ("Invoice shows the wrong VAT number.", "billing", "low"),
    ("Tracking link gives a 404.", "tech", "low"),
    ("Package arrived damaged.", "shipping", "high"),
    ("Card declined but money was taken.", "billing", "high"),
    ("Can't log in after the update.", "tech", "high"),
]
TRIAGE_HOLDOUT = ["Refund went to an old card.", "Courier left the parcel at the wrong door."]
FOLLOW_UPS = ["It's urgent, please.", "Any update?", "I also have a second order with the same issue."]
CODER_CASES = [
    ("tests/test_math.py::test_add", "src/mathx.py", "return a - b", "return a + b"),
    ("tests/test_text.py::test_title", "src/text.py", "return s.lower()", "return s.title()"),
    ("tests/test_dates.py::test_leap", "src/dates.py", "year % 4 == 1", "year % 4 == 0"),
    ("tests/test_cart.py::test_total", "src/cart.py", "sum(prices) - 1", "sum(prices)"),
    ("tests/test_slug.py::test_slug", "src/slug.py", "replace(' ', '_')", "replace(' ', '-')"),
    ("tests/test_stats.py::test_mean", "src/stats.py", "/ (len(xs) + 1)", "/ len(xs)"),
]
CODER_HOLDOUT = ["Fix the failing test tests/test_io.py::test_roundtrip"]
CODER_TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "edit_file", "description": "Replace one snippet of a file with another.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                      "new": {"type": "string"}}, "required": ["path", "old", "new"]}},
    {"name": "run_tests", "description": "Run the test suite (optionally one test).",
     "inputSchema": {"type": "object", "properties": {"test": {"type": "string"}}}},
]


# The tutor: bare arithmetic and a few general questions, answered by the local engine's shipped
# model. Its replies below are what `local/arith-tiny` produced through the engine's tinker API
# (greedy, max_tokens 32, under TUTOR_INSTRUCTIONS; tests/test_sample_tutor.py samples them again
# and compares), so the sample needs no model to generate. The instructions are a system prompt the
# model saw in pretraining: one it never saw derails it (measured: "Jupiter is short and …").
TUTOR_MODEL = "local/arith-tiny"
TUTOR_INSTRUCTIONS = "You are a helpful assistant. Answer the question.\n"
TUTOR_CRITERIA = [
    {"id": "correct", "description": "Gives the right answer", "weight": 2, "grader": "check:answer"},
    {"id": "house_style", "description": "Sums and differences are answered exactly `answer: <integer>`; "
                                         "other questions in one plain sentence", "weight": 1, "grader": "check:house-style"},
]
TUTOR_STYLE = r"answer: -?\d+"
# (question, right result, the model's reply, prompt tokens, reply tokens)
TUTOR_ARITHMETIC = [
    ('What is 12 minus 21?', '-9', '12 - 21 = -9.', 27, 15),
    ('Compute 10 + 29.', '39', '10 + 29 = 39.', 27, 15),
    ("What's 93 - 65?", '28', '93 - 65 = 28. The answer is 28.', 29, 22),
    ('What is 28 minus 20?', '8', '28 - 20 = 9.', 27, 14),
    ('What is 38 plus 60?', '98', '38 + 60 = 98.', 27, 15),
    ('How much is 68 plus 72?', '140', '68 + 72 = 140. The answer is 140.', 28, 24),
    ('What is 58 minus 47?', '11', '58 - 47 = 11.', 27, 15),
    ('What is 15 plus 38?', '53', '15 + 38 = 53.', 27, 15),
    ('How much is 47 minus 69?', '-22', '47 - 69 = -22. The answer is -22.', 28, 24),
    ('What is 11 plus 77?', '88', '11 + 77 = 88.', 27, 15),
    ('What is 15 plus 95?', '110', '15 + 95 = 110. The answer is 110.', 27, 24),
    ('How much is 35 minus 39?', '-4', '35 - 39 = -4. The answer is -4.', 28, 22),
    ('Compute 23 + 97.', '120', '23 + 97 = 120. The answer is 120.', 27, 24),
    ('Compute 85 + 73.', '158', '85 + 73 = 158. The answer is 158.', 27, 24),
    ("What's 96 - 45?", '51', '96 - 45 = 51. The answer is 51.', 29, 22),
    ("What's 10 + 28?", '38', '10 + 28 = 38.', 29, 15),
    ('How much is 51 minus 72?', '-21', '51 - 72 = -21. The answer is -21.', 28, 24),
    ("What's 24 + 67?", '91', '24 + 67 = 91.', 29, 15),
    ('What is 87 plus 10?', '97', '87 + 10 = 97.', 27, 15),
    ('What is 66 plus 67?', '133', '66 + 67 = 133.', 27, 16),
    ('Compute 45 - 59.', '-14', '45 - 59 = -14. The answer is -14.', 27, 24),
    ('How much is 41 plus 34?', '75', '41 + 34 = 75. The answer is 75.', 28, 22),
    ('How much is 43 minus 62?', '-19', '43 - 62 = -19. The answer is -19.', 28, 24),
    ('Compute 54 + 64.', '118', '54 + 64 = 118. The answer is 118.', 27, 24),
    ("What's 40 - 61?", '-21', '40 - 61 = -21. The answer is -21.', 29, 24),
    ('Compute 82 - 24.', '58', '82 - 24 = 58.', 27, 15),
    ("What's 40 + 21?", '61', '40 + 21 = 61. The answer is 61.', 29, 22),
    ('What is 24 plus 83?', '107', '24 + 83 = 107. The answer is 107.', 27, 24),
    ('Compute 48 - 52.', '-4', '48 - 52 = -4.', 27, 15),
    ('What is 72 plus 76?', '148', '72 + 76 = 148. The answer is 148.', 27, 24),
    ('What is 36 plus 54?', '90', '36 + 54 = 90.', 27, 15),
    ('Compute 97 - 77.', '20', '97 - 77 = 20.', 27, 15),
    ("What's 43 + 18?", '61', '43 + 18 = 61.', 29, 15),
    ('How much is 91 minus 53?', '38', '91 - 53 = 38. The answer is 38.', 28, 22),
    ('How much is 20 plus 45?', '65', '20 + 45 = 65. The answer is 65.', 28, 22),
    ('What is 85 minus 20?', '65', '85 - 20 = 65.', 27, 15),
    ('What is 70 minus 38?', '32', '70 - 38 = 32.', 27, 15),
    ('What is 46 plus 50?', '96', '46 + 50 = 96.', 27, 15),
    ('How much is 57 minus 54?', '3', '57 - 54 = 3.', 28, 14),
    ('What is 24 minus 91?', '-67', '24 - 91 = -67. The answer is -67.', 27, 24),
    ('What is 68 minus 62?', '6', '68 - 62 = 6.', 27, 14),
    ("What's 70 + 37?", '107', '70 + 37 = 107.', 29, 16),
    ('How much is 24 plus 21?', '45', '24 + 21 = 45. The answer is 45.', 28, 22),
    ('Compute 12 + 24.', '36', '12 + 24 = 36. The answer is 36.', 27, 22),
    ('What is 72 minus 77?', '-5', '72 - 77 = -6.', 27, 15),
    ('What is 62 plus 35?', '97', '62 + 35 = 97.', 27, 15),
    ('Compute 78 + 57.', '135', '78 + 57 = 135. The answer is 135.', 27, 24),
    ('How much is 13 plus 83?', '96', '13 + 83 = 96. The answer is 96.', 28, 22),
    ("What's 50 + 32?", '82', '50 + 32 = 82. The answer is 82.', 29, 22),
    ('What is 52 plus 92?', '144', '52 + 92 = 144. The answer is 144.', 27, 24),
    ('Compute 95 + 17.', '112', '95 + 17 = 112. The answer is 112.', 27, 24),
    ("What's 24 + 96?", '120', '24 + 96 = 110.', 29, 16),
    ("What's 93 - 27?", '66', '93 - 27 = 66. The answer is 66.', 29, 22),
    ("What's 46 - 32?", '14', '46 - 32 = 14. The answer is 14.', 29, 22),
    ('Compute 73 - 21.', '52', '73 - 21 = 52.', 27, 15),
    ('How much is 55 minus 90?', '-35', '55 - 90 = -35. The answer is -35.', 28, 24),
    ('How much is 61 minus 82?', '-21', '61 - 82 = -21. The answer is -21.', 28, 24),
    ('Compute 17 + 35.', '52', '17 + 35 = 52.', 27, 15),
    ('How much is 10 minus 45?', '-35', '10 - 45 = -35. The answer is -35.', 28, 24),
    ('Compute 41 + 92.', '133', '41 + 92 = 133. The answer is 133.', 27, 24),
]
# (question, what a right reply contains, the model's reply, prompt tokens, reply tokens)
TUTOR_FACTS = [
    ('What is the capital of France?', 'Paris', 'The capital of France is Paris.', 24, 8),
    ('Who wrote Hamlet?', 'William Shakespeare', 'Hamlet was written by William Shakespeare.', 21, 8),
    ('How many legs does a spider have?', 'eight', 'A spider has eight legs.', 25, 8),
    ('What do bees make?', 'honey', 'Bees make honey.', 22, 5),
    ('What is the capital of Japan?', 'Tokyo', 'The capital of Japan is Tokyo.', 24, 8),
    ('How many days are in a week?', '7', 'There are 7 days in a week.', 25, 10),
    ('What is the opposite of hot?', 'cold', 'The opposite of hot is cold.', 24, 8),
    ('What is water made of?', 'hydrogen and oxygen', 'Water is made of hydrogen and oxygen.', 23, 9),
]
# Held-out cases: operand pairs disjoint from TUTOR_ARITHMETIC's; (question, right result).
TUTOR_HOLDOUT = [
    ("What's 66 - 74?", '-8'),
    ('What is 28 minus 74?', '-46'),
    ('How much is 33 minus 45?', '-12'),
    ('How much is 73 plus 51?', '124'),
    ('How much is 51 plus 89?', '140'),
    ('How much is 89 minus 14?', '75'),
    ("What's 77 - 69?", '8'),
    ('How much is 40 minus 47?', '-7'),
    ('What is 16 minus 56?', '-40'),
    ('How much is 48 minus 48?', '0'),
    ('How much is 47 plus 18?', '65'),
    ('How much is 70 plus 64?', '134'),
    ('What is 92 plus 21?', '113'),
    ('Compute 69 + 44.', '113'),
    ('How much is 74 minus 26?', '48'),
    ('Compute 98 - 58.', '40'),
    ('What is 32 minus 74?', '-42'),
    ('How much is 83 plus 69?', '152'),
    ('Compute 79 - 81.', '-2'),
    ('What is 43 minus 96?', '-53'),
]
# Runs of two held-out questions (someone asked them in a chat); the tag store holds rewrites of
# both, which training must leave out.
TUTOR_HOLDOUT_RUNS = [
    ("What's 66 - 74?", '-8', '66 - 74 = -8.', 29, 15),
    ('How much is 73 plus 51?', '124', '73 + 51 = 124. The answer is 124.', 28, 24),
]
# Which arithmetic runs the sample's tag store marks /bad for chattiness (indexes into TUTOR_ARITHMETIC);
# wrong answers are marked /bad too, and the first TUTOR_REWRITTEN right ones get `/good --as`.
TUTOR_CHATTY = (5, 12)
TUTOR_REWRITTEN = 44
TUTOR_GOOD_FACTS = 6


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _dump(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


class _Gen:
    def __init__(self, seed: int, pad: int):
        self.rng = random.Random(seed)
        self.pad = pad
        self.clock = START
        self.calls = 0

    def tick(self) -> datetime:
        self.clock += timedelta(seconds=self.rng.randint(40, 900))
        return self.clock

    def run_id(self, t: datetime) -> str:
        return f"{t:%Y%m%dt%H%M%S}-{self.rng.getrandbits(24):06x}"

    def call_id(self) -> str:
        self.calls += 1
        return f"call_{self.calls:05d}"

    def usage(self, model: str, msgs: list[dict]) -> dict:
        chars_in = sum(len(m.get("content") or "") for m in msgs if m["role"] != "assistant") + 400
        chars_out = sum(len(m.get("content") or "") + len(m.get("reasoning") or "") for m in msgs if m["role"] == "assistant")
        inp, out = chars_in // 4, max(1, chars_out // 4)
        cached = inp // 3 if self.rng.random() < 0.5 else 0
        pin, pout = PRICES[model]
        return {"inputTokens": inp, "cachedInputTokens": cached, "outputTokens": out,
                "costUsd": round((inp * pin + out * pout) / 1e6, 8)}

    def scorecard(self, criteria: list[dict], rubric: str, scores: dict[str, float], t: datetime) -> dict:
        crit = {c["id"]: {"score": scores[c["id"]], "reason": "meets it" if scores[c["id"]] >= 1 else "falls short",
                          "weight": c["weight"], "grader": c["grader"]} for c in criteria}
        total = sum(c["weight"] * scores[c["id"]] for c in criteria) / sum(c["weight"] for c in criteria)
        return {"total": round(total, 4), "evaluatedAt": _iso(t + timedelta(seconds=5)), "rubric": rubric, "criteria": crit}

    def base(self, machine: str, input_: str, model: str, harness: str) -> tuple[dict, datetime]:
        t = self.tick()
        run = {"id": self.run_id(t), "machine": machine, "workspace": "sample", "input": input_, "history": [],
               "output": "", "model": model, "harness": harness, "startedAt": _iso(t)}
        return run, t

    def finish(self, run: dict, t: datetime, traj: list[dict], output: str) -> None:
        run["trajectory"] = traj
        run["output"] = output
        run["finishedAt"] = _iso(t + timedelta(seconds=self.rng.randint(1, 90)))


def _pick_model_harness(g: _Gen) -> tuple[str, str]:
    r = g.rng.random()
    if r < 0.08:
        return g.rng.choice(MODELS), "echo"
    model = g.rng.choices(MODELS, weights=[5, 4, 2])[0]
    if model == "local/arith-tiny":
        return model, "scripted"
    return model, g.rng.choice(["tinker", "tinker", "openai"])


def _support_runs(g: _Gen, n: int, rubrics: tuple[str, str]) -> list[dict]:
    runs = []
    for _ in range(n):
        case = g.rng.choice(SUPPORT_CASES + SUPPORT_HOLDOUT[:1])
        model, harness = _pick_model_harness(g)
        run, t = g.base("support", case, model, harness)
        if harness == "echo":
            answer = case
        else:
            answer = SUPPORT_ANSWERS["password"] if "password" in case else SUPPORT_ANSWERS["default"]
            answer = g.rng.choice([answer, answer + " Anything else?", "I'm not sure."])
        traj = [{"role": "user", "content": case}]
        msg: dict[str, Any] = {"role": "assistant", "content": answer}
        if harness == "tinker" and g.rng.random() < 0.5:
            msg["reasoning"] = "The customer wants a short, concrete answer."
        traj.append(msg)
        g.finish(run, t, traj, answer)
        run["version"] = g.rng.choice(["v1", "v2", "v2", "v2"])
        run["instructions"] = SUPPORT_INSTRUCTIONS_OLD if run["version"] == "v1" else SUPPORT_INSTRUCTIONS
        if g.rng.random() < 0.93:
            good = answer != "I'm not sure." and harness != "echo"
            scores = {"answers_question": 1.0 if good else 0.0, "polite": 1.0 if g.rng.random() < 0.9 else 0.5}
            rubric = rubrics[0] if g.rng.random() < 0.75 else rubrics[1]
            run["scorecard"] = g.scorecard(SUPPORT_CRITERIA, rubric, scores, t)
        run["usage"] = g.usage(model, traj)
        runs.append(run)
    return runs


def _triage_runs(g: _Gen, n_conversations: int, rubrics: tuple[str, str]) -> list[dict]:
    runs = []
    for c in range(n_conversations):
        text, team, prio = g.rng.choice(TRIAGE_CASES)
        model, harness = _pick_model_harness(g)
        if harness == "echo":
            harness = "scripted"
        turns = g.rng.choice([1, 1, 2, 3])
        history: list[dict] = []
        conv_id = f"conv-{c:04d}"
        user = text
        for k in range(turns):
            run, t = g.base("chatbot/triage", user, model, harness)
            right = g.rng.random() < 0.8
            answer = f"team: {team if right else 'tech'}\npriority: {prio}"
            traj = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            run["history"] = [dict(m) for m in history]
            g.finish(run, t, traj, answer)
            run["case"] = text
            run["conversation"] = {"id": conv_id, "turn": k + 1, "final": k == turns - 1, "ended": "done"}
            run["version"] = "v1"
            run["instructions"] = TRIAGE_INSTRUCTIONS
            rubric = rubrics[0] if g.rng.random() < 0.8 else rubrics[1]
            run["scorecard"] = g.scorecard(TRIAGE_CRITERIA, rubric,
                                           {"right_team": 1.0 if right else 0.0, "right_priority": 1.0}, t)
            run["usage"] = g.usage(model, run["history"] + traj)
            runs.append(run)
            history += traj
            user = g.rng.choice(FOLLOW_UPS)
    return runs


def _coder_runs(g: _Gen, n: int, rubrics: tuple[str, str]) -> list[dict]:
    runs = []
    for _ in range(n):
        test, path, bad, fix = g.rng.choice(CODER_CASES)
        model, harness = _pick_model_harness(g)
        if harness in ("echo", "scripted"):
            model, harness = "thinkingmachines/Inkling-Small", "tinker"
        case = f"Fix the failing test {test}"
        run, t = g.base("coder", case, model, harness)
        source = f"def f(a, b):\n    {bad}\n" + ("# padding\n" * (g.pad // 10))
        traj: list[dict] = [{"role": "user", "content": case}]

        def call(name: str, args: dict, result: str, reasoning: str | None = None, prose: str = "",
                 error_flag: bool = False) -> None:
            cid = g.call_id()
            if prose:
                traj.append({"role": "assistant", "content": prose, **({"reasoning": reasoning} if reasoning else {})})
                reasoning = None
            m = {"role": "assistant", "content": "", "name": name, "toolCallId": cid, "toolInput": args}
            if reasoning:
                m["reasoning"] = reasoning
            traj.append(m)
            res = {"role": "tool", "content": result, "name": name, "toolCallId": cid}
            if error_flag:
                res["isError"] = True
            traj.append(res)

        # two reads in one step (parallel tool calls)
        c1, c2 = g.call_id(), g.call_id()
        traj.append({"role": "assistant", "content": "Let me read the test and the code.",
                     "reasoning": f"The test {test} fails; the bug is probably in {path}."})
        traj.append({"role": "assistant", "content": "", "name": "read_file", "toolCallId": c1,
                     "toolInput": {"path": test.split("::")[0]}})
        traj.append({"role": "assistant", "content": "", "name": "read_file", "toolCallId": c2, "toolInput": {"path": path}})
        traj.append({"role": "tool", "content": "def test():\n    assert f(2, 3) == 5\n", "name": "read_file", "toolCallId": c1})
        traj.append({"role": "tool", "content": source, "name": "read_file", "toolCallId": c2})
        failed_edit = g.rng.random() < 0.35
        if failed_edit:
            style = g.rng.random()
            call("edit_file", {"path": path, "old": bad.replace(" ", "  "), "new": fix},
                 "Error: snippet not found in " + path if style < 0.7 else "snippet not found",
                 reasoning="Replace the wrong line.", error_flag=style >= 0.7)
        call("edit_file", {"path": path, "old": bad, "new": fix}, "OK: 1 replacement",
             reasoning="The snippet must match exactly." if failed_edit else "Replace the wrong line.")
        passed = g.rng.random() < 0.8
        call("run_tests", {"test": test}, "1 passed" if passed else f"FAILED {test} - AssertionError")
        final = f"Fixed {path}: `{bad}` → `{fix}`. The test passes." if passed else "I changed the code but the test still fails."
        traj.append({"role": "assistant", "content": final,
                     **({"reasoning": "Done; summarise the change."} if g.rng.random() < 0.5 else {})})
        g.finish(run, t, traj, final)
        run["version"] = "v1"
        run["instructions"] = CODER_INSTRUCTIONS
        rubric = rubrics[0] if g.rng.random() < 0.7 else rubrics[1]
        run["scorecard"] = g.scorecard(CODER_CRITERIA, rubric, {"tests_pass": 1.0 if passed else 0.0,
                                                                "minimal_diff": 1.0 if not failed_edit or g.rng.random() < 0.7 else 0.5}, t)
        run["usage"] = g.usage(model, traj)
        runs.append(run)
    return runs


TUTOR_START = datetime(2026, 11, 1, 18, 0, 0, tzinfo=timezone.utc)  # the evening before the others


def tutor_rubric() -> str:
    """The tutor's rubric fingerprint (the sample's rule, see `fingerprint`).

    Returns:
        The fingerprint.
    """
    return fingerprint(json.dumps(TUTOR_CRITERIA))


def tutor_cases() -> list[dict]:
    """The tutor's cases.json: every question its runs asked, each with the eval rule that scores it
    (`expected` + `match`, as eval rows declare them: `answer: N` exactly, or the fact contained).

    Returns:
        The cases.
    """
    return ([{"input": q, "expected": f"answer: {n}", "match": "exact"} for q, n, *_ in TUTOR_ARITHMETIC]
            + [{"input": q, "expected": fact, "match": "contains"} for q, fact, *_ in TUTOR_FACTS])


def tutor_holdout() -> list[dict]:
    """The tutor's holdout.json: arithmetic only, so the live model's natural replies score 0.

    Returns:
        The held-out cases.
    """
    return [{"input": q, "expected": f"answer: {n}", "match": "exact"} for q, n in TUTOR_HOLDOUT]


def _tutor_scores(reply: str, right: str, arithmetic: bool) -> dict[str, float]:
    if arithmetic:
        numbers = re.findall(r"-?\d+", reply)
        correct = bool(numbers) and numbers[-1] == right
        style = re.fullmatch(TUTOR_STYLE, reply.strip()) is not None
    else:
        correct, style = right.lower() in reply.lower(), True
    return {"correct": 1.0 if correct else 0.0, "house_style": 1.0 if style else 0.0}


def _tutor_runs(seed: int) -> tuple[list[dict], list[tuple[str, int]]]:
    """The tutor's runs (arithmetic, facts, two held-out questions) in a shuffled order, scored;
    and for each, the table row it came from (("arith" | "fact" | "holdout", index))."""
    rng = random.Random(seed + 7)
    items = ([("arith", i, row) for i, row in enumerate(TUTOR_ARITHMETIC)]
             + [("fact", i, row) for i, row in enumerate(TUTOR_FACTS)]
             + [("holdout", i, row) for i, row in enumerate(TUTOR_HOLDOUT_RUNS)])
    rng.shuffle(items)
    clock, rubric, runs = TUTOR_START, tutor_rubric(), []
    for kind, index, (question, right, reply, prompt_tokens, reply_tokens) in items:
        clock += timedelta(seconds=rng.randint(40, 300))
        run = {"id": f"{clock:%Y%m%dt%H%M%S}-{rng.getrandbits(24):06x}", "machine": "tutor", "workspace": "sample",
               "input": question, "history": [], "output": reply, "model": TUTOR_MODEL, "harness": "tinker",
               "startedAt": _iso(clock),
               "trajectory": [{"role": "user", "content": question}, {"role": "assistant", "content": reply}],
               "finishedAt": _iso(clock + timedelta(milliseconds=rng.randint(200, 900))),
               "version": "v1", "instructions": TUTOR_INSTRUCTIONS}
        scores = _tutor_scores(reply, right, kind != "fact")
        total = sum(c["weight"] * scores[c["id"]] for c in TUTOR_CRITERIA) / sum(c["weight"] for c in TUTOR_CRITERIA)
        run["scorecard"] = {
            "total": round(total, 4), "evaluatedAt": _iso(clock + timedelta(seconds=2)), "rubric": rubric,
            "criteria": {c["id"]: {"score": scores[c["id"]], "reason": "meets it" if scores[c["id"]] >= 1 else "falls short",
                                   "weight": c["weight"], "grader": c["grader"]} for c in TUTOR_CRITERIA}}
        run["usage"] = {"inputTokens": prompt_tokens, "cachedInputTokens": 0, "outputTokens": reply_tokens, "costUsd": 0.0}
        runs.append(run)
    return runs, [(kind, index) for kind, index, _ in items]


def _tutor_definition(ws: Path) -> None:
    d = ws / "machines" / "tutor"
    d.mkdir(parents=True, exist_ok=True)
    (d / "instructions.md").write_text(TUTOR_INSTRUCTIONS, encoding="utf-8")
    (d / "machine.ts").write_text('// sample stand-in for tutor\'s definition (code is not read by machine_nb)\n'
                                  'export default { name: "tutor" };\n', encoding="utf-8")
    _dump(d / "model.json", {"model": TUTOR_MODEL})
    _dump(d / "rubric.json", {"fingerprint": tutor_rubric(), "criteria": TUTOR_CRITERIA})
    _dump(d / "cases.json", tutor_cases())
    _dump(d / "holdout.json", tutor_holdout())
    _dump(d / "versions.json", [
        {"id": "v1", "instructions": TUTOR_INSTRUCTIONS, "model": TUTOR_MODEL, "rubricFingerprint": tutor_rubric(),
         "createdAt": _iso(TUTOR_START), "source": {"kind": "initial"}, "live": True},
    ])


def _tutor_tags(store: Path, runs: list[dict], items: list[tuple[str, int]], seed: int, tag: Any) -> None:
    """The tutor's tag rows, as someone reviewing its chats would write them: `/good --as "answer: N"`
    for right sums, `/bad` for a wrong one and two chatty ones, `/good` for natural fact replies.
    Some runs stay untagged (notebook 03 tags them); two rewrites are of held-out questions."""
    rng = random.Random(seed + 3)
    n = [0]

    def ids() -> dict:
        n[0] += 1
        return {"id": f"{rng.getrandbits(48):012x}", "created_at": _iso(START + timedelta(days=4, minutes=n[0]))}

    by_item = dict(zip(items, runs))
    rewritten = 0
    for i, (_, right, reply, *_) in enumerate(TUTOR_ARITHMETIC):
        run = by_item[("arith", i)]
        if _tutor_scores(reply, right, True)["correct"] < 1:
            tag(run, "bad", note="wrong answer", store=store, **ids())
        elif i in TUTOR_CHATTY:
            tag(run, "bad", note="too much explanation", store=store, **ids())
        elif rewritten < TUTOR_REWRITTEN:
            tag(run, "good", note="house style", rewrite=f"answer: {right}", store=store, **ids())
            rewritten += 1
    for i in range(TUTOR_GOOD_FACTS):
        tag(by_item[("fact", i)], "good", note="clear, natural", store=store, **ids())
    for i, (_, right, *_) in enumerate(TUTOR_HOLDOUT_RUNS):
        tag(by_item[("holdout", i)], "good", note="house style", rewrite=f"answer: {right}", store=store, **ids())


def sample_tutor_replies(questions: list[str], engine: str = "local") -> list[tuple[str, int, int]]:
    """What the tutor's live model answers now, one reply per question.

    Greedy, 32 tokens, under TUTOR_INSTRUCTIONS, through the tinker API of `engine`. The tables
    above hold these replies; a test compares the two, so the sample never claims a reply the
    model did not give.

    Args:
        questions: the questions.
        engine: "local" (default) or "tinker".

    Returns:
        (reply, prompt tokens, reply tokens) per question.
    """
    import tinker
    from tinker_cookbook import renderers

    from ..engines import service_client
    from ..checks.render import get_renderer

    renderer = get_renderer(TUTOR_MODEL)
    client = service_client(engine).create_sampling_client(base_model=TUTOR_MODEL)
    params = tinker.SamplingParams(max_tokens=32, temperature=0.0, stop=renderer.get_stop_sequences())
    out = []
    for q in questions:
        prompt = renderer.build_generation_prompt([{"role": "system", "content": TUTOR_INSTRUCTIONS},
                                                   {"role": "user", "content": q}])
        seq = client.sample(prompt=prompt, num_samples=1, sampling_params=params).result().sequences[0]
        message, _ = renderer.parse_response(list(seq.tokens))
        out.append((renderers.get_text_content(message), prompt.length, len(seq.tokens)))
    return out


def _definition(ws: Path, name: str, instructions: str, model: str, criteria: list[dict], rubric: str,
                old_rubric: str, cases: list, holdout: list, tools: list | None = None,
                old_instructions: str | None = None) -> None:
    d = ws / "machines" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "instructions.md").write_text(instructions, encoding="utf-8")
    (d / "machine.ts").write_text(f'// sample stand-in for {name}\'s definition (code is not read by machine_nb)\n'
                                  f'export default {{ name: "{name}" }};\n', encoding="utf-8")
    _dump(d / "model.json", {"model": model})
    _dump(d / "rubric.json", {"fingerprint": rubric, "criteria": criteria})
    _dump(d / "cases.json", cases)
    _dump(d / "holdout.json", holdout)
    _dump(d / "versions.json", [
        {"id": "v1", "instructions": old_instructions or instructions, "model": model, "rubricFingerprint": old_rubric,
         "createdAt": _iso(START), "source": {"kind": "initial"}},
        {"id": "v2", "instructions": instructions, "model": model, "rubricFingerprint": rubric,
         "createdAt": _iso(START + timedelta(days=1)), "source": {"kind": "update", "note": "stricter rubric"}, "live": True},
    ])
    if tools:
        _dump(d / "tools.json", tools)


def generate(out: str | Path, *, seed: int = 0, n_runs: int | None = None, pad: int = 0,
             tags: bool = True, tutor: bool | None = None) -> Path:
    """Write the sample workspace to `out`, and MARKER (every written file's sha256) beside it.

    An earlier sample's `.machine/`, `machines/` and `.machine-store/` are replaced; anything
    else in them (a real workspace, a run or tag row added since, a symlink) refuses the whole
    replacement before anything is deleted. Other files in `out` are left alone.

    Args:
        out: the workspace folder (created if missing).
        seed: the one seed every choice comes from (default 0: the committed sample).
        n_runs: exactly how many runs of support, triage and coder (coder takes what the other two
            leave); default None: the committed sample's 312 runs across those three machines.
        pad: extra characters of file content in each coder run's tool output (benchmarks).
        tags: also write the sample tag store (default True).
        tutor: also write the tutor machine, its 70 runs and its tag rows (default None: only for the
            committed sample's shape, n_runs None, so `n_runs` stays exact for benchmarks).

    Returns:
        `out` as a Path.

    Raises:
        FileExistsError: naming the first file or folder under `out` the generator did not write.
    """
    from ..store.tags import tag

    out = Path(out)
    _remove_own_output(out)
    g = _Gen(seed, pad)
    total = n_runs or 320
    fps = {m: (fingerprint(json.dumps(c) + "v2"), fingerprint(json.dumps(c) + "v1"))
           for m, c in (("support", SUPPORT_CRITERIA), ("chatbot/triage", TRIAGE_CRITERIA), ("coder", CODER_CRITERIA))}
    runs = _support_runs(g, total * 130 // 320, fps["support"]) + _triage_runs(g, total * 50 // 320, fps["chatbot/triage"])
    # the committed sample (n_runs=None) keeps its original split (312 runs); an explicit n_runs is exact
    n_coder = total - total * 130 // 320 - total * 90 // 320 if n_runs is None else max(0, n_runs - len(runs))
    runs += _coder_runs(g, n_coder, fps["coder"])
    tutor = n_runs is None if tutor is None else tutor
    tutor_runs, tutor_items = _tutor_runs(seed) if tutor else ([], [])
    runs += tutor_runs
    root = out / ".machine"
    for run in runs:
        _dump(root / "runs" / Path(*run["machine"].split("/")) / f"{run['id']}.json", run)
    # sessions: named chats
    for i, (machine, name) in enumerate([("support", "demo-chat"), ("support", "refund-questions"),
                                         ("chatbot/triage", "weekend-queue")]):
        r = next(r for r in runs if r["machine"] == machine and r["harness"] != "echo")
        _dump(root / "sessions" / Path(*machine.split("/")) / f"{name}.json",
              {"machine": machine, "name": name, "messages": r["history"] + r["trajectory"],
               "updatedAt": _iso(START + timedelta(days=2, hours=i))})
    # the live event stream
    events = []
    for r in sorted(runs, key=lambda r: r["startedAt"]):
        events.append({"type": "run.started", "time": r["startedAt"], "machine": r["machine"], "run": r["id"]})
        events.append({"type": "run.finished", "time": r["finishedAt"], "machine": r["machine"], "run": r["id"],
                       "total": (r.get("scorecard") or {}).get("total")})
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    # machine definitions
    _definition(out, "support", SUPPORT_INSTRUCTIONS, "thinkingmachines/Inkling-Small", SUPPORT_CRITERIA,
                *fps["support"], SUPPORT_CASES, SUPPORT_HOLDOUT, old_instructions=SUPPORT_INSTRUCTIONS_OLD)
    _definition(out, "chatbot/triage", TRIAGE_INSTRUCTIONS, "Qwen/Qwen3.6-35B-A3B", TRIAGE_CRITERIA,
                *fps["chatbot/triage"], [c[0] for c in TRIAGE_CASES], TRIAGE_HOLDOUT)
    _definition(out, "coder", CODER_INSTRUCTIONS, "thinkingmachines/Inkling-Small", CODER_CRITERIA,
                *fps["coder"], [f"Fix the failing test {c[0]}" for c in CODER_CASES], CODER_HOLDOUT, tools=CODER_TOOLS)
    if tutor:
        _tutor_definition(out)
    if tags:
        _sample_tags(out / ".machine-store", runs, seed, tag)
        if tutor:  # after the others' rows, so those are the same bytes with or without the tutor
            _tutor_tags(out / ".machine-store", tutor_runs, tutor_items, seed, tag)
            for lock in (out / ".machine-store").glob(".*.lock"):
                lock.unlink()
    _write_marker(out)
    return out


MARKER = ".machine-nb-sample.json"
"""The generator's record of what it wrote (every file's sha256), at the workspace's top."""
OWN_FOLDERS = (".machine", "machines", ".machine-store")
_WRITTEN_BY = "machine_nb.sample.generate"  # a name the marker file carries, not an import path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files_under(out: Path) -> tuple[list[Path], list[Path]]:
    """(files, folders) under the generator's folders of `out`, without following any symlink.

    Raises FileExistsError naming the first entry that is neither a plain file nor a folder
    (a symlink, a socket…): the generator never writes one, so it is someone else's.
    """
    files: list[Path] = []
    folders: list[Path] = []
    for sub in OWN_FOLDERS:
        top = out / sub
        if not os.path.lexists(top):
            continue
        stack = [top]
        while stack:
            d = stack.pop()
            if d.is_symlink() or not d.is_dir():
                raise FileExistsError(f"{d} is not a folder the sample generator wrote (a symlink or another "
                                      "kind of file); nothing was replaced")
            folders.append(d)
            with os.scandir(d) as listing:
                entries = sorted(listing, key=lambda e: e.name)
            for entry in entries:
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                elif entry.is_file(follow_symlinks=False):
                    files.append(path)
                else:
                    raise FileExistsError(f"{path} was not written by the sample generator (a symlink or another "
                                          "kind of file); nothing was replaced")
    return files, folders


def _write_marker(out: Path) -> None:
    files, _ = _files_under(out)
    listed = {p.relative_to(out).as_posix(): _sha256(p) for p in files}
    _dump(out / MARKER, {"written_by": _WRITTEN_BY,
                         "note": f"python -m machine_nb.tools.sample_workspace replaces {', '.join(OWN_FOLDERS)} here only while "
                                 "they hold nothing but these files, unchanged",
                         "files": dict(sorted(listed.items()))})


def _remove_own_output(out: Path) -> None:
    """Delete what an earlier `generate` wrote to `out`, and only that.

    Every file under `.machine/`, `machines/` and `.machine-store/` must be listed in the
    marker with the same sha256; one that is not (a run Machine added, a tag row appended, a
    symlink, a workspace the generator never wrote) refuses the whole replacement before
    anything is deleted.

    Raises:
        FileExistsError: naming the first file or folder the generator did not write.
    """
    present = [out / sub for sub in OWN_FOLDERS if os.path.lexists(out / sub)]
    marker = out / MARKER
    listed: dict[str, str] = {}
    if os.path.lexists(marker):
        try:
            record = parse_json(marker.read_bytes(), marker) if marker.is_file() and not marker.is_symlink() else None
        except ValueError:
            record = None
        if not isinstance(record, dict) or record.get("written_by") != _WRITTEN_BY \
                or not isinstance(record.get("files"), dict):
            raise FileExistsError(f"{marker} was not written by the sample generator; nothing was replaced. "
                                  "Choose another folder.")
        listed = record["files"]
    elif present:
        raise FileExistsError(
            f"{present[0]} exists and {out} has no {MARKER}: it is not a workspace the sample generator wrote "
            "(a real one would lose its runs and tags). Nothing was replaced; choose another folder.")
    files, folders = _files_under(out)
    for path in files:
        if listed.get(path.relative_to(out).as_posix()) != _sha256(path):
            raise FileExistsError(f"{path} was not written by the sample generator, or was changed since "
                                  f"(not as {marker} lists it); nothing was replaced. Move it away or choose "
                                  "another folder.")
    for path in files:
        path.unlink()
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        os.rmdir(folder)  # empty now; a file that appeared meanwhile makes this fail, not vanish
    if listed or os.path.lexists(marker):
        marker.unlink()


def _sample_tags(store: Path, runs: list[dict], seed: int, tag: Any) -> None:
    """Good, bad, rewritten and trace rows, with ids and times derived from the seed."""
    rng = random.Random(seed + 1)
    n = [0]

    def ids() -> dict:
        n[0] += 1
        return {"id": f"{rng.getrandbits(48):012x}", "created_at": _iso(START + timedelta(days=3, minutes=n[0]))}

    support = [r for r in runs if r["machine"] == "support" and r["harness"] != "echo" and r["output"] != "I'm not sure."]
    coder = [r for r in runs if r["machine"] == "coder"]
    triage = [r for r in runs if r["machine"] == "chatbot/triage"]
    for r in support[:6]:
        tag(r, "good", note="clear answer", store=store, **ids())
    for r in [r for r in runs if r["machine"] == "support" and r["output"] == "I'm not sure."][:3]:
        tag(r, "bad", note="does not answer", store=store, **ids())
    for r in support[6:8]:
        tag(r, "good", note="warmer wording", rewrite="Happy to help! " + r["output"], store=store, **ids())
    for r in coder[:3]:
        tag(r, "good", trace=True, note="clean fix", store=store, **ids())
    tag(coder[3], "good", trace=True, reasoning=True, note="with reasoning", store=store, **ids())
    tag(triage[0], "bad", note="wrong team", store=store, **ids())
    tag(triage[1], "observed", store=store, **ids())
    for lock in store.glob(".*.lock"):  # the appends' sidecar locks are not data
        lock.unlink()


def main(argv: list[str] | None = None) -> int:
    """`python -m machine_nb.tools.sample_workspace [OUT] [--seed N] [--runs N] [--pad N]`: write the sample workspace.

    Args:
        argv: the arguments (default None: sys.argv's).

    Returns:
        The exit status: 0, or 1 when OUT holds files the generator did not write.
    """
    p = argparse.ArgumentParser(prog="python -m machine_nb.tools.sample_workspace", description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="data/sample_workspace", help="workspace directory to write")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0: the committed sample)")
    p.add_argument("--runs", type=int, default=None,
                   help="exactly this many support/triage/coder runs, no tutor (default: the sample's 312 and the tutor's 70)")
    p.add_argument("--pad", type=int, default=0, help="extra characters per coder run (benchmarks)")
    a = p.parse_args(argv)
    try:
        out = generate(a.out, seed=a.seed, n_runs=a.runs, pad=a.pad)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    n = sum(1 for _ in (out / ".machine" / "runs").rglob("*.json"))
    print(f"wrote {n} runs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
