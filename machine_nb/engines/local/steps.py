"""A training step that fails, or leaves a gradient or weight NaN or infinite, leaves its run as
it was before it: `kept_if_not_finite`, the guard of `Trainer.guarded_forward_backward` and
`guarded_optim_step` (compute.py), for any trainer of the local engine (compute.py's,
hf_compute.py's), in the server's process or in a training process of its own (workers.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ...errors import EngineError


def _flat(tensors: list) -> dict:
    """Flat float32 copies of `tensors`, one per device they live on (one copy per device, not one
    per tensor: many small tensors). An optimizer's state can span devices: AdamW keeps its step
    counts on the CPU beside moments on the GPU."""
    import torch

    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.device, []).append(t.detach().reshape(-1).float())
    return {device: torch.cat(parts) for device, parts in groups.items()}


def _put_back(tensors: list, flat: dict) -> None:
    import torch

    with torch.no_grad():
        offsets = dict.fromkeys(flat, 0)
        for t in tensors:
            n, at = t.numel(), offsets[t.device]
            t.copy_(flat[t.device][at:at + n].view_as(t))
            offsets[t.device] = at + n


def _finite(flat: dict) -> bool:
    import torch

    return all(bool(torch.isfinite(part).all()) for part in flat.values())


@contextlib.contextmanager
def kept_if_not_finite(trainer: Any, call: str, *, weights: bool = False) -> Iterator[None]:
    """Run a training step so that a step that fails, or leaves a gradient (or, with `weights`, a
    trainable weight) NaN or infinite, leaves the run as it was before it: gradients, and with
    `weights` the parameters and the optimizer's state and last settings, are put back, and the step
    fails saying why.
    Works on any trainer with `params` (its trainable tensors) and `optimizer` (None until the
    first step)."""
    import torch

    params = list(getattr(trainer, "params", ()))
    had_grad = [q for q in params if q.grad is not None]
    grads = _flat([q.grad for q in had_grad]) if had_grad else None  # none: the usual first step
    if weights:
        values = _flat(params)
        optimizer = trainer.optimizer
        kept = [] if optimizer is None else [(q, dict(optimizer.state[q])) for q in params if q in optimizer.state]
        # the last step's settings, which a checkpoint of the optimizer records (adamw.py)
        settings = None if optimizer is None else dict(getattr(optimizer, "settings", None) or {})
        state_tensors = [v for _, st in kept for v in st.values() if isinstance(v, torch.Tensor)]
        state = _flat(state_tensors)

    def restore() -> None:
        with torch.no_grad():
            for q in params:
                q.grad = None
            for q in had_grad:
                q.grad = torch.zeros_like(q)
            if had_grad:
                _put_back([q.grad for q in had_grad], grads)
            if weights:
                _put_back(params, values)
                if optimizer is None:
                    trainer.optimizer = None
                else:
                    optimizer.state.clear()
                    for q, st in kept:
                        optimizer.state[q] = st
                    _put_back(state_tensors, state)
                    if settings:
                        optimizer.settings = settings

    try:
        yield
    except BaseException:
        restore()
        raise
    what = None
    if not _finite(_flat([q.grad for q in params if q.grad is not None])):
        what = "gradient"
    elif weights:
        after = _flat(params)
        if not _finite(after):
            what = "parameter"
        else:
            largest = max((float(part.abs().max()) for part in after.values() if part.numel()), default=None)
            if largest is not None and not _adapted_weights_finite(getattr(trainer, "model", None), largest):
                what = "weight (base plus adapter)"
    if what is not None:
        restore()
        raise EngineError(f"{call}: this step made a {what} NaN or infinite (a learning rate, beta2 or loss "
                          "weight too large?); the run is kept as it was before it. Retry with smaller "
                          "settings.")


def _adapted_weights_finite(model: Any, largest: float) -> bool:
    """Whether every LoRA-adapted weight (base + scale * B @ A) is finite: finite adapters can still
    multiply out to infinity, which a sampler (that merges them) would then serve. `largest` bounds
    every adapter value, so the products are computed only when that bound does not settle it."""
    import torch

    from .lora import lora_modules

    if not isinstance(model, torch.nn.Module):
        return True
    modules = list(lora_modules(model).values())
    if not modules or max(m.scale * m.rank for m in modules) * largest * largest < 1e30:
        return True
    with torch.no_grad():
        return all(bool(torch.isfinite(m.base.weight + m.scale * (m.lora_b @ m.lora_a)).all()) for m in modules)
