"""LoRA for the local engine: low-rank adapters on attention and MLP projections and, when asked
(Tinker's `train_unembed`), on the output projection, like Tinker's.

`apply_lora` wraps the base model's projections (`attn.q_proj/k_proj/v_proj/o_proj`,
`mlp.fc_in/fc_out`) in `LoRALinear` and freezes everything else; the trainer (compute.py)
optimises only the adapters, saves them as a checkpoint, and a sampler merges them into a copy
of the base for fast generation. alpha = 2 * rank (scale 2.0 at every
rank), the common choice, so a learning rate found at one rank carries over to others.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: Projections that get adapters, by the last two parts of their module name.
ATTN_TARGETS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj")
MLP_TARGETS = ("mlp.fc_in", "mlp.fc_out")


def default_alpha(rank: int) -> float:
    """alpha = 2 * rank: the adapter's update is scaled by alpha / rank = 2 at every rank."""
    return 2.0 * rank


class LoRALinear(nn.Module):
    """`base(x) + scale * x @ A.T @ B.T`, with `base` frozen; B starts at zero, so the wrap is exact."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be at least 1, got {rank}")
        self.base = base
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        for p in base.parameters():
            p.requires_grad_(False)
        # A as nn.Linear's own init (kaiming-uniform, a=sqrt(5)), from an explicit generator
        # so adapters are reproducible from the client's seed.
        bound = 1.0 / math.sqrt(base.in_features)
        a = (torch.rand(rank, base.in_features, generator=generator) * 2 - 1) * bound
        self.lora_a = nn.Parameter(a.to(base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    def merged(self) -> nn.Linear:
        """A plain nn.Linear with the adapter folded into its weight (for sampling)."""
        out = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.base.weight + self.scale * (self.lora_b @ self.lora_a))
            if self.base.bias is not None:
                out.bias.copy_(self.base.bias)
        out.requires_grad_(False)
        return out


class UnembedLoRA(nn.Module):
    """A low-rank update of the output projection (the unembedding, tied to the input embedding in
    the local GPT): logits += scale * h @ A.T @ B.T, with h the final layer norm's output. Attached
    as `model.unembed_lora` with two forward hooks (one keeps h, one adds the update), so the tied
    embedding itself stays frozen and untouched; B starts at zero, so attaching it is exact."""

    def __init__(self, n_embd: int, vocab_size: int, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        bound = 1.0 / math.sqrt(n_embd)
        self.lora_a = nn.Parameter((torch.rand(rank, n_embd, generator=generator) * 2 - 1) * bound)
        self.lora_b = nn.Parameter(torch.zeros(vocab_size, rank))
        self._h: torch.Tensor | None = None

    def keep(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self._h = output

    def add(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        h, self._h = self._h, None
        return output + (h @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def target_names(model: nn.Module, *, attn: bool = True, mlp: bool = True) -> list[str]:
    """Names of the nn.Linear modules that get adapters (attention and/or MLP projections)."""
    suffixes = (ATTN_TARGETS if attn else ()) + (MLP_TARGETS if mlp else ())
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.endswith(suffixes)]


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def apply_lora(model: nn.Module, rank: int, *, alpha: float | None = None, seed: int = 0,
               attn: bool = True, mlp: bool = True, unembed: bool = False) -> list[str]:
    """Freeze `model` and wrap its attention/MLP projections in LoRALinear, in place.

    `alpha`: default None = 2 * rank. `seed`: initialises the A matrices (B starts at zero), in
    module order, so the same seed gives the same adapters. Returns the wrapped module names;
    raises ValueError when the model has none of the expected projections.
    """
    names = target_names(model, attn=attn, mlp=mlp)
    if not names:
        raise ValueError("no attention/MLP projections (attn.q_proj … mlp.fc_out) found to adapt")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(int(seed))
    alpha = default_alpha(rank) if alpha is None else alpha
    for name in names:
        _set_module(model, name, LoRALinear(model.get_submodule(name), rank, alpha, generator))
    if unembed:  # after the projections: their adapters are the same with or without it
        cfg = model.config
        model.unembed_lora = UnembedLoRA(cfg.n_embd, cfg.vocab_size, rank, alpha, generator)
        model.ln_f.register_forward_hook(model.unembed_lora.keep)
        model.register_forward_hook(model.unembed_lora.add)
        names.append("unembed_lora")
    return names


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The LoRALinear modules of `model`, by name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def _adapters(model: nn.Module) -> dict[str, nn.Module]:
    """Every adapter of `model` by name: the projections' and the unembedding's."""
    return {name: m for name, m in model.named_modules() if isinstance(m, (LoRALinear, UnembedLoRA))}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors (`<module>.lora_a`, `<module>.lora_b`), detached copies, for saving."""
    state = {}
    for name, m in _adapters(model).items():
        state[f"{name}.lora_a"] = m.lora_a.detach().clone().contiguous()
        state[f"{name}.lora_b"] = m.lora_b.detach().clone().contiguous()
    return state


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors into a model that `apply_lora` wrapped with the same rank and targets."""
    modules = _adapters(model)
    expected = {f"{n}.{p}" for n in modules for p in ("lora_a", "lora_b")}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"adapter tensors do not match the model (missing {missing[:4]}, unexpected {extra[:4]})")
    with torch.no_grad():
        for key, value in state.items():
            name, _, param = key.rpartition(".")
            target = getattr(modules[name], param)
            if target.shape != value.shape:
                raise ValueError(f"adapter {key}: shape {tuple(value.shape)} != model's {tuple(target.shape)}")
            target.copy_(value)


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every projection's adapter into its base projection, in place (for sampling); returns
    `model`. The unembedding's adapter stays as it is (the embedding it would fold into is tied to
    the input's)."""
    for name, m in list(lora_modules(model).items()):
        _set_module(model, name, m.merged())
    return model
