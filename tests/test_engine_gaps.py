"""The local engine's numerics at their edges: loss settings that cannot mean anything are refused
naming the field (losses.py), RL losses computed where the model's log-probabilities live, AdamW
settings outside their ranges refused before anything changes (adamw.py), and a step that fails
leaving the run exactly as it was, optimizer settings included (steps.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import losses as ls
from machine_nb.engines.local.adamw import AdamW
from machine_nb.engines.local.steps import kept_if_not_finite
from machine_nb.errors import EngineError

SAMPLING = np.array([-1.1, -2.0, -0.4], np.float32)
ADVANTAGES = np.array([1.0, -1.0, 0.5], np.float32)


def rl_inputs(**extra: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"logprobs": SAMPLING, "advantages": ADVANTAGES, **extra}]


# -- losses


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo", "gspo"])
@pytest.mark.parametrize("config, field", [
    ({"clip_low_threshold": 1.5, "clip_high_threshold": 0.5}, "loss_fn_config.clip_low_threshold"),
    ({"clip_low_threshold": 0.0, "clip_high_threshold": -1.0}, "loss_fn_config.clip_high_threshold"),
    ({"clip_low_threshold": -0.2}, "loss_fn_config.clip_low_threshold"),
])
def test_clip_thresholds_that_are_negative_or_crossed_are_refused_naming_the_setting(loss_fn, config, field):
    """A ratio is positive: a negative bound, or a low bound above the high one, means nothing (a
    negative high bound would flip cispo's gradient and train away from the advantages)."""
    with pytest.raises(ls.LossError) as caught:
        ls.prepare(loss_fn, config, rl_inputs(), [3])
    assert caught.value.field == field


def test_per_token_clip_thresholds_that_cross_are_refused_naming_the_datum():
    low = np.array([0.8, 1.3, 0.8], np.float32)
    with pytest.raises(ls.LossError, match="above") as caught:
        ls.prepare("ppo", {}, rl_inputs(clip_low_threshold=low), [3])
    assert caught.value.field == "data.0.loss_fn_inputs.clip_low_threshold"


def test_a_negative_dro_beta_is_refused():
    """beta weighs a squared-distance penalty: a negative one rewards drifting from the sampler
    without bound."""
    with pytest.raises(ls.LossError, match="beta") as caught:
        ls.prepare("dro", {"beta": -0.1}, rl_inputs(), [3])
    assert caught.value.field == "loss_fn_config.beta"
    assert ls.prepare("dro", {"beta": 0.0}, rl_inputs(), [3]).fn is not None


def test_a_finite_input_too_large_for_float32_is_named_as_such():
    """1e300 is a finite number: the message says it is out of range, not that it is NaN."""
    with pytest.raises(ls.LossError, match="float32") as caught:
        ls.prepare("cross_entropy", {}, [{"weights": np.array([1e300, 0.0, 1.0])}], [3])
    assert caught.value.field == "data.0.loss_fn_inputs.weights"


@pytest.mark.parametrize("loss_fn, config", [("importance_sampling", {}), ("ppo", {}), ("cispo", {}),
                                             ("dro", {"beta": 0.1}), ("gspo", {})])
def test_rl_losses_work_on_the_device_of_the_log_probabilities(loss_fn, config):
    """A real model trains on a GPU, so the target log-probabilities arrive there ("meta" stands in
    for a GPU on a machine without one: it has the device checks, not the arithmetic)."""
    fn = ls.prepare(loss_fn, config, [{"logprobs": SAMPLING, "advantages": ADVANTAGES},
                                      {"logprobs": SAMPLING[:1], "advantages": ADVANTAGES[:1]}], [3, 1]).fn
    out = fn(torch.zeros(2, 3, device="meta", requires_grad=True))
    assert out.device.type == "meta" and out.shape == (2, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; the meta-device test covers devices")
def test_rl_losses_on_a_gpu_match_the_same_losses_on_the_cpu():
    fn = ls.prepare("ppo", {}, rl_inputs(), [3]).fn
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    assert torch.allclose(fn(lp.cuda()).cpu(), fn(lp))


# -- AdamW


def one_param() -> tuple[torch.nn.Parameter, AdamW]:
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 0.5]))
    p.grad = torch.tensor([0.1, 0.0, -0.2])
    return p, AdamW([p])


GOOD = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}


@pytest.mark.parametrize("setting, value, named", [
    ("beta1", 1.0, "beta1"), ("beta1", 1.5, "beta1"), ("beta1", -0.1, "beta1"),
    ("beta2", 1.0, "beta2"), ("beta2", -0.5, "beta2"),
    ("eps", 0.0, "eps"), ("eps", -1e-8, "eps"),
    ("lr", -1e-3, "learning_rate"), ("weight_decay", -0.1, "weight_decay"),
    ("lr", float("nan"), "learning_rate"), ("eps", float("inf"), "eps"),
])
def test_adamw_settings_outside_their_ranges_are_refused_before_anything_changes(setting, value, named):
    """beta1 = 1 divided by zero (an internal error), beta2 = 1 and eps = 0 made every weight with
    a zero gradient NaN, and a beta above 1 stepped silently: each is refused naming the setting
    as Tinker's AdamParams calls it, with the weights and optimizer state untouched."""
    p, opt = one_param()
    before = p.detach().clone()
    with pytest.raises(ValueError, match=named):
        opt.step(**{**GOOD, setting: value})
    assert torch.equal(p.detach(), before) and not opt.state
    opt.step(**GOOD)
    assert not torch.equal(p.detach(), before)


def test_adamw_accepts_the_edges_of_its_ranges():
    p, opt = one_param()
    opt.step(lr=0.0, beta1=0.0, beta2=0.0, eps=1e-12, weight_decay=0.0)
    assert torch.equal(p.detach(), torch.tensor([1.0, 2.0, 0.5]))


# -- a training run's state around a failed step


def test_a_refused_optim_step_on_a_trainer_leaves_the_run_as_it_was():
    from machine_nb.engines.local.compute import Example, Trainer

    t = Trainer(DEFAULT_MODEL, rank=2, seed=3)
    ids = [5, 17, 23, 9, 11]
    batch = [Example(ids, np.array(ids[1:] + [2], np.int64), np.ones(5, np.float32))]
    t.guarded_forward_backward(batch, backward=True)
    t.guarded_optim_step(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12)
    t.guarded_forward_backward(batch, backward=True)
    weights = [q.detach().clone() for q in t.params]
    grads = [q.grad.detach().clone() for q in t.params]
    saved = t.optimizer.state_dict()
    with pytest.raises(ValueError, match="beta1"):
        t.guarded_optim_step(learning_rate=1e-2, beta1=1.0, beta2=0.95, eps=1e-12)
    assert all(torch.equal(q.detach(), w) for q, w in zip(t.params, weights))
    assert all(torch.equal(q.grad, g) for q, g in zip(t.params, grads))
    now = t.optimizer.state_dict()
    assert now["param_groups"] == saved["param_groups"]
    assert all(torch.equal(now["state"][i][k], saved["state"][i][k]) for i in saved["state"] for k in saved["state"][i])


class Run:
    """The two things the guard reads from a trainer: its trainable tensors and its optimizer."""

    def __init__(self) -> None:
        self.params = [torch.nn.Parameter(torch.linspace(-1, 1, 6))]
        self.optimizer = AdamW(self.params)

    def step(self, lr: float, scale: float = 1.0) -> None:
        ((self.params[0] ** 2).sum() * scale).backward()
        self.optimizer.step(lr=lr, beta1=0.9, beta2=0.999, eps=1e-8)
        self.optimizer.zero_grad()


def test_a_step_gone_non_finite_keeps_the_optimizers_last_settings():
    """The settings a checkpoint's optimizer state records are the last step that was kept."""
    run = Run()
    run.step(lr=0.1)
    with pytest.raises(EngineError, match="NaN or infinite"):
        with kept_if_not_finite(run, "optim_step", weights=True):
            run.step(lr=1e30, scale=float("inf"))
    assert run.optimizer.state_dict()["param_groups"][0]["lr"] == 0.1
