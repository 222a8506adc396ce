"""The loss functions the local engine serves for `forward_backward`, by Tinker's names.

Each works on the per-token log-probabilities of the target tokens under the model being trained
(`target_logprobs`, one row per datum, padded to the batch's width), so it does not depend on the
model behind them: the server checks a request's inputs here (`prepare`), and the trainer calls
the returned function on its log-probabilities to get the per-token losses it sums and
differentiates. The formulas, inputs, defaults and outputs follow Tinker's loss documentation:

| loss_fn | loss_fn_inputs (besides target_tokens) | loss_fn_config | per-token loss |
|---|---|---|---|
| cross_entropy | weights | none | -w * lp |
| importance_sampling | logprobs, advantages | none | -r * A, with r = exp(lp - logprobs) |
| ppo | logprobs, advantages | clip_low_threshold 0.8, clip_high_threshold 1.2 | -min(r * A, clip(r) * A) |
| cispo | logprobs, advantages | clip_low_threshold 0.0, clip_high_threshold 4.0 | -sg(clip(r)) * lp * A |
| dro | logprobs, advantages | beta (required) | -(lp * A - beta/2 * (lp - logprobs)^2) |
| gspo | logprobs, advantages, sequence_ratio_mask (optional) | as ppo | ppo's, with every token's ratio taking its sequence's geometric-mean ratio as value |

Clip thresholds may also come per token as loss_fn_inputs of the same names (Tinker's datum
types list them). `stable_reinforce` and client-side `custom` losses are refused with a message
saying so (`forward_backward_custom` runs custom losses through cross_entropy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

_RL_INPUTS = ("logprobs", "advantages")
#: loss_fn -> (required loss_fn_inputs besides target_tokens, optional ones, config keys with defaults)
LOSSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict[str, float | None]]] = {
    "cross_entropy": (("weights",), (), {}),
    "importance_sampling": (_RL_INPUTS, (), {}),
    "ppo": (_RL_INPUTS, ("clip_low_threshold", "clip_high_threshold"),
            {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": (_RL_INPUTS, ("clip_low_threshold", "clip_high_threshold"),
              {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
    "dro": (_RL_INPUTS, (), {"beta": None}),
    "gspo": (_RL_INPUTS, ("sequence_ratio_mask", "clip_low_threshold", "clip_high_threshold"),
             {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
}
_NOT_SERVED = {
    "stable_reinforce": "the local engine does not serve loss_fn 'stable_reinforce'",
    "custom": "loss_fn 'custom' is computed by the client: use forward_backward_custom",
}


class LossError(ValueError):
    """A request's loss function, config or inputs that cannot be used; `field` names which."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


#: f(target_logprobs [batch, width]) -> per-token losses [batch, width] (zero on padding)
LossFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Prepared:
    """A checked loss: its name, the function the trainer calls, and per-datum weights for
    cross_entropy (None for the others)."""

    name: str
    fn: LossFn | None
    weights: list[np.ndarray] | None


def served() -> list[str]:
    """The loss_fn names the local engine computes."""
    return sorted(LOSSES)


def _finite(arr: np.ndarray, where: str) -> None:
    if not np.all(np.isfinite(arr)):
        raise LossError("values must be finite numbers (no NaN or infinity)", where)


def prepare(loss_fn: str, config: dict, inputs: Sequence[dict[str, np.ndarray]], lengths: Sequence[int]) -> Prepared:
    """Check `loss_fn`, its `config` and each datum's `inputs` (target_tokens aside); LossError
    naming the field otherwise. Returns what the trainer needs."""
    if loss_fn in _NOT_SERVED:
        raise LossError(f"{_NOT_SERVED[loss_fn]}; it serves {', '.join(served())}", "loss_fn")
    if loss_fn not in LOSSES:
        raise LossError(f"unknown loss_fn {loss_fn!r}; the local engine serves {', '.join(served())}", "loss_fn")
    required, optional, defaults = LOSSES[loss_fn]
    config = dict(config or {})
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        takes = ", ".join(sorted(defaults)) or "none"
        raise LossError(f"{loss_fn} takes no loss_fn_config {unknown[0]!r} (it takes: {takes})",
                        f"loss_fn_config.{unknown[0]}")
    settings: dict[str, float] = {}
    for key, default in defaults.items():
        value = config.get(key, default)
        if value is None:
            raise LossError(f"{loss_fn} needs loss_fn_config {key!r}", f"loss_fn_config.{key}")
        if isinstance(value, str) or not np.isfinite(float(value)):
            raise LossError(f"{loss_fn}: loss_fn_config {key} must be a finite number, got {value!r}",
                            f"loss_fn_config.{key}")
        settings[key] = float(value)
    known = set(required) | set(optional) | {"target_tokens"}
    columns: dict[str, list[np.ndarray]] = {k: [] for k in (*required, *optional)}
    for i, (d, n) in enumerate(zip(inputs, lengths)):
        for key in required:
            if key not in d:
                raise LossError(f"{loss_fn} needs loss_fn_inputs {key!r}", f"data.{i}.loss_fn_inputs.{key}")
        extra = sorted(set(d) - known)
        if extra:
            raise LossError(f"{loss_fn} takes no loss_fn_inputs {extra[0]!r} (it takes: {', '.join(sorted(known))})",
                            f"data.{i}.loss_fn_inputs.{extra[0]}")
        for key in (*required, *optional):
            if key not in d:
                continue
            arr = np.asarray(d[key])
            where = f"data.{i}.loss_fn_inputs.{key}"
            if arr.dtype.kind not in "fiu":
                raise LossError(f"must be numbers, got {arr.dtype}", where)
            if arr.size != n:
                raise LossError(f"has {arr.size} values for {n} tokens; they must be equal", where)
            arr = arr.astype(np.float32).reshape(-1)
            _finite(arr, where)
            columns[key].append(arr)
        for key in optional:
            if key not in d:
                columns[key].append(None)  # type: ignore[arg-type]
    if loss_fn == "cross_entropy":
        return Prepared(loss_fn, None, columns["weights"])
    return Prepared(loss_fn, RLLoss(loss_fn, settings, columns), None)


def _padded(arrays: Sequence[np.ndarray | None], width: int, fill: float) -> torch.Tensor:
    out = torch.full((len(arrays), width), fill, dtype=torch.float32)
    for i, a in enumerate(arrays):
        if a is not None:
            out[i, :len(a)] = torch.from_numpy(a)
    return out


@dataclass
class RLLoss:
    """One request's RL loss over its inputs: a plain object, so it travels to a training process."""

    loss_fn: str
    settings: dict[str, float]
    columns: dict[str, list]

    def __call__(self, lp: torch.Tensor) -> torch.Tensor:
        loss_fn, settings, columns = self.loss_fn, self.settings, self.columns
        lengths = [len(a) for a in columns["logprobs"]]
        width = lp.shape[1]
        valid = torch.zeros(lp.shape, dtype=torch.bool)
        for i, n in enumerate(lengths):
            valid[i, :n] = True
        # padding gets the target's own log-probability as "sampling" one and no advantage: ratio 1, loss 0
        sampling = torch.where(valid, _padded(columns["logprobs"], width, 0.0), lp.detach())
        adv = _padded(columns["advantages"], width, 0.0)
        log_ratio = lp - sampling
        if loss_fn == "importance_sampling":
            loss = -torch.exp(log_ratio) * adv
        elif loss_fn == "dro":
            loss = -(lp * adv - 0.5 * settings["beta"] * log_ratio ** 2)
        else:
            low = _padded(columns["clip_low_threshold"], width, settings["clip_low_threshold"])
            high = _padded(columns["clip_high_threshold"], width, settings["clip_high_threshold"])
            if loss_fn == "gspo":
                mask = _padded(columns["sequence_ratio_mask"], width, 1.0) * valid
                mask = (mask != 0).float()
                seq = (log_ratio.detach() * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
                log_ratio = seq + lp - lp.detach()
            ratio = torch.exp(log_ratio)
            clipped = torch.minimum(torch.maximum(ratio, low), high)
            if loss_fn == "cispo":
                loss = -clipped.detach() * lp * adv
            else:  # ppo, gspo
                loss = -torch.minimum(ratio * adv, clipped * adv)
        return torch.where(valid, loss, torch.zeros_like(loss))
