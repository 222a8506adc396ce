"""The promotion gate on the sample's tutor, local engine: tag → export → SFT → candidate → commit.

A checkpoint trained on the tagged rewrites passes (live ≤ 0.1, candidate ≥ 0.7 on the held-out
cases) and commits v2; a one-step checkpoint is refused with a reason and writes nothing;
revert restores v1; a candidate of another base model, one trained on held-out inputs, and
commits that race each other are refused with clear errors and leave versions.json whole.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.evaluation.candidate import Candidate, CommitConflict, CommitRefused, Gate
from machine_nb.evaluation.cases import read_versions

from scratch import local_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample_workspace"


def copy_sample(dest: Path) -> Path:
    shutil.copytree(SAMPLE, dest)
    return dest


def tag_the_rest(ws: Path) -> None:
    """What notebook 03 does: tag the tutor's untagged runs its rubric scored right."""
    store = ws / ".machine-store"
    runs = mnb.load_runs(ws, "tutor", store=store)
    cases = mnb.load_cases(ws, "tutor")
    expected = dict(zip(cases["input"], cases["expected"]))
    for _, run in runs[runs["tags"].map(len) == 0].iterrows():
        if run["run"]["scorecard"]["criteria"]["correct"]["score"] == 1 and run["input"] in expected:
            answer = expected[run["input"]]
            mnb.tag(run, "good", rewrite=answer if answer.startswith("answer: ") else None, store=store)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A scratch workspace, its tagged lines (63: 7 steps an epoch at batch 8), a 30-step checkpoint
    that has learned the house style and a 1-step one that has not."""
    tmp = tmp_path_factory.mktemp("loop")
    ws = copy_sample(tmp / "ws")
    tag_the_rest(ws)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mnb.HeldOutExcluded)
        lines = mnb.tagged_lines(mnb.tagged(ws / ".machine-store"), "tutor", workspace=ws)
    strong = mnb.sft(lines, epochs=9, max_steps=30, log_dir=tmp / "strong", progress=False)
    weak = mnb.sft(lines, max_steps=1, log_dir=tmp / "weak", progress=False)
    return {"tmp": tmp, "ws": ws, "lines": lines, "strong": strong.checkpoint, "weak": weak.checkpoint}


@pytest.fixture
def ws(trained, tmp_path):
    """A fresh copy of the tagged workspace per test (commits write into it)."""
    return shutil.copytree(trained["ws"], tmp_path / "ws")


def test_trained_candidate_passes_and_commit_writes_v2(trained, ws):
    before = (ws / "machines" / "tutor" / "versions.json").read_bytes()
    cand = mnb.candidate(ws, "tutor", trained["strong"], data=trained["lines"], progress=False)
    r = cand.report
    assert r.live_accuracy <= 0.1 and r.candidate_accuracy >= 0.7 and r.losses == 0 and r.p_value < 0.05
    assert cand.passed and cand.reason.startswith("Passed:") and cand.base_model == "local/arith-tiny"
    assert (ws / "machines" / "tutor" / "versions.json").read_bytes() == before  # measuring changes nothing
    # the per-case table and the paired comparison agree
    assert len(r.cases) == 20 and r.wins == (r.cases["change"] == "win").sum() == r.comparison.wins
    assert set(r.flipped["change"]) == {"win"} and r.flipped["candidate_output"].str.startswith("answer: ").all()

    entry = cand.commit(note="tutor learns the house style")
    versions = read_versions(ws, "tutor")
    assert [v["id"] for v in versions] == ["v1", "v2"] and entry == versions[-1]
    assert [v["id"] for v in versions if v.get("live")] == ["v2"]
    assert entry["source"] == {"kind": "train", "candidate": cand.id, "checkpoint": trained["strong"],
                               "note": "tutor learns the house style"}
    assert entry["model"] == trained["strong"] and entry["baseModel"] == "local/arith-tiny"
    assert entry["rubricFingerprint"] == mnb.load_machine(ws, "tutor")["rubric"]
    assert entry["instructions"] == versions[0]["instructions"] and "forced" not in entry
    assert entry["report"]["candidate_accuracy"] == r.candidate_accuracy and entry["report"]["passed"] is True
    assert json.loads((ws / "machines" / "tutor" / "model.json").read_text()) == {"model": trained["strong"]}
    assert not list((ws / "machines" / "tutor").glob(".*"))  # no lock or temp file beside the definition
    # the machine now runs the checkpoint: its live version scores what the candidate scored
    live_now = mnb.evaluate_cases(ws, "tutor", progress=False)
    assert live_now.summary["version"] == "v2" and live_now.rows["correct"].mean() == r.candidate_accuracy
    with pytest.raises(CommitConflict, match="already committed as v2"):
        cand.commit()

    restored = mnb.revert(ws, "tutor")
    assert restored["id"] == "v1" and [v["id"] for v in read_versions(ws, "tutor") if v.get("live")] == ["v1"]
    assert json.loads((ws / "machines" / "tutor" / "model.json").read_text()) == {"model": "local/arith-tiny"}
    assert len(read_versions(ws, "tutor")) == 2  # the history stays
    with pytest.raises(ValueError, match="v1 is the first version of tutor; there is none before it"):
        mnb.revert(ws, "tutor")


def test_one_step_candidate_is_refused_with_a_reason_and_nothing_written(trained, ws):
    path = ws / "machines" / "tutor" / "versions.json"
    before = path.read_bytes()
    weak = mnb.candidate(ws, "tutor", trained["weak"], progress=False)
    assert not weak.passed and weak.report.candidate_accuracy <= 0.1
    assert "its gain is not beyond chance (sign test p = 1, needs < 0.05)" in weak.reason
    assert "The numbers: 0 won, 20 tied, 0 lost of 20 held-out cases" in weak.reason
    with pytest.raises(CommitRefused) as err:
        weak.commit()
    assert err.value.reason == weak.reason and err.value.report is weak.report
    assert "v1 stays live" in str(err.value) and path.read_bytes() == before
    forced = weak.commit(force=True)
    assert forced["forced"] is True and forced["report"]["passed"] is False and forced["id"] == "v2"


def test_gate_is_configurable_and_says_its_rule(trained, ws):
    strict = Gate(min_delta=0.95)
    cand = mnb.candidate(ws, "tutor", trained["strong"], gate=strict, progress=False)
    assert not cand.passed and "is not above the live version's 0% by more than 95%" in cand.reason
    assert Gate().describe() == (
        "A candidate passes when it loses no held-out case the live version gets right, its held-out accuracy "
        "is above the live version's and its wins outnumber its losses beyond chance (exact two-sided sign test "
        "on the cases that changed, p < 0.05).")
    assert "by more than 10%" in Gate(min_delta=0.1, alpha=None, max_losses=2).describe()
    assert "sign test" not in Gate(alpha=None).describe()
    # the decision is on the report alone
    passed, reason = Gate(alpha=None).decide(cand.report)
    assert passed and reason.startswith("Passed:")
    few = Gate().decide(cand.report.__class__(**{**cand.report.__dict__, "cases": cand.report.cases.head(4),
                                                "wins": 4, "ties": 0, "losses": 0, "p_value": 0.125}))
    assert not few[0] and "with 4 held-out cases no result can get there (it takes 6): add cases" in few[1]


def test_trained_on_held_out_inputs_is_refused(trained, ws):
    leaked = list(trained["lines"]) + [{"messages": [{"role": "user", "content": "What's 66 - 74?"},
                                                     {"role": "assistant", "content": "answer: -8"}]}]
    cand = mnb.candidate(ws, "tutor", trained["strong"], data=leaked, progress=False)
    assert cand.report.trained_on_holdout == 1 and not cand.passed
    assert "it was trained on 1 held-out input(s)" in cand.reason


def test_checkpoint_of_another_base_model_is_refused(trained, ws):
    path = ws / "machines" / "tutor" / "versions.json"
    versions = json.loads(path.read_text())
    versions[0]["model"] = "local/arith-small"
    path.write_text(json.dumps(versions))
    with pytest.raises(ValueError, match=r"was trained from local/arith-tiny, but tutor's live version v1 runs "
                                         r"local/arith-small: a candidate must share the live version's base model"):
        mnb.candidate(ws, "tutor", trained["strong"], progress=False)
    versions[0]["model"], versions[0]["baseModel"] = trained["weak"], "local/arith-small"  # a live checkpoint
    path.write_text(json.dumps(versions))
    with pytest.raises(ValueError, match="local/arith-small"):
        mnb.candidate(ws, "tutor", trained["strong"], progress=False)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "versions.json").unlink(), "has no recorded versions"),
    (lambda d: (d / "versions.json").write_text("{}"), "versions.json must be a non-empty JSON array of versions."),
    (lambda d: (d / "holdout.json").unlink(), "has no held-out cases"),
    (lambda d: (d / "holdout.json").write_text("[]"), "holdout.json must be a non-empty JSON array of cases."),
    (lambda d: (d / "cases.json").write_text('[{"input": 1}]'), 'case 1 must be a string or an object'),
])
def test_missing_or_malformed_files_stop_before_any_sampling(trained, ws, damage, message):
    damage(ws / "machines" / "tutor")
    with pytest.raises(mnb.MachineFormatError, match=message):
        mnb.candidate(ws, "tutor", trained["strong"], progress=False)


def checkpoint_folder(path: str) -> Path:
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir

    return checkpoint_dir(default_data_dir(), path)


COMMITTER = textwrap.dedent("""
    import json, sys
    from machine_nb.evaluation.candidate import Candidate, CommitConflict, checkpoint_problem
    from machine_nb.evaluation.cases import live_version
    ws, who = sys.argv[1], sys.argv[2]
    import hashlib
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir
    for attempt in map(int, sys.stdin):  # the parent starts each round once the last one is settled
        ckpt = (f"tinker://local-{hashlib.sha256(ws.encode()).hexdigest()[:16]}:train:0/sampler_weights/"
                f"{attempt}-{who}")
        folder = checkpoint_dir(default_data_dir(), ckpt)
        folder.mkdir(parents=True)
        (folder / "checkpoint.json").write_text(json.dumps({"base_model": "local/arith-tiny", "lora_rank": 0}))
        cand = Candidate(workspace=ws, machine="tutor", checkpoint=ckpt, base_model="local/arith-tiny",
                         engine="local", live_version=live_version(ws, "tutor"), report=None, passed=True,
                         reason="test")
        assert checkpoint_problem(ckpt) is None  # what commit checks first, loaded: the four reach the lock together
        print("ready", flush=True)
        assert sys.stdin.readline() == "go\\n"  # blocks until the parent releases all four at once
        try:
            print("won", cand.commit()["id"], flush=True)
        except CommitConflict as exc:
            print("lost", exc, flush=True)
""")


def test_concurrent_commits_one_wins_the_other_sees_a_clear_error(tmp_path):
    """Four processes race to commit, three rounds over: each round exactly one wins and the
    others see a clear error, and versions.json stays whole. The same four processes play every
    round (each measures against the live version after the last round), each blocked on its stdin
    until the parent, once all four are ready, writes "go" to all four."""
    import threading

    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", ws / "machines" / "tutor")
    script = tmp_path / "commit.py"
    script.write_text(COMMITTER)
    procs = [subprocess.Popen([sys.executable, str(script), str(ws), str(i)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for i in range(4)]
    # a broken round ends the processes (and so every read below) rather than hang the test
    watchdog = threading.Timer(300, lambda: [p.kill() for p in procs])
    watchdog.start()

    def lines() -> list[str]:
        said = [p.stdout.readline() for p in procs]
        if not all(said):  # a process ended: its error
            for p in procs:
                p.kill()
            raise AssertionError([p.communicate()[1] for p in procs])
        return said

    try:
        for attempt in range(3):
            for p in procs:
                p.stdin.write(f"{attempt}\n")
                p.stdin.flush()
            assert lines() == ["ready\n"] * 4  # all four are waiting for the signal
            for p in procs:
                p.stdin.write("go\n")
            for p in procs:
                p.stdin.flush()
            said = [s.strip() for s in lines()]
            won = [s for s in said if s.startswith("won")]
            assert len(won) == 1, said
            lost = [s for s in said if s.startswith("lost")]
            assert len(lost) == 3 and all("another commit or revert came first. Nothing was written" in s for s in lost)
            versions = json.loads((ws / "machines" / "tutor" / "versions.json").read_text())  # whole, valid JSON
            assert [v["id"] for v in versions] == [f"v{i}" for i in range(1, attempt + 3)]
            assert [v["id"] for v in versions if v.get("live")] == [won[0].split()[1]] == [versions[-1]["id"]]
        outs = [p.communicate(timeout=60) for p in procs]  # stdin closes: each process ends
        assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    finally:
        watchdog.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_stale_candidate_cannot_commit_over_a_newer_version(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", ws / "machines" / "tutor")
    live = read_versions(ws, "tutor")[0]
    make = lambda name: Candidate(workspace=str(ws), machine="tutor", checkpoint=local_checkpoint(tmp_path, name),  # noqa: E731
                                  base_model="local/arith-tiny", engine="local", live_version=live, report=None,
                                  passed=True, reason="test")
    first, second = make("a"), make("b")
    assert first.commit()["id"] == "v2"
    with pytest.raises(CommitConflict, match="the live version is now v2"):
        second.commit()
    mnb.revert(ws, "tutor")  # v1 is live again, but this candidate still measured against v1: it may commit
    assert second.commit()["id"] == "v3"


def _bare(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(SAMPLE / "machines" / "tutor", ws / "machines" / "tutor")
    return ws


def _commit(ws: Path, tmp_path: Path, name: str) -> dict:
    from machine_nb.evaluation.cases import live_version

    return Candidate(workspace=str(ws), machine="tutor", checkpoint=local_checkpoint(tmp_path, name),
                     base_model="local/arith-tiny", engine="local", live_version=live_version(ws, "tutor"),
                     report=None, passed=True, reason="test").commit()


def live_id(ws: Path) -> str:
    from machine_nb.evaluation.cases import live_version

    return live_version(ws, "tutor")["id"]


def test_revert_goes_back_to_the_version_that_was_live_not_the_previous_entry(tmp_path):
    ws = _bare(tmp_path)
    assert _commit(ws, tmp_path, "a")["id"] == "v2"
    assert mnb.revert(ws, "tutor")["id"] == "v1"
    v3 = _commit(ws, tmp_path, "b")
    assert v3["id"] == "v3" and v3["previousLive"] == "v1"
    assert mnb.revert(ws, "tutor")["id"] == "v1"  # not v2, which was rolled back
    assert live_id(ws) == "v1"
    with pytest.raises(ValueError, match="v1 is the first version of tutor"):
        mnb.revert(ws, "tutor")
    # a chain of commits reverts one step at a time, through what was live
    _commit(ws, tmp_path, "c")  # v4 over v1
    _commit(ws, tmp_path, "d")  # v5 over v4
    assert [mnb.revert(ws, "tutor")["id"] for _ in range(2)] == ["v4", "v1"]


def test_commit_refuses_a_candidate_whose_checkpoint_is_gone(tmp_path):
    ws = _bare(tmp_path)
    from machine_nb.evaluation.cases import live_version

    ckpt = local_checkpoint(tmp_path, "gone")
    cand = Candidate(workspace=str(ws), machine="tutor", checkpoint=ckpt, base_model="local/arith-tiny",
                     engine="local", live_version=live_version(ws, "tutor"), report=None, passed=True, reason="test")
    shutil.rmtree(checkpoint_folder(ckpt))
    before = (ws / "machines" / "tutor" / "versions.json").read_bytes()
    with pytest.raises(CommitRefused, match="checkpoint .* cannot be sampled .*v1 stays live"):
        cand.commit(force=True)
    assert (ws / "machines" / "tutor" / "versions.json").read_bytes() == before


@pytest.mark.parametrize("entry, message", [
    ({"id": "v\u00b2", "model": "m"}, 'version ids are "v" and a number'),
    ({"id": "v" + "7" * 5000, "model": "m"}, 'version ids are "v" and a number'),
    ({"id": "v2", "model": "m", "source": "train"}, "source must be an object"),
])
def test_malformed_versions_stop_the_candidate_before_any_sampling(trained, ws, monkeypatch, entry, message):
    path = ws / "machines" / "tutor" / "versions.json"
    path.write_text(json.dumps(json.loads(path.read_text()) + [entry]))
    import machine_nb.evaluation.cases as cases_mod

    monkeypatch.setattr(cases_mod, "evaluate_cases", lambda *a, **k: pytest.fail("sampled"))
    with pytest.raises(mnb.MachineFormatError, match=message):
        mnb.candidate(ws, "tutor", trained["strong"], progress=False)


def test_a_checkpoint_that_is_gone_stops_the_candidate_before_any_sampling(trained, ws, tmp_path):
    gone = local_checkpoint(tmp_path, "x")
    shutil.rmtree(checkpoint_folder(gone))
    with pytest.raises(ValueError, match="cannot be sampled .* nothing was measured"):
        mnb.candidate(ws, "tutor", gone, progress=False)


# --------------------------------------------------------------------------- the CLI


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`machine-nb ARGS` in this process: (exit status, stdout, stderr)."""
    from machine_nb.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # --help
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_cases_candidate_commit_revert(trained, ws, tmp_path, capsys):
    code, out, _ = cli(capsys, "cases", str(ws), "--machine", "tutor", "--holdout", "--json")
    assert code == 0 and len(json.loads(out)) == 20 and json.loads(out)[0]["expected"] == "answer: -8"

    path = ws / "machines" / "tutor" / "versions.json"
    before = path.read_bytes()
    code, out, _ = cli(capsys, "candidate", str(ws), "--machine", "tutor", "--checkpoint", trained["weak"])
    assert code == 3 and "Refused: " in out and "A candidate passes when" in out
    code, _, err = cli(capsys, "commit", str(ws), "--machine", "tutor", "--checkpoint", trained["weak"])
    assert code == 3 and "did not pass the promotion gate, so v1 stays live" in err  # as candidate's refusal
    assert path.read_bytes() == before

    report = tmp_path / "report"
    code, out, _ = cli(capsys, "candidate", str(ws), "--machine", "tutor", "--checkpoint", trained["strong"],
                       "--out", str(report), "--json")
    said = json.loads(out)
    assert code == 0 and said["passed"] and said["candidate_accuracy"] >= 0.7
    assert {p.name for p in report.iterdir()} == {"live.json", "candidate.json", "report.json"}
    assert json.loads((report / "report.json").read_text())["passed"] is True
    assert mnb.load_results(report / "candidate.json").rows["correct"].mean() == said["candidate_accuracy"]
    assert path.read_bytes() == before  # `candidate` never changes the machine

    code, out, _ = cli(capsys, "commit", str(ws), "--machine", "tutor", "--checkpoint", trained["strong"],
                       "--note", "from the cli")
    assert code == 0 and "committed v2: tutor now runs " in out
    assert read_versions(ws, "tutor")[-1]["source"]["note"] == "from the cli"
    code, out, _ = cli(capsys, "revert", str(ws), "--machine", "tutor")
    assert code == 0 and "v1 is live again (local/arith-tiny)" in out
    for command in ("cases", "candidate", "commit", "revert"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "Writes:" in " ".join(out.split())


def test_the_gate_opens_samplers_through_open_sampler_and_reads_any_result_form(trained, ws, monkeypatch):
    """candidate() opens both sampling clients with sampling.open_sampler (the SDK's client, never
    a future of it), and its report is built the same from EvalResults as from bare frames."""
    import machine_nb.evaluation.sampling as sampling
    from machine_nb.evaluation.candidate import build_report, case_table
    from machine_nb.evaluation.results import EvalResult

    opened = []
    real = sampling.open_sampler

    def noting(target, service_client=None):
        client = real(target, service_client)
        opened.append((target.checkpoint, type(client).__name__))
        return client

    monkeypatch.setattr(sampling, "open_sampler", noting)
    cand = mnb.candidate(ws, "tutor", trained["strong"], progress=False)
    assert opened == [(trained["strong"], "SamplingClient"), (None, "SamplingClient")]

    r = cand.report
    assert isinstance(r.live, EvalResult) and r.live.summary["name"].startswith("live ")
    live = EvalResult(r.live.rows.copy(), {"name": "live v1"})
    framed = r.candidate.rows.copy()  # a bare frame of rows
    again = build_report("tutor", live, framed)
    assert again.live_name == "live v1" and again.cases.equals(r.cases) and again.p_value == r.p_value
    assert case_table(live, r.candidate).equals(r.cases)
    plain = cand.to_dict()
    assert plain["report"]["wins"] == r.wins and plain["gate"]["max_losses"] == 0 and plain["committed"] is None
    assert json.loads(json.dumps(plain, default=str))["checkpoint"] == trained["strong"]


class _Killed(BaseException):
    """A process killed between two writes, as far as the code after them can tell."""


def _killed_after_the_first_write(monkeypatch) -> None:
    from machine_nb.core import jsonl

    real, done = jsonl.atomic_write_text, []

    def write(path, *args, **kwargs):
        if done:
            raise _Killed(path)
        real(path, *args, **kwargs)
        done.append(path)

    monkeypatch.setattr(jsonl, "atomic_write_text", write)


def test_a_commit_or_revert_cut_short_between_its_files_finishes_when_run_again(tmp_path, monkeypatch):
    """versions.json is written last: a commit or revert killed after its first file leaves the
    history as it was, so running it again finishes it, and model.json names the live version's
    model. (Written first, the history would mark a version live that model.json does not run, and
    the commit could not be retried: "already committed".)"""
    from machine_nb.evaluation.cases import live_version

    ws = _bare(tmp_path)
    d = ws / "machines" / "tutor"
    cand = Candidate(workspace=str(ws), machine="tutor", checkpoint=local_checkpoint(tmp_path, "a"),
                     base_model="local/arith-tiny", engine="local", live_version=live_version(ws, "tutor"),
                     report=None, passed=True, reason="test")
    with monkeypatch.context() as m:
        _killed_after_the_first_write(m)
        with pytest.raises(_Killed):
            cand.commit()
    assert live_id(ws) == "v1"
    assert cand.commit()["id"] == "v2"
    model = lambda: json.loads((d / "model.json").read_text())["model"]  # noqa: E731
    assert live_version(ws, "tutor")["model"] == model() == cand.checkpoint
    with monkeypatch.context() as m:
        _killed_after_the_first_write(m)
        with pytest.raises(_Killed):
            mnb.revert(ws, "tutor")
    assert live_id(ws) == "v2"
    assert mnb.revert(ws, "tutor")["id"] == "v1"
    assert live_id(ws) == "v1" and model() == "local/arith-tiny" == live_version(ws, "tutor")["model"]
