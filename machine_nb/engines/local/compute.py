"""The local engine's work on this CPU: LoRA (or full) training steps and sampling of a local model.

Plain torch over plain data (token-id lists, numpy arrays, dicts): no HTTP and no tinker client
classes here. server.py turns Tinker API requests into calls of `Trainer` and `Sampler` and their
results back into the SDK's wire types; checkpoints.py decides where checkpoint directories live.
Everything is deterministic at a fixed torch thread count (`configure_torch`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import random
import re
import secrets
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...errors import EngineError, MachineFormatError
from . import lora as _lora
from .adamw import AdamW
from .checkpoints import FORMAT, read_meta
from .workarounds import deterministic_kernels

#: torch threads when MACHINE_NB_THREADS is unset: 1, because torch's threads spin-wait for each
#: other, so next to any other busy process more threads make a step slower, not faster; and
#: 1 vs 2 threads change results from the 4th decimal.
DEFAULT_THREADS = 1
#: LoRA seed when a request gives none. Tinker draws a random one; the local engine stays
#: repeatable instead (the same run twice gives the same adapters, losses and outputs).
DEFAULT_LORA_SEED = 0


def configure_torch(threads: int | None = None) -> int:
    """Pin torch's thread count (default $MACHINE_NB_THREADS, else 1) and deterministic kernels.

    Both are process-wide torch settings; the engine sets them because the same seed must give
    bit-identical losses and outputs, which holds only at a fixed thread count.
    """
    if threads is None:
        raw = os.environ.get("MACHINE_NB_THREADS", "").strip()
        try:
            threads = int(raw) if raw else DEFAULT_THREADS
        except ValueError:
            raise EngineError(f"MACHINE_NB_THREADS must be a whole number, got {raw!r}") from None
    threads = max(1, int(threads))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    deterministic_kernels()
    return threads


def _backend(name: Any, role: str) -> Any:
    """The Trainer or Sampler class the registry names for a model served by another backend
    (the real model's, in hf_compute.py), or None for the classes here."""
    import importlib

    from . import MODELS

    entry = MODELS.get(str(name).split(":", 1)[0])
    if entry is None or entry.backend is None:
        return None
    return importlib.import_module(entry.backend).BACKEND[role]


def load_base(base_model: str) -> torch.nn.Module:
    """A fresh float32 copy of a served base model (EngineError for a model not served here); for
    the real model, its shared frozen base (never trained in place)."""
    from . import MODELS, load_base as _load

    if base_model not in MODELS:
        raise EngineError(f"The local engine has no model {base_model!r}; it serves: {', '.join(sorted(MODELS))}.")
    return _load(base_model).eval()


# ---------------------------------------------------------------------------------------------
# checkpoint files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; MachineFormatError naming the file when it is missing or corrupt."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise MachineFormatError(str(path), "missing: the checkpoint has no weights file") from None
    except Exception as exc:  # safetensors raises its own error types for truncated or random bytes
        raise MachineFormatError(str(path), f"not a readable safetensors file ({type(exc).__name__}: {exc})") from None


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    os.chmod(path, 0o600)


def _lora_model(meta: dict, directory: Path) -> torch.nn.Module:
    """The base model with a checkpoint's weights in it (adapters applied, not merged)."""
    model = load_base(meta["base_model"])
    rank = int(meta["lora_rank"])
    if rank > 0:
        targets = meta.get("targets") or {}
        _lora.apply_lora(model, rank, alpha=float(meta.get("lora_alpha") or _lora.default_alpha(rank)),
                         attn=targets.get("attn", True), mlp=targets.get("mlp", True),
                         unembed=targets.get("unembed", False))
        path = directory / "adapter.safetensors"
        try:
            _lora.load_adapter_state(model, read_tensors(path))
        except ValueError as exc:
            raise MachineFormatError(str(path), f"the adapter does not fit {meta['base_model']} at rank {rank}: {exc}") from None
    else:
        path = directory / "model.safetensors"
        try:
            model.load_state_dict(read_tensors(path))
        except RuntimeError as exc:
            raise MachineFormatError(str(path), f"the weights do not fit {meta['base_model']}: {exc}") from None
    return model


# ---------------------------------------------------------------------------------------------
# sampling


@dataclass
class Sample:
    """One sampled continuation: its tokens, their log-probabilities and why it stopped."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


class _ModelShape:
    """The context and vocabulary of `self.model`, as the server's checks read them from a trainer
    or sampler."""

    @property
    def block_size(self) -> int:
        return int(self.model.config.block_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)


class _Kept:
    """What samplers computed, kept in this process for the next request that asks the same of the
    same weights, up to `limit` bytes; once full, new results are computed and not kept (a run that
    cycles through more prompts than fit still finds the first ones)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: dict[tuple, Any] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> Any:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple, value: Any, size: int) -> None:
        with self._lock:
            if key not in self._items and self._bytes + size <= self.limit:
                self._items[key] = value
                self._bytes += size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)


#: Greedy samples (temperature 0: a function of the weights, the prompt and the settings, whatever
#: the seed): an evaluation of a checkpoint that was evaluated before, such as the held-out rows of
#: a run's last step and then `evaluate` of its final checkpoint, or a baseline cell run again.
KEPT_SAMPLES = _Kept(32 * 2**20)
#: Forward passes over the prompts of one-token requests (the SDK's `compute_logprobs`) and of
#: `prompt_logprobs`: the prompt's log-probabilities and its last position's logits. A DPO run asks
#: for the reference log-probabilities of the same pairs every epoch.
KEPT_PROMPT_PASSES = _Kept(64 * 2**20)


def clear_kept() -> None:
    """Forget every kept sample and prompt pass of this process (KEPT_SAMPLES, KEPT_PROMPT_PASSES)."""
    KEPT_SAMPLES.clear()
    KEPT_PROMPT_PASSES.clear()


def weights_digest(model: torch.nn.Module) -> str:
    """A digest of everything a model's outputs depend on: its config and every tensor of its
    state (names, dtypes, shapes and values)."""
    import hashlib

    h = hashlib.blake2b(repr(getattr(model, "config", None)).encode(), digest_size=16)
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class Sampler(_ModelShape):
    """Greedy or seeded sampling, and prompt log-probabilities, from one fixed set of weights.

    `seed`: where the seeds of requests that give none come from (a per-sampler sequence), so a
    run of requests repeats exactly.

    Greedy samples and the prompt passes of one-token requests and of `prompt_logprobs` are kept in
    this process (KEPT_SAMPLES, KEPT_PROMPT_PASSES) by a digest of the weights, the torch thread count
    and the device, so any sampler of the same weights answers them again without a forward pass,
    with the very values a forward pass gives.
    """

    def __new__(cls, model: Any = None, base_model: str = "", *args: Any, **kwargs: Any) -> "Sampler":
        if cls is Sampler:
            cls = _backend(base_model, "Sampler") or cls
        return super().__new__(cls)

    def __init__(self, model: torch.nn.Module, base_model: str, *, seed: int = 0):
        self.model = model.eval().requires_grad_(False)
        self.base_model = base_model
        self._seeds = random.Random(seed)
        self._digest: str | None = None

    @classmethod
    def from_checkpoint(cls, directory: Path, *, seed: int = 0) -> "Sampler":
        """A sampler of a checkpoint directory's weights (LoRA merged); MachineFormatError if corrupt."""
        meta = read_meta(directory)
        backend = _backend(meta["base_model"], "Sampler") if cls is Sampler else None
        if backend is not None:
            return backend.from_checkpoint(directory, seed=seed)
        model = _lora_model(meta, Path(directory))
        if int(meta["lora_rank"]) > 0:
            _lora.merge_lora(model)
        return cls(model, meta["base_model"], seed=seed)

    def next_seed(self) -> int:
        return self._seeds.randrange(2**31)

    def sample(self, ids: Sequence[int], num_samples: int, *, max_tokens: int | None, temperature: float,
               seed: int, stop: Any = None, top_k: int | None = None, top_p: float | None = None) -> list[Sample]:
        """`num_samples` continuations of `ids`; sample i uses `seed + i` (temperature 0 is greedy).

        stop: strings, token ids, or token-id lists; a matched stop stays at the end of `tokens`, as
        on Tinker. max_tokens None: up to the model's context. Raises EngineError for a prompt that
        does not fit the context.
        """
        return self._sample(ids, num_samples, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop,
                            top_k=top_k, top_p=top_p)

    def sample_with_prompt_logprobs(self, ids: Sequence[int], num_samples: int, *, last_n: int | None = None,
                                    **params: Any) -> tuple[list[Sample], list[float | None]]:
        """`sample(ids, num_samples, **params)` and `prompt_logprobs(ids, last_n)` from one forward pass
        over the prompt (the first sample's; for one token, a pass kept from an earlier request of
        the same prompt): the same values the two calls give."""
        if params.get("max_tokens") != 1:
            prompt: list[torch.Tensor] = []
            samples = self._sample(ids, num_samples, on_prompt=prompt.append, **params)
            return samples, _prompt_logprobs(prompt[0], ids, last_n)
        self._check_prompt(ids)
        logprobs, last = self._prompt_pass(ids)
        samples = self._sample(ids, num_samples, last_logits=last, **params)
        return samples, prompt_logprobs_list(logprobs.tolist(), last_n)

    def _weights_key(self) -> tuple:
        """What a kept result of this sampler is filed under, besides the request itself."""
        if self._digest is None:
            self._digest = weights_digest(self.model)
        device = next(self.model.parameters()).device
        return self._digest, self.base_model, torch.get_num_threads(), str(device)

    @torch.inference_mode()
    def _prompt_pass(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(log p of each prompt token after the first, the logits at the last position): kept, or
        computed and kept while KEPT_PROMPT_PASSES has room."""
        from .model import plain_forward

        prompt = tuple(int(t) for t in ids)
        key = (self._weights_key(), prompt)
        kept = KEPT_PROMPT_PASSES.get(key)
        if kept is None:
            forward = plain_forward(self.model) or self.model
            logits = forward(torch.tensor([list(prompt)], dtype=torch.long))[0]
            kept = (_token_logprobs(logits, prompt), logits[-1].clone())
            KEPT_PROMPT_PASSES.put(key, kept, 8 * len(prompt) + sum(t.numel() * t.element_size() for t in kept))
        return kept

    def _sample(self, ids: Sequence[int], num_samples: int, *, max_tokens: int | None, temperature: float,
                seed: int, stop: Any = None, top_k: int | None = None, top_p: float | None = None,
                on_prompt: Any = None, last_logits: torch.Tensor | None = None) -> list[Sample]:
        from .model import generate

        self._check_prompt(ids)
        budget = self.block_size - len(ids) if max_tokens is None else int(max_tokens)
        token_stops, text_stops = split_stops(stop)
        decode = None
        if text_stops:
            from . import get_tokenizer

            decode = get_tokenizer(self.base_model).decode
        temperature = float(temperature or 0.0)
        n = int(num_samples)

        def draw(sample_seed: int, hook: Any) -> Sample:
            try:
                return Sample(*generate(self.model, list(ids), budget, temperature=temperature, seed=sample_seed,
                                        stop=token_stops, top_k=top_k, top_p=top_p, stop_strings=text_stops,
                                        decode=decode, on_prompt=hook, last_logits=last_logits))
            except ValueError as exc:
                raise EngineError(str(exc)) from exc

        if temperature == 0.0 and on_prompt is None:  # greedy: every sample is the same, whatever its seed
            key = (self._weights_key(), tuple(int(t) for t in ids), budget, tuple(tuple(s) for s in token_stops),
                   tuple(text_stops), top_k, top_p)
            kept = KEPT_SAMPLES.get(key)
            if kept is None and n > 0:
                first = draw(int(seed), None)
                kept = (tuple(first.tokens), tuple(first.logprobs), first.stop_reason)
                KEPT_SAMPLES.put(key, kept, 16 * (len(first.tokens) + len(ids)) + 256)
            return [Sample(list(kept[0]), list(kept[1]), kept[2]) for _ in range(n)]
        return [draw(int(seed) + i, on_prompt if i == 0 else None) for i in range(n)]

    def _check_prompt(self, ids: Sequence[int]) -> None:
        """EngineError for a prompt that is empty or leaves no room for a token."""
        if not ids:
            raise EngineError("the prompt is empty")
        if len(ids) >= self.block_size:
            raise EngineError(f"the prompt has {len(ids)} tokens; the local model's context is "
                              f"{self.block_size} tokens (shorten the prompt)")

    @torch.inference_mode()
    def prompt_logprobs(self, ids: Sequence[int], last_n: int | None = None) -> list[float | None]:
        """log p(token_t | tokens before it) for each prompt token; the first (and, with last_n, all
        but the last n) are None."""
        if len(ids) > self.block_size:
            raise EngineError(f"{len(ids)} tokens exceed the local model's context ({self.block_size})")
        return prompt_logprobs_list(self._prompt_pass(ids)[0].tolist(), last_n)


def _token_logprobs(logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1, float32 (T - 1,), from the logits at every position of `ids`."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp[:-1].gather(-1, torch.tensor(list(ids[1:]), dtype=torch.long).unsqueeze(-1)).squeeze(-1)


def _prompt_logprobs(logits: torch.Tensor, ids: Sequence[int], last_n: int | None) -> list[float | None]:
    """Sampler.prompt_logprobs from the logits at every position of `ids` (T, vocab)."""
    return prompt_logprobs_list(_token_logprobs(logits, ids).tolist(), last_n)


def prompt_logprobs_list(logprobs: list[float], last_n: int | None) -> list[float | None]:
    """A prompt's log-probabilities as Tinker returns them, from those of its tokens after the first:
    None for the first token and, with `last_n`, for all but the last n."""
    out: list[float | None] = [None] + logprobs
    if last_n is not None:
        keep = max(0, len(out) - int(last_n))
        out = [None] * keep + out[keep:]
    return out


def split_stops(stop: Any) -> tuple[list[list[int]], list[str]]:
    if stop is None:
        return [], []
    if isinstance(stop, (str, int, np.integer)):
        stop = [stop]
    token_stops: list[list[int]] = []
    text_stops: list[str] = []
    for item in stop:
        if isinstance(item, str):
            if item:
                text_stops.append(item)
        elif isinstance(item, (int, np.integer)):
            token_stops.append([int(item)])
        else:
            token_stops.append([int(t) for t in item])
    return token_stops, text_stops


# ---------------------------------------------------------------------------------------------
# training


@dataclass
class Example:
    """One datum of a forward/backward batch: input ids, target ids and per-token loss weights."""

    ids: list[int]
    targets: np.ndarray  # int64
    weights: np.ndarray  # float32, may be negative (custom losses send -dLoss/dlogprobs)


#: A checkpoint folder's temporary or replaced copy, as `Trainer.save` names it: `.<name>.tmp-<pid>-<hex>`.
_SAVE_LEFTOVER = re.compile(r"\..+\.(?:tmp|old)-(\d+)-[0-9a-f]{6}")


def _running(pid: int) -> bool:
    """Whether a process with this id is running (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_saves(parent: Path) -> int:
    """Remove the temporary and replaced checkpoint folders in `parent` whose process has ended:
    what a process killed mid-save left (for a full fine-tune, the model's weights). A save under
    way in a running process, another server's on the same data dir included, keeps its own.

    Args:
        parent: a folder of checkpoints (a run's `weights` or `sampler_weights`).

    Returns:
        How many were removed.
    """
    removed = 0
    try:
        with os.scandir(parent) as entries:
            left = [(Path(e.path), int(m.group(1))) for e in entries
                    if (m := _SAVE_LEFTOVER.fullmatch(e.name)) and (e.is_dir(follow_symlinks=False) or e.is_symlink())]
    except OSError:
        return 0
    for path, pid in left:
        if not _running(pid):
            _remove(path)
            removed += 1
    return removed


def _remove(path: Path) -> None:
    """Remove a checkpoint folder, or only the link when it is one (what a link leads to stays)."""
    if path.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


class Trainer(_ModelShape):
    """One training run: a local base model with LoRA adapters of `rank` (0: every weight), and AdamW.

    Gradients from `forward_backward` accumulate until `optim_step` applies them and clears them,
    as on Tinker. Not thread-safe: the server runs one trainer's requests one at a time, in order.
    """

    def __new__(cls, base_model: str = "", *args: Any, **kwargs: Any) -> "Trainer":
        if cls is Trainer:
            cls = _backend(base_model, "Trainer") or cls
        return super().__new__(cls)

    def __init__(self, base_model: str, rank: int, *, seed: int | None = None, train_attn: bool = True,
                 train_mlp: bool = True, train_unembed: bool = False):
        if rank < 0:
            raise EngineError(f"LoRA rank must be 0 (full fine-tuning) or more, got {rank}")
        self.base_model = base_model
        self.rank = int(rank)
        self.seed = DEFAULT_LORA_SEED if seed is None else int(seed)
        self.targets = {"attn": bool(train_attn), "mlp": bool(train_mlp), "unembed": bool(train_unembed and rank > 0)}
        # the base weights are loaded, not drawn; the adapters come from their own seeded
        # generator (lora.apply_lora), so the global torch RNG is left alone
        self.model = load_base(base_model)
        if self.rank > 0:
            if not (train_attn or train_mlp):
                raise EngineError("LoRA needs train_attn or train_mlp (or both)")
            self.alpha: float | None = _lora.default_alpha(self.rank)
            _lora.apply_lora(self.model, self.rank, alpha=self.alpha, seed=self.seed, attn=train_attn, mlp=train_mlp,
                             unembed=train_unembed)
        else:
            self.alpha = None
            self.model.requires_grad_(True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: AdamW | None = None

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.params)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def target_logprobs(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """log p(tgt[b, t] | idx[b, :t+1]) for every position (B, T), float32, differentiable."""
        logits = self.model(idx)
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)

    def forward_backward(self, batch: Sequence[Example], backward: bool,
                         loss: Callable[[torch.Tensor], torch.Tensor] | None = None
                         ) -> tuple[list[np.ndarray], list[np.ndarray], float]:
        """(per-datum target logprobs, per-datum elementwise losses, loss sum) of sum -w * logp, or
        of `loss(target logprobs [batch, width])` (per-token losses, losses.py) when given.

        With `backward`, the gradients of that sum accumulate in the trainable parameters.
        """
        idx, tgt, w = self._tensors(batch)
        with torch.set_grad_enabled(backward):
            logp = self.target_logprobs(idx, tgt)
            elementwise = -w * logp if loss is None else loss(logp)
            total = elementwise.sum()
            if backward:
                total.backward()
        return self._outputs(batch, logp, elementwise, total)

    def guarded_forward_backward(self, batch: Sequence[Example], *, backward: bool,
                                 loss: Callable[[torch.Tensor], torch.Tensor] | None = None
                                 ) -> tuple[list[np.ndarray], list[np.ndarray], float]:
        """`forward_backward` that leaves the run as it was when it fails or goes non-finite
        (steps.py), and fails on a non-finite loss."""
        from .steps import kept_if_not_finite

        with kept_if_not_finite(self, "forward_backward" if backward else "forward"):
            logprobs, elementwise, total = self.forward_backward(batch, backward=backward, loss=loss)
            if not math.isfinite(total):
                raise EngineError(f"the loss is {total}: check the inputs' scale (weights, advantages, "
                                  "logprobs); the run's gradients are as they were before this request")
        return logprobs, elementwise, total

    def guarded_optim_step(self, **adam: float) -> dict[str, float]:
        """`optim_step` that leaves the run as it was when it fails or goes non-finite (steps.py)."""
        from .steps import kept_if_not_finite

        with kept_if_not_finite(self, "optim_step", weights=True):
            return self.optim_step(**adam)

    def _tensors(self, batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, target ids, weights) of a batch, each [batch, width], right-padded with zeros."""
        if not batch:
            raise EngineError("empty batch")
        width = max(len(ex.ids) for ex in batch)
        idx = torch.zeros(len(batch), width, dtype=torch.long)
        tgt = torch.zeros(len(batch), width, dtype=torch.long)
        w = torch.zeros(len(batch), width, dtype=torch.float32)
        for i, ex in enumerate(batch):
            n = len(ex.ids)
            idx[i, :n] = torch.tensor(ex.ids, dtype=torch.long)
            tgt[i, :n] = torch.from_numpy(np.ascontiguousarray(ex.targets, dtype=np.int64))
            w[i, :n] = torch.from_numpy(np.ascontiguousarray(ex.weights, dtype=np.float32))
        return idx.to(self.device), tgt.to(self.device), w.to(self.device)

    @staticmethod
    def _outputs(batch: Sequence[Example], logp: torch.Tensor, elementwise: torch.Tensor, total: torch.Tensor
                 ) -> tuple[list[np.ndarray], list[np.ndarray], float]:
        logp_np = logp.detach().cpu().numpy()
        el_np = elementwise.detach().cpu().numpy()
        lengths = [len(ex.ids) for ex in batch]
        return ([logp_np[i, :n].astype(np.float32) for i, n in enumerate(lengths)],
                [el_np[i, :n].astype(np.float32) for i, n in enumerate(lengths)], float(total.detach()))

    def _make_optimizer(self) -> AdamW:
        return AdamW(self.params)

    def optim_step(self, *, learning_rate: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float = 0.0, grad_clip_norm: float = 0.0) -> dict[str, float]:
        """One AdamW step with these settings (decoupled weight decay, as torch and Tinker), then
        gradients cleared. Returns {"grad_norm": norm before clipping}."""
        if self.optimizer is None:
            self.optimizer = self._make_optimizer()
        grads = [q.grad for q in self.params if q.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) if grads else 0.0
        if grad_clip_norm and grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(self.params, float(grad_clip_norm), foreach=False)
        self.optimizer.step(lr=float(learning_rate), beta1=float(beta1), beta2=float(beta2), eps=float(eps),
                            weight_decay=float(weight_decay))
        self.optimizer.zero_grad()
        return {"grad_norm": norm}

    # -- checkpoints
    def meta(self, kind: str, name: str, model_id: str, user_metadata: dict | None) -> dict:
        return {"format": FORMAT, "kind": kind, "name": name, "base_model": self.base_model,
                "lora_rank": self.rank, "lora_alpha": self.alpha, "targets": self.targets, "seed": self.seed,
                "model_id": model_id, "user_metadata": dict(user_metadata or {}),
                "saved_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    def _weights(self) -> tuple[str, dict[str, torch.Tensor]]:
        if self.rank > 0:
            return "adapter.safetensors", _lora.adapter_state(self.model)
        return "model.safetensors", {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def save(self, final: Path, meta: dict, *, optimizer: bool) -> None:
        """Write a checkpoint directory atomically (temp dir + rename): weights, meta, optimizer state.

        The temporary and replaced folders carry this process's id, so that a later save beside
        them removes those a killed process left (`remove_stale_saves`)."""
        parent = final.parent
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        remove_stale_saves(parent)
        tmp = parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}"
        tmp.mkdir(mode=0o700)
        try:
            filename, tensors = self._weights()
            _write_tensors(tensors, tmp / filename)
            if optimizer and self.optimizer is not None:
                torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
                os.chmod(tmp / "optimizer.pt", 0o600)
            meta_path = tmp / "checkpoint.json"
            meta_path.write_text(json.dumps(meta, indent=1), encoding="utf-8")
            os.chmod(meta_path, 0o600)
            if final.exists():  # overwrite=True, or a rerun that saves the same step again
                old = parent / f".{final.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
                final.rename(old)
                tmp.rename(final)
                _remove(old)
            else:
                tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def load(self, directory: Path, *, optimizer: bool) -> None:
        """Load a checkpoint's weights (and, with `optimizer`, its optimizer state) into this trainer."""
        meta = read_meta(directory)
        if meta["base_model"] != self.base_model or int(meta["lora_rank"]) != self.rank:
            raise EngineError(f"{directory} holds {meta['base_model']} at LoRA rank {meta['lora_rank']}; this "
                              f"run trains {self.base_model} at rank {self.rank}")
        filename, _ = self._weights()
        path = Path(directory) / filename
        state = read_tensors(path)
        try:
            self._load_weights(state)
        except (ValueError, RuntimeError) as exc:
            raise MachineFormatError(str(path), f"the weights do not fit this run: {exc}") from None
        self.optimizer = None
        if optimizer:
            opt_file = Path(directory) / "optimizer.pt"
            self.optimizer = self._make_optimizer()
            if opt_file.exists():
                try:
                    self.optimizer.load_state_dict(torch.load(opt_file, weights_only=True))
                except Exception as exc:  # a truncated or foreign file
                    raise MachineFormatError(str(opt_file), f"unreadable optimizer state ({type(exc).__name__}: {exc})") from None

    def _load_weights(self, state: dict[str, torch.Tensor]) -> None:
        if self.rank > 0:
            _lora.load_adapter_state(self.model, state)
        else:
            self.model.load_state_dict(state)

    @classmethod
    def from_checkpoint(cls, directory: Path, *, optimizer: bool, base_model: str | None = None) -> "Trainer":
        """A trainer resumed from a checkpoint directory (its rank, targets and seed)."""
        meta = read_meta(directory)
        if base_model is not None and base_model != meta["base_model"]:
            raise EngineError(f"{directory} was trained from {meta['base_model']}, not {base_model}")
        targets = meta.get("targets") or {}
        trainer = cls(meta["base_model"], int(meta["lora_rank"]), seed=meta.get("seed"),
                      train_attn=targets.get("attn", True), train_mlp=targets.get("mlp", True),
                      train_unembed=targets.get("unembed", False))
        trainer.load(Path(directory), optimizer=optimizer)
        return trainer

    def snapshot(self, *, seed: int = 0) -> Sampler:
        """A Sampler of the current weights (a merged copy; training goes on unaffected)."""
        import copy

        model = copy.deepcopy(self.model)
        if self.rank > 0:
            _lora.merge_lora(model)
        return Sampler(model, self.base_model, seed=seed)
