"""Preference pairs as a user builds them: tag runs (rewrites, /bad and /good), score runs, then
`preference_pairs` → a frame of (prompt, chosen, rejected) with ties, identical replies, duplicates
and held-out cases left out and counted; written in the cookbook's comparison JSONL (read back by
the cookbook's own DPO dataset builder) and TRL's format."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.data.export import HeldOutExcluded
from machine_nb.training.pairs import (CONTRADICTS, DUPLICATE, IDENTICAL, PAIR_COLUMNS, REPLACED_KEY, REPLACED_UNKNOWN,
                              SMALL_GAP, TIE, TURN_DIFFERS, PairsSkipped, preference_pairs, read_pairs, write_pairs)
from machine_nb.tools.sample_workspace import TUTOR_INSTRUCTIONS

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
SYSTEM = {"role": "system", "content": TUTOR_INSTRUCTIONS}


def run(rid: str, question: str, reply: str, score: float | None, *, minute: int = 0, history=None) -> dict:
    record = {"id": rid, "machine": "tutor", "input": question, "history": history or [], "output": reply,
              "model": "local/arith-tiny", "harness": "tinker", "startedAt": f"2026-11-01T18:{minute:02d}:00.000Z",
              "trajectory": [{"role": "user", "content": question}, {"role": "assistant", "content": reply}],
              "instructions": TUTOR_INSTRUCTIONS}
    if score is not None:
        record["scorecard"] = {"total": score, "rubric": "rb-x", "criteria": {}}
    return record


@pytest.fixture
def ws(tmp_path):
    """The sample's tutor definition (instructions, cases, holdout) with runs written here."""
    root = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", root / "machines" / "tutor")
    (root / ".machine" / "runs" / "tutor").mkdir(parents=True)
    return root


def save(ws: Path, *runs: dict) -> list[dict]:
    for r in runs:
        (ws / ".machine" / "runs" / "tutor" / f"{r['id']}.json").write_text(json.dumps(r), encoding="utf-8")
    return list(runs)


def texts(pairs) -> list[tuple[str, str, str]]:
    return [(p["input"], p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs.to_dict("records")]


# --------------------------------------------------------------------------- rewrites


def test_a_rewrite_row_pairs_the_rewrite_over_the_reply_it_replaced(ws, tmp_path):
    store = tmp_path / "store"
    r = save(ws, run("r1", "Compute 10 + 29.", "10 + 29 = 39.", 0.6667))[0]
    row = mnb.tag(r, "good", rewrite="answer: 39", store=store, id="t1")
    row_with_key = {**row, "id": "t2", "messages": [{"role": "user", "content": "What is 2 plus 3?"},
                                                    {"role": "assistant", "content": "answer: 5"}],
                    REPLACED_KEY: "2 + 3 = 5.", "run": None, "source": None}
    mnb.append_jsonl([row_with_key], store / "train.jsonl")
    pairs = preference_pairs(store, workspace=ws, machine="tutor")
    assert list(pairs.columns) == PAIR_COLUMNS
    # the first is rebuilt from the run the row names (rows written so far carry no replaced reply),
    # the second reads the key
    assert texts(pairs) == [("Compute 10 + 29.", "answer: 39", "10 + 29 = 39."),
                            ("What is 2 plus 3?", "answer: 5", "2 + 3 = 5.")]
    first = pairs.iloc[0]
    assert first["source"] == "rewrite" and first["machine"] == "tutor"
    assert first["prompt"] == [SYSTEM, {"role": "user", "content": "Compute 10 + 29."}]
    assert first["chosen_tag"] == first["rejected_tag"] == "t1" and first["chosen_run"] == "r1"
    assert pairs["pair"].is_unique and pairs.skipped == [] and pairs.excluded == []


def as_machine_writes(store):
    """The store's rows without the `replaced` key tag() adds (Machine's own rows lack it)."""
    import json

    path = store / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "replaced"}) + "\n" for r in rows))


def test_a_rewrite_whose_replaced_reply_is_unknown_is_skipped_and_counted(ws, tmp_path):
    store = tmp_path / "store"
    r = run("r1", "Compute 10 + 29.", "10 + 29 = 39.", 0.6667)  # never saved: the run is not in the workspace
    mnb.tag(r, "good", rewrite="answer: 39", store=store, id="t1")
    moved = save(ws, run("r2", "Compute 11 + 1.", "11 + 1 = 12.", 0.6667))[0]
    mnb.tag(moved, "good", rewrite="answer: 12", store=store, id="t2")
    moved["trajectory"][0]["content"] = "Compute 11 + 2."  # the run file no longer holds the tagged turn
    save(ws, moved)
    as_machine_writes(store)
    with pytest.warns(PairsSkipped, match=r"2 rewrite row\(s\) gave no pair.*t1, t2"):
        pairs = preference_pairs(store, workspace=ws, machine="tutor")
    assert len(pairs) == 0
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("t1", REPLACED_UNKNOWN), ("t2", TURN_DIFFERS)]
    assert pairs.skipped_counts().to_dict() == {REPLACED_UNKNOWN: 1, TURN_DIFFERS: 1}


def test_runs_of_two_machines_with_the_same_id_are_told_apart_by_machine(ws, tmp_path):
    """Run ids are unique within a machine only: a rewrite row is rebuilt from the run of its own
    machine, and a row that names no machine only from an id no other machine has."""
    store = tmp_path / "store"
    (ws / ".machine" / "runs" / "other").mkdir(parents=True)
    mine = save(ws, run("r1", "Compute 10 + 29.", "10 + 29 = 39.", 0.5))[0]
    theirs = {**run("r1", "Compute 10 + 29.", "It is 39, I think.", 0.5), "machine": "other"}
    (ws / ".machine" / "runs" / "other" / "r1.json").write_text(json.dumps(theirs), encoding="utf-8")
    solo = {**run("r2", "Compute 1 + 2.", "1 + 2 = 3.", 0.5), "machine": "other"}
    (ws / ".machine" / "runs" / "other" / "r2.json").write_text(json.dumps(solo), encoding="utf-8")
    mnb.tag(mine, "good", rewrite="answer: 39", store=store, id="t-mine")
    mnb.tag(theirs, "good", rewrite="answer: 39.", store=store, id="t-theirs")
    mnb.tag(solo, "good", rewrite="answer: 3", store=store, id="t-solo")
    as_machine_writes(store)
    pairs = preference_pairs(store, workspace=ws, exclude=[], sources=["rewrite"])
    got = {p["chosen_tag"]: (p["machine"], p["rejected"][0]["content"]) for p in pairs.to_dict("records")}
    assert got == {"t-mine": ("tutor", "10 + 29 = 39."), "t-theirs": ("other", "It is 39, I think."),
                   "t-solo": ("other", "1 + 2 = 3.")}
    # rows as Machine writes them name no machine: r1 is ambiguous (skipped, counted), r2 is not
    path = store / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "machine"}) + "\n" for r in rows))
    with pytest.warns(PairsSkipped, match="t-mine, t-theirs"):
        pairs = preference_pairs(store, workspace=ws, exclude=[], sources=["rewrite"])
    assert texts(pairs) == [("Compute 1 + 2.", "answer: 3", "1 + 2 = 3.")]
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("t-mine", REPLACED_UNKNOWN),
                                                                ("t-theirs", REPLACED_UNKNOWN)]


# --------------------------------------------------------------------------- /bad + /good


def test_bad_and_good_rows_of_the_same_conversation_make_pairs(ws, tmp_path):
    store = tmp_path / "store"
    q = "What is 28 minus 20?"
    mnb.tag([{"role": "user", "content": q}, {"role": "assistant", "content": "28 - 20 = 9."}], "bad",
            store=store, id="b1")
    mnb.tag([{"role": "user", "content": q}, {"role": "assistant", "content": "28 - 20 = 7."}], "bad",
            store=store, id="b2")
    mnb.tag([{"role": "user", "content": q}, {"role": "assistant", "content": "answer: 8"}], "good",
            store=store, id="g1")
    # a different conversation (another question) pairs with nothing; a good row the same as a bad one is no preference
    mnb.tag([{"role": "user", "content": "Compute 1 + 1."}, {"role": "assistant", "content": "answer: 2"}], "good",
            store=store, id="g2")
    mnb.tag([{"role": "user", "content": q}, {"role": "assistant", "content": "28 - 20 = 9."}], "good",
            store=store, id="g3")
    pairs = preference_pairs(store, machine={"name": None, "instructions": TUTOR_INSTRUCTIONS})
    assert texts(pairs) == [(q, "answer: 8", "28 - 20 = 9."), (q, "answer: 8", "28 - 20 = 7."),
                            (q, "28 - 20 = 9.", "28 - 20 = 7.")]
    assert list(pairs["chosen_tag"]) == ["g1", "g1", "g3"] and list(pairs["rejected_tag"]) == ["b1", "b2", "b2"]
    assert (pairs["source"] == "tags").all()
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("g3", IDENTICAL)]


def test_duplicates_keep_the_first_source_and_contradictions_drop_both(ws, tmp_path):
    store = tmp_path / "store"
    q = "Compute 10 + 29."
    r = save(ws, run("r1", q, "10 + 29 = 39.", 0.6667))[0]
    mnb.tag(r, "good", rewrite="answer: 39", store=store, id="rw")
    mnb.tag(r, "bad", store=store, id="bad")            # the same preference again, through /bad + /good
    p = "Compute 2 + 2."
    mnb.tag([{"role": "user", "content": p}, {"role": "assistant", "content": "answer: 4"}], "good", store=store, id="g")
    mnb.tag([{"role": "user", "content": p}, {"role": "assistant", "content": "2 + 2 = 4."}], "bad", store=store, id="b")
    mnb.tag([{"role": "user", "content": p}, {"role": "assistant", "content": "2 + 2 = 4."}], "good", store=store, id="g2")
    mnb.tag([{"role": "user", "content": p}, {"role": "assistant", "content": "answer: 4"}], "bad", store=store, id="b2")
    pairs = preference_pairs(store, workspace=ws)  # rows of no machine: every row counts
    assert texts(pairs) == [(q, "answer: 39", "10 + 29 = 39.")] and pairs["source"].tolist() == ["rewrite"]
    reasons = pairs.skipped_counts().to_dict()
    assert reasons == {CONTRADICTS: 2, DUPLICATE: 1, IDENTICAL: 2}


# --------------------------------------------------------------------------- scores


def test_runs_of_the_same_case_pair_best_over_worst_when_the_gap_is_large_enough(ws, tmp_path):
    runs = save(ws,
                run("a1", "Compute 10 + 29.", "answer: 39", 1.0, minute=1),
                run("a2", "Compute 10 + 29.", "10 + 29 = 40.", 0.0, minute=2),
                run("a3", "Compute 10 + 29.", "10 + 29 = 39.", 0.6667, minute=3),
                run("b1", "Compute 5 + 5.", "answer: 10", 1.0, minute=4),      # a tie
                run("b2", "Compute 5 + 5.", "answer: 11", 1.0, minute=5),
                run("c1", "Compute 6 + 6.", "answer: 12", 1.0, minute=6),      # a gap of 0.1
                run("c2", "Compute 6 + 6.", "6 + 6 = 12.", 0.9, minute=7),
                run("d1", "Compute 7 + 7.", "answer: 14", 1.0, minute=8),      # the same reply, scored twice
                run("d2", "Compute 7 + 7.", "answer: 14", 0.0, minute=9),
                run("e1", "Compute 8 + 8.", "answer: 16", 1.0, minute=10),     # another conversation before it
                run("e2", "Compute 8 + 8.", "8 + 8 = 17.", 0.0, minute=11,
                    history=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]),
                run("f1", "Compute 9 + 9.", "answer: 18", None, minute=12),    # unscored
                run("f2", "Compute 9 + 9.", "9 + 9 = 19.", 0.0, minute=13))
    pairs = preference_pairs(tmp_path / "empty-store", workspace=ws, machine="tutor", sources=["scores"])
    assert texts(pairs) == [("Compute 10 + 29.", "answer: 39", "10 + 29 = 40.")]
    row = pairs.iloc[0]
    assert (row["chosen_run"], row["rejected_run"], row["chosen_score"], row["rejected_score"]) == ("a1", "a2", 1.0, 0.0)
    assert row["prompt"] == [SYSTEM, {"role": "user", "content": "Compute 10 + 29."}]
    assert sorted(pairs.skipped_counts().to_dict().items()) == sorted(
        {TIE: 1, SMALL_GAP: 1, IDENTICAL: 1, "unscored run": 1}.items())
    # a smaller min_gap takes the 0.1 gap too; runs can be given directly
    looser = preference_pairs(tmp_path / "empty-store", runs, machine="tutor", min_gap=0.05, sources=["scores"])
    assert ("Compute 6 + 6.", "answer: 12", "6 + 6 = 12.") in texts(looser)
    for bad in (0, float("nan"), "0.25", True):  # a NaN gap dropped every score pair without a word
        with pytest.raises(ValueError, match="min_gap"):
            preference_pairs(tmp_path / "empty-store", runs, min_gap=bad)


# --------------------------------------------------------------------------- held-out cases


def test_held_out_cases_are_never_paired(ws, tmp_path):
    store = tmp_path / "store"
    held = save(ws, run("h1", "What's 66 - 74?", "66 - 74 = -8.", 0.6667))[0]  # holdout.json's first case
    train = save(ws, run("t1", "Compute 10 + 29.", "10 + 29 = 39.", 0.6667))[0]
    mnb.tag(held, "good", rewrite="answer: -8", store=store, id="held")
    mnb.tag(train, "good", rewrite="answer: 39", store=store, id="train")
    with pytest.warns(HeldOutExcluded, match=r"left out 1 of 2 preference pair\(s\).*tutor's holdout.json"):
        pairs = preference_pairs(store, workspace=ws, machine="tutor")
    assert texts(pairs) == [("Compute 10 + 29.", "answer: 39", "10 + 29 = 39.")]
    assert [p["chosen_tag"] for p in pairs.excluded] == ["held"]
    # an explicit exclude list (case and spacing do not matter), or none at all
    with pytest.warns(HeldOutExcluded):
        only = preference_pairs(store, workspace=ws, machine="tutor", exclude=["  compute 10 +   29."])
    assert texts(only) == [("What's 66 - 74?", "answer: -8", "66 - 74 = -8.")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeldOutExcluded)
        assert len(preference_pairs(store, workspace=ws, machine="tutor", exclude=())) == 2


def test_the_sample_tutor_gives_its_rewrites_as_pairs_held_out_ones_left_out(tmp_path):
    """The committed sample's rewrite rows keep the reply they replaced; rows without it (as
    Machine writes them) are rebuilt from the run they name, to the very same pairs."""
    import shutil

    with pytest.warns(HeldOutExcluded, match="left out 2 of 46"):
        pairs = preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor")
    assert len(pairs) == 44 and set(pairs["source"]) == {"rewrite"} and pairs.skipped == []
    assert all(p["chosen"][0]["content"].startswith("answer: ") for p in pairs.to_dict("records"))
    assert not any(p["rejected"][0]["content"].startswith("answer: ") for p in pairs.to_dict("records"))
    holdout = {c["input"] for c in json.loads((SAMPLE / "machines" / "tutor" / "holdout.json").read_text())}
    assert not set(pairs["input"]) & holdout and {p["input"] for p in pairs.excluded} <= holdout
    store = tmp_path / "store"
    shutil.copytree(SAMPLE / ".machine-store", store)
    as_machine_writes(store)
    with pytest.warns(HeldOutExcluded, match="left out 2 of 46"):
        rebuilt = preference_pairs(store, workspace=SAMPLE, machine="tutor")
    assert rebuilt[["input", "chosen", "rejected"]].equals(pairs[["input", "chosen", "rejected"]])
    # without the workspace the runs are unknown: every rewrite without its reply is skipped and counted
    with pytest.warns(PairsSkipped, match="46 rewrite row"):
        blind = preference_pairs(store, machine="tutor")
    assert len(blind) == 0 and blind.skipped_counts().to_dict() == {REPLACED_UNKNOWN: 46}


# --------------------------------------------------------------------------- files


def test_pairs_written_in_both_formats_read_back_and_load_in_the_cookbooks_dpo_builder(tmp_path):
    from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
    from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    with pytest.warns(HeldOutExcluded):
        pairs = preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor")
    comparison = write_pairs(pairs, tmp_path / "pairs.jsonl")
    trl = write_pairs(pairs, tmp_path / "trl.jsonl", format="trl")
    first = json.loads(comparison.read_text().splitlines()[0])
    assert first["label"] == "A" and first["comparison"]["completion_A"] == pairs.iloc[0]["chosen"]
    assert first["comparison"]["prompt_conversation"][0] == SYSTEM and first["source"] == "rewrite"
    line = json.loads(trl.read_text().splitlines()[0])
    assert set(line) >= {"prompt", "chosen", "rejected"} and line["chosen"] == pairs.iloc[0]["chosen"]
    for path in (comparison, trl):
        back = read_pairs(path)
        assert list(back["pair"]) == list(pairs["pair"]) and texts(back) == texts(pairs)

    from machine_nb.checks.render import get_tokenizer, renderer_name

    mnb.use_local_models()
    builder = DPODatasetBuilderFromComparisons(
        comparison_builder=ComparisonBuilderFromJsonl(train_path=str(comparison)),
        common_config=ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="local/arith-tiny",
                                                     renderer_name=renderer_name("local/arith-tiny"),
                                                     max_length=128, batch_size=4))
    dataset, _ = builder()
    batch = dataset.get_batch(0)
    assert len(dataset) == 11 and len(batch) == 8  # two datums per pair: chosen, then rejected
    tok = get_tokenizer("local/arith-tiny")

    def trained_text(datum):
        target, weights = datum.loss_fn_inputs["target_tokens"].data, datum.loss_fn_inputs["weights"].data
        return tok.decode([t for t, w in zip(target, weights) if w > 0])

    assert trained_text(batch[0]).strip().startswith("answer: ") and "=" in trained_text(batch[1])


@pytest.mark.parametrize("line, message, field", [
    ('{"comparison": {"prompt_conversation": [], "completion_A": [{"role": "assistant", "content": "a"}], '
     '"completion_B": [{"role": "assistant", "content": "b"}]}, "label": "Tie"}', "a tie is no preference", "label"),
    ('{"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": []}', "list of chat messages", "chosen"),
    ('{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "a"}], '
     '"rejected": [{"role": "assistant", "content": "b"}]}', "must end with an assistant reply", "chosen"),
    ('{"prompt": [], "chosen": [{"role": "assistant", "content": "a"}], '
     '"rejected": [{"role": "assistant", "content": " a "}]}', "the same reply", "chosen"),
    ('{"question": "q"}', "neither a comparison line", None),
])
def test_bad_pair_lines_name_file_line_and_field(tmp_path, line, message, field):
    path = tmp_path / "pairs.jsonl"
    good = '{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}], ' \
           '"rejected": [{"role": "assistant", "content": "b"}]}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(MachineFormatError, match=message) as err:
        read_pairs(path)
    assert err.value.line == 2 and err.value.field == field and str(path) in str(err.value)


def test_a_label_b_comparison_is_read_with_its_completions_swapped(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps({"comparison": {"prompt_conversation": [{"role": "user", "content": "q"}],
                                               "completion_A": [{"role": "assistant", "content": "worse"}],
                                               "completion_B": [{"role": "assistant", "content": "better"}]},
                                "label": "B"}) + "\n")
    assert texts(read_pairs(path)) == [("q", "better", "worse")]


def test_pairs_from_eval_results_prefer_the_expected_answer_over_a_wrong_reply():
    import pandas as pd

    results = pd.DataFrame([
        {"input": "What's 66 - 74?", "prompt": "What's 66 - 74?", "expected": "answer: -8", "match": "exact",
         "output": "66 - 74 = -8.", "correct": False, "error": None},
        {"input": "Compute 1 + 1.", "prompt": "Compute 1 + 1.", "expected": "answer: 2", "match": "exact",
         "output": "answer: 2", "correct": True, "error": None},                      # right: nothing to prefer
        {"input": "Capital of France?", "prompt": "Capital of France?", "expected": "Paris", "match": "contains",
         "output": "Lyon.", "correct": False, "error": None},                         # not a literal answer
        {"input": "Compute 2 + 2.", "prompt": "Compute 2 + 2.", "expected": "answer: 4", "match": "exact",
         "output": "", "correct": False, "error": "timeout"},                        # a failed request
    ])
    pairs = mnb.pairs_from_results(results, instructions=TUTOR_INSTRUCTIONS)
    assert texts(pairs) == [("What's 66 - 74?", "answer: -8", "66 - 74 = -8.")]
    assert pairs.iloc[0]["prompt"] == [SYSTEM, {"role": "user", "content": "What's 66 - 74?"}]
    assert pairs.iloc[0]["source"] == "results"


def test_cli_pairs_writes_the_file_and_counts(tmp_path, capsys):
    from machine_nb.cli import main

    out = tmp_path / "pairs.jsonl"
    code = main(["pairs", "--store", str(SAMPLE / ".machine-store"), "--workspace", str(SAMPLE),
                 "--machine", "tutor", "-o", str(out), "--format", "trl", "--json"])
    assert code == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["pairs"] == 44 and counts["by_source"] == {"rewrite": 44} and counts["excluded_held_out"] == 2
    assert len(read_pairs(out)) == 44
    stripped = tmp_path / "store"
    import shutil

    shutil.copytree(SAMPLE / ".machine-store", stripped)
    as_machine_writes(stripped)
    assert main(["pairs", "--store", str(stripped), "--machine", "tutor"]) == 0
    captured = capsys.readouterr()
    assert "0 pair(s)" in captured.out and "skipped 46" in captured.out and "46 rewrite row" in captured.err


def test_pairs_without_a_machine_definition_say_held_out_cases_were_not_checked():
    with pytest.warns(UserWarning, match="held-out cases were not checked"):
        preference_pairs(SAMPLE / ".machine-store", machine="tutor")


def test_a_results_json_nested_too_deep_or_broken_is_a_format_error_naming_file_and_line(tmp_path):
    path = tmp_path / "results.json"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text('{\n "model": "m",\n "rows": [\n  ' + deep + '\n ]\n}\n')
    with pytest.raises(MachineFormatError, match="nested deeper") as e:
        mnb.pairs_from_results(path)
    assert e.value.path == str(path) and e.value.line == 4
    path.write_text('{\n "rows": [\n  {"match": "exact",}\n ]\n}\n')
    with pytest.raises(MachineFormatError, match="invalid JSON") as e:
        mnb.pairs_from_results(path)
    assert e.value.path == str(path) and e.value.line == 3
    path.write_text('{"rows": [["not", "a", "row"]]}\n')
    with pytest.raises(MachineFormatError, match="rows.0") as e:
        mnb.pairs_from_results(path)
    assert e.value.path == str(path)


def test_a_folder_given_as_results_is_an_error_naming_it(tmp_path):
    with pytest.raises((MachineFormatError, IsADirectoryError), match=str(tmp_path)):
        mnb.pairs_from_results(tmp_path)
    with pytest.raises((MachineFormatError, IsADirectoryError), match=str(tmp_path)):
        mnb.load_results(tmp_path)


def test_pairs_from_results_read_an_eval_result_like_its_rows():
    import pandas as pd

    from machine_nb.evaluation.results import EvalResult

    rows = pd.DataFrame([{"input": "What's 66 - 74?", "prompt": "What's 66 - 74?", "expected": "answer: -8",
                          "match": "exact", "output": "-8", "correct": False, "error": None}])
    from_result = mnb.pairs_from_results(EvalResult(rows, {"name": "live"}), machine="tutor")
    assert texts(from_result) == texts(mnb.pairs_from_results(rows, machine="tutor")) == [
        ("What's 66 - 74?", "answer: -8", "-8")]


def test_pairs_from_a_results_file_keep_its_exact_prompts_through_the_one_results_reader(tmp_path, monkeypatch):
    """A results file's rows carry the exact prompt messages (evaluate_cases writes the machine's
    instructions and the case); the pair's prompt is those messages, read by load_results."""
    from machine_nb.evaluation import results

    prompt = [SYSTEM, {"role": "user", "content": "What's 66 - 74?"}]
    rows = [{"row": 0, "case": 0, "trial": 0, "input": "What's 66 - 74?", "prompt": "What's 66 - 74?",
             "expected": "answer: -8", "match": "exact", "output": "66 - 74 = -8.", "correct": False, "error": None,
             "messages": prompt},
            {"row": 1, "case": 1, "trial": 0, "input": "Compute 1 + 1.", "prompt": "Compute 1 + 1.",
             "expected": "answer: 2", "match": "exact", "output": "", "correct": False, "error": "timeout",
             "messages": [SYSTEM, {"role": "user", "content": "Compute 1 + 1."}]}]
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"name": "live v1", "rows": rows}))
    reads = []
    real = results.load_results
    monkeypatch.setattr(results, "load_results", lambda p: reads.append(p) or real(p))
    pairs = mnb.pairs_from_results(path, instructions="not used: the rows carry their prompt")
    assert reads == [path]  # one reader of results files
    assert len(pairs) == 1 and pairs.iloc[0]["prompt"] == prompt  # the failed request gives no pair
    assert texts(pairs) == [("What's 66 - 74?", "answer: -8", "66 - 74 = -8.")]
    rows[0]["messages"] = [SYSTEM, "not a message"]
    path.write_text(json.dumps({"name": "live v1", "rows": rows}))
    with pytest.raises(MachineFormatError, match="list of chat messages") as err:
        mnb.pairs_from_results(path)
    assert err.value.path == str(path) and err.value.field == "rows.0.messages"
