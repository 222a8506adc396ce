"""Workspace data a user really has: a tag store file reached through a symlink or left as a
FIFO, tag rows with a stray value among their messages, and a single name passed where a list of
names belongs. Each story builds a tiny store or a few runs on disk and checks what the user sees."""

import json
import os
import signal
import stat

import pytest

import machine_nb as mnb
from machine_nb.data.export import tagged_lines
from machine_nb.data.select import select_runs
from machine_nb.errors import MachineFormatError


def turn(q, a="a"):
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def ids_in(path):
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


def test_untag_through_a_symlinked_store_file_edits_the_file_it_points_to(tmp_path):
    """A user keeps train.jsonl elsewhere (a synced folder) and links it into the store: untag
    removes the row from that file and leaves the link, and the file's permissions, as they were."""
    store, elsewhere = tmp_path / "store", tmp_path / "synced"
    store.mkdir()
    elsewhere.mkdir()
    mnb.tag(turn("q1"), store=store, id="aaa111")
    mnb.tag(turn("q2"), store=store, id="bbb222")
    real = elsewhere / "train.jsonl"
    os.replace(store / "train.jsonl", real)
    os.chmod(real, 0o644)
    os.symlink(real, store / "train.jsonl")

    mnb.untag("aaa111", store=store)

    assert os.path.islink(store / "train.jsonl")
    assert ids_in(real) == ["bbb222"]
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o644
    assert list(mnb.tagged(store)["id"]) == ["bbb222"]


def test_untag_refuses_a_fifo_in_the_store_instead_of_waiting_forever(tmp_path):
    """A named pipe where a store file belongs would block a plain open until a writer comes;
    untag raises an error naming it (the row asked for could be in it)."""
    mnb.tag(turn("q1", "bad answer"), "bad", store=tmp_path, id="ccc333")
    os.mkfifo(tmp_path / "train.jsonl")

    def hung(*_):
        raise TimeoutError("untag blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        with pytest.raises(MachineFormatError, match=r"train\.jsonl.*FIFO"):
            mnb.untag("ccc333", store=tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_untag_of_an_unreadable_store_file_names_it(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    mnb.tag(turn("q1"), store=tmp_path, id="ddd444")
    os.chmod(tmp_path / "train.jsonl", 0)
    try:
        with pytest.raises(MachineFormatError, match=r"train\.jsonl: cannot read"):
            mnb.untag("ddd444", store=tmp_path)
    finally:
        os.chmod(tmp_path / "train.jsonl", 0o600)


@pytest.mark.parametrize("stray", ["oops", None, 7, ["nested"]])
def test_tagged_lines_skips_a_row_whose_messages_hold_a_non_object(tmp_path, stray):
    """A hand-edited row with a stray value among its messages is left out with its reason in
    `.skipped`; the good rows still become lines."""
    path = tmp_path / "train.jsonl"
    bad = {"id": "bad", "tag": "good", "messages": [stray, *turn("q1")]}
    good = {"id": "good", "tag": "good", "messages": turn("q2")}
    path.write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")

    lines = tagged_lines(mnb.tagged(tmp_path))

    assert [line["tag_id"] for line in lines] == ["good"]
    assert [(row["id"], why) for row, why in lines.skipped] == [("bad", "messages[0] is not a message object")]


def test_a_single_tag_name_for_include_means_that_tag(tmp_path):
    rows = [{"id": "g", "tag": "good", "messages": turn("q1")}, {"id": "o", "tag": "observed", "messages": turn("q2")}]
    assert [line["tag_id"] for line in tagged_lines(rows, include="good")] == ["g"]
    assert [line["tag_id"] for line in tagged_lines(rows, include="observed")] == ["o"]


def test_a_single_held_out_case_string_excludes_that_case_only(tmp_path):
    """exclude="<case>" holds that one case out; it is not read as a set of characters (which
    held out nothing longer than one character and so trained on the case)."""
    rows = [{"id": "held", "tag": "good", "messages": turn("What is 2+2?")},
            {"id": "kept", "tag": "good", "messages": turn("x")}]
    with pytest.warns(mnb.HeldOutExcluded):
        lines = tagged_lines(rows, exclude="what is 2+2?")
    assert [line["tag_id"] for line in lines] == ["kept"]
    runs = [{"id": f"r{i}", "machine": "m", "input": q, "model": "mod-a", "harness": "h",
             "scorecard": {"total": 1, "rubric": "fp"}, "trajectory": turn(q)} for i, q in enumerate(["What is 2+2?", "x"])]
    with pytest.warns(mnb.HeldOutExcluded):
        kept = select_runs(runs, {"name": "m", "rubric": "fp"}, exclude="What is 2+2?")
    assert [r["id"] for r in kept] == ["r1"]


def test_a_single_model_name_for_models_means_that_model():
    runs = [{"id": f"r{i}", "machine": "m", "input": f"q{i}", "model": model, "harness": "h",
             "scorecard": {"total": 1, "rubric": "fp"}, "trajectory": turn(f"q{i}")}
            for i, model in enumerate(["mod-a", "mod-b"])]
    assert [r["id"] for r in select_runs(runs, {"name": "m", "rubric": "fp"}, models="mod-a", exclude=())] == ["r0"]


def test_a_call_id_reused_in_a_later_step_is_judged_by_its_own_result(tmp_path):
    """A harness that numbers calls per reply sends "call_0" in every step: the failed first read
    is not trained on, the successful second one is, and load_runs and messages() count one
    failed call, the first."""
    run = {"id": "r1", "machine": "m", "harness": "h", "input": "read it", "scorecard": {"total": 1},
           "trajectory": [
               {"role": "user", "content": "read it"},
               {"role": "assistant", "content": "", "name": "read", "toolCallId": "call_0", "toolInput": {"p": "x"}},
               {"role": "tool", "name": "read", "toolCallId": "call_0", "content": "Error: no such file"},
               {"role": "assistant", "content": "", "name": "read", "toolCallId": "call_0", "toolInput": {"p": "y"}},
               {"role": "tool", "name": "read", "toolCallId": "call_0", "content": "the text"},
               {"role": "assistant", "content": "done"}]}
    folder = tmp_path / ".machine" / "runs" / "m"
    folder.mkdir(parents=True)
    (folder / "r1.json").write_text(json.dumps(run))

    runs = mnb.load_runs(tmp_path, index=False)
    assert runs.loc[0, "n_tool_calls"] == 2 and runs.loc[0, "n_failed_tool_calls"] == 1
    msgs = mnb.messages(runs)
    assert msgs.loc[msgs["is_tool_call"], "failed"].tolist() == [True, False]
    lines = mnb.training_lines(runs, {"name": "m"})
    steps = [line["messages"][-1] for line in lines]
    assert [json.loads(s["tool_calls"][0]["function"]["arguments"]) if s.get("tool_calls") else s["content"]
            for s in steps] == [{"p": "y"}, "done"]
    assert mnb.step_failed(run["trajectory"], 1) is True and mnb.step_failed(run["trajectory"], 3) is False


def test_one_store_file_that_cannot_be_read_is_named_and_the_others_load(tmp_path):
    """observed.jsonl left as a FIFO: tagged() and load_runs(store=) warn naming it and still show
    the rows of train.jsonl, as a bad run file does not hide the good ones."""
    from machine_nb.store.workspace import SkippedFiles

    run = {"id": "r1", "machine": "m", "input": "q", "trajectory": turn("q")}
    folder = tmp_path / "ws" / ".machine" / "runs" / "m"
    folder.mkdir(parents=True)
    (folder / "r1.json").write_text(json.dumps(run))
    store = tmp_path / "store"
    mnb.tag(run, store=store, id="eee555")
    os.mkfifo(store / "observed.jsonl")

    with pytest.warns(SkippedFiles, match=r"observed\.jsonl: a FIFO"):
        assert list(mnb.tagged(store)["id"]) == ["eee555"]
    with pytest.warns(SkippedFiles, match=r"observed\.jsonl: a FIFO"):
        runs = mnb.load_runs(tmp_path / "ws", store=store, index=False)
    assert runs["tags"].tolist() == [["good"]]


@pytest.mark.parametrize("best_of", [0, -1, 1.5, True])
def test_a_best_of_that_keeps_no_whole_number_of_runs_is_refused_naming_it(best_of):
    """best_of=-1 dropped each case's last run and 0 kept none, without a word."""
    runs = [{"id": f"r{i}", "machine": "m", "input": "q", "model": "mod-a", "harness": "h",
             "scorecard": {"total": 1, "rubric": "fp"}, "trajectory": turn("q")} for i in range(3)]
    with pytest.raises(ValueError, match=r"best_of must be a whole number, 1 or more"):
        select_runs(runs, {"name": "m", "rubric": "fp"}, best_of=best_of, exclude=())


def test_a_held_out_case_dict_without_an_input_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"held-out case 1 .* has no 'input'"):
        tagged_lines([{"id": "a", "tag": "good", "messages": turn("q")}], exclude=["x", {"expected": "y"}])


def test_tagging_into_a_store_file_that_is_a_fifo_or_a_folder_is_refused_naming_it(tmp_path):
    """An append opened a FIFO for writing and waited for a reader without end; a folder gave a bare
    IsADirectoryError. Both are refused naming the file, and nothing is written."""
    import threading

    store = tmp_path / "store"
    store.mkdir()
    os.mkfifo(store / "train.jsonl")
    said: list = []

    def tag_it() -> None:
        try:
            mnb.tag(turn("What is 1+1?"), "good", store=store)
        except Exception as exc:  # kept for the asserts below
            said.append(exc)

    t = threading.Thread(target=tag_it, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # still waiting on the FIFO: let it go before failing
        with open(store / "train.jsonl", "rb"):
            pass
        t.join(20)
        pytest.fail("tag() waited on a FIFO")
    assert len(said) == 1 and isinstance(said[0], MachineFormatError) and "train.jsonl" in str(said[0]), said
    assert "FIFO" in str(said[0]) or "fifo" in str(said[0]).lower(), said
    (store / "train.jsonl").unlink()
    (store / "train.jsonl").mkdir()
    with pytest.raises(MachineFormatError, match="train.jsonl"):
        mnb.tag(turn("What is 1+1?"), "good", store=store)
