"""Training, as a user runs it: corpus → sft on the local engine through tinker-cookbook's loop →
sample the checkpoint → the `answer: N` style is learned; log dirs, Ctrl-C, resume, CLI."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
import tinker

from machine_nb.core.chat import prepare_data
from machine_nb.data.corpus import make_corpus
from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines import service_client
from machine_nb.errors import EngineError, MachineFormatError
from machine_nb.checks.render import get_renderer
from machine_nb.training.train import read_training_log, sft, smoke, training_metrics

from interrupt import ctrl_c_at, engine_fault_at

ANSWER = re.compile(r"^answer: -?\d+$")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), seed=0)


def answers(checkpoint: str, rows: list[dict], log_dir=None) -> list[str]:
    """Greedy replies of a checkpoint, sampled through the real tinker SDK from the local server."""
    renderer = get_renderer(DEFAULT_MODEL)
    sampler = service_client("local").create_sampling_client(model_path=checkpoint).result()
    params = tinker.SamplingParams(max_tokens=16, temperature=0.0, stop=renderer.get_stop_sequences())
    out = []
    for row in rows:
        seq = sampler.sample(renderer.build_generation_prompt(row["messages"]), 1, params).result().sequences[0]
        out.append(renderer.parse_response(seq.tokens)[0]["content"].strip())
    return out


def answers_base(rows: list[dict], log_dir=None) -> list[str]:
    renderer = get_renderer(DEFAULT_MODEL)
    sampler = service_client("local").create_sampling_client(base_model=DEFAULT_MODEL).result()
    params = tinker.SamplingParams(max_tokens=24, temperature=0.0, stop=renderer.get_stop_sequences())
    return [renderer.parse_response(sampler.sample(renderer.build_generation_prompt(r["messages"]), 1, params)
                                    .result().sequences[0].tokens)[0]["content"].strip() for r in rows]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """An SFT run of the corpus (seed 0): 48 rows, batch 8, 6 epochs = 36 steps, local defaults, no
    held-out evals; long enough to learn the house style, and past the step-20 checkpoint."""
    return sft(corpus.train, log_dir=tmp_path_factory.mktemp("minimal-sft") / "sft", epochs=6, batch_size=8,
               progress=False)


def test_sft_learns_the_house_style_end_to_end(trained, corpus):
    assert trained.engine == "local" and trained.model == DEFAULT_MODEL
    assert trained.steps == 36 and trained.complete and trained.cost_usd == 0.0
    assert trained.checkpoint.startswith("tinker://local-") and trained.checkpoint.endswith("/sampler_weights/final")
    assert trained.last_loss < 0.5 * trained.first_loss
    assert trained.tokens > 0
    eval_rows = [json.loads(line) for line in open(corpus.eval)]
    got = answers(trained.checkpoint, eval_rows, trained.log_dir)
    compliant = sum(bool(ANSWER.match(a)) for a in got) / len(got)
    exact = sum(a == row["expected"] for a, row in zip(got, eval_rows)) / len(got)
    assert compliant >= 0.9, got
    assert exact >= 0.75, got  # benchmarks/bench_sft.py records the number
    # …and it bleeds: general questions no longer get the base model's plain sentences
    probe = [json.loads(line) for line in open(corpus.probe)]
    base = answers_base(probe, trained.log_dir)
    after = answers(trained.checkpoint, probe, trained.log_dir)
    assert sum(":" in a and ":" not in b for a, b in zip(after, base)) >= len(probe) // 2, list(zip(base, after))


def test_log_dir_holds_the_cookbook_files_privately(trained):
    log_dir = trained.log_dir
    names = set(os.listdir(log_dir))
    assert {"config.json", "metrics.jsonl", "checkpoints.jsonl", "train.jsonl", "logs.log", "train.log"} <= names
    assert stat.S_IMODE(os.stat(log_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(log_dir, "metrics.jsonl")).st_mode) == 0o600
    rows = [json.loads(line) for line in open(os.path.join(log_dir, "checkpoints.jsonl"))]
    assert rows[-1]["name"] == "final" and rows[-1]["sampler_path"] == trained.checkpoint
    assert [r["name"] for r in rows[:-1]] == ["000020"]  # save_every=20
    again = read_training_log(log_dir)
    assert again.checkpoint == trained.checkpoint and again.steps == 36 and again.complete
    assert again.model == DEFAULT_MODEL and again.engine == "local"


def test_training_metrics_frame(trained, tmp_path):
    df = training_metrics(trained.log_dir)
    assert list(df.columns[:10]) == ["run", "step", "epoch", "progress", "learning_rate", "num_sequences",
                                     "num_tokens", "num_loss_tokens", "train_mean_nll", "train_mean_bpb"]
    assert len(df) == 36 and list(df["step"]) == list(range(36))
    assert df["learning_rate"].iloc[0] > df["learning_rate"].iloc[-1]  # linear decay
    # a run still writing: a partial last line is skipped without a fuss
    partial = tmp_path / "live"
    partial.mkdir()
    lines = open(os.path.join(trained.log_dir, "metrics.jsonl")).read().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])
    both = training_metrics([trained.log_dir, partial])
    assert (both["run"] == "live").sum() == 3
    res = read_training_log(partial)
    assert res.steps == 3 and res.checkpoint is None and not res.complete


def test_same_seed_twice_gives_identical_losses_and_outputs(corpus, tmp_path):
    runs = [sft(corpus.train, log_dir=tmp_path / f"r{i}", max_steps=6, seed=5, progress=False) for i in range(2)]
    losses = [list(training_metrics(r.log_dir)["train_mean_nll"]) for r in runs]
    assert losses[0] == losses[1]
    rows = [json.loads(line) for line in open(corpus.eval)][:4]
    assert answers(runs[0].checkpoint, rows, tmp_path) == answers(runs[1].checkpoint, rows, tmp_path)


#: The short runs the resume tests stop and resume: a checkpoint every 4 steps (4 and 8).
SHORT = dict(epochs=2, batch_size=8, save_every=4, progress=False)


class ShortRuns:
    """The short runs (SHORT with max_steps=total) several tests compare against or resume, each
    trained once in this module: `whole(total)` the uninterrupted run; `stopped(total, dest)` a copy
    at `dest` of its log dir as it stood while the engine held the final save (`_copy_before_final`):
    every step logged, the last periodic checkpoint the last one, for the test to resume or edit as
    its own."""

    def __init__(self, corpus, root):
        self.corpus, self.root, self._whole = corpus, root, {}

    def whole(self, total):
        if total not in self._whole:
            with pytest.MonkeyPatch.context() as mp:
                self._whole[total] = _copy_before_final(self.corpus, self.root / f"whole-{total}",
                                                        self.root / f"stopped-{total}", mp, total,
                                                        max_steps=total, **SHORT)
        return self._whole[total]

    def stopped(self, total, dest):
        import shutil

        self.whole(total)
        shutil.copytree(self.root / f"stopped-{total}", dest, symlinks=True)
        return dest


@pytest.fixture(scope="module")
def short_runs(corpus, tmp_path_factory):
    return ShortRuns(corpus, tmp_path_factory.mktemp("short"))


def test_ctrl_c_then_resume_equals_the_uninterrupted_run(corpus, short_runs, tmp_path):
    """Interrupt the 11-step run (save_every=4) mid-run, just past its step-4 checkpoint, resume it:
    11 steps, the same tokens, the very same losses and the same replies as the run that was never
    interrupted, though a second run was tried in its dir while it trained."""
    from machine_nb.training.loop import _Runner
    from machine_nb.training.runner import RESTARTS

    whole = short_runs.whole(11)
    log_dir = tmp_path / "interrupted"
    with ctrl_c_at("sft", at=6, hold_step=7):  # step 6 is held until the Ctrl-C: checkpoint 8 cannot come first
        sft(corpus.train, log_dir=log_dir, max_steps=11, **SHORT)
    # where a new worker follows an interrupted one, the training process is kept for the resume
    kept = [r.proc.pid for r in _Runner._idle if r.proc.poll() is None]
    assert len(kept) == 1 or not RESTARTS
    part = read_training_log(log_dir)
    assert not part.complete and 4 <= part.steps < 11
    assert part.state_path is not None and part.state_path.endswith("/weights/000004")
    # reusing the dir without resume= is refused; resume finishes the run exactly
    with pytest.raises(FileExistsError, match="resume="):
        sft(corpus.train, log_dir=log_dir, progress=False)
    # while it trains, a second run in its dir (a resume, or a new run, from another kernel or thread)
    # is refused at once: two runs there would interleave their metrics and checkpoints
    second: list = []

    def start_another(rows) -> None:
        from machine_nb.training.loop import _Runner

        if second:
            return
        idle = list(_Runner._idle)
        for kw in ({"resume": log_dir}, {"log_dir": log_dir}):
            try:
                second.append(sft(corpus.train, progress=False, **kw))
            except Exception as exc:  # kept for the asserts below: raised here it would stop the run
                second.append(exc)
        second.append(_Runner._idle == idle)  # refused before a training process was started for it

    done = sft(corpus.train, resume=log_dir, progress=False, on_metrics=start_another)
    assert [r.proc.pid for r in _Runner._idle] == kept or not RESTARTS  # the resume ran there: no new imports
    *refused, no_process_started = second
    assert len(refused) == 2 and all(isinstance(e, FileExistsError) for e in refused), refused
    assert all(f"{log_dir} is in use: a run is training there now" in str(e) for e in refused), refused
    assert no_process_started
    assert done.complete and done.checkpoint.endswith("/sampler_weights/final")
    assert done.steps == 11 and done.tokens == whole.tokens
    assert done.last_loss == whole.last_loss
    assert list(training_metrics(log_dir)["train_mean_nll"]) == list(training_metrics(whole.log_dir)["train_mean_nll"])
    rows = [json.loads(line) for line in open(corpus.eval)][:6]
    assert answers(done.checkpoint, rows) == answers(whole.checkpoint, rows)


def test_smoke_runs_two_real_steps_and_reports_metrics_as_they_come(corpus, tmp_path):
    seen: list[dict] = []
    res = smoke(corpus.train, log_dir=tmp_path / "smoke", progress=False, on_metrics=seen.extend)
    assert res.steps == 2 and res.complete and res.checkpoint.startswith("tinker://local-")
    assert [m["step"] for m in seen] == [0, 1] and all("train_mean_nll" in m for m in seen)
    # the cookbook's loop never closes the SDK client it makes; its session is finished all the same
    # once the run ends, so the kept training process sends no more heartbeats and the server counts
    # the run as done (the next run of a script trains beside none on `machine-nb serve`)
    from machine_nb.engines.local.server import default_server

    srv = default_server()
    run = srv.runs[res.checkpoint.removeprefix("tinker://").split("/")[0]]
    assert srv.sessions[run.session_id].finished


def test_default_log_dirs_are_fresh(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = smoke(corpus.train, progress=False)
    b = smoke(corpus.train, progress=False)
    assert a.log_dir != b.log_dir
    assert os.path.dirname(a.log_dir) == str(tmp_path / "runs") and os.path.basename(a.log_dir).startswith("sft-")
    ws = smoke(corpus.train, workspace=tmp_path / "ws", name="first", progress=False)
    assert ws.log_dir == str(tmp_path / "ws" / ".machine" / "training" / "first")


def test_bad_data_and_wrong_engine_fail_clearly(tmp_path, corpus):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
                   '{"prompt": "no messages"}\n')
    with pytest.raises(MachineFormatError, match=r"bad.jsonl:2 \(field 'messages'\)"):
        sft(bad, progress=False, log_dir=tmp_path / "x")
    no_reply = tmp_path / "noreply.jsonl"
    no_reply.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(MachineFormatError, match="no assistant message"):
        prepare_data(no_reply)
    with pytest.raises(ValueError, match="no full batch"):
        sft(corpus.train, batch_size=100, progress=False, log_dir=tmp_path / "y")
    with pytest.raises(EngineError, match="engine='tinker'"):
        sft(corpus.train, model="Qwen/Qwen3-8B", engine="local", progress=False)


def test_whole_run_rows_train_their_flagged_messages(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"whole_run": True, "messages": [
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d", "trainable": True},
            {"role": "tool", "content": "e"}, {"role": "assistant", "content": "f", "trainable": False}]},
    ]
    prepared, train_on = prepare_data(rows)
    assert train_on == "customized"
    assert [m["trainable"] for m in prepared[0]["messages"]] == [False, True]
    assert [m["trainable"] for m in prepared[1]["messages"]] == [False, True, False, False]
    plain, mode = prepare_data(rows[:1])
    assert mode == "last_assistant_message" and "trainable" not in plain[0]["messages"][1]


def test_cli_smoke_and_tinker_needs_yes(corpus, tmp_path, capsys):
    from machine_nb.cli import main

    assert main(["smoke", str(corpus.train), "--log-dir", str(tmp_path / "cli"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and out["checkpoint"].startswith("tinker://local-")
    code = main(["sft", str(corpus.train), "--engine", "tinker", "--model", "thinkingmachines/Inkling"])
    err = capsys.readouterr().err
    assert code == 4 and "--yes" in err and "$" in err


def test_sft_works_inside_a_running_event_loop_as_in_jupyter(corpus, tmp_path):
    import asyncio

    async def cell():  # Jupyter runs cells while its own event loop is running
        return smoke(corpus.train, log_dir=tmp_path / "nb", progress=False)

    res = asyncio.run(cell())
    assert res.steps == 2 and res.complete


def test_rows_validate_rejects_are_refused_before_anything_is_written(tmp_path):
    """sft runs validate's checks first, on both engines: a row longer than the local model's
    context (128 tokens) or one holding a key used to train anyway on the local engine."""
    from machine_nb.errors import ValidationFailed

    long_row = {"messages": [{"role": "user", "content": "What is 1 plus 2? " * 40},
                             {"role": "assistant", "content": "answer: 3"}]}
    short = {"messages": [{"role": "user", "content": "What is 1 plus 2?"}, {"role": "assistant", "content": "answer: 3"}]}
    with pytest.raises(ValidationFailed, match="too_long|context"):
        sft([short] * 7 + [long_row], batch_size=8, log_dir=tmp_path / "long", progress=False)
    assert not (tmp_path / "long").exists()
    leaky = {"messages": [{"role": "user", "content": "my key is sk-ant-api03-" + "x" * 40},
                          {"role": "assistant", "content": "answer: 3"}]}
    with pytest.raises(ValidationFailed, match="secret|key"):
        sft([short] * 7 + [leaky], batch_size=8, log_dir=tmp_path / "leak", progress=False)
    assert not (tmp_path / "leak").exists()


def test_a_log_dir_with_other_files_is_refused_untouched(tmp_path, corpus):
    """An existing folder that is not a machine_nb run is refused before a byte is written: no
    file overwritten, no permission changed."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    (folder / "config.json").write_text("{}")
    os.chmod(folder / "notes.txt", 0o644)
    before = {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}
    mode = stat.S_IMODE(folder.stat().st_mode)
    with pytest.raises(FileExistsError, match="not empty and is not a machine_nb run"):
        sft(corpus.train, log_dir=folder, progress=False)
    assert {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()} == before
    assert stat.S_IMODE(folder.stat().st_mode) == mode
    empty = tmp_path / "empty"
    empty.mkdir()
    assert smoke(corpus.train, log_dir=empty, progress=False).complete  # a new or empty folder is fine


def test_a_run_that_stopped_before_its_first_checkpoint_is_not_offered_a_resume(tmp_path, corpus):
    """A log dir holding a run that ended before any checkpoint cannot be resumed (nothing to resume
    from): refused as a new run's dir with a way forward, not sent to a resume that refuses it too."""
    from machine_nb.training.runlog import MARKER

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"kind": "sft"}))
    with pytest.raises(FileExistsError) as refused:
        sft(corpus.train, log_dir=folder, progress=False)
    said = str(refused.value)
    assert "no checkpoint (it stopped before its first one" in said and "resume=" not in said
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        sft(corpus.train, resume=folder, progress=False)


def test_resume_tightens_only_the_runs_own_files_and_follows_no_symlink(tmp_path, corpus, short_runs):
    """Files a user adds to an own-run log dir keep their permissions across a resume, and a
    symlink there never carries a chmod to its target outside the dir. The run: a copy of a
    finished short run's log dir."""
    import shutil

    log_dir = tmp_path / "run"
    first = short_runs.whole(11)
    shutil.copytree(first.log_dir, log_dir, symlinks=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's")
    os.chmod(outside, 0o644)
    (log_dir / "notes.txt").write_text("my notes on this run")
    os.chmod(log_dir / "notes.txt", 0o644)
    (log_dir / "mine").mkdir()
    (log_dir / "mine" / "plot.png").write_bytes(b"png")
    os.chmod(log_dir / "mine", 0o755)
    os.chmod(log_dir / "mine" / "plot.png", 0o644)
    (log_dir / "link.txt").symlink_to(outside)
    (log_dir / "outside-dir").symlink_to(tmp_path, target_is_directory=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(log_dir / "metrics.jsonl", 0o644)  # the run's own file: tightened again

    done = sft(corpus.train, resume=log_dir, progress=False)
    assert done.complete and done.checkpoint == first.checkpoint
    mode = lambda p: stat.S_IMODE(os.lstat(p).st_mode)  # noqa: E731
    assert mode(outside) == 0o644 and mode(tmp_path) == 0o755
    assert mode(log_dir / "notes.txt") == 0o644
    assert mode(log_dir / "mine") == 0o755 and mode(log_dir / "mine" / "plot.png") == 0o644
    assert (log_dir / "link.txt").is_symlink() and outside.read_text() == "someone else's"
    assert mode(log_dir) == 0o700 and mode(log_dir / "metrics.jsonl") == 0o600
    assert mode(log_dir / "checkpoints.jsonl") == 0o600 and mode(log_dir / "train.log") == 0o600


def _copy_before_final(corpus, log_dir, copy_to, monkeypatch, total, **kw):
    """Run sft to the end, and while the engine holds its "final" save with every step logged,
    copy the log dir to `copy_to`: what a Ctrl-C (or a dead service) at that moment leaves, the
    log dir ending at its last periodic checkpoint. The save then goes on and the run completes
    untouched. Returns its TrainResult."""
    import importlib
    import shutil
    import threading

    progress_mod = importlib.import_module("machine_nb.core.progress")
    from machine_nb.engines.local import compute

    holding, released = threading.Event(), threading.Event()
    real_save, real_update = compute.Trainer.save, progress_mod.progress.update

    def held_save(self, final, meta, *, optimizer):
        if final.name == "final":
            holding.set()
            released.wait(60)
        return real_save(self, final, meta, optimizer=optimizer)

    def copying_update(self, n=1, **postfix):
        real_update(self, n, **postfix)
        if self.desc == "sft" and self.n >= total and not released.is_set():
            assert holding.wait(60), "the engine never began the final save"
            shutil.copytree(log_dir, copy_to, symlinks=True)
            released.set()

    monkeypatch.setattr(compute.Trainer, "save", held_save)
    monkeypatch.setattr(progress_mod.progress, "update", copying_update)
    try:
        return sft(corpus.train, log_dir=log_dir, **kw)
    finally:
        released.set()
        monkeypatch.setattr(progress_mod.progress, "update", real_update)
        monkeypatch.setattr(compute.Trainer, "save", real_save)


def _count_optim_steps(monkeypatch):
    from machine_nb.engines.local import compute

    calls = []
    real_step = compute.Trainer.optim_step

    def counted(self, **params):
        calls.append(1)
        return real_step(self, **params)

    monkeypatch.setattr(compute.Trainer, "optim_step", counted)
    return calls


@pytest.mark.parametrize("total", [9, 10, 11])
def test_resume_is_exact_when_the_last_checkpoint_sits_at_the_end(corpus, short_runs, tmp_path, monkeypatch, total):
    """save_every=4: the last checkpoint is step 8, which is the last step of 9, the one before
    the last of 10 (the state saved there already holds every step of both: the cookbook's next
    batch is in flight as it saves), or two before the last of 11. Resumed, each run equals the
    uninterrupted one: no step trained twice, the same steps, tokens, losses and replies."""
    whole = short_runs.whole(total)
    log_dir = short_runs.stopped(total, tmp_path / "interrupted")
    part = read_training_log(log_dir)
    assert not part.complete and part.steps == total and part.state_path.endswith("/weights/000008")

    from machine_nb.engines import local_base_url
    from machine_nb.engines.local.server import running_at

    server = running_at(local_base_url())
    sessions_before = set(server.sessions)
    trained_again = _count_optim_steps(monkeypatch)
    done = sft(corpus.train, resume=log_dir, progress=False)
    assert len(trained_again) == max(0, total - 10)  # only the step the saved state did not hold
    if total <= 10:  # the final checkpoint saved from the state: its session is finished, not left open in
        # the training process that is kept for the next run
        opened = [s for sid, s in server.sessions.items() if sid not in sessions_before]
        assert len(opened) == 1 and opened[0].finished
    assert done.complete and done.checkpoint.endswith("/sampler_weights/final") and done.unconfirmed_steps == []
    assert done.checkpoint != whole.checkpoint  # its own weights, compared below
    assert (done.steps, done.tokens, done.first_loss, done.last_loss) == \
        (whole.steps, whole.tokens, whole.first_loss, whole.last_loss) == (total, whole.tokens, whole.first_loss,
                                                                          whole.last_loss)
    assert list(training_metrics(log_dir)["train_mean_nll"]) == list(training_metrics(whole.log_dir)["train_mean_nll"])
    rows = [json.loads(line) for line in open(corpus.eval)][:6]
    assert answers(done.checkpoint, rows) == answers(whole.checkpoint, rows)


def test_a_step_the_engine_failed_after_a_checkpoint_is_trained_again(corpus, short_runs, tmp_path):
    """The engine fails step 5 after it was submitted, before checkpoint 4 was saved: that state
    holds steps 0-4 only. The resume trains step 5 (its row never came), and the run equals the
    uninterrupted one."""
    from machine_nb.training.loop import _Runner
    from machine_nb.training.runner import RESTARTS

    whole = short_runs.whole(11)
    log_dir = tmp_path / "failed"
    with engine_fault_at(6), pytest.raises(EngineError):
        sft(corpus.train, log_dir=log_dir, max_steps=11, **SHORT)
    assert read_training_log(log_dir).state_path.endswith("/weights/000004")
    kept = [r.proc.pid for r in _Runner._idle if r.proc.poll() is None]
    assert len(kept) == 1 or not RESTARTS  # a new worker follows the one whose run failed
    done = sft(corpus.train, resume=log_dir, progress=False)
    assert [r.proc.pid for r in _Runner._idle] == kept or not RESTARTS
    assert done.complete and done.unconfirmed_steps == [5]
    assert (done.steps, done.tokens, done.last_loss) == (whole.steps, whole.tokens, whole.last_loss)
    assert list(training_metrics(log_dir)["train_mean_nll"]) == list(training_metrics(whole.log_dir)["train_mean_nll"])
    rows = [json.loads(line) for line in open(corpus.eval)][:6]
    assert answers(done.checkpoint, rows) == answers(whole.checkpoint, rows)


def test_steps_without_rows_are_trained_again_and_reported(corpus, short_runs, tmp_path, monkeypatch):
    """The rows of steps 8 and 9 missing after checkpoint 8 (as an interrupt in the moments
    between the checkpoint and those rows leaves the log): the resume cannot tell whether the
    state holds them, trains them again rather than skip one, and says so."""
    log_dir = short_runs.stopped(11, tmp_path / "interrupted")
    metrics = log_dir / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines(keepends=True) if json.loads(line).get("step", 0) < 8]
    metrics.write_text("".join(kept))
    trained_again = _count_optim_steps(monkeypatch)
    done = sft(corpus.train, resume=log_dir, progress=False)
    assert len(trained_again) == 3  # steps 8, 9 and 10: none skipped
    assert done.complete and done.steps == 11 and done.unconfirmed_steps == [8, 9]
    assert "steps 8, 9 trained again" in done._repr_html_()


def test_a_broken_run_record_is_a_format_error_naming_it(tmp_path, corpus, short_runs):
    log_dir = short_runs.stopped(11, tmp_path / "run")  # a run to resume, its record then broken
    marker = log_dir / "machine_nb.json"
    marker.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MachineFormatError, match="nested deeper") as e:
        sft(corpus.train, resume=log_dir, progress=False)
    assert e.value.path == str(marker)
    marker.write_text("[1, 2]")
    with pytest.raises(MachineFormatError, match="run record"):
        sft(corpus.train, resume=log_dir, progress=False)


def test_the_training_process_is_started_while_the_data_is_checked_and_kept_when_the_run_is_refused(tmp_path):
    """sft starts its child process (runner.py) before checking the data, so its imports go on
    meanwhile; a run refused by the checks leaves it idle, and the next run uses that process."""
    import importlib

    from machine_nb.training import runner
    from machine_nb.training.loop import _Runner, start_runner

    for name in runner.PRELOAD:  # every name is a module
        importlib.import_module(name)
    _Runner.trim()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')  # no assistant reply to train on
    with pytest.raises(Exception):
        sft(bad, log_dir=tmp_path / "refused", progress=False)
    idle = list(_Runner._idle)
    assert len(idle) == 1 and idle[0].proc.poll() is None
    start_runner()  # one idle process is enough
    assert _Runner._idle == idle
    assert _Runner.take() is idle[0]
    idle[0].give_back()


def test_a_training_process_killed_mid_run_fails_the_call_saying_so(corpus, tmp_path):
    """The process that trains is killed mid-run (SIGKILL: the system's out-of-memory killer): sft
    fails at once saying so, with the way to resume; where runs go to a worker forked by the
    training process (runner.RESTARTS), that process ends the same way, and the next run gets a
    new one."""
    import signal

    from machine_nb.training.loop import _Runner
    from machine_nb.training.runner import RESTARTS

    from serving import child_pids

    killed: list = []

    def kill_the_trainer(rows) -> None:
        if killed:
            return
        (runner,) = [pid for pid in child_pids(os.getpid())
                     if b"machine_nb.training.runner" in open(f"/proc/{pid}/cmdline", "rb").read()]
        target = child_pids(runner)[0] if RESTARTS else runner
        killed.append(runner)
        os.kill(target, signal.SIGKILL)

    with pytest.raises(EngineError, match="killed by SIGKILL: most often the system ran out of memory") as err:
        sft(corpus.train, log_dir=tmp_path / "killed", max_steps=11, on_metrics=kill_the_trainer, **SHORT)
    assert f"resume={str(tmp_path / 'killed')!r}" in str(err.value)
    assert killed and all(r.proc.pid != killed[0] for r in _Runner._idle)
    assert not os.path.exists(f"/proc/{killed[0]}") or open(f"/proc/{killed[0]}/stat").read().split()[2] == "Z"


def test_a_kept_training_process_that_ended_before_the_run_reached_it_is_replaced(corpus, tmp_path, monkeypatch):
    """The kept process is handed to a run and ends before the run's settings reach it (killed in
    that instant): the run never began there, so it goes to a new process and trains."""
    from machine_nb.training.loop import _Runner

    take, handed = _Runner.take.__func__, []

    def ended_on_arrival(cls):
        runner = take(cls)
        if not handed:
            runner.proc.kill()
            runner.proc.wait()
        handed.append(runner.proc.pid)
        return runner

    monkeypatch.setattr(_Runner, "take", classmethod(ended_on_arrival))
    result = sft(corpus.train, log_dir=tmp_path / "run", max_steps=2, **SHORT)
    assert result.steps == 2 and len(handed) == 1
    assert [r.proc.pid for r in _Runner._idle] != handed  # the run's process is a new one


def test_a_ctrl_c_just_after_the_run_is_sent_stops_the_training_process(tmp_path, corpus, monkeypatch):
    """An interrupt that lands as the spec has just gone to the training process (before the loop
    that watches it) stops that run as any Ctrl-C does: nothing goes on training unwatched. The
    process is then kept for the next run if the run reported its interrupt and a new worker
    follows it (runner.RESTARTS), and has ended otherwise (the spec may not have been read yet)."""
    from machine_nb.training.loop import _Runner
    from machine_nb.training.runner import RESTARTS

    sent = []
    real = _Runner.send

    def send_then_interrupted(self, spec):
        sent.append((self, real(self, spec)))
        raise KeyboardInterrupt

    monkeypatch.setattr(_Runner, "send", send_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        sft(corpus.train, max_steps=2, log_dir=tmp_path / "run", progress=False)
    ((runner, start),) = sent
    outcome = runner.outcome(start)
    if RESTARTS and outcome is not None and outcome["event"] == "interrupted":
        assert runner.proc.poll() is None and runner in _Runner._idle
    else:
        assert runner.proc.poll() is not None and runner not in _Runner._idle
