"""The sample workspace: a deterministic generator of Machine's files for the explore notebook,
the tests and the benchmarks (`python -m machine_nb.sample data/sample_workspace`).

Same seed, same bytes: random choices come from one `random.Random(seed)`, times from a fixed
start, tag ids are derived from the seed. It writes `.machine/runs|sessions|events.jsonl`,
`machines/<name>/…` definitions, and a tag store in `.machine-store/`. Scale it up for
benchmarks with `n_runs=` and `pad=` (extra characters of tool output per run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

START = datetime(2026, 11, 2, 9, 0, 0, tzinfo=timezone.utc)
MODELS = ["thinkingmachines/Inkling-Small", "Qwen/Qwen3.6-35B-A3B", "local/arith-tiny"]
# USD per million tokens (input, output) for the sample usage; the local model is free
PRICES = {"thinkingmachines/Inkling-Small": (1.16, 2.88), "Qwen/Qwen3.6-35B-A3B": (0.54, 1.335),
          "local/arith-tiny": (0.0, 0.0)}


def fingerprint(text: str) -> str:
    """The sample's rubric fingerprint: "rb-" + 12 hex of sha256 over the criteria (ours; Machine's is unknown)."""
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
             tags: bool = True) -> Path:
    """Write the sample workspace to `out` (its `.machine/`, `machines/` and `.machine-store/` are replaced).

    seed: the one seed every choice comes from (default 0: the committed sample).
    n_runs: exactly how many runs (coder takes what support and triage leave); default None: the
            committed sample's 312 runs across the three machines.
    pad: extra characters of file content in each coder run's tool output (benchmarks).
    tags: also write the sample tag store (default True).
    """
    from .store.tags import tag

    out = Path(out)
    for sub in (".machine", "machines", ".machine-store"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    g = _Gen(seed, pad)
    total = n_runs or 320
    fps = {m: (fingerprint(json.dumps(c) + "v2"), fingerprint(json.dumps(c) + "v1"))
           for m, c in (("support", SUPPORT_CRITERIA), ("chatbot/triage", TRIAGE_CRITERIA), ("coder", CODER_CRITERIA))}
    runs = _support_runs(g, total * 130 // 320, fps["support"]) + _triage_runs(g, total * 50 // 320, fps["chatbot/triage"])
    # the committed sample (n_runs=None) keeps its original split (312 runs); an explicit n_runs is exact
    n_coder = total - total * 130 // 320 - total * 90 // 320 if n_runs is None else max(0, n_runs - len(runs))
    runs += _coder_runs(g, n_coder, fps["coder"])
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
    if tags:
        _sample_tags(out / ".machine-store", runs, seed, tag)
    return out


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
    p = argparse.ArgumentParser(prog="python -m machine_nb.sample", description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="data/sample_workspace", help="workspace directory to write")
    p.add_argument("--seed", type=int, default=0, help="seed (default 0: the committed sample)")
    p.add_argument("--runs", type=int, default=None, help="exactly this many runs (default: the sample's 312)")
    p.add_argument("--pad", type=int, default=0, help="extra characters per coder run (benchmarks)")
    a = p.parse_args(argv)
    out = generate(a.out, seed=a.seed, n_runs=a.runs, pad=a.pad)
    n = sum(1 for _ in (out / ".machine" / "runs").rglob("*.json"))
    print(f"wrote {n} runs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
