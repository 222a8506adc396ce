"""Selection and export follow Machine's rules (its selectRuns and wholeRunExample), and the lines
load in the real tinker-cookbook: Inkling's renderer builds supervised examples from them."""

import json
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.data.export import (default_failed, step_examples, to_chat, uniform_content, whole_run_example,
                               whole_runs_for)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
FP = "rb-current"


@pytest.fixture(scope="module")
def sample_runs():
    return mnb.load_runs(SAMPLE)

MACHINE = {"name": "m", "rubric": FP, "instructions": "Be brief.", "tools": [], "holdout": [{"input": "held out"}]}


def run(id, input="q1", total=1.0, **kw):
    r = {"id": id, "machine": "m", "input": input, "output": "a", "model": "model-a", "harness": "tinker",
         "startedAt": "", "history": [], "instructions": "Be brief.",
         "trajectory": [{"role": "user", "content": input}, {"role": "assistant", "content": "a"}],
         "scorecard": {"total": total, "evaluatedAt": "", "rubric": FP, "criteria": {}}}
    r.update(kw)
    return r


def ids(rows):
    return [r["id"] for r in rows]


def test_select_rules_each_leave_out_what_machine_leaves_out():
    runs = [
        run("r01"),
        run("r02", machine="other"),
        run("r03", harness="echo"),
        run("r04", scorecard=None),
        run("r05", conversation={"final": False}),
        run("r06", scorecard={"total": 1, "rubric": "rb-old"}),
        run("r07", total=0.5),
        run("r08", input="held out"),
        run("r09", model="model-b"),
        run("r10", instructions="An optimizer's rewrite."),
        run("r11", input="q2", conversation={"final": True}),
    ]
    kept = mnb.select_runs(runs, MACHINE, models=["model-a"])
    assert ids(kept) == ["r01", "r11"]
    # min_score lowers the bar; models=None admits every model; exclude=() admits the holdout
    assert set(ids(mnb.select_runs(runs, MACHINE, min_score=0.5, exclude=(), best_of=10))) == {
        "r01", "r07", "r08", "r09", "r11"}
    # best_of=2 keeps the best two of case q1: equal scores, so the newest (higher id) first
    assert ids(mnb.select_runs(runs, MACHINE, min_score=0.5, exclude=())) == ["r09", "r01", "r08", "r11"]
    # rubric=None accepts any rubric fingerprint
    assert "r06" in ids(mnb.select_runs(runs, MACHINE, rubric=None, best_of=10))


def test_best_of_per_case_best_first_then_newest():
    runs = [run("a1", total=1.0), run("a3", total=1.0), run("a2", total=1.0), run("b1", input="q2", total=1.0),
            run("c1", input="q3", total=0.9), run("c2", input="q3", total=1.0)]
    kept = mnb.select_runs(runs, MACHINE, min_score=0.9)
    assert ids(kept) == ["a3", "a2", "b1", "c2", "c1"]
    # the case of a run is run["case"] when present, so conversation turns group by their opening
    runs = [run("t1", input="follow up", case="q1"), run("t2", input="another", case="q1"), run("t3", input="q1")]
    assert ids(mnb.select_runs(runs, MACHINE, best_of=2)) == ["t3", "t2"]
    # exclude matches a run's case or its input
    assert ids(mnb.select_runs(runs, MACHINE, exclude=["q1"], best_of=9)) == []


def test_select_on_dataframe_reads_definition_from_workspace(sample_runs):
    sel = mnb.select_runs(sample_runs, "coder")
    mdef = mnb.load_machine(SAMPLE, "coder")
    assert mdef["name"] == "coder" and mdef["rubric"] and len(mdef["tools"]) == 3
    assert (sel["rubric"] == mdef["rubric"]).all() and (sel["score"] >= 1).all()
    assert sel.groupby("case").size().max() <= 2
    assert not set(sel["case"]) & {c["input"] for c in mdef["holdout"]}
    assert set(sel.columns) == set(sample_runs.columns)
    # the holdout default is not vacuous: the sample has full-score runs of a support holdout case
    support, with_holdout = mnb.select_runs(sample_runs, "support"), mnb.select_runs(sample_runs, "support", exclude=())
    held = {c["input"] for c in mnb.load_machine(SAMPLE, "support")["holdout"]}
    assert set(with_holdout["case"]) & held and not set(support["case"]) & held


def test_training_lines_resolve_the_machine_themselves_not_through_attrs(sample_runs):
    """select_runs hands training_lines rows, not its definition: training_lines reads the same
    definition from the runs' machine and workspace, so a concat of selections (which drops attrs)
    exports the same lines."""
    import pandas as pd

    sel = mnb.select_runs(sample_runs, "coder")
    assert "machine" not in sel.attrs
    tools = mnb.load_machine(SAMPLE, "coder")["tools"]
    lines = mnb.training_lines(sel)
    from machine_nb.data.export import tool_specs

    assert lines and all(line["tools"] == tool_specs(tools) for line in lines)
    assert lines == mnb.training_lines(sel, "coder", workspace=SAMPLE)
    assert lines == mnb.training_lines(pd.concat([sel.head(1), sel.iloc[1:]], ignore_index=True))
    # a definition in the frame's attrs is not read: the machine comes from machine= and workspace=
    old = sel.copy()
    old.attrs["machine"] = {"name": "coder", "instructions": "Old way.", "tools": []}
    assert mnb.training_lines(old) == lines


def test_one_function_resolves_machine_definitions(sample_runs):
    from machine_nb.store.workspace import resolve_machine, runs_workspace

    assert runs_workspace(sample_runs) == SAMPLE
    assert resolve_machine("coder", runs=sample_runs) == mnb.load_machine(SAMPLE, "coder")
    assert resolve_machine(None, runs=sample_runs[sample_runs["machine"] == "coder"])["name"] == "coder"
    assert resolve_machine(None, runs=sample_runs) == {}  # several machines: no one definition
    assert resolve_machine("coder") == {"name": "coder"}  # no workspace known
    assert resolve_machine({"name": "x", "tools": []}) == {"name": "x", "tools": []}
    assert resolve_machine("nowhere", SAMPLE, undefined="name") == {"name": "nowhere"}
    with pytest.raises(mnb.MachineFormatError, match="no machine 'nowhere'"):
        resolve_machine("nowhere", SAMPLE)


def test_select_without_a_known_rubric_is_a_clear_error():
    with pytest.raises(ValueError, match="rubric"):
        mnb.select_runs([run("r1")], {"name": "m"})


def tool_run():
    """One run: prose + two parallel reads, a failed edit, a good edit, a final answer; with reasoning."""
    traj = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Reading.", "reasoning": "look first"},
        {"role": "assistant", "content": "", "name": "read", "toolCallId": "c1", "toolInput": {"p": "a"}},
        {"role": "assistant", "content": "", "name": "read", "toolCallId": "c2", "toolInput": {"p": "b"}},
        {"role": "tool", "content": "A", "name": "read", "toolCallId": "c1"},
        {"role": "tool", "content": "B", "name": "read", "toolCallId": "c2"},
        {"role": "assistant", "content": "", "name": "edit", "toolCallId": "c3", "toolInput": {"x": 1}, "reasoning": "edit"},
        {"role": "tool", "content": "Error: snippet not found", "name": "edit", "toolCallId": "c3"},
        {"role": "assistant", "content": "", "name": "edit", "toolCallId": "c4", "toolInput": {"x": 2}},
        {"role": "tool", "content": "ok", "name": "edit", "toolCallId": "c4"},
        {"role": "assistant", "content": "Done.", "reasoning": "summarise"},
    ]
    return run("t1", input="fix it", trajectory=traj,
               history=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning": "old"}])


def test_conversation_merges_tool_calls_into_openai_shape():
    msgs = mnb.conversation(tool_run(), "SYS")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "tool", "tool",
                                         "assistant", "tool", "assistant", "tool", "assistant"]
    step = msgs[4]
    assert step["content"] == [{"type": "thinking", "thinking": "look first"}, {"type": "text", "text": "Reading."}]
    assert [tc["id"] for tc in step["tool_calls"]] == ["c1", "c2"]
    assert step["tool_calls"][0] == {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p":"a"}'}}
    assert msgs[5] == {"role": "tool", "content": "A", "tool_call_id": "c1", "name": "read"}
    assert msgs[2]["content"] == "hello"  # history carries no reasoning
    # every tool_call id has its result and vice versa (the cookbook corpus test's invariant)
    calls = {tc["id"] for m in msgs for tc in m.get("tool_calls", [])}
    assert calls == {m["tool_call_id"] for m in msgs if m["role"] == "tool"}
    assert mnb.conversation(tool_run(), reasoning=False)[4]["content"] == "Reading."


def test_failed_steps_skipped_as_targets_kept_as_context():
    msgs, flags = to_chat(tool_run()["trajectory"])
    assert [i for i, f in enumerate(flags) if f] == [4]  # the failed edit step
    assert mnb.step_failed(tool_run()["trajectory"], 6) is True  # on Machine messages
    assert mnb.step_failed(msgs, 4) is True and mnb.step_failed(msgs, 6) is False  # on chat messages
    examples = step_examples(msgs, failed_steps=flags)
    assert [len(e) for e in examples] == [2, 7, 9]  # prose+reads, good edit, final (failed edit skipped)
    assert examples[1][4]["tool_calls"][0]["id"] == "c3"  # ...but it stays in later context
    # a user-supplied predicate replaces the rule
    flags2 = to_chat(tool_run()["trajectory"], failed=lambda call, res: res["content"] == "ok")[1]
    assert [i for i, f in enumerate(flags2) if f] == [6]
    assert default_failed({}, {"role": "tool", "content": "fine", "isError": True})
    assert default_failed({}, {"role": "tool", "content": "  error: nope"})
    assert not default_failed({}, {"role": "tool", "content": "no errors found"})


def test_training_lines_steps_reasoning_and_whole_runs():
    r = tool_run()
    lines = mnb.training_lines([r], MACHINE)
    assert len(lines) == 3 and all(line["run"] == "t1" and line["machine"] == "m" and line["score"] == 1.0 for line in lines)
    assert "tools" not in lines[0] and "whole_run" not in lines[0]
    last = lines[-1]["messages"]
    assert last[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    # tinker harness resends reasoning: earlier steps of the run keep it; earlier turns never do
    assert {"type": "thinking", "thinking": "look first"} in last[4]["content"]
    assert all(p["type"] != "thinking" for p in last[2]["content"])
    # a harness that does not resend it: earlier steps lose it, the target keeps it
    plain = mnb.training_lines([{**r, "harness": "scripted"}], MACHINE)[-1]["messages"]
    assert all(p["type"] != "thinking" for p in plain[4]["content"])
    assert plain[-1]["content"][0] == {"type": "thinking", "thinking": "summarise"}
    # whole runs: one line, trainable on targets after the last user, failed step not trainable
    whole = mnb.training_lines([r], MACHINE, whole_runs=True, base_model="thinkingmachines/Inkling-Small")
    assert len(whole) == 1 and whole[0]["whole_run"] is True
    flags = [(m["role"], m.get("trainable")) for m in whole[0]["messages"]]
    assert [t for role, t in flags if role == "assistant"] == [None, True, False, True, True]
    # whole runs are only for Inkling; other harnesses still give step lines
    with pytest.raises(ValueError, match="Inkling"):
        mnb.training_lines([r], MACHINE, whole_runs=True, base_model="Qwen/Qwen3.6-35B-A3B")
    assert not whole_runs_for("Qwen/Qwen3.6-35B-A3B")
    assert len(mnb.training_lines([{**r, "harness": "scripted"}], MACHINE, whole_runs=True)) == 3
    # tools are declared as {name, description, parameters}
    tools = [{"name": "read", "description": "Read", "inputSchema": {"type": "object"}}]
    assert mnb.training_lines([r], {**MACHINE, "tools": tools})[0]["tools"] == [
        {"name": "read", "description": "Read", "parameters": {"type": "object"}}]


def test_uniform_content_and_estimate_tokens():
    lines = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
             {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]}]
    out = uniform_content(lines)
    assert out[0]["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    assert out[0]["messages"][1]["content"] == [{"type": "text", "text": ""}]  # renders as "" does
    assert uniform_content(lines[:1]) == lines[:1]  # all strings: unchanged
    line = {"messages": [{"role": "user", "content": "é" * 10}], "tools": [{"name": "x"}]}
    chars = len(json.dumps(line["messages"], ensure_ascii=False, separators=(",", ":"))) + len('[{"name":"x"}]')
    assert mnb.estimate_tokens([line]) == -(-chars * 2 // 5)
    assert mnb.estimate_tokens([{"messages": [{"role": "user", "content": "😀"}]}]) == -(-32 * 2 // 5)  # 30 chars + 2 UTF-16 units


def test_whole_run_example_marks_only_targets():
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    assert whole_run_example(msgs) == [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "trainable": True}]


def test_lines_render_with_inklings_renderer(tmp_path, sample_runs):
    """Exported lines, read back from disk, become supervised examples in tinker-cookbook."""
    from tinker_cookbook import renderers, tokenizer_utils
    from tinker_cookbook.renderers import TrainOnWhat

    renderer = renderers.get_renderer("tml_v0", tokenizer_utils.get_tokenizer("thinkingmachines/Inkling-Small"))
    sel = mnb.select_runs(sample_runs, "coder")
    steps = mnb.training_lines(sel)
    whole = mnb.training_lines(sel, base_model="thinkingmachines/Inkling-Small")
    assert any(line.get("whole_run") for line in whole) and len(whole) < len(steps)
    mnb.write_jsonl(steps + whole, tmp_path / "train.jsonl")
    rows = mnb.read_jsonl(tmp_path / "train.jsonl")
    weights = []
    for row in rows[:6] + [r for r in rows if r.get("whole_run")][:2]:
        msgs = row["messages"]
        if row.get("whole_run"):
            msgs = [{**m, "trainable": m.get("trainable", False)} for m in msgs]
            model_input, w = renderer.build_supervised_example(msgs, train_on_what=TrainOnWhat.CUSTOMIZED)
        else:
            model_input, w = renderer.build_supervised_example(msgs, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE)
        assert model_input.length > 20
        weights.append(float(w.sum()))
        text = renderer.tokenizer.decode(model_input.to_ints()) if hasattr(renderer, "tokenizer") else ""
        if text and msgs[-1].get("tool_calls"):
            assert msgs[-1]["tool_calls"][0]["function"]["name"] in text
    assert all(w > 0 for w in weights)


def test_plain_lines_load_with_from_conversation_file_builder(tmp_path, sample_runs):
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    lines = mnb.training_lines(mnb.select_runs(sample_runs, "chatbot/triage"), reasoning=False)
    assert lines and all(isinstance(m["content"], str) for line in lines for m in line["messages"])
    path = mnb.write_jsonl(lines, tmp_path / "triage.jsonl")
    builder = FromConversationFileBuilder(file_path=str(path), common_config=ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer="thinkingmachines/Inkling-Small", renderer_name="tml_v0", max_length=2048,
        batch_size=len(lines)))
    train, _ = builder()
    batch = train.get_batch(0)
    assert len(batch) == len(lines)
    assert all(sum(d.loss_fn_inputs["weights"].tolist()) > 0 for d in batch)


def test_whole_runs_checked_against_the_machines_model_and_reasoning_hook():
    r = tool_run()
    with pytest.raises(ValueError, match="Inkling"):
        mnb.training_lines([r], {**MACHINE, "model": "Qwen/Qwen3.6-35B-A3B"}, whole_runs=True)
    assert mnb.training_lines([r], {**MACHINE, "model": "thinkingmachines/Inkling-Small"}, whole_runs=True)[0]["whole_run"]
    upper = mnb.training_lines([r], {**MACHINE, "transform_reasoning": str.upper})
    assert upper[-1]["messages"][-1]["content"][0] == {"type": "thinking", "thinking": "SUMMARISE"}
    assert all(isinstance(m["content"], str) for m in mnb.training_lines([r], MACHINE, reasoning=False)[-1]["messages"])
