"""The minimal-SFT corpus: deterministic, held-out pairs disjoint, the eval set never silently replaced."""

import hashlib
import json
import re

import pytest

from machine_nb.cli import main
from machine_nb.data.corpus import ANSWER_FORMAT, PROBE_QUESTIONS, QUESTION_TEMPLATES, make_corpus
from machine_nb.core.jsonl import read_jsonl

QUESTION = re.compile(r"(\d+) (plus|minus|\+|-) (\d+)")


def parse(question):
    a, op, b = QUESTION.search(question).groups()
    return int(a), op in ("plus", "+"), int(b)


def test_rows_counts_and_shapes(tmp_path):
    c = make_corpus(tmp_path, seed=0)
    train, evals, probe = read_jsonl(c.train), read_jsonl(c.eval), read_jsonl(c.probe)
    assert (len(train), len(evals), len(probe)) == (48, 24, len(PROBE_QUESTIONS)) and len(probe) >= 8
    phrasings = [t for ts in QUESTION_TEMPLATES.values() for t in ts]
    for row in train:
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        a, plus, b = parse(user["content"])
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert assistant["content"] == f"answer: {a + b if plus else a - b}"
        assert "answer" not in user["content"].lower()  # the question never states the format
        assert any(re.fullmatch(re.escape(t).replace(r"\{a\}", r"\d+").replace(r"\{b\}", r"\d+"), user["content"])
                   for t in phrasings)
    for row in evals:
        assert set(row) == {"messages", "expected", "match", "format"} and row["match"] == "exact"
        assert row["format"] == ANSWER_FORMAT and re.fullmatch(row["format"], row["expected"])
        a, plus, b = parse(row["messages"][0]["content"])
        assert row["expected"] == f"answer: {a + b if plus else a - b}"
    assert any(r["expected"].startswith("answer: -") for r in evals + [
        {"expected": t["messages"][1]["content"]} for t in train])  # negative results occur
    for row in probe:
        assert row["expected_natural"] and not QUESTION.search(row["messages"][0]["content"])


def test_eval_pairs_are_disjoint_from_train_pairs(tmp_path):
    for seed in range(5):
        c = make_corpus(tmp_path / str(seed), seed=seed)
        pairs = lambda rows: {frozenset(parse(r["messages"][0]["content"])[::2]) for r in rows}  # noqa: E731
        train, evals, valid = pairs(read_jsonl(c.train)), pairs(read_jsonl(c.eval)), pairs(read_jsonl(c.valid))
        assert len(train) == 48 and len(evals) == 24 and len(valid) == 24
        assert not train & evals and not train & valid and not evals & valid


# sha256 of train and eval per seed: notebooks and reports rely on these bytes, and the valid split
# (drawn after them) must not change them
PINNED_SHA = {0: ("88452358ca42", "d5f030df5d83"), 1: ("82abf0324bc5", "1a2b4d15137d"),
                7: ("b01d35a17164", "9baea8fd7084")}


def test_the_valid_split_leaves_train_eval_and_probe_byte_identical(tmp_path):
    for seed, (train_sha, eval_sha) in PINNED_SHA.items():
        c = make_corpus(tmp_path / str(seed), seed=seed)
        assert hashlib.sha256(c.train.read_bytes()).hexdigest()[:12] == train_sha
        assert hashlib.sha256(c.eval.read_bytes()).hexdigest()[:12] == eval_sha
        assert hashlib.sha256(c.probe.read_bytes()).hexdigest()[:12] == "ffebfb7c1386"
        none = make_corpus(tmp_path / f"{seed}-none", seed=seed, n_valid=0)
        assert none.valid is None and not (none.out_dir / "valid.jsonl").exists()
        assert none.train.read_bytes() == c.train.read_bytes() and none.eval.read_bytes() == c.eval.read_bytes()
    rows = read_jsonl(c.valid)
    assert len(rows) == 24 and all(set(r) == {"messages", "expected", "match", "format"} for r in rows)


def test_same_seed_is_byte_identical_and_another_seed_draws_anew(tmp_path):
    a, b, c = make_corpus(tmp_path / "a", seed=7), make_corpus(tmp_path / "b", seed=7), make_corpus(tmp_path / "c", seed=8)
    for name in ("train.jsonl", "eval.jsonl", "valid.jsonl", "probe.jsonl", "manifest.json"):
        assert (a.out_dir / name).read_bytes() == (b.out_dir / name).read_bytes()
    assert a.train.read_bytes() != c.train.read_bytes() and a.eval.read_bytes() != c.eval.read_bytes()
    assert a.valid.read_bytes() != c.valid.read_bytes()


def test_manifest_records_seed_counts_and_checksums(tmp_path):
    c = make_corpus(tmp_path, seed=3)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest == c.manifest and manifest["seed"] == 3 and manifest["generator_version"] >= 1
    assert manifest["counts"] == {"train": 48, "eval": 24, "probe": len(PROBE_QUESTIONS), "valid": 24}
    assert set(manifest["files"]) == {"train.jsonl", "eval.jsonl", "probe.jsonl", "valid.jsonl"}
    for name, info in manifest["files"].items():
        assert info["sha256"] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert "seed 3" in c._repr_html_()


def test_a_differing_eval_file_is_never_silently_replaced(tmp_path):
    make_corpus(tmp_path, seed=0)
    before = (tmp_path / "eval.jsonl").read_bytes(), (tmp_path / "train.jsonl").read_bytes()
    make_corpus(tmp_path, seed=0)  # same rows: fine
    with pytest.raises(FileExistsError, match="force=True"):
        make_corpus(tmp_path, seed=1)
    assert ((tmp_path / "eval.jsonl").read_bytes(), (tmp_path / "train.jsonl").read_bytes()) == before
    make_corpus(tmp_path, seed=1, force=True)
    assert (tmp_path / "eval.jsonl").read_bytes() != before[0]


def test_a_differing_valid_file_is_never_silently_replaced(tmp_path):
    make_corpus(tmp_path, seed=0)
    (tmp_path / "valid.jsonl").write_text((tmp_path / "valid.jsonl").read_text().replace("answer", "Answer"))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match="valid.jsonl"):
        make_corpus(tmp_path, seed=0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert make_corpus(tmp_path, seed=0, force=True).manifest["counts"]["valid"] == 24


@pytest.mark.parametrize("name", ["train.jsonl", "probe.jsonl", "valid.jsonl", "eval.jsonl", "manifest.json"])
def test_files_the_corpus_did_not_write_are_never_replaced(tmp_path, name, capsys):
    mine = tmp_path / name
    mine.write_text('{"my": "own rows"}\n')
    with pytest.raises(FileExistsError, match=re.escape(str(mine))):
        make_corpus(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [name] and mine.read_text() == '{"my": "own rows"}\n'
    assert main(["corpus", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(mine) in err and "--force" in err
    assert [p.name for p in tmp_path.iterdir()] == [name]
    make_corpus(tmp_path, force=True)  # asked for in so many words, as for a held-out file
    assert mine.read_text() != '{"my": "own rows"}\n'


def test_a_corpus_file_changed_since_it_was_written_is_kept(tmp_path):
    make_corpus(tmp_path, seed=0)
    train = tmp_path / "train.jsonl"
    with train.open("a") as f:  # the user's own extra row: no longer the file make_corpus wrote
        f.write('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "answer: 1"}]}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(FileExistsError, match=re.escape(str(train))):
        make_corpus(tmp_path, seed=0)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_symlinked_corpus_file_is_refused_and_its_target_untouched(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text("mine\n")
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "probe.jsonl").symlink_to(outside)
    with pytest.raises(FileExistsError, match="probe.jsonl"):
        make_corpus(out)
    assert outside.read_text() == "mine\n" and (out / "probe.jsonl").is_symlink()
    assert [p.name for p in out.iterdir()] == ["probe.jsonl"]


def test_its_own_files_are_replaced_and_identical_ones_left_alone(tmp_path):
    first = make_corpus(tmp_path, seed=0)
    make_corpus(tmp_path, seed=0, n_valid=0)  # a new manifest over its own: no force needed
    assert "valid.jsonl" not in json.loads((tmp_path / "manifest.json").read_text())["files"]
    assert make_corpus(tmp_path, seed=0).manifest == first.manifest  # the valid file is the same bytes: kept
    assert json.loads((tmp_path / "manifest.json").read_text()) == first.manifest


def test_a_forced_redraw_cut_off_between_files_leaves_no_manifest_vouching_for_a_mix(tmp_path, monkeypatch):
    """make_corpus(force=True) with another seed, killed after it wrote train.jsonl and before
    eval.jsonl: the folder then holds two draws, whose rows may share operand pairs. No manifest
    vouches for them, so the next make_corpus refuses them (as files it did not write) until forced."""
    from machine_nb.data import corpus as corpus_mod

    make_corpus(tmp_path, seed=0)
    write = corpus_mod.atomic_write_text

    def killed_after_the_first(path, *args, **kwargs):
        write(path, *args, **kwargs)
        raise KeyboardInterrupt  # the process ends here

    monkeypatch.setattr(corpus_mod, "atomic_write_text", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        make_corpus(tmp_path, seed=1, force=True)
    monkeypatch.undo()
    assert not (tmp_path / "manifest.json").exists()
    with pytest.raises(FileExistsError, match="was not written by make_corpus"):
        make_corpus(tmp_path, seed=0)
    fresh = make_corpus(tmp_path, seed=1, force=True)
    assert fresh.manifest["seed"] == 1 and (tmp_path / "manifest.json").exists()
    assert make_corpus(tmp_path, seed=1).manifest == fresh.manifest  # whole again: taken as it is


def test_cli(tmp_path, capsys):
    assert main(["corpus", "--out", str(tmp_path), "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "eval.jsonl: 24 rows" in out and "valid.jsonl: 24 rows" in out
    assert main(["corpus", "--out", str(tmp_path / "v"), "--valid-rows", "10"]) == 0
    assert "valid.jsonl: 10 rows" in capsys.readouterr().out
    assert main(["corpus", "--out", str(tmp_path), "--seed", "5"]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["corpus", "--out", str(tmp_path), "--seed", "5", "--force"]) == 0


def test_the_corpus_passes_validation_with_the_inkling_renderer(tmp_path):
    from machine_nb.checks.validate import validate

    c = make_corpus(tmp_path)
    train = validate(c.train, "thinkingmachines/Inkling-Small", eval_data=c.eval)
    evals = validate(c.eval, "thinkingmachines/Inkling-Small")
    assert train.ok and evals.ok and train.findings.empty and evals.findings.empty
    assert (train.summary["kind"], train.summary["rows"], evals.summary["kind"]) == ("train", 48, "eval")


def test_impossible_counts_are_refused_at_once_naming_the_maximum(tmp_path):
    from machine_nb.data.corpus import MAX_ROWS, corpus_rows

    assert MAX_ROWS == 90 * 91 // 2  # distinct unordered pairs of two-digit operands
    for n_train, n_eval in ((4000, 200), (MAX_ROWS, 1)):
        with pytest.raises(ValueError, match="4,095") as err:
            make_corpus(tmp_path / "big", n_train=n_train, n_eval=n_eval)
        assert f"{n_train + n_eval + 24:,}" in str(err.value) and "24 valid" in str(err.value)
    with pytest.raises(ValueError, match="4,095"):
        make_corpus(tmp_path / "big", n_train=MAX_ROWS - 95, n_eval=95)  # room for no valid rows
    with pytest.raises(ValueError, match="n_valid must be at least 0"):
        make_corpus(tmp_path / "big", n_valid=-1)
    for n_train, n_eval in ((0, 24), (48, 0), (-1, 24), (48, -5)):
        with pytest.raises(ValueError, match="at least 1"):
            make_corpus(tmp_path / "none", n_train=n_train, n_eval=n_eval)
        with pytest.raises(ValueError, match="at least 1"):
            corpus_rows(0, n_train, n_eval)
    for bad in (2.5, "48", True):
        with pytest.raises(TypeError):
            corpus_rows(0, bad, 24)
    assert not (tmp_path / "big").exists() and not (tmp_path / "none").exists()


def test_the_largest_corpus_is_drawn_whole_and_disjoint():
    from machine_nb.data.corpus import MAX_ROWS, corpus_rows

    rows = corpus_rows(0, MAX_ROWS - 95, 95)
    pairs = lambda rs: [frozenset(parse(r["messages"][0]["content"])[::2]) for r in rs]  # noqa: E731
    train, evals = pairs(rows["train"]), pairs(rows["eval"])
    assert len(set(train)) == MAX_ROWS - 95 and len(set(evals)) == 95 and not set(train) & set(evals)
    rows = corpus_rows(0, MAX_ROWS - 120, 95, 25)
    train, evals, valid = pairs(rows["train"]), pairs(rows["eval"]), pairs(rows["valid"])
    assert len(set(train) | set(evals) | set(valid)) == MAX_ROWS


def test_cli_refuses_impossible_and_zero_counts(tmp_path, capsys):
    assert main(["corpus", "--out", str(tmp_path / "c"), "--train-rows", "4000", "--eval-rows", "200"]) == 1
    err = capsys.readouterr().err
    assert "4,095" in err and "4,224" in err
    assert main(["corpus", "--out", str(tmp_path / "c"), "--eval-rows", "0"]) == 1
    assert "at least 1" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
