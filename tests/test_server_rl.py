"""The RL loss functions Tinker documents, served by the local engine: their values against the
documented formulas computed client-side, and tinker-cookbook's own RL loop (`rl.train.main`)
with its own arithmetic environment, unmodified, learning on the tiny model."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import server as server_mod

IDS = [5, 17, 23, 9, 11, 40, 3, 8, 12]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("rl") / "data").start()
    yield s
    s.stop()


def _rl_datum(sampling, advantages, **extra):
    return types.Datum(model_input=types.ModelInput.from_ints(IDS),
                       loss_fn_inputs={"target_tokens": IDS[1:] + [2], "logprobs": sampling,
                                       "advantages": advantages, **extra})


def test_rl_losses_match_the_documented_formulas(srv):
    sc = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    ce = types.Datum(model_input=types.ModelInput.from_ints(IDS),
                     loss_fn_inputs={"target_tokens": IDS[1:] + [2], "weights": [1.0] * len(IDS)})
    lp = torch.tensor(tc.forward([ce], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist())
    rng = np.random.default_rng(0)
    sampling = (lp + torch.tensor(rng.normal(0, 0.3, len(IDS)), dtype=torch.float32)).tolist()
    adv = rng.normal(0, 1, len(IDS)).astype(np.float32).tolist()
    q, a = torch.tensor(sampling), torch.tensor(adv)
    ratio = torch.exp(lp - q)
    expected = {
        ("importance_sampling", None): -(ratio * a).sum(),
        ("ppo", None): -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a).sum(),
        ("ppo", (0.9, 1.1)): -torch.minimum(ratio * a, ratio.clamp(0.9, 1.1) * a).sum(),
        ("cispo", None): -(ratio.clamp(0.0, 4.0) * lp * a).sum(),
        ("dro", 0.05): -(lp * a - 0.5 * 0.05 * (lp - q) ** 2).sum(),
    }
    for (name, setting), value in expected.items():
        config = ({"clip_low_threshold": setting[0], "clip_high_threshold": setting[1]} if isinstance(setting, tuple)
                  else {"beta": setting} if setting is not None else None)
        out = tc.forward([_rl_datum(sampling, adv)], name, config).result()
        assert out.metrics["loss:sum"] == pytest.approx(float(value), rel=1e-4, abs=1e-4), name
        assert np.allclose(out.loss_fn_outputs[0]["logprobs"].tolist(), lp.tolist(), atol=1e-5)
    with pytest.raises(tinker.BadRequestError, match="dro needs loss_fn_config 'beta'"):
        tc.forward([_rl_datum(sampling, adv)], "dro").result()
    with pytest.raises(tinker.BadRequestError, match="takes no loss_fn_config 'beta'"):
        tc.forward([_rl_datum(sampling, adv)], "ppo", {"beta": 1.0}).result()
    sc.close("success").result(timeout=60)


def test_the_cookbooks_rl_loop_learns_on_the_local_engine(srv, tmp_path, monkeypatch):
    """`rl.train.main` with the cookbook's arithmetic environment (importance_sampling, served by
    the local engine): the run completes, and its reward in the last steps is above the first.
    Groups of 4 samples a problem suffice: wherever a group's rewards differ, its advantages (reward
    minus the group's mean) push toward the better samples, which is what the loss learns from."""
    import machine_nb
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder
    from tinker_cookbook.rl import train as rl_train

    machine_nb.use_local_models()
    monkeypatch.setenv("TINKER_API_KEY", srv.key)
    steps = 12
    config = rl_train.Config(
        learning_rate=1e-3, model_name=DEFAULT_MODEL, recipe_name="machine_nb_test_rl", max_tokens=16,
        log_path=str(tmp_path / "rl"), eval_every=0, save_every=0, renderer_name="machine_nb/local_chat",
        base_url=srv.url, lora_rank=8, max_steps=steps, num_groups_to_log=0, rollout_json_export=False,
        dataset_builder=ArithmeticDatasetBuilder(batch_size=4, model_name_for_tokenizer=DEFAULT_MODEL,
                                                 renderer_name="machine_nb/local_chat", n_batches=steps,
                                                 group_size=4, include_fewshot=False))
    asyncio.run(rl_train.main(config))
    rewards = [json.loads(line)["env/all/reward/total"] for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert len(rewards) == steps
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.1
