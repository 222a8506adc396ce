"""The checks before training take whatever a user hands them: a folder, a named pipe or JSONL
text where a file's path was meant, a schedule the trainer would refuse, a secret in a field a
finding quotes, a DataFrame read from a JSONL file whose rows do not all carry the same keys. Each
gives a finding or an error that names the problem, never a traceback, a hang or a wrong verdict."""

import json
import os
import threading

import pandas as pd
import pytest

from machine_nb.checks.pricing import estimate_cost, estimate_dpo_cost
from machine_nb.checks.tokens import count_tokens
from machine_nb.checks.validate import preflight, validate
from machine_nb.errors import MachineFormatError

LOCAL = "local/arith-tiny"
INKLING = "thinkingmachines/Inkling"
KEY = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"


def qa(q="What is 2 plus 2?", a="answer: 4"):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def codes(result):
    return [(None if str(v) == "<NA>" else int(v), c) for v, c in zip(result.findings["line"], result.findings["code"])]


# --------------------------------------------------------------------------- not a regular file

@pytest.mark.parametrize("kind", ["auto", "train"])
def test_validate_a_folder_is_a_finding_not_a_traceback(tmp_path, kind):
    folder = tmp_path / "train.jsonl"
    folder.mkdir()
    r = validate(folder, LOCAL, kind=kind)
    assert not r.ok and codes(r) == [(None, "not_a_file")]
    assert str(folder) in r.findings["message"][0] and "folder" in r.findings["message"][0]


def test_validate_an_eval_file_that_is_a_folder_is_a_finding(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(qa()) + "\n")
    held = tmp_path / "eval.jsonl"
    held.mkdir()
    r = validate(train, LOCAL, eval_data=held)
    assert not r.ok and (None, "no_file") in codes(r)
    assert str(held) in " ".join(r.findings["message"])


def test_count_tokens_on_a_folder_names_it(tmp_path):
    folder = tmp_path / "train.jsonl"
    folder.mkdir()
    with pytest.raises(MachineFormatError, match="folder"):
        count_tokens(folder, LOCAL)


def _refused_in_time(call, fifo):
    """(returned in time, what `call` raised or returned). A call stuck opening the pipe is let go
    by opening its other end, so a failing test does not hang the run."""
    out = {}

    def run():
        try:
            out["value"] = call()
        except Exception as exc:  # the refusal under test
            out["value"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader's open returns; it reads EOF
        worker.join(10)
        return False, out.get("value")
    return True, out.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    in_time, r = _refused_in_time(lambda: validate(fifo, LOCAL, kind="train"), fifo)
    assert in_time, "validate waited on a named pipe"
    assert not r.ok and codes(r) == [(None, "not_a_file")] and "FIFO" in r.findings["message"][0]
    in_time, err = _refused_in_time(lambda: count_tokens(fifo, LOCAL), fifo)
    assert in_time, "count_tokens waited on a named pipe"
    assert isinstance(err, MachineFormatError) and "FIFO" in str(err)


# --------------------------------------------------------------------------- schedules

@pytest.mark.parametrize("schedule", [{"epochs": 1.5}, {"max_steps": 1.5}, {"batch_size": True}, {"epochs": "2"}])
def test_a_schedule_the_trainer_refuses_is_refused_not_priced(schedule):
    with pytest.raises(ValueError, match=next(iter(schedule))):
        estimate_cost([qa()] * 16, INKLING, **schedule)
    pair = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
            "rejected": [{"role": "assistant", "content": "b"}]}
    with pytest.raises(ValueError, match=next(iter(schedule))):
        estimate_dpo_cost([pair] * 16, INKLING, **schedule)


def test_numpy_whole_numbers_are_priced_as_the_trainer_takes_them():
    """sft takes numpy numbers (a DataFrame cell, an np.arange step) as the numbers they stand for:
    so does the estimate."""
    import numpy as np

    plain = estimate_cost([qa()] * 16, INKLING, epochs=2, batch_size=4, max_steps=5)
    assert estimate_cost([qa()] * 16, INKLING, epochs=np.int64(2), batch_size=np.int32(4),
                         max_steps=np.int64(5)).usd == plain.usd


# --------------------------------------------------------------------------- secrets in findings

@pytest.mark.parametrize("row,kind", [
    ({"messages": [{"role": KEY, "content": "q"}, {"role": "assistant", "content": "a"}]}, "train"),
    ({"messages": [{"role": "user", "content": [{"type": KEY}]}, {"role": "assistant", "content": "a"}]}, "train"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": KEY, "content": "x"},
                   {"role": "assistant", "content": "a"}]}, "train"),
    ({"messages": [{"role": "user", "content": "q"}], "expected": KEY, "match": "number"}, "eval"),
    ({"messages": [{"role": "user", "content": "q"}], "expected": "a", "match": KEY}, "eval"),
])
def test_a_secret_in_a_quoted_field_never_reaches_a_finding_whole(tmp_path, row, kind):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    for r in (validate(path, None, kind=kind), validate([row], None, kind=kind)):
        assert not r.ok and "secret" in set(r.findings["code"])
        text = " ".join(r.findings["message"]) + json.dumps(r.to_dict()) + r._repr_html_()
        assert KEY not in text and KEY[:20] not in text


# --------------------------------------------------------------------------- frames with missing cells

def test_a_frame_whose_rows_lack_some_keys_is_read_as_the_rows_were():
    plain = qa()
    with_tools = {**qa("list files", "a.txt"), "tools": [{"name": "ls", "description": "list", "parameters": {}}]}
    whole = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "yo", "trainable": True}], "whole_run": True}
    rows = [plain, with_tools, whole]
    frame = pd.DataFrame(rows)  # as pd.read_json(lines=True) gives: NaN where a row has no such key
    assert frame.isna().any().any()
    from_rows, from_frame = validate(rows, LOCAL), validate(frame, LOCAL)
    assert from_rows.ok and from_frame.ok, from_frame.findings
    assert codes(from_frame) == codes(from_rows)
    assert from_frame.summary == from_rows.summary
    assert preflight(frame, LOCAL).ok
    counted, want = count_tokens(frame, LOCAL), count_tokens(rows, LOCAL)
    assert counted["trained_tokens"].tolist() == want["trained_tokens"].tolist()
    assert estimate_cost(frame, LOCAL, batch_size=1).trained_tokens == want["trained_tokens"].sum()


# --------------------------------------------------------------------------- JSONL text for a path

def test_jsonl_text_given_for_a_path_says_so_briefly():
    text = "\n".join(json.dumps(qa("q" * 50)) for _ in range(40))  # longer than any file name may be
    for call in (lambda: validate(text, LOCAL), lambda: validate(text.splitlines()[0], LOCAL), lambda: count_tokens(text, LOCAL),
                 lambda: estimate_cost(text, INKLING)):
        with pytest.raises(ValueError) as err:
            call()
        said = str(err.value)
        assert "JSONL text, not a file path" in said and "json.loads" in said and len(said) < 400, said
