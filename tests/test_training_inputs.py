"""Training log dirs that a user finds damaged (hand-edited, half-copied, written by another tool)
read back with an error naming the file, line and field, or with a correct partial result: never
a bare TypeError from deep inside the reader, and never a TrainResult holding a wrong value."""

from __future__ import annotations

import json

import pytest

from machine_nb.errors import MachineFormatError
from machine_nb.training.runlog import heldout_curve, heldout_results, read_training_log, training_metrics


def log_dir(tmp_path, **files):
    """A log dir built by hand: each keyword a file (`metrics`, `checkpoints`, `heldout`: lists of rows
    written one JSON object a line; `marker`: the run record)."""
    d = tmp_path / "run"
    d.mkdir()
    names = {"metrics": "metrics.jsonl", "checkpoints": "checkpoints.jsonl", "heldout": "heldout.jsonl"}
    for key, value in files.items():
        if key == "marker":
            (d / "machine_nb.json").write_text(json.dumps(value))
        else:
            (d / names[key]).write_text("".join(json.dumps(r) + "\n" for r in value))
    return d


def step(i, loss=1.0, **extra):
    return {"step": i, "train_mean_nll": loss, "num_tokens": 10, **extra}


def heldout_line(i, **extra):
    return {"step": i, "accuracy": 0.5, "correct": 1, "n": 2, "rows": [], "parameters": {"max_tokens": 32},
            "prompt_tokens": 4, "output_tokens": 2, **extra}


def refused(fn, *, file, line, field):
    with pytest.raises(MachineFormatError) as info:
        fn()
    err = info.value
    assert err.path.endswith(file) and err.line == line and err.field == field, str(err)
    return str(err)


@pytest.mark.parametrize("bad", ["1", 1.5, True, [1]])
def test_a_metrics_step_that_is_not_a_whole_number_is_named(tmp_path, bad):
    d = log_dir(tmp_path, metrics=[step(0), step(bad)])
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=2, field="step")
    assert len(training_metrics(d)) == 2  # the plot's table keeps it, as a gap


@pytest.mark.parametrize("bad", ["10", [10], {"n": 10}])
def test_a_metrics_token_count_that_is_not_a_number_is_named(tmp_path, bad):
    d = log_dir(tmp_path, metrics=[step(0), step(1, num_tokens=bad)])
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=2, field="num_tokens")


def test_an_infinite_token_count_is_named(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 0, "train_mean_nll": 1.0, "num_tokens": 1e400}\n')
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=1, field="num_tokens")


def test_a_loss_of_true_is_not_a_loss(tmp_path):
    """JSON true is no loss: reading it as 1.0 would give a wrong first_loss."""
    d = log_dir(tmp_path, metrics=[step(0, loss=True)])
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=1, field="train_mean_nll")


def test_a_diverged_run_still_reads_back(tmp_path):
    """NaN and infinite losses are what a diverged run logs: they read back as they are."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 0, "train_mean_nll": 2.0, "num_tokens": 3}\n'
                                     '{"step": 1, "train_mean_nll": NaN, "num_tokens": 3}\n')
    result = read_training_log(d)
    assert result.steps == 2 and result.tokens == 6 and result.first_loss == 2.0


def test_a_heldout_score_without_a_step_is_named(tmp_path):
    d = log_dir(tmp_path, metrics=[step(0), {"train_mean_nll": 1.0, "test/accuracy": 0.5}])
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=2, field="step")


def test_a_heldout_accuracy_that_is_not_a_number_is_named(tmp_path):
    d = log_dir(tmp_path, metrics=[step(0, **{"test/accuracy": "0.5"})])
    refused(lambda: read_training_log(d), file="metrics.jsonl", line=1, field="test/accuracy")


def test_unconfirmed_steps_that_are_not_a_list_are_named(tmp_path):
    d = log_dir(tmp_path, metrics=[step(0)],
                checkpoints=[{"name": "000001", "batch": 1, "state_path": "tinker://s", "machine_nb_resume": True,
                              "unconfirmed": 5}])
    refused(lambda: read_training_log(d), file="checkpoints.jsonl", line=1, field="unconfirmed")


def test_a_checkpoint_path_that_is_not_text_is_named(tmp_path):
    """A final row whose sampler_path is not a string would read back complete with no checkpoint."""
    d = log_dir(tmp_path, metrics=[step(0)], checkpoints=[{"name": "final", "sampler_path": 3}])
    refused(lambda: read_training_log(d), file="checkpoints.jsonl", line=1, field="sampler_path")


@pytest.mark.parametrize("field, bad", [("n", "x"), ("correct", "1"), ("prompt_tokens", "4"),
                                        ("parameters", "greedy"), ("rows", [1, 2]), ("step", "0")])
def test_a_damaged_heldout_line_is_named(tmp_path, field, bad):
    d = log_dir(tmp_path, metrics=[step(0)], heldout=[heldout_line(0), heldout_line(1, **{field: bad})])
    for read in (lambda: heldout_curve(d), lambda: heldout_results(d), lambda: read_training_log(d)):
        refused(read, file="heldout.jsonl", line=2, field=field)


def test_a_run_record_with_a_wrong_estimate_reads_back_without_it(tmp_path):
    """The run record is read tolerantly: a value of the wrong type is left out, not passed on."""
    d = log_dir(tmp_path, metrics=[step(0)],
                marker={"kind": "dpo", "estimate": {"usd": "0.5", "tokens": 1.5}, "resumed_at": [True, 3], "steps": 5})
    result = read_training_log(d)
    assert result.estimated_usd is None and result.estimated_tokens is None
    assert result.resumed_at == [3]


def test_the_metrics_table_keeps_a_row_whose_step_is_text(tmp_path):
    """training_metrics feeds the loss plot, which shows a value of the wrong type as a gap: a row
    whose step is text is kept, after the numbered steps, instead of failing the sort."""
    d = log_dir(tmp_path, metrics=[step(1, loss=0.5), step("x", loss=0.7), step(0, loss=1.0), step(None, loss=0.9)])
    frame = training_metrics(d)
    assert frame["step"].tolist() == [0, 1, "x", None]
    assert frame["train_mean_nll"].tolist() == [1.0, 0.5, 0.7, 0.9]


@pytest.mark.parametrize("kind, file", [("sft", "train.jsonl"), ("dpo", "pairs.jsonl")])
def test_a_resume_whose_data_file_is_gone_is_refused_before_it_runs(tmp_path, kind, file):
    """A resumed run trains on the rows it started with (its own copy in the log dir). With that copy
    gone, the rows given to the call may differ: the resume is refused, naming the file, with the
    log dir left as it was."""
    import machine_nb as mnb

    d = tmp_path / "run"
    d.mkdir()
    (d / "machine_nb.json").write_text(json.dumps({"kind": kind, "model": "local/arith-tiny", "engine": "local",
                                                   "epochs": 1, "batch_size": 1, "steps": 2}))
    (d / "checkpoints.jsonl").write_text(json.dumps({"name": "000001", "epoch": 0, "batch": 1,
                                                     "state_path": "local://nowhere"}) + "\n")
    before = sorted(p.name for p in d.iterdir())
    row = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "answer: 2"}]}
    pair = {"prompt": [{"role": "user", "content": "1+1"}], "chosen": [{"role": "assistant", "content": "answer: 2"}],
            "rejected": [{"role": "assistant", "content": "answer: 3"}]}
    with pytest.raises(FileNotFoundError, match=file):
        if kind == "sft":
            mnb.sft([row, row], resume=d, progress=False)
        else:
            mnb.dpo([pair, pair], resume=d, progress=False)
    assert sorted(p.name for p in d.iterdir()) == before


def test_a_resumed_run_record_whose_heldout_lacks_a_setting_names_the_record(tmp_path):
    """A hand-edited machine_nb.json whose "heldout" lacks max_tokens gave a bare KeyError."""
    from machine_nb.training.loop import Resumed
    from machine_nb.training.train import SFTSettings

    record = {"kind": "sft", "heldout": {"every": 3, "temperature": 0.0}}
    with pytest.raises(MachineFormatError, match="max_tokens") as refused:
        SFTSettings.resolve(Resumed(tmp_path, record), model="local/arith-tiny")
    assert refused.value.path == str(tmp_path / "machine_nb.json")
