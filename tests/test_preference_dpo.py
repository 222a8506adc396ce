"""DPO as a user runs it: the tutor's rewrite pairs → `dpo` on the local engine through
tinker-cookbook's own `train_dpo` loop → the loss falls and the checkpoint ranks the chosen replies
first; SFT then DPO; Ctrl-C and resume; and on Tinker, every refusal comes before anything is spent."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.engines import tinker as tinker_engine
from machine_nb.errors import BudgetExceeded, EngineError, MachineFormatError, ValidationFailed
from machine_nb.data.export import HeldOutExcluded
from machine_nb.training.preference import SCORE_COLUMNS, dpo, read_dpo_log, score_pairs
from machine_nb.checks.pricing import UnknownPrice, clear_prices, estimate_dpo_cost, set_price

from interrupt import ctrl_c_at

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
SECRET = "tml-test-key-that-must-never-show-0123456789"


@pytest.fixture(scope="module")
def pairs():
    with pytest.warns(HeldOutExcluded):
        return mnb.preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor")


#: The file's run: 44 pairs at batch 8 = 5 steps an epoch, 2 epochs = 10 steps, a checkpoint every 4,
#: at a rate at which a few steps rank every pair the right way round (one step brings the loss from
#: log 2 under 0.05); the defaults' own settings are checked without training, below
SHORT = dict(epochs=2, learning_rate=1e-2, save_every=4, progress=False)


@pytest.fixture(scope="module")
def short(pairs, tmp_path_factory):
    """The short run, uninterrupted: what DPO does to the loss and the checkpoint, what the log dir
    holds, and what an interrupted and resumed run is held against. It is called from inside a
    running event loop, as a notebook cell calls it."""
    import asyncio

    async def cell():
        return dpo(pairs, log_dir=tmp_path_factory.mktemp("runs") / "short", **SHORT)

    return asyncio.run(cell())


@pytest.fixture(scope="module")
def base_scores(pairs):
    """How the base model ranks the pairs (score_pairs with no checkpoint)."""
    return score_pairs(pairs)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """SFT on the tutor's tagged lines: where SFT then DPO starts, and a run of the other kind. Ten
    steps already raise the chosen replies' margin over the rejected ones far past the base model's,
    which is what SFT then DPO builds on."""
    with pytest.warns(HeldOutExcluded):
        lines = mnb.tagged_lines(mnb.tagged(SAMPLE / ".machine-store"), "tutor", workspace=SAMPLE)
    return mnb.sft(lines, max_steps=10, log_dir=tmp_path_factory.mktemp("sft") / "sft", progress=False)


def test_dpo_through_the_cookbook_lowers_the_loss_and_ranks_the_chosen_replies_first(pairs, short, base_scores):
    assert short.engine == "local" and short.model == "local/arith-tiny"
    assert short.steps == 10 and short.complete and short.cost_usd == 0.0
    assert short.checkpoint.startswith("tinker://local-") and short.checkpoint.endswith("/sampler_weights/final")
    metrics = mnb.training_metrics(short.log_dir)
    assert len(metrics) == 10 and list(metrics["step"]) == list(range(10))
    for col in ("dpo_loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "num_pairs"):
        assert metrics[col].notna().all(), col
    # the first step is measured against a reference equal to the policy: log 2, no margin
    assert math.isclose(metrics["dpo_loss"].iloc[0], math.log(2), rel_tol=1e-4) and abs(metrics["margin"].iloc[0]) < 1e-4
    assert short.first_loss == metrics["dpo_loss"].iloc[0] and short.last_loss == metrics["dpo_loss"].iloc[-1]
    assert short.last_loss < 0.05 and metrics["accuracy"].tail(5).min() == 1.0 and metrics["margin"].iloc[-1] > 1
    assert short.tokens == int(metrics["num_tokens"].sum())
    # the checkpoint, not just the loop's own metric: absolute log-probabilities of each pair's replies
    before, after = base_scores, score_pairs(pairs, checkpoint=short.checkpoint)
    assert list(after.columns) == SCORE_COLUMNS and len(after) == 44
    assert before["correct"].mean() == 0.0  # the base model prefers its own natural answers
    assert after["correct"].mean() == 1.0 and (after["margin"] > before["margin"]).all()
    # two score frames compare pair by pair like eval results
    cmp = mnb.compare(before, after)
    assert cmp.wins == 44 and cmp.losses == 0


def test_the_log_dir_holds_the_pairs_the_cookbook_read_and_reads_back(short, pairs):
    log_dir = Path(short.log_dir)
    assert {"pairs.jsonl", "metrics.jsonl", "checkpoints.jsonl", "config.json", "machine_nb.json"} <= set(os.listdir(log_dir))
    lines = [json.loads(line) for line in (log_dir / "pairs.jsonl").read_text().splitlines()]
    assert len(lines) == 44 and {line["label"] for line in lines} == {"A"}
    assert sorted(line["comparison"]["completion_A"][0]["content"] for line in lines) == \
        sorted(p[0]["content"] for p in pairs["chosen"])
    marker = json.loads((log_dir / "machine_nb.json").read_text())
    assert marker["kind"] == "dpo" and marker["beta"] == 0.1 and marker["learning_rate"] == 1e-2
    assert marker["epochs"] == 2 and marker["save_every"] == 4 and marker["steps"] == 10
    assert (os.stat(log_dir).st_mode & 0o777) == 0o700
    again = read_dpo_log(log_dir)
    assert (again.steps, again.checkpoint, again.complete, again.last_loss) == (10, short.checkpoint, True,
                                                                             short.last_loss)
    assert [r["name"] for r in map(json.loads, (log_dir / "checkpoints.jsonl").read_text().splitlines())] == \
        ["000004", "000008", "final"]


def test_dpo_at_its_defaults_plans_10_epochs_at_the_local_rate_with_a_checkpoint_every_20_steps(pairs, tmp_path,
                                                                                                 monkeypatch):
    """dpo(pairs) with nothing else given, up to the point where the cookbook's loop would start: the
    run record it writes and the settings the loop is handed (the training itself is the short run's)."""
    from machine_nb.training import loop

    class Handed(Exception):
        pass

    handed = []

    def take_spec(spec, log_dir, **kw):
        handed.append(spec)
        raise Handed

    monkeypatch.setattr(loop, "run_cookbook", take_spec)
    with pytest.raises(Handed):
        dpo(pairs, log_dir=tmp_path / "dpo", progress=False)
    marker = json.loads((tmp_path / "dpo" / "machine_nb.json").read_text())
    assert (marker["model"], marker["engine"], marker["pairs"]) == ("local/arith-tiny", "local", 44)
    # 44 pairs at batch 8 = 5 steps an epoch, 10 epochs; the local LoRA rate; the cookbook's checkpoint interval
    assert (marker["epochs"], marker["batch_size"], marker["steps"]) == (10, 8, 50)
    assert marker["beta"] == 0.1 and marker["learning_rate"] == 3e-3 and marker["save_every"] == 20
    [spec] = handed
    assert (spec["epochs"], spec["batch_size"], spec["max_steps"]) == (10, 8, None)
    assert (spec["learning_rate"], spec["save_every"], spec["beta"]) == (3e-3, 20, 0.1)


def test_sft_then_dpo_starts_from_the_sft_weights(pairs, sft_run, base_scores, tmp_path):
    sft = sft_run
    both = dpo(pairs, load_checkpoint=sft, max_steps=5, log_dir=tmp_path / "dpo", progress=False)
    marker = json.loads((tmp_path / "dpo" / "machine_nb.json").read_text())
    assert marker["load_checkpoint"] == sft.state_path and marker["learning_rate"] == 1e-4
    assert both.steps == 5 and both.complete and both.model == "local/arith-tiny"
    # the SFT checkpoint already prefers the chosen replies more than the base model; DPO widens that
    base = base_scores
    start, end = score_pairs(pairs, checkpoint=sft.checkpoint), score_pairs(pairs, checkpoint=both.checkpoint)
    assert start["margin"].mean() > base["margin"].mean() + 20
    assert (end["margin"] > start["margin"]).all()
    # a log dir works as well as the result; sampler weights are not a starting point
    again = dpo(pairs, load_checkpoint=Path(sft.log_dir), max_steps=1, log_dir=tmp_path / "dpo2", progress=False)
    assert json.loads((tmp_path / "dpo2" / "machine_nb.json").read_text())["load_checkpoint"] == sft.state_path
    assert again.steps == 1
    with pytest.raises(ValueError, match="sampler weights"):
        dpo(pairs, load_checkpoint=sft.checkpoint, log_dir=tmp_path / "dpo3", progress=False)
    assert not (tmp_path / "dpo3").exists()


def test_ctrl_c_then_resume_finishes_the_run_without_repeating_steps(pairs, short, sft_run, tmp_path):
    log_dir = tmp_path / "interrupted"
    with ctrl_c_at("dpo", at=5, hold_step=6):
        dpo(pairs, log_dir=log_dir, **SHORT)
    part = read_dpo_log(log_dir)
    assert not part.complete and 4 <= part.steps < 10 and part.state_path.endswith("/weights/000004")
    with pytest.raises(FileExistsError, match="resume="):
        dpo(pairs, log_dir=log_dir, **SHORT)
    with pytest.raises(ValueError, match="not a dpo run"):
        dpo(pairs, resume=sft_run.log_dir, progress=False)
    done = dpo(pairs, resume=log_dir, progress=False)
    assert done.complete and done.steps == 10 and done.tokens == short.tokens
    full, resumed = mnb.training_metrics(short.log_dir), mnb.training_metrics(log_dir)
    assert list(resumed["step"]) == list(range(10))
    # the steps before the checkpoint are the uninterrupted run's; the cookbook then takes its
    # reference model from the weights it resumes from, so step 4 is measured from log 2 again
    assert list(resumed["dpo_loss"][:4]) == list(full["dpo_loss"][:4])
    assert math.isclose(resumed["dpo_loss"].iloc[4], math.log(2), rel_tol=1e-4)
    assert not math.isclose(full["dpo_loss"].iloc[4], math.log(2), rel_tol=1e-4)
    assert done.last_loss < 0.05 and resumed["accuracy"].iloc[-1] == 1.0
    # and the result says so: where it resumed and what that changed
    assert done.resumed_at == [4] and "resumed at step 4" in done.note and "steps 4-9" in done.note
    assert short.resumed_at == [] and short.note is None and part.note is None
    assert score_pairs(pairs, checkpoint=done.checkpoint)["correct"].mean() == 1.0


def test_dpo_works_inside_a_running_event_loop_as_in_jupyter(short):
    """The short run is called from a coroutine inside asyncio.run (see its fixture)."""
    assert short.steps == 10 and short.complete


def test_bad_pairs_are_refused_before_anything_is_written(pairs, tmp_path):
    same = pairs.to_dict("records")[:8]
    same[3] = {**same[3], "rejected": same[3]["chosen"]}
    with pytest.raises(MachineFormatError, match=r"<pairs>:4 \(field 'chosen'\): chosen and rejected are the same"):
        dpo(same, log_dir=tmp_path / "same", progress=False)
    long = pairs.to_dict("records")[:8]
    long[5] = {**long[5], "rejected": [{"role": "assistant", "content": "12 + 1 = 13. " * 40}]}
    with pytest.raises(ValidationFailed, match=r"pair 6 \(rejected\)"):
        dpo(long, log_dir=tmp_path / "long", progress=False)
    with pytest.raises(ValueError, match="no full batch"):
        dpo(pairs.head(3), log_dir=tmp_path / "few", progress=False)
    with pytest.raises(EngineError, match="engine='tinker'"):
        dpo(pairs, model="Qwen/Qwen3-8B", engine="local", log_dir=tmp_path / "qwen", progress=False)
    other = mnb.TrainResult(checkpoint=None, steps=1, tokens=1, first_loss=1.0, last_loss=1.0, log_dir=str(tmp_path),
                            cost_usd=0.0, model="local/other-tiny", engine="local",
                            state_path="tinker://local-0123456789ab:train:0/weights/final")
    with pytest.raises(ValueError, match="trained from 'local/other-tiny'"):
        dpo(pairs, model="local/arith-tiny", load_checkpoint=other, log_dir=tmp_path / "other", progress=False)
    assert not any((tmp_path / d).exists() for d in ("same", "long", "few", "qwen", "other"))


# --------------------------------------------------------------------------- Tinker: refused before spending


@pytest.fixture
def no_network(monkeypatch):
    monkeypatch.setattr(tinker_engine, "probe", lambda *a: pytest.fail("must refuse before connecting"))
    yield
    clear_prices()


@pytest.mark.filterwarnings("ignore::machine_nb.checks.tokens.TokenEstimateWarning")  # a made-up model: estimated counts
def test_the_estimate_counts_the_reference_model_and_the_policy_forward_pass(pairs):
    try:
        set_price("someone/Priced-8B", train=2.0, prefill=0.5, sample=1.0)
        est = estimate_dpo_cost(pairs, "someone/Priced-8B", epochs=3, batch_size=8)
        assert est.pairs == 44 and est.steps == 15 and est.tokens > 0
        passed = est.tokens * 3 / 1e6
        assert math.isclose(est.train_usd, passed * 2.0) and math.isclose(est.forward_usd, passed * 2.0)
        assert math.isclose(est.reference_usd, passed * 0.5)
        assert math.isclose(est.usd, est.train_usd + est.forward_usd + est.reference_usd)
        assert "reference model" in est._repr_html_()
        with pytest.raises(BudgetExceeded, match="over the budget"):
            estimate_dpo_cost(pairs, "someone/Priced-8B", epochs=3, max_usd=est.usd / 2)
    finally:
        clear_prices()


def test_unknown_prices_are_refused_before_connecting(pairs, tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    with pytest.raises(UnknownPrice, match="cannot bound the cost"):  # no price at all
        dpo(pairs, model="someone/Unpriced-7B", engine="tinker", log_dir=tmp_path / "a", progress=False)
    with pytest.raises(UnknownPrice, match="cannot bound the cost"):  # sampling prices, no training price
        dpo(pairs, model="thinkingmachines/Inkling-Small", engine="tinker", log_dir=tmp_path / "b", progress=False)
    set_price("someone/TrainOnly-7B", train=1.0)                      # no prefill price for the reference model
    with pytest.raises(UnknownPrice, match="prefill"):
        dpo(pairs, model="someone/TrainOnly-7B", engine="tinker", log_dir=tmp_path / "c", progress=False)
    assert not any((tmp_path / d).exists() for d in "abc")


def test_over_budget_is_refused_before_connecting(pairs, tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    with pytest.raises(BudgetExceeded, match="over the budget"):
        dpo(pairs, model="thinkingmachines/Inkling", engine="tinker", max_usd=1e-6, log_dir=tmp_path / "d",
            progress=False)
    assert not (tmp_path / "d").exists()


def test_no_key_or_no_service_is_refused_before_anything_is_written(pairs, tmp_path, monkeypatch):
    import socket

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    with pytest.raises(EngineError, match="TINKER_API_KEY is not set"):
        dpo(pairs, model="thinkingmachines/Inkling", engine="tinker", log_dir=tmp_path / "e", progress=False)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    with pytest.raises(EngineError, match="did not answer") as err:
        dpo(pairs, model="thinkingmachines/Inkling", engine="tinker", base_url=f"http://127.0.0.1:{port}",
            log_dir=tmp_path / "f", progress=False)
    assert SECRET not in str(err.value)
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()


def test_cli_dpo_trains_locally_and_asks_before_spending_on_tinker(pairs, tmp_path, capsys):
    from machine_nb.cli import main
    from machine_nb.training.pairs import write_pairs

    path = write_pairs(pairs, tmp_path / "pairs.jsonl")
    assert main(["dpo", str(path), "--steps", "2", "--log-dir", str(tmp_path / "cli"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 2 and out["checkpoint"].startswith("tinker://local-")
    code = main(["dpo", str(path), "--engine", "tinker", "--model", "thinkingmachines/Inkling"])
    err = capsys.readouterr().err
    assert code == 4 and "--yes" in err and "reference model" in err and "$" in err
    assert not (tmp_path / "runs").exists()
