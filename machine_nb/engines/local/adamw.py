"""AdamW for the local engine's trainers, in plain tensor operations.

The arithmetic is torch.optim.AdamW's single-tensor path (`foreach=False`, decoupled weight decay),
operation for operation, so a step gives bit-identical weights; the state (`state[param]`: a CPU
float32 `step`, `exp_avg`, `exp_avg_sq`) and `state_dict()` have torch's layout, so a checkpoint's
optimizer.pt loads in either. It exists because torch's optimizer classes import torch's compiler
stack (`torch._dynamo`) the first time a group is added or a step is taken: seconds of start-up in
every process that trains, for a compiler the engine never uses.

Tinker's `optim_step` carries its settings in each request, so `step` takes them as arguments and
refuses, before changing anything, those outside the ranges where the update is defined (torch's
ranges, with eps above 0: at 0 every weight whose gradients were all zero so far becomes 0/0).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch


def settings_problem(*, lr: float, beta1: float, beta2: float, eps: float,
                     weight_decay: float) -> tuple[str, str] | None:
    """The first setting outside its range, by Tinker's AdamParams names, and what it must be:
    learning_rate and weight_decay 0 or more, beta1 and beta2 at least 0 and below 1 (at 1 a bias
    correction divides by zero), eps above 0; None when every one is in range."""
    at_least_0, unit, positive = (lambda v: v >= 0, "0 or more"), (lambda v: 0 <= v < 1, "at least 0 and below 1"), \
        (lambda v: v > 0, "above 0")
    for name, value, (ok, says) in (("learning_rate", lr, at_least_0), ("beta1", beta1, unit), ("beta2", beta2, unit),
                                    ("eps", eps, positive), ("weight_decay", weight_decay, at_least_0)):
        if not (math.isfinite(float(value)) and ok(float(value))):
            return name, f"must be a finite number {says}, got {value!r}"
    return None


def check_settings(*, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """ValueError naming the first setting outside its range (settings_problem)."""
    problem = settings_problem(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    if problem is not None:
        raise ValueError(f"AdamW {problem[0]} {problem[1]}")


class AdamW:
    """AdamW over `params` (the trainable tensors); state is made for a tensor at its first step
    with a gradient. Settings come with each `step`."""

    def __init__(self, params: Iterable[torch.Tensor]):
        self.params = list(params)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        #: the last step's settings, kept for state_dict (torch's param_groups layout)
        self.settings = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}

    @torch.no_grad()
    def step(self, *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float = 0.0) -> None:
        """One update of every tensor that has a gradient.

        Raises:
            ValueError: a setting outside its range, named as Tinker's AdamParams names it; nothing
                has changed then.
        """
        check_settings(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        self.settings = {"lr": lr, "betas": (beta1, beta2), "eps": eps, "weight_decay": weight_decay}
        for param in self.params:
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(param)
            if state is None:
                state = self.state[param] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
            exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            step_t += 1
            if weight_decay != 0:
                param.mul_(1 - lr * weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            bias_correction1 = 1 - beta1 ** step
            bias_correction2 = 1 - beta2 ** step
            step_size = lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def zero_grad(self) -> None:
        """Drop every gradient (set to None)."""
        for param in self.params:
            param.grad = None

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.AdamW's layout: state by parameter index, one parameter group."""
        index = {id(p): i for i, p in enumerate(self.params)}
        group = {**self.settings, "amsgrad": False, "maximize": False, "foreach": False, "capturable": False,
                 "differentiable": False, "fused": None, "decoupled_weight_decay": True,
                 "params": list(range(len(self.params)))}
        return {"state": {index[id(p)]: dict(s) for p, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Load a state_dict of this class or of torch.optim.AdamW over the same parameters.

        Raises:
            ValueError: the saved state is for other parameters (count or shapes).
        """
        groups = saved["param_groups"]
        order = [i for g in groups for i in g["params"]]
        if len(order) != len(self.params):
            raise ValueError(f"the state is for {len(order)} tensors, this run trains {len(self.params)}")
        by_index = dict(zip(order, self.params))
        state = {}
        for i, values in saved["state"].items():
            param = by_index[int(i)]
            for key in ("exp_avg", "exp_avg_sq"):
                if values[key].shape != param.shape:
                    raise ValueError(f"{key} of tensor {i} has shape {tuple(values[key].shape)}, "
                                     f"the tensor {tuple(param.shape)}")
            state[param] = {"step": values["step"].detach().to(torch.float32).cpu().clone(),
                            "exp_avg": values["exp_avg"].to(dtype=param.dtype, device=param.device).clone(),
                            "exp_avg_sq": values["exp_avg_sq"].to(dtype=param.dtype, device=param.device).clone()}
        self.state = state
        group = groups[0]
        self.settings = {k: group[k] for k in ("lr", "betas", "eps", "weight_decay") if k in group}
