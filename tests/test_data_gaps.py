"""Data made for training, at its edges: the minimal-SFT corpus written into folders that already
hold something (another draw, a half-written one, a second writer at the same moment) and
preference pairs built from odd tag rows and scores (NaN, ties, blank replies, several machines)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import threading

import numpy as np
import pytest

import machine_nb.data.corpus as corpus_module
from machine_nb.core.jsonl import read_jsonl
from machine_nb.data.corpus import corpus_rows, make_corpus
from machine_nb.training.pairs import (DUPLICATE, REPLACED_UNKNOWN, pairs_from_results, preference_pairs, read_pairs,
                                      write_pairs)

QUESTION = re.compile(r"(\d+) (?:plus|minus|\+|-) (\d+)")


def operand_pairs(rows) -> set[frozenset[int]]:
    return {frozenset(map(int, QUESTION.search(r["messages"][0]["content"]).groups())) for r in rows}


def on_disk(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def assert_consistent(folder) -> dict:
    """The folder is one corpus: its manifest vouches for every split it lists, and no operand pair
    is in two splits (valid.jsonl included when it is there at all)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, info in manifest["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == info["sha256"], name
    splits = [operand_pairs(read_jsonl(folder / n)) for n in ("train.jsonl", "eval.jsonl", "valid.jsonl")
              if (folder / n).exists()]
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            assert not a & b
    return manifest


# --------------------------------------------------------------------------- the corpus


def test_two_make_corpus_calls_into_one_folder_at_once_never_both_succeed(tmp_path, monkeypatch):
    """The second writer waits for the first, then finds its held-out rows and is refused: neither
    caller is told a corpus is theirs while the other's rows sit in the folder."""
    write = corpus_module.atomic_write_text
    results: dict[int, object] = {}
    arrived = threading.Event()  # the other call waits on the folder's hold, or has ended without one
    real_flock = fcntl.flock

    def flock(fd, op):
        if threading.current_thread() is not threading.main_thread():
            arrived.set()
        return real_flock(fd, op)

    def other():
        try:
            results[1] = make_corpus(tmp_path, seed=1)
        except FileExistsError as exc:
            results[1] = exc
        finally:
            arrived.set()

    started = []

    def first_write_lets_another_call_in(path, text, **kw):
        if not started and threading.current_thread() is threading.main_thread():
            t = threading.Thread(target=other)
            started.append(t)
            t.start()
            assert arrived.wait(60)  # without a hold on the folder the other call runs to its end here
        return write(path, text, **kw)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(corpus_module, "atomic_write_text", first_write_lets_another_call_in)
    try:
        results[0] = make_corpus(tmp_path, seed=0)
    except FileExistsError as exc:
        results[0] = exc
    started[0].join()
    refused = [seed for seed, r in results.items() if isinstance(r, FileExistsError)]
    assert refused == [1], results
    assert assert_consistent(tmp_path)["seed"] == 0
    assert results[0].train.read_bytes() == make_corpus(tmp_path / "again", seed=0).train.read_bytes()


def test_a_valid_file_of_another_draw_is_not_left_beside_a_corpus_made_without_one(tmp_path):
    """With n_valid=0 a valid.jsonl already in the folder is left only when train and eval are the
    draw it was made with; one of another draw may share operand pairs with the new train.jsonl."""
    make_corpus(tmp_path, seed=0)
    (tmp_path / "eval.jsonl").unlink()  # lost, or deleted by hand
    before = on_disk(tmp_path)
    with pytest.raises(FileExistsError, match=r"valid\.jsonl.*force=True"):
        make_corpus(tmp_path, seed=1, n_train=2000, n_valid=0)
    assert on_disk(tmp_path) == before
    c = make_corpus(tmp_path, seed=1, n_train=2000, n_valid=0, force=True)
    assert c.valid is None and not (tmp_path / "valid.jsonl").exists()
    assert_consistent(tmp_path)
    # the same draw without a valid split keeps the valid file it drew (it shares no pair)
    same = tmp_path / "same"
    make_corpus(same, seed=0)
    valid = (same / "valid.jsonl").read_bytes()
    make_corpus(same, seed=0, n_valid=0)
    assert (same / "valid.jsonl").read_bytes() == valid
    assert_consistent(same)


def test_force_over_a_corpus_with_a_valid_split_leaves_no_stale_one_behind(tmp_path):
    make_corpus(tmp_path, seed=0)
    make_corpus(tmp_path, seed=5, n_train=2000, n_valid=0, force=True)
    assert not (tmp_path / "valid.jsonl").exists()
    assert_consistent(tmp_path)


def test_a_make_corpus_killed_between_files_is_finished_by_running_it_again(tmp_path, monkeypatch):
    make_corpus(tmp_path, seed=0, n_valid=0)
    write = corpus_module.atomic_write_text
    calls = []

    def killed_after_one(path, text, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(path)
        return write(path, text, **kw)

    monkeypatch.setattr(corpus_module, "atomic_write_text", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        make_corpus(tmp_path, seed=0)  # valid.jsonl written, the manifest not yet
    monkeypatch.setattr(corpus_module, "atomic_write_text", write)
    (tmp_path / ".train.jsonl.k1ll3d00.tmp").write_text("half a file")  # what a kill inside a write leaves
    with pytest.raises(FileExistsError):
        make_corpus(tmp_path, seed=1)  # another draw is still refused
    c = make_corpus(tmp_path, seed=0)
    assert c.manifest["counts"]["valid"] == 24 and assert_consistent(tmp_path)["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "eval.jsonl", "manifest.json", "probe.jsonl", "train.jsonl", "valid.jsonl"]


def test_seeds_that_would_not_draw_their_own_rows_are_refused(tmp_path):
    # random.Random(-3) draws what Random(3) draws, and None draws anew every call
    with pytest.raises(ValueError, match="seed must be at least 0, got -3"):
        make_corpus(tmp_path, seed=-3)
    for bad in (None, 1.5, "0", True):
        with pytest.raises(TypeError, match="seed must be an integer"):
            corpus_rows(bad)
    assert not tmp_path.joinpath("manifest.json").exists()


def test_numpy_integers_count_as_integers():
    assert corpus_rows(np.int64(3), np.int64(5), np.int32(2), np.int16(1)) == corpus_rows(3, 5, 2, 1)


@pytest.mark.parametrize("sizes", [(1, 1, 0), (1, 1, 1), (2, 1, 3), (1, 4094, 0), (4093, 1, 1)])
def test_splits_share_no_operand_pair_at_any_size_and_seed(sizes):
    for seed in range(3) if sizes[0] + sizes[1] > 100 else range(200):
        rows = corpus_rows(seed, *sizes)
        train, evals, valid = (operand_pairs(rows[k]) for k in ("train", "eval", "valid"))
        assert (len(train), len(evals), len(valid)) == sizes
        assert not train & evals and not train & valid and not evals & valid


# --------------------------------------------------------------------------- preference pairs


def run(rid: str, reply: str, score, *, machine: str = "tutor", minute: int | None = 0, question: str = "Q?") -> dict:
    r = {"id": rid, "machine": machine, "input": question, "history": [], "output": reply, "model": "m",
         "harness": "tinker", "trajectory": [{"role": "user", "content": question},
                                             {"role": "assistant", "content": reply}]}
    if minute is not None:
        r["startedAt"] = f"2026-11-01T18:{minute:02d}:00.000Z"
    if score is not None:
        r["scorecard"] = {"total": score, "criteria": {}}
    return r


def score_pairs(runs, **kw):
    return preference_pairs([], runs, machine={"name": None}, exclude=(), sources=["scores"], **kw)


def chosen_rejected(pairs):
    return [(p["chosen_run"], p["rejected_run"]) for p in pairs.to_dict("records")]


def test_a_nan_or_infinite_score_is_no_score():
    nan, inf = float("nan"), float("inf")
    pairs = score_pairs([run("r0", "a", nan), run("r1", "b", 1.0, minute=1), run("r2", "c", 0.0, minute=2)])
    assert chosen_rejected(pairs) == [("r1", "r2")]
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("r0", "score not a finite number")]
    assert list(pairs["chosen_score"]) == [1.0] and list(pairs["rejected_score"]) == [0.0]
    for scores in ([nan, nan], [1.0, nan], [inf, 0.0], [-inf, 1.0]):
        pairs = score_pairs([run(f"r{i}", f"reply {i}", s, minute=i) for i, s in enumerate(scores)])
        assert len(pairs) == 0, scores
        assert "tie (equal scores)" not in pairs.skipped_counts()


def test_equal_scores_and_times_choose_the_same_runs_whatever_order_the_runs_come_in():
    runs = [run("r1", "a", 1.0, minute=None), run("r2", "b", 1.0, minute=None), run("r3", "c", 0.0, minute=None),
            run("r4", "d", 0.0, minute=None)]
    assert chosen_rejected(score_pairs(runs)) == chosen_rejected(score_pairs(runs[::-1])) == [("r2", "r4")]


def test_a_gap_of_min_gap_is_a_pair_whatever_float_rounding_does():
    assert 0.35 - 0.1 < 0.25  # the gap as floats compute it
    assert chosen_rejected(score_pairs([run("a", "x", 0.35), run("b", "y", 0.1, minute=1)])) == [("a", "b")]
    assert len(score_pairs([run("a", "x", 0.34), run("b", "y", 0.1, minute=1)])) == 0


def test_good_and_bad_rows_of_different_machines_are_not_paired():
    turn = [{"role": "user", "content": "Compute 1 + 1."}]
    rows = [{"id": "g-a", "tag": "good", "machine": "a", "messages": turn + [{"role": "assistant", "content": "2"}]},
            {"id": "b-b", "tag": "bad", "machine": "b", "messages": turn + [{"role": "assistant", "content": "3"}]},
            {"id": "b-a", "tag": "bad", "machine": "a", "messages": turn + [{"role": "assistant", "content": "4"}]}]
    pairs = preference_pairs(rows, machine={"name": None}, exclude=())
    assert [(p["machine"], p["chosen_tag"], p["rejected_tag"]) for p in pairs.to_dict("records")] == [("a", "g-a", "b-a")]


def test_a_rewrite_whose_replaced_reply_is_blank_gives_no_unreadable_pair(tmp_path):
    turn = [{"role": "user", "content": "Compute 1 + 1."}, {"role": "assistant", "content": "answer: 2"}]
    rows = [{"id": "w", "tag": "good", "rewritten": True, "replaced": "  \n", "messages": turn},
            {"id": "ok", "tag": "good", "rewritten": True, "replaced": "1 + 1 = 2.", "messages": turn}]
    with pytest.warns(UserWarning, match=r"1 rewrite row\(s\) gave no pair.*\(w\)"):
        pairs = preference_pairs(rows, machine={"name": None}, exclude=())
    assert [p["chosen_tag"] for p in pairs.to_dict("records")] == ["ok"]
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("w", REPLACED_UNKNOWN)]
    path = write_pairs(pairs, tmp_path / "pairs.jsonl")
    assert len(read_pairs(path)) == 1


def test_a_result_whose_expected_answer_is_blank_gives_no_pair(tmp_path):
    import pandas as pd

    results = pd.DataFrame([
        {"input": "q1", "prompt": "q1", "expected": " ", "match": "exact", "output": "x", "correct": False,
         "error": None},
        {"input": "q2", "prompt": "q2", "expected": "answer: 2", "match": "exact", "output": "3", "correct": False,
         "error": None}])
    pairs = pairs_from_results(results)
    assert list(pairs["input"]) == ["q2"]
    assert len(read_pairs(write_pairs(pairs, tmp_path / "p.jsonl"))) == 1


def test_a_held_out_prompt_is_left_out_and_said_from_every_source():
    from machine_nb.data.export import HeldOutExcluded

    q = "What's 66 - 74?"
    turn = [{"role": "user", "content": q}]
    rows = [{"id": "g", "tag": "good", "messages": turn + [{"role": "assistant", "content": "answer: -8"}]},
            {"id": "b", "tag": "bad", "messages": turn + [{"role": "assistant", "content": "-7"}]},
            {"id": "w", "tag": "good", "rewritten": True, "replaced": "66 - 74 = -8.",
             "messages": turn + [{"role": "assistant", "content": "answer: -8"}]}]
    runs = [run("r1", "answer: -8", 1.0, question=q, machine=None), run("r2", "-9", 0.0, question=q, minute=1, machine=None)]
    with pytest.warns(HeldOutExcluded, match=r"left out 3 of 3"):
        pairs = preference_pairs(rows, runs, machine={"name": None}, exclude=["what's 66 - 74?"])
    # the /good row and the rewrite row both set answer: -8 over -7: one pair, left out once
    assert len(pairs) == 0 and sorted(p["source"] for p in pairs.excluded) == ["rewrite", "scores", "tags"]
    assert pairs.skipped_counts().to_dict() == {DUPLICATE: 1}


def test_the_cli_refuses_a_negative_seed_as_a_usage_error(tmp_path, capsys):
    from machine_nb.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["corpus", "-o", str(tmp_path / "c"), "--seed", "-1"])
    assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
