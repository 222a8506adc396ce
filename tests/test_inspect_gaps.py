"""Inspect logs a user gets from elsewhere, and logs written where another run's already lie.

Each log here is built by hand (an EvalResult written with write_inspect_log, then changed with
inspect_ai's own log API or, for what that API cannot write, as a zip): a damaged archive, a zip
bomb, a member path that leaves the archive, a sample twice, a score that is no grade, a sample
that lacks the log's first scorer, a log from a newer Inspect. Each is a clear error naming the
file and the sample, member or field, or a read whose rule is documented; none is a wrong accuracy.
Nothing here samples a model.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
import zipfile
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("inspect_ai")

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.evaluation import inspect_logs
from machine_nb.evaluation.results import EvalResult

MODEL = "thinkingmachines/Inkling-Small"


def result(correct, **summary) -> EvalResult:
    """Per-row results as evaluate() returns them, built by hand."""
    n = len(correct)
    rows = pd.DataFrame({
        "row": range(n), "prompt": [f"What is {i} plus {i}?" for i in range(n)],
        "expected": [str(2 * i) for i in range(n)], "match": ["exact"] * n,
        "output": [str(2 * i) if c else "no" for i, c in enumerate(correct)], "correct": list(correct)})
    return EvalResult(rows, {"name": "sums", "model": MODEL, "checkpoint": None, **summary})


def changed_log(tmp_path, change, correct=(True, False, True), name="changed.eval") -> Path:
    """A log of three rows, changed by `change(log)` through inspect_ai's log API and written again."""
    from inspect_ai.log import read_eval_log, write_eval_log

    path = Path(result(list(correct)).write_inspect_log(tmp_path / name))
    log = read_eval_log(str(path))
    change(log)
    write_eval_log(log, str(path))
    return path


def members(path) -> dict[str, bytes]:
    """A .eval log's members, decompressed (Inspect writes them with zstd, which zipfile cannot read)."""
    import zstandard

    out = {}
    with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
        for info in zf.infolist():
            fh.seek(info.header_offset)
            name_len, extra_len = struct.unpack("<HH", fh.read(30)[26:30])
            fh.seek(info.header_offset + 30 + name_len + extra_len)
            raw = fh.read(info.compress_size)
            out[info.filename] = (zstandard.ZstdDecompressor().stream_reader(raw).read()
                                  if info.compress_type == 93 else zf.read(info.filename))
    return out


def rezip(path, parts: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in parts.items():
            zf.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return Path(path)


# --------------------------------------------------------------------------- where write_inspect_log writes

def test_two_runs_final_checkpoints_write_their_inspect_logs_side_by_side(tmp_path, monkeypatch):
    """Two runs' final checkpoints both defaulted to eval_results/final.eval, the second replacing
    the first's log: it goes to final-2.eval with a warning; the same checkpoint again replaces its
    own log, and a file this toolkit did not write is left alone."""
    monkeypatch.chdir(tmp_path)
    run_a = dict(name="final", checkpoint="tinker://run-a/sampler_weights/final")
    first = result([True, False], **run_a).write_inspect_log()
    assert Path(first) == Path("eval_results") / "final.eval"
    with pytest.warns(UserWarning, match=r"final\.eval holds the results of tinker://run-a/sampler_weights/final"):
        second = result([False, False], name="final", checkpoint="tinker://run-b/sampler_weights/final").write_inspect_log()
    assert Path(second) == Path("eval_results") / "final-2.eval"
    assert mnb.load_results(first).summary["checkpoint"] == "tinker://run-a/sampler_weights/final"
    assert mnb.load_results(second).summary["checkpoint"] == "tinker://run-b/sampler_weights/final"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert result([True, True], **run_a).write_inspect_log() == first  # its own: replaced
    assert mnb.load_results(first).accuracy == 1.0

    (tmp_path / "eval_results" / "000020.eval").write_bytes(b"not ours")
    with pytest.warns(UserWarning, match=r"000020-2\.eval"):
        assert Path(result([True], name="000020").write_inspect_log()).name == "000020-2.eval"
    assert (tmp_path / "eval_results" / "000020.eval").read_bytes() == b"not ours"

    # beside a results JSON: another run's log of the same stem is not replaced either
    (tmp_path / "out").mkdir()
    theirs = result([True], checkpoint="tinker://run-c/sampler_weights/final").write_inspect_log(tmp_path / "out" / "r.eval")
    mine = EvalResult(result([False]).rows, {"name": "r", "model": MODEL, "checkpoint": None},
                      str(tmp_path / "out" / "r.json"))
    with pytest.warns(UserWarning, match=r"r\.eval holds the results of tinker://run-c"):
        assert Path(mine.write_inspect_log()).name == "r-2.eval"
    assert mnb.load_results(theirs).summary["checkpoint"] == "tinker://run-c/sampler_weights/final"


# --------------------------------------------------------------------------- scores

def test_a_sample_without_the_logs_first_scorer_is_unscored_not_scored_by_another(tmp_path):
    """A sample whose first scorer gave no score took another scorer's C and counted as correct."""
    from inspect_ai.scorer import Score

    def change(log):
        log.samples[1].scores = {"judge": Score(value="C")}
    path = changed_log(tmp_path, change)
    with pytest.warns(UserWarning, match=r"changed\.eval: 1 of 3 sample\(s\) have no 'match' score"):
        res = mnb.load_results(path)
    assert res.rows["correct"].tolist() == [True, False, True]
    assert res.rows["score"].isna().tolist() == [False, True, False]
    assert res.rows["scorer"].tolist() == ["match"] * 3
    assert res.accuracy == pytest.approx(2 / 3)


@pytest.mark.parametrize("value", ["garbage", [1, 0], 3, -1])
def test_a_score_that_is_no_grade_is_an_error_naming_the_file_sample_and_scorer(tmp_path, value):
    """'garbage' and [1, 0] were read as 0.0 (wrong) with only a log line; 3 counted as correct."""
    def change(log):
        log.samples[2].scores["match"].value = value
    path = changed_log(tmp_path, change)
    with pytest.raises(MachineFormatError, match=r"changed\.eval \(field 'samples\[id 3, epoch 1\]\.scores\.match'\)"):
        mnb.load_results(path)


def test_grades_inspect_reads_as_numbers_keep_their_meaning(tmp_path):
    """C, yes, True and 1 are full marks; P (0.5), I, N and 0 are not; NaN is no score."""
    values = ["C", "yes", True, 1, "P", "I", "N", 0, float("nan")]

    def change(log):
        for sample, value in zip(log.samples, values):
            sample.scores["match"].value = value
    path = changed_log(tmp_path, change, correct=[True] * len(values))
    with pytest.warns(UserWarning, match=r"1 of 9 sample\(s\) have no 'match' score"):
        res = mnb.load_results(path)
    assert res.rows["correct"].tolist() == [True] * 4 + [False] * 5
    assert [None if math.isnan(s) else s for s in res.rows["score"]] == [1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, None]


def test_a_scorer_with_several_values_is_read_at_the_logs_first_score(tmp_path):
    """A dict-valued scorer is listed in the log's results by key: the first key listed is read,
    not another scorer the sample also has."""
    from inspect_ai.log import EvalMetric, EvalScore
    from inspect_ai.scorer import Score

    def change(log):
        for sample, b in zip(log.samples, (0, 1, 1)):
            sample.scores = {"match": sample.scores["match"], "multi": Score(value={"a": 1, "b": b})}
        log.results.scores = [EvalScore(name="b", scorer="multi", metrics={"accuracy": EvalMetric(name="accuracy", value=2 / 3)}),
                              EvalScore(name="a", scorer="multi", metrics={}), *log.results.scores]
    res = mnb.load_results(changed_log(tmp_path, change))
    assert res.rows["correct"].tolist() == [False, True, True]
    assert res.rows["scorer"].tolist() == ["b"] * 3 and res.summary["inspect"]["scorer"] == "b"


# --------------------------------------------------------------------------- samples and fields

def test_a_sample_logged_twice_is_an_error_not_counted_twice(tmp_path):
    from inspect_ai.log import read_eval_log, write_eval_log

    path = Path(result([True, False]).write_inspect_log(tmp_path / "twice.json"))
    log = read_eval_log(str(path))
    log.samples.append(log.samples[0])
    write_eval_log(log, str(path), format="json")
    with pytest.raises(MachineFormatError, match=r"twice\.json \(field 'samples'\): sample 1 epoch 1 appears 2 times"):
        mnb.load_results(path)


def test_a_member_path_that_leaves_the_archive_is_refused(tmp_path):
    """samples/../../x.json was read as one more sample (counted twice in the accuracy)."""
    good = Path(result([True, False]).write_inspect_log(tmp_path / "good.eval"))
    parts = members(good)
    parts["samples/../../evil.json"] = parts["samples/1_epoch_1.json"]
    bad = rezip(tmp_path / "escape.eval", parts)
    with pytest.raises(MachineFormatError, match=r"escape\.eval \(field 'samples/\.\./\.\./evil\.json'\)"):
        mnb.load_results(bad)


def test_a_log_whose_field_is_not_inspects_names_the_field_and_the_member(tmp_path):
    good = Path(result([True, False]).write_inspect_log(tmp_path / "good.eval"))
    parts = members(good)
    header = json.loads(parts["header.json"])
    del header["eval"]["task"]
    with pytest.raises(MachineFormatError, match=r"notask\.eval \(field 'header\.json: eval\.task'\): Field required"):
        mnb.load_results(rezip(tmp_path / "notask.eval", {**parts, "header.json": json.dumps(header).encode()}))
    sample = json.loads(parts["samples/2_epoch_1.json"])
    sample["scores"]["match"]["value"] = None
    with pytest.raises(MachineFormatError, match=r"noscore\.eval \(field 'samples/2_epoch_1\.json: scores\.match\.value"):
        mnb.load_results(rezip(tmp_path / "noscore.eval", {**parts, "samples/2_epoch_1.json": json.dumps(sample).encode()}))


def test_a_log_from_a_newer_inspect_is_read_with_a_warning(tmp_path):
    """A newer log format's fields this inspect_ai does not know were dropped without a word."""
    good = Path(result([True, False, True]).write_inspect_log(tmp_path / "good.eval"))
    parts = members(good)
    header = json.loads(parts["header.json"])
    header["version"], header["eval"]["field_of_the_future"] = 99, {"x": 1}
    path = rezip(tmp_path / "newer.eval", {**parts, "header.json": json.dumps(header).encode()})
    with pytest.warns(UserWarning, match=r"newer\.eval: written in Inspect's log format version 99"):
        res = mnb.load_results(path)
    assert res.accuracy == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- damaged archives and zip bombs

def test_a_truncated_log_says_so(tmp_path):
    good = Path(result([True, False]).write_inspect_log(tmp_path / "good.eval"))
    cut = tmp_path / "cut.eval"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(MachineFormatError, match=r"cut\.eval: not an Inspect eval log: not a complete zip archive"):
        mnb.load_results(cut)


def _bomb(tmp_path, name, declared: int | None) -> Path:
    """A log whose sample member holds 4 MiB of spaces (4 KiB compressed), declaring `declared` bytes."""
    good = Path(result([True, False]).write_inspect_log(tmp_path / "good.eval"))
    parts = members(good)
    sample = parts["samples/1_epoch_1.json"]
    parts["samples/1_epoch_1.json"] = sample[:-1] + b" " * (4 << 20) + sample[-1:]
    path = rezip(tmp_path / name, parts)
    if declared is not None:  # the entry's size in its local header and the central directory
        data = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("samples/1_epoch_1.json")
        struct.pack_into("<I", data, info.header_offset + 22, declared)
        central = data.rindex(b"samples/1_epoch_1.json") - 46
        assert data[central:central + 4] == b"PK\x01\x02"
        struct.pack_into("<I", data, central + 24, declared)
        path.write_bytes(bytes(data))
    return path


def test_a_member_larger_than_the_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect_logs, "MAX_MEMBER_BYTES", 1 << 20)
    with pytest.raises(MachineFormatError, match=r"big\.eval \(field 'samples/1_epoch_1\.json'\): .*MAX_MEMBER_BYTES"):
        mnb.load_results(_bomb(tmp_path, "big.eval", None))


def test_a_member_that_expands_past_its_declared_size_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect_logs, "MAX_MEMBER_BYTES", 1 << 20)
    with pytest.raises(MachineFormatError, match=r"bomb\.eval \(field 'samples/1_epoch_1\.json'\): .*more than the 1,000 bytes it declares"):
        mnb.load_results(_bomb(tmp_path, "bomb.eval", 1000))


def test_a_log_larger_than_the_bound_in_all_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(inspect_logs, "MAX_LOG_BYTES", 1 << 20)
    with pytest.raises(MachineFormatError, match=r"all\.eval: .*MAX_LOG_BYTES"):
        mnb.load_results(_bomb(tmp_path, "all.eval", None))


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_named_like_an_eval_log_is_refused_without_waiting_for_a_writer(tmp_path):
    import os

    fifo = tmp_path / "final.eval"
    os.mkfifo(fifo)
    for read in (mnb.load_results, inspect_logs.check_archive):
        with pytest.raises(MachineFormatError, match="FIFO"):
            read(fifo)
    assert inspect_logs.log_run(fifo) is None
    # a results file's log written beside it, where the pipe lies: the pipe is passed over, never read
    res = result([True, False])
    res.path = str(tmp_path / "final.json")
    with pytest.warns(UserWarning, match="final-2.eval"):
        written = res.write_inspect_log()
    assert Path(written) == tmp_path / "final-2.eval" and fifo.exists()
