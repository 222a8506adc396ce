"""Training log dirs, the runner child and DPO's pairs at their edges, as a user meets them: a
held-out file cut mid-character by a crash reads back quietly; a stepless Inspect row or a NaN score
never breaks the curve or the best step; two runs of one name stay apart; a log dir name stays inside
its folder and a link to nothing is named; a failed run's traceback and error text carry no secret,
and a log that cannot be opened is reported, not a silent exit; eval_every=0 runs no Inspect tasks
while training; pairs in the wrong shape, as a generator, from Parquet, with no prompt or a missing
id are refused or scored as they should be; a DPO resume reads an odd run record and names a
damaged checkpoint row."""

from __future__ import annotations

import io
import json
import os
import warnings

import pandas as pd
import pytest

from machine_nb.errors import MachineFormatError
from machine_nb.training import runner
from machine_nb.training.loop import Resumed
from machine_nb.training.preference import DPOSettings, score_pairs
from machine_nb.training.runlog import (heldout_curve, new_log_dir, read_log_lines, read_training_log,
                                        training_metrics)


def log_dir(tmp_path, **files):
    """A log dir built by hand: `metrics`, `checkpoints`, `heldout` (rows, one JSON object a line)
    and `marker` (the run record)."""
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


def heldout_line(i, output="ok"):
    return {"step": i, "accuracy": 1.0, "correct": 1, "n": 1, "rows": [{"output": output}],
            "parameters": {"max_tokens": 32}, "prompt_tokens": 4, "output_tokens": 2}


# ---------------------------------------------------------------------------------------------
# reading a log dir


def test_a_held_out_line_cut_inside_a_character_reads_back_quietly_as_a_truncated_last_line(tmp_path):
    """heldout.jsonl keeps model outputs as UTF-8; a crash (or a read while the line is written)
    can cut its last line inside a character. That is the usual partial last line, not a file in
    another encoding: it is skipped without a warning, as any partial last line is."""
    d = log_dir(tmp_path, metrics=[step(0), step(1)])
    whole = (json.dumps(heldout_line(0, "é"), ensure_ascii=False) + "\n").encode()
    cut = (json.dumps(heldout_line(1, "日本"), ensure_ascii=False) + "\n").encode()
    (d / "heldout.jsonl").write_bytes(whole + cut[:cut.index("日".encode()) + 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        curve = heldout_curve(d)
        assert list(curve["step"]) == [0]
        assert read_training_log(d).steps == 2
    # a damaged line that is not the last one still warns, naming it
    (d / "heldout.jsonl").write_bytes(cut[:cut.index("日".encode()) + 1] + b"\n" + whole)
    with pytest.warns(UserWarning, match=r"heldout\.jsonl:1: not UTF-8"):
        assert [r["step"] for r in read_log_lines(d / "heldout.jsonl")] == [0]


@pytest.mark.parametrize("bad_step", [None, "3"])
def test_an_inspect_score_without_a_whole_step_leaves_the_curve_drawable(tmp_path, bad_step):
    """An Inspect score whose row has no step (or a step as text: a hand-edited line) cannot be
    placed on the curve: it is left out, and the other steps' scores are drawn."""
    bad = {"test/inspect/arith/accuracy": 0.25}
    if bad_step is not None:
        bad["step"] = bad_step
    d = log_dir(tmp_path, metrics=[step(0, **{"test/inspect/arith/accuracy": 0.5}), bad, step(1)],
                heldout=[heldout_line(0), heldout_line(1)])
    curve = heldout_curve(d)
    assert list(curve["step"]) == [0, 1]
    assert curve["inspect:arith"].tolist()[0] == 0.5 and pd.isna(curve["inspect:arith"].tolist()[1])


def test_a_nan_held_out_score_is_never_the_best_step(tmp_path):
    """max() keeps a NaN it meets first, so a diverged step's NaN score was reported as the best."""
    d = log_dir(tmp_path, metrics=[step(0, **{"test/accuracy": float("nan")}), step(1, **{"test/accuracy": 0.7}),
                                   step(2, **{"test/accuracy": 0.4})])
    result = read_training_log(d)
    assert (result.best_step, result.best_accuracy, result.evals) == (1, 0.7, 3)
    (tmp_path / "b").mkdir()
    only_nan = read_training_log(log_dir(tmp_path / "b", metrics=[step(0, **{"test/accuracy": float("nan")})]))
    assert only_nan.best_step is None and only_nan.best_accuracy is None


# ---------------------------------------------------------------------------------------------
# making log dirs


@pytest.mark.parametrize("name", ["../../elsewhere", "a/b", "/tmp/outside", "..", ".", "a\\b", ""])
def test_a_log_dir_name_that_is_a_path_is_refused(tmp_path, name):
    """`name` is the log dir's name under the workspace's training folder (or runs/): a name that
    is a path would put the run (and its chmod 0700) somewhere else, outside that folder."""
    if name == "":
        assert new_log_dir("sft", workspace=tmp_path, name=name).parent == tmp_path / ".machine" / "training"
        return
    with pytest.raises(ValueError, match=r"name=.*a folder name"):
        new_log_dir("sft", workspace=tmp_path, name=name)
    assert not (tmp_path / ".machine").exists()
    assert new_log_dir("sft", workspace=tmp_path, name="lr-3e-4 run").name == "lr-3e-4 run"


# ---------------------------------------------------------------------------------------------
# the runner child's error report


def test_a_failed_runs_traceback_and_error_text_carry_no_secret(monkeypatch, capsys):
    """The child writes the traceback of a failed run into train.log and sends its text to the
    caller: an exception holding the API key, or a base URL's password, is redacted in both."""
    key, password = "tml-abcdefghijklmnop0123456789", "hunter2-pass-word"
    monkeypatch.setenv("TINKER_API_KEY", key)
    monkeypatch.setenv("TINKER_BASE_URL", f"https://me:{password}@gateway.example/v1")

    class SdkError(Exception):
        body = {"detail": f"bad key {key}"}

    status = io.StringIO()
    try:
        raise SdkError(f"could not reach https://me:{password}@gateway.example/v1 with {key}")
    except SdkError as exc:
        runner.report_error(status, exc)
    log = capsys.readouterr().err
    sent = json.loads(status.getvalue())
    assert "SdkError" in log and "could not reach" in log and "[redacted]" in log
    assert sent["event"] == "error" and sent["type"] == "SdkError" and "could not reach" in sent["message"]
    for text in (log, status.getvalue()):
        assert key not in text and password not in text


def test_an_error_whose_body_is_not_json_is_still_reported(capsys):
    """A body the status line cannot hold as JSON (bytes, a date) must not end the child before it
    reports: the caller would see only "the training process ended unexpectedly"."""
    class SdkError(Exception):
        body = {"detail": b"raw bytes", "when": object()}

    status = io.StringIO()
    try:
        raise SdkError("server said no")
    except SdkError as exc:
        runner.report_error(status, exc)
    sent = json.loads(status.getvalue())
    assert sent["event"] == "error" and sent["message"] == "server said no"
    assert sent["body"]["detail"] == "b'raw bytes'"
    assert "server said no" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# DPO's pairs


def pair(question="What is 2+2?", chosen="4", rejected="5", **extra):
    return {"prompt": [{"role": "user", "content": question}], "chosen": [{"role": "assistant", "content": chosen}],
            "rejected": [{"role": "assistant", "content": rejected}], **extra}


@pytest.fixture
def fake_sampler(monkeypatch):
    """score_pairs against a stand-in model: each token's log-probability is -0.5, except that every
    token of a reply starting with "4" scores -0.1 (the model prefers the right answer)."""
    from machine_nb.evaluation import sampling

    class Future:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    class Client:
        def compute_logprobs(self, model_input):
            ints = model_input.to_ints()
            return Future([None] + [-0.5] * (len(ints) - 1))

    monkeypatch.setattr(sampling, "open_sampler", lambda target: Client())


def test_score_pairs_takes_pairs_as_a_generator(fake_sampler):
    """The pairs are read once: a generator (or any iterator) gives every pair its row."""
    scored = score_pairs(p for p in [pair(source="mine"), pair("What is 3+3?", "6", "7")])
    assert len(scored) == 2 and list(scored["row"]) == [0, 1]
    assert scored["source"][0] == "mine" and pd.isna(scored["source"][1])
    assert list(scored["expected"]) == ["4", "6"]


def test_a_pair_id_missing_from_a_frame_row_is_computed(fake_sampler):
    """A pairs frame with rows added by hand (pd.concat) holds NaN in `pair` for them: the id is
    computed, never NaN, so compare() can match the rows of two score frames."""
    frame = pd.concat([pd.DataFrame([pair(pair="abc123abc123")]), pd.DataFrame([pair("What is 3+3?", "6", "7")])],
                      ignore_index=True)
    assert pd.isna(frame.loc[1, "pair"])
    ids = list(score_pairs(frame)["pair"])
    assert ids[0] == "abc123abc123" and isinstance(ids[1], str) and len(ids[1]) == 12


@pytest.mark.parametrize("given, field, line", [
    (pair(), None, None),  # one pair, not a list of them
    ([pair(), ("prompt", "chosen")], None, 2),
    ([pair(), "pairs.jsonl"], None, 2),
])
def test_pairs_in_the_wrong_shape_are_refused_naming_the_pair(given, field, line):
    with pytest.raises(MachineFormatError) as info:
        score_pairs(given)
    err = info.value
    assert err.line == line and err.field == field, str(err)
    assert "pair" in str(err)


def test_pairs_that_are_not_pairs_at_all_are_refused_clearly():
    with pytest.raises(TypeError, match=r"pairs must be .*not None"):
        score_pairs(None)


@pytest.mark.parametrize("prompt", [[], [{"role": "user", "content": ""}], [{"role": "user", "content": "  \n"}]])
def test_a_pair_with_an_empty_prompt_is_refused(prompt):
    """A pair without a prompt trains the model to prefer one reply to nothing in particular: the
    pair is refused naming it, before anything runs."""
    bad = {**pair(), "prompt": prompt}
    with pytest.raises(MachineFormatError, match="no text") as info:
        score_pairs([pair(), bad])
    assert info.value.line == 2 and info.value.field == "prompt"


# ---------------------------------------------------------------------------------------------
# DPO resume and its run record


@pytest.mark.parametrize("recorded", [None, "3", [3, "x"]])
def test_a_dpo_resume_reads_a_run_record_whose_resumed_at_is_not_a_list_of_steps(tmp_path, recorded):
    """A run record written by another version (or edited) with `resumed_at` null or odd: the
    resume records its own step among the whole-number ones there, instead of a TypeError."""
    d = log_dir(tmp_path, checkpoints=[{"name": "000004", "state_path": "tinker://x/weights/4", "epoch": 0,
                                        "batch": 4}])
    update = DPOSettings.resume_update(None, Resumed(d, {"kind": "dpo", "resumed_at": recorded, "steps": 10}), 5, 10)
    expected = sorted({4, 3} if isinstance(recorded, list) else {4})
    assert update == {"resumed_at": expected, "steps": 10}


def test_two_runs_of_one_name_stay_apart_in_the_metrics_table(tmp_path):
    """Two sweeps' runs of one name (each sweep's `run`) read together: each keeps its own rows
    under its own `run`, instead of one run with every step twice."""
    (tmp_path / "sweep-a").mkdir()
    (tmp_path / "sweep-b").mkdir()
    a = log_dir(tmp_path / "sweep-a", metrics=[step(0, 2.0), step(1, 1.0)])
    b = log_dir(tmp_path / "sweep-b", metrics=[step(0, 3.0)])
    table = training_metrics([a, b])
    assert table.groupby("run")["step"].apply(list).to_dict() == {str(a): [0, 1], str(b): [0]}
    assert list(training_metrics(a)["run"]) == ["run", "run"]  # a name alone when it is the only one


def test_a_log_dir_that_is_a_link_to_nothing_is_named_as_such(tmp_path):
    """A log_dir that is a symlink whose folder is gone (or not made yet): the refusal says so,
    instead of mkdir's bare "File exists" about a path that does not exist."""
    from machine_nb.training.runlog import claim_log_dir

    link = tmp_path / "latest"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(FileExistsError, match=r"is a link to .*gone.*which does not exist"):
        claim_log_dir(link, resume=False)
    assert not (tmp_path / "gone").exists()
    (tmp_path / "gone").mkdir()
    claim_log_dir(link, resume=False)  # a link to an empty folder is a log dir like any other


@pytest.mark.parametrize("every, expected", [(None, 5), (0, 0), (2, 2)])
def test_inspect_tasks_run_while_training_as_eval_every_says(every, expected):
    """eval_every=0 means no evals while training (the final checkpoint alone is scored), so the
    Inspect tasks are not run once an epoch then; None means once an epoch."""
    assert runner.inspect_every({"tasks": ["t"], "every": every}, 5) == expected


def _runner_child(preload: tuple = (), restarts: bool | None = None, poll: bool = True, env: dict | None = None):
    """The runner child (runner.main) with PRELOAD set to `preload`, RESTARTS to `restarts` (None: as
    on this platform), and select.poll taken away unless `poll` (as on Windows); pipes on its stdin and
    stdout."""
    import subprocess
    import sys

    code = (("" if poll else "import select; del select.poll; ")
            + f"import machine_nb.training.runner as r; r.PRELOAD = {preload!r}; "
            + ("" if restarts is None else f"r.RESTARTS = {restarts}; ")
            + "from machine_nb.core.process import end_process; end_process(r.main())")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)


def _serve_one(spec, restarts: bool, poll: bool = True):
    """The runner child (preloading nothing; runner.RESTARTS set to `restarts`; select.poll taken
    away unless `poll`, as on Windows) given `spec`: its status lines after "ready", and its exit
    code. Its stdin stays open, as the parent keeps it, until the run's outcome; where a new worker
    follows a failed run (`restarts`), `spec` goes once more, and the child must serve it too (its
    outcome is in the events) before its stdin closes and it ends."""
    import threading

    proc = _runner_child(restarts=restarts, poll=poll)
    guard = threading.Timer(60, proc.kill)  # never a hung test, whatever the child does
    guard.start()
    try:
        assert json.loads(proc.stdout.readline()) == {"event": "ready", "restarts": restarts}
        events = []
        for _ in range(2 if restarts else 1):
            proc.stdin.write((json.dumps(spec) + "\n").encode())
            proc.stdin.flush()
            events.append(json.loads(proc.stdout.readline()))
        if restarts:
            proc.stdin.close()
        events += [json.loads(line) for line in proc.stdout]
        return events, proc.wait()
    finally:
        guard.cancel()
        proc.kill()
        if not proc.stdin.closed:
            proc.stdin.close()
        proc.stdout.close()


def test_stop_keeps_a_process_whose_ready_line_is_read_only_after_the_interrupt_was_sent():
    """The parent stops a run before it has read the child's "ready" line (a child started a moment
    ago, on a busy machine): the run's "interrupted", which comes after that line, ends the wait,
    and the process that said it restarts is not killed (it would be, after the graces, were the
    "ready" line read only once, when stop began)."""
    import threading

    from machine_nb.training.loop import _Runner

    runner = _Runner.__new__(_Runner)

    class Child:  # the runner process: its lines arrive once the first SIGINT has gone
        returncode = None
        stdin = io.BytesIO()

        def poll(self):
            return self.returncode

        def send_signal(self, signum):
            threading.Thread(target=lines_arrive).start()

        def kill(self):
            self.returncode = -9

        def wait(self, timeout=None):
            return self.returncode

    def lines_arrive() -> None:
        with runner._cond:
            runner.events += [{"event": "ready", "restarts": True}, {"event": "interrupted"}]
            runner._cond.notify_all()

    runner.proc, runner.events, runner._sent, runner._cond = Child(), [], 0, threading.Condition()
    runner.stop()
    assert runner.proc.returncode is None and runner.last_outcome() == {"event": "interrupted"}
    if runner in _Runner._idle:
        _Runner._idle.remove(runner)


def test_a_ctrl_c_while_the_runner_still_imports_ends_it_and_the_run_sent_never_starts(tmp_path):
    """The parent's SIGINT for a run it has just sent lands while the runner child is still importing
    (its PRELOAD, held here by a module that takes seconds): the child ends as an interrupted
    interpreter does, and the run never starts, as when the child runs the loops itself."""
    import signal
    import sys

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(3)\n")
    (tmp_path / "probe_run.py").write_text("def child_run(spec):\n    open(spec['out'], 'w').write('ran')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = _runner_child(preload=("slow_import",), env=env)
    try:
        assert json.loads(proc.stdout.readline())["event"] == "ready"
        spec = {"module": "probe_run", "out": str(tmp_path / "out"), "env": env, "cwd": str(tmp_path),
                "log": str(tmp_path / "run.log")}
        proc.stdin.write((json.dumps(spec) + "\n").encode())
        proc.stdin.flush()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == -signal.SIGINT
    finally:
        proc.kill()
        proc.stdin.close()
        proc.stdout.close()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("what, restarts, poll", [("log", True, True), ("cwd", True, True), ("log", False, True),
                                                ("log", False, False)])
def test_a_run_whose_log_or_folder_cannot_be_opened_says_why(tmp_path, what, restarts, poll):
    """The log dir removed (or on a disk that went read-only) before the child opens train.log, or the
    notebook's folder gone: the child reports the error, instead of ending with no word (which the
    caller shows as "the training process ended unexpectedly; see train.log", a file that is not there),
    and ends (exit code 1), or, where a new worker follows (runner.RESTARTS), serves the next run and
    ends when its stdin closes (3)."""
    spec = {"module": "machine_nb.training.train", "env": {}, "cwd": str(tmp_path), "log": str(tmp_path / "train.log")}
    spec[what] = str(tmp_path / "gone" / ("train.log" if what == "log" else ""))
    events, code = _serve_one(spec, restarts, poll)
    assert code == (3 if restarts else 1)
    assert len(events) == (2 if restarts else 1)
    for event in events:
        assert event["event"] == "error" and event["type"] == "FileNotFoundError"
        assert str(tmp_path / "gone") in event["message"]


def test_a_load_checkpoint_folder_that_is_not_there_is_named_as_missing(tmp_path):
    """A log dir path with a typo: the refusal says there is no such folder, rather than that the
    path is none of the forms taken (which reads as if a log dir were the wrong thing to pass)."""
    from machine_nb.training.preference import dpo

    with pytest.raises(ValueError, match=r"load_checkpoint=.*sft-typo.*no such folder"):
        dpo([pair()], load_checkpoint=tmp_path / "sft-typo", log_dir=tmp_path / "dpo", progress=False)
    with pytest.raises(ValueError, match=r"load_checkpoint=.*no such folder"):
        dpo([pair()], load_checkpoint=str(tmp_path / "sft-typo"), log_dir=tmp_path / "dpo", progress=False)
    assert not (tmp_path / "dpo").exists()


def test_a_dpo_resume_names_a_damaged_checkpoint_row(tmp_path):
    """The row a DPO resume continues from, damaged (an epoch as text): refused naming the file,
    line and field, as read_training_log names it, rather than a bare int() error."""
    d = log_dir(tmp_path, checkpoints=[{"name": "000004", "state_path": "tinker://x/weights/4", "epoch": "one",
                                        "batch": 4}])
    with pytest.raises(MachineFormatError) as info:
        DPOSettings.resume_update(None, Resumed(d, {"kind": "dpo", "steps": 10}), 5, 10)
    assert info.value.path.endswith("checkpoints.jsonl") and (info.value.line, info.value.field) == (1, "epoch")


def test_a_pairs_frame_read_back_from_parquet_is_scored_like_the_frame(tmp_path, fake_sampler):
    """pd.read_parquet gives numpy arrays where the frame held lists, and every message every key
    some message has (None): the pairs are the same pairs, not "not a list of chat messages"."""
    frame = pd.DataFrame([pair(pair="p1", source="tags", machine="tutor"),
                          pair("What is 3+3?", "6", "7", pair="p2", source="tags", machine="tutor")])
    frame.at[1, "prompt"] = [{"role": "system", "content": "Be brief.", "name": "house"},
                             {"role": "user", "content": "What is 3+3?"}]
    frame.to_parquet(tmp_path / "pairs.parquet")
    back = pd.read_parquet(tmp_path / "pairs.parquet")
    assert not isinstance(back.at[0, "prompt"], list)
    scored, original = score_pairs(back), score_pairs(frame)
    pd.testing.assert_frame_equal(scored, original)
    assert list(scored["pair"]) == ["p1", "p2"] and list(scored["expected"]) == ["4", "6"]


def test_a_training_process_killed_by_a_signal_is_named_with_the_way_on(tmp_path):
    """A training process the system killed (out of memory: SIGKILL) was "exit code -9"; the
    message names the signal, what usually sends it, and how to resume the run."""
    from machine_nb.training.loop import ended_message

    killed = ended_message(-9, tmp_path / "run")
    assert "killed by SIGKILL: most often the system ran out of memory" in killed
    assert f"resume={str(tmp_path / 'run')!r}" in killed and "train.log" in killed
    assert "(exit code 1)" in ended_message(1, tmp_path / "run")
    assert "killed by SIGTERM" in ended_message(-15, tmp_path / "run")
