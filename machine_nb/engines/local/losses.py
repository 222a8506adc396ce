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
types list them); they bound a ratio, which is positive, so a negative one or a low one above the
high one is refused, as is a negative dro beta (it would reward drifting from the sampler without
bound). `stable_reinforce` and client-side `custom` losses are refused with a message saying so
(`forward_backward_custom` runs custom losses through cross_entropy).
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


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _float32(arr: np.ndarray, where: str) -> np.ndarray:
    """`arr` as flat float32; LossError for NaN, infinity, or a value past float32's range."""
    if not np.all(np.isfinite(arr)):
        raise LossError("values must be finite numbers (no NaN or infinity)", where)
    if arr.dtype.kind == "f" and arr.size and float(np.abs(arr).max()) > _FLOAT32_MAX:
        raise LossError(f"values must fit in float32 (at most {_FLOAT32_MAX:.3g} in size), "
                        f"got {float(arr.flat[np.abs(arr).argmax()]):g}", where)
    return arr.astype(np.float32).reshape(-1)


def _check_bounds(loss_fn: str, low: np.ndarray | float, high: np.ndarray | float, where_low: str,
                  where_high: str) -> None:
    """Clip thresholds (numbers, or one per token) bound a ratio, which is positive: each must be
    0 or more, and low at most high."""
    lows, highs = np.broadcast_arrays(np.atleast_1d(low), np.atleast_1d(high))
    for values, where, name in ((lows, where_low, "clip_low_threshold"), (highs, where_high, "clip_high_threshold")):
        if values.size and values.min() < 0:
            raise LossError(f"{loss_fn}: {name} bounds a probability ratio and must be 0 or more, "
                            f"got {float(values.min()):g}", where)
    crossed = np.flatnonzero(lows > highs)
    if crossed.size:
        at = int(crossed[0])
        token = f" at token {at}" if lows.size > 1 else ""
        raise LossError(f"{loss_fn}: clip_low_threshold {float(lows[at]):g} is above clip_high_threshold "
                        f"{float(highs[at]):g}{token}; the low bound must be at most the high one", where_low)


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
    if settings.get("beta", 0.0) < 0:
        raise LossError(f"{loss_fn}: loss_fn_config beta weighs a penalty and must be 0 or more, "
                        f"got {settings['beta']:g}", "loss_fn_config.beta")
    if "clip_low_threshold" in settings:
        _check_bounds(loss_fn, settings["clip_low_threshold"], settings["clip_high_threshold"],
                      "loss_fn_config.clip_low_threshold", "loss_fn_config.clip_high_threshold")
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
            columns[key].append(_float32(arr, where))
        for key in optional:
            if key not in d:
                columns[key].append(None)  # type: ignore[arg-type]
        if "clip_low_threshold" in settings and ("clip_low_threshold" in d or "clip_high_threshold" in d):
            low, high = (columns[k][-1] if k in d else settings[k] for k in ("clip_low_threshold", "clip_high_threshold"))
            _check_bounds(loss_fn, low, high, f"data.{i}.loss_fn_inputs.clip_low_threshold",
                          f"data.{i}.loss_fn_inputs.clip_high_threshold")
    if loss_fn == "cross_entropy":
        return Prepared(loss_fn, None, columns["weights"])
    return Prepared(loss_fn, RLLoss(loss_fn, settings, columns), None)


def _padded(arrays: Sequence[np.ndarray | None], width: int, fill: float, device: torch.device) -> torch.Tensor:
    """[len(arrays), width] float32 on `device`: each array from the left, `fill` after it (and for None)."""
    out = torch.full((len(arrays), width), fill, dtype=torch.float32)
    for i, a in enumerate(arrays):
        if a is not None:
            out[i, :len(a)] = torch.from_numpy(a)
    return out.to(device)


@dataclass
class RLLoss:
    """One request's RL loss over its inputs: a plain object, so it travels to a training process."""

    loss_fn: str
    settings: dict[str, float]
    columns: dict[str, list]

    def __call__(self, lp: torch.Tensor) -> torch.Tensor:
        loss_fn, settings, columns = self.loss_fn, self.settings, self.columns
        lengths = [len(a) for a in columns["logprobs"]]
        width, device = lp.shape[1], lp.device  # the model's device: a real model's is a GPU
        valid = torch.zeros(lp.shape, dtype=torch.bool)
        for i, n in enumerate(lengths):
            valid[i, :n] = True
        valid = valid.to(device)
        # padding gets the target's own log-probability as "sampling" one and no advantage: ratio 1, loss 0
        sampling = torch.where(valid, _padded(columns["logprobs"], width, 0.0, device), lp.detach())
        adv = _padded(columns["advantages"], width, 0.0, device)
        log_ratio = lp - sampling
        if loss_fn == "importance_sampling":
            loss = -torch.exp(log_ratio) * adv
        elif loss_fn == "dro":
            loss = -(lp * adv - 0.5 * settings["beta"] * log_ratio ** 2)
        else:
            low = _padded(columns["clip_low_threshold"], width, settings["clip_low_threshold"], device)
            high = _padded(columns["clip_high_threshold"], width, settings["clip_high_threshold"], device)
            if loss_fn == "gspo":
                mask = _padded(columns["sequence_ratio_mask"], width, 1.0, device) * valid
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
