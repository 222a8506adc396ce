"""The sample's tutor machine: its replies are the shipped model's own, its cases and held-out cases
are disjoint, its tag rows are Machine's, and adding it left the other machines' files as they were."""

from __future__ import annotations

import filecmp
import re
from pathlib import Path

import machine_nb as mnb
from machine_nb.tools import sample_workspace as sample
from machine_nb.evaluation.cases import read_versions

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


def test_recorded_replies_are_what_the_model_answers_through_the_engine():
    tables = sample.TUTOR_ARITHMETIC + sample.TUTOR_FACTS + sample.TUTOR_HOLDOUT_RUNS
    got = sample.sample_tutor_replies([row[0] for row in tables])
    assert [tuple(row[2:]) for row in tables] == got


def test_tutor_files_cases_holdout_versions():
    tutor = mnb.load_machine(SAMPLE, "tutor")
    assert tutor["model"] == "local/arith-tiny" and tutor["live_version"] == "v1"
    assert tutor["instructions"] == sample.TUTOR_INSTRUCTIONS and tutor["rubric"] == sample.tutor_rubric()
    cases, holdout = mnb.load_cases(SAMPLE, "tutor"), mnb.load_cases(SAMPLE, "tutor", "holdout")
    assert len(cases) == len(sample.TUTOR_ARITHMETIC) + len(sample.TUTOR_FACTS) and len(holdout) == 20
    assert not set(cases["input"]) & set(holdout["input"])
    pairs = lambda texts: {frozenset(map(int, re.findall(r"\d+", t))) for t in texts}  # noqa: E731
    assert not pairs(cases["input"][: len(sample.TUTOR_ARITHMETIC)]) & pairs(holdout["input"])
    assert (holdout["match"] == "exact").all() and holdout["expected"].str.fullmatch(r"answer: -?\d+").all()
    versions = read_versions(SAMPLE, "tutor")
    assert [v["id"] for v in versions] == ["v1"] and versions[0]["live"] is True


def test_tutor_runs_are_scored_and_tagged_in_the_house_style():
    runs = mnb.load_runs(SAMPLE, "tutor", store=SAMPLE / ".machine-store")
    n = len(sample.TUTOR_ARITHMETIC) + len(sample.TUTOR_FACTS) + len(sample.TUTOR_HOLDOUT_RUNS)
    assert len(runs) == n and (runs["model"] == "local/arith-tiny").all() and (runs["version"] == "v1").all()
    assert runs["score"].notna().all() and (runs["rubric"] == sample.tutor_rubric()).all()
    assert runs["started_at"].max() < mnb.load_runs(SAMPLE, "support")["started_at"].min()  # an evening earlier
    # natural arithmetic replies miss the house style: the live model scores at most 2/3 on them
    arith = runs[runs["input"].str.contains(r"\d")]
    assert (arith["score"] < 1).all() and (runs[~runs["input"].str.contains(r"\d")]["score"] == 1).all()

    tags = mnb.tagged(SAMPLE / ".machine-store")
    rows = [r for r in tags["row"] if r.get("machine") == "tutor"]
    rewrites = [r for r in rows if r.get("rewritten")]
    assert len(rewrites) == sample.TUTOR_REWRITTEN + len(sample.TUTOR_HOLDOUT_RUNS)
    assert all(re.fullmatch(r"answer: -?\d+", r["messages"][-1]["content"]) for r in rewrites)
    bad = [r for r in rows if r["tag"] == "bad"]
    assert {r["note"] for r in bad} == {"wrong answer", "too much explanation"} and len(bad) == 5
    held = set(mnb.load_cases(SAMPLE, "tutor", "holdout")["input"])
    assert sum(r["messages"][0]["content"] in held for r in rewrites) == 2  # training must leave these out
    assert (runs["tags"].map(len) == 0).sum() > 0  # left for notebook 03 to tag


def test_adding_the_tutor_left_the_other_machines_files_as_they_were(tmp_path):
    with_tutor, without = sample.generate(tmp_path / "a"), sample.generate(tmp_path / "b", tutor=False)
    for f in without.rglob("*"):
        rel = f.relative_to(without)
        if not f.is_file() or rel.name == sample.MARKER:  # the marker lists every file, the tutor's too
            continue
        other = with_tutor / rel
        if rel.name.endswith(".jsonl"):  # the shared files gained the tutor's lines, the others' kept
            old, new = f.read_text().splitlines(), other.read_text().splitlines()
            assert [line for line in new if '"tutor"' not in line] == old, rel
        else:
            assert filecmp.cmp(f, other, shallow=False), rel
    assert (with_tutor / "machines" / "tutor" / "holdout.json").exists() and not (without / "machines" / "tutor").exists()


def test_explicit_run_counts_stay_exact_without_the_tutor(tmp_path):
    out = sample.generate(tmp_path / "w", n_runs=40, tags=False)
    assert sum(1 for _ in (out / ".machine" / "runs").rglob("*.json")) == 40
    assert "tutor" not in mnb.list_machines(out)
