"""A training step's guard (engines/local/steps.py) on a run whose tensors span devices: on a GPU,
the engine's AdamW (as torch's) keeps each parameter's step count on the CPU beside its moments on
the GPU, and the guard snapshots and puts back both."""

from __future__ import annotations

import pytest
import torch

from machine_nb.engines.local.adamw import AdamW
from machine_nb.engines.local.steps import kept_if_not_finite
from machine_nb.errors import EngineError


class Run:
    """The two things the guard reads from a trainer: its trainable tensors and its optimizer."""

    def __init__(self, device: str):
        self.params = [torch.nn.Parameter(torch.linspace(-1, 1, 6, device=device).reshape(2, 3)),
                       torch.nn.Parameter(torch.ones(4, device=device))]
        self.optimizer = AdamW(self.params)

    def step(self, scale: float = 1.0) -> None:
        loss = sum((p * p).sum() for p in self.params) * scale
        loss.backward()
        self.optimizer.step(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8)
        self.optimizer.zero_grad()


def snapshot(run: Run) -> list[torch.Tensor]:
    state = [v for p in run.params for v in run.optimizer.state[p].values() if isinstance(v, torch.Tensor)]
    return [t.detach().clone() if t.device.type == "meta" else t.detach().cpu().clone() for t in [*run.params, *state]]


def test_a_failed_step_puts_back_an_optimizer_state_that_spans_two_devices():
    run = Run("cpu")
    run.step()
    # a state tensor on a second device ("meta" stands in for a GPU on a machine without one)
    run.optimizer.state[run.params[0]]["elsewhere"] = torch.zeros(3, device="meta")
    before = snapshot(run)
    with pytest.raises(RuntimeError, match="the step broke"):
        with kept_if_not_finite(run, "optim_step", weights=True):
            run.step()
            raise RuntimeError("the step broke")
    after = snapshot(run)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before) if a.device.type != "meta")
    assert run.optimizer.state[run.params[0]]["elsewhere"].device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; the CPU test above covers two devices")
def test_on_a_gpu_a_step_gone_non_finite_keeps_adams_cpu_step_counts_and_gpu_moments():
    run = Run("cuda")
    run.step()
    steps = {p.device.type for p in run.params} | {run.optimizer.state[p]["step"].device.type for p in run.params}
    before = snapshot(run)
    with pytest.raises(EngineError, match="NaN or infinite"):
        with kept_if_not_finite(run, "optim_step", weights=True):
            run.step(scale=float("inf"))
    assert all(torch.equal(a, b) for a, b in zip(snapshot(run), before))
    with kept_if_not_finite(run, "optim_step", weights=True):
        run.step()
    assert steps == {"cuda", "cpu"} and float(run.optimizer.state[run.params[0]]["step"]) == 2
