"""Training and sampling of the local engine's real model (hf.py): the transformers/PEFT side of
compute.py's `Trainer` and `Sampler`.

`Trainer(name, …)` and `Sampler(model, name)` in compute.py hand a real model's name to the
classes here, so the server runs one code path for every model: the same requests, checkpoint
files, AdamW, and per-token target log-probabilities (`target_logprobs`) under the loss. What
differs lives here: PEFT adapters over a shared frozen base, logits taken a chunk of tokens at a
time (the 49k-word unembedding of a long batch would not fit otherwise; a cross-entropy step takes
each chunk's gradient as soon as its logits are made, so they are computed once), as many layers
recomputed in the backward pass as a batch needs to fit its memory (`hf.plan_batch`), and batched
sampling with a KV cache.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from ...errors import EngineError, MachineFormatError
from . import hf
from .checkpoints import read_meta
from .compute import Sample, Sampler, Trainer, prompt_logprobs_list, read_tensors, split_stops
from .lora import default_alpha
from .model import choose

def _parts(model: Any) -> tuple[Any, Any]:
    """(the decoder stack, the unembedding) of a LlamaForCausalLM, bare or inside a PeftModel."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return lm.model, lm.lm_head


def _chunk_logprobs(head: Any, hidden: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(head(hidden).float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)


@contextlib.contextmanager
def _recomputing(body: Any, layers: int) -> Iterator[None]:
    """Recompute `layers` of the decoder's layers (spread evenly over the stack) in the backward
    pass instead of keeping their activations; the others keep theirs (no recomputation: faster)."""
    if layers <= 0:
        yield
        return
    stack = list(body.layers)
    picked = {round(i * len(stack) / layers) for i in range(min(layers, len(stack)))}
    body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for i, layer in enumerate(stack):
        layer.gradient_checkpointing = i in picked
    try:
        yield
    finally:
        body.gradient_checkpointing_disable()


def target_logprobs(model: Any, idx: torch.Tensor, tgt: torch.Tensor, *, recompute: int = 0) -> torch.Tensor:
    """log p(tgt | prefix) at every position (B, T), float32: the decoder once (`recompute` of its
    layers recomputed in the backward pass), the unembedding a chunk of hf.LOGIT_CHUNK tokens at a
    time (recomputed in the backward pass, never all kept)."""
    body, head = _parts(model)
    with _recomputing(body, recompute):
        hidden = body(input_ids=idx, use_cache=False).last_hidden_state
    B, T, C = hidden.shape
    flat_h, flat_t = hidden.reshape(B * T, C), tgt.reshape(B * T)
    out = []
    for start in range(0, B * T, hf.LOGIT_CHUNK):
        h, t = flat_h[start:start + hf.LOGIT_CHUNK], flat_t[start:start + hf.LOGIT_CHUNK]
        if torch.is_grad_enabled():
            out.append(checkpoint(_chunk_logprobs, head, h, t, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(head, h, t))
    return torch.cat(out).reshape(B, T)


def cross_entropy_backward(model: Any, idx: torch.Tensor, tgt: torch.Tensor, weights: torch.Tensor, *,
                           recompute: int = 0) -> torch.Tensor:
    """Accumulate the gradients of sum(-weights * log p(tgt)) into the model's trainable parameters;
    returns log p(tgt) (B, T), float32, detached.

    The same figures as `target_logprobs` then backward, with the unembedding's logits computed
    once: the loss's gradient with respect to the log-probabilities (-weights) is known before the
    forward pass, so each chunk's logits go backward (weights * (softmax - one-hot)) as soon as
    they are made, and the decoder's backward pass follows with the gradients of its output.
    """
    body, head = _parts(model)
    with _recomputing(body, recompute):
        hidden = body(input_ids=idx, use_cache=False).last_hidden_state
    B, T, C = hidden.shape
    flat_h = hidden.detach().reshape(B * T, C)
    flat_t, flat_w = tgt.reshape(B * T, 1), weights.reshape(B * T, 1).to(torch.float32)
    grad_h = torch.empty_like(flat_h)
    logp = torch.empty(B * T, dtype=torch.float32, device=flat_h.device)
    for start in range(0, B * T, hf.LOGIT_CHUNK):
        part = slice(start, start + hf.LOGIT_CHUNK)
        h = flat_h[part].detach().requires_grad_(True)
        logits = head(h).float()
        with torch.no_grad():
            t, w = flat_t[part], flat_w[part]
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            logp[part] = (logits.gather(-1, t) - lse).squeeze(-1)
            grad = torch.sub(logits, lse).exp_().mul_(w)  # d(-w * log_softmax[t]) / dlogits = w * (p - onehot)
            grad.scatter_add_(-1, t, -w)
        logits.backward(grad)
        del logits, grad
        grad_h[part] = h.grad
    hidden.backward(grad_h.reshape(B, T, C).to(hidden.dtype))
    return logp.reshape(B, T)


class _RealModelShape:
    """The real model's context and vocabulary, as the server's checks read them from a trainer or sampler."""

    @property
    def block_size(self) -> int:
        return hf.CONTEXT_LENGTH

    @property
    def vocab_size(self) -> int:
        return hf.VOCAB_SIZE


class HFTrainer(_RealModelShape, Trainer):
    """A training run of a real model: PEFT LoRA adapters over the shared frozen base, AdamW.

    LoRA only (rank >= 1): full fine-tuning would copy the whole model per run.
    """

    def __init__(self, base_model: str, rank: int, *, seed: int | None = None, train_attn: bool = True,
                 train_mlp: bool = True, train_unembed: bool = False):
        from .compute import DEFAULT_LORA_SEED

        if int(rank) < 1:
            raise EngineError(f"{base_model} trains LoRA adapters only: give a LoRA rank of 1 or more, got {rank}")
        if not (train_attn or train_mlp):
            raise EngineError("LoRA needs train_attn or train_mlp (or both)")
        self.base_model = base_model.split(":", 1)[0]
        self.rank = int(rank)
        self.seed = DEFAULT_LORA_SEED if seed is None else int(seed)
        self.targets = {"attn": bool(train_attn), "mlp": bool(train_mlp), "unembed": bool(train_unembed)}
        self.alpha: float | None = default_alpha(self.rank)
        self.model = hf.with_lora(self.rank, alpha=self.alpha, seed=self.seed, attn=train_attn, mlp=train_mlp,
                                  unembed=train_unembed)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = None
        self._device = hf.device_and_dtype()[0]

    @property
    def device(self) -> torch.device:
        return self._device

    def target_logprobs(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        lengths = [idx.shape[1]] * idx.shape[0]
        recompute = hf.plan_batch(lengths, backward=torch.is_grad_enabled())
        return target_logprobs(self.model, idx, tgt, recompute=recompute)

    def forward_backward(self, batch: Sequence[Any], backward: bool, loss: Any = None
                         ) -> tuple[list[Any], list[Any], float]:
        """As Trainer.forward_backward; cross-entropy with gradients (loss None: sum -w * logp)
        computes each chunk's logits once (`cross_entropy_backward`), the other cases as the base class."""
        if not backward or loss is not None:
            return super().forward_backward(batch, backward, loss)
        idx, tgt, w = self._tensors(batch)
        recompute = hf.plan_batch([idx.shape[1]] * idx.shape[0], backward=True)
        with torch.enable_grad():
            logp = cross_entropy_backward(self.model, idx, tgt, w, recompute=recompute)
        elementwise = -w * logp
        return self._outputs(batch, logp, elementwise, elementwise.sum())

    def _weights(self) -> tuple[str, dict[str, torch.Tensor]]:
        from peft import get_peft_model_state_dict

        return "adapter.safetensors", {k: v.detach().to("cpu", torch.float32).clone().contiguous()
                                       for k, v in get_peft_model_state_dict(self.model, save_embedding_layers=False).items()}

    def _load_weights(self, state: dict[str, torch.Tensor]) -> None:
        _load_adapter(self.model, state)

    def snapshot(self, *, seed: int = 0) -> Sampler:
        """A sampler of the current adapters (copied; training goes on unaffected)."""
        _, state = self._weights()
        model = hf.with_lora(self.rank, alpha=float(self.alpha or 0), seed=self.seed, attn=self.targets["attn"],
                             mlp=self.targets["mlp"], unembed=self.targets.get("unembed", False))
        _load_adapter(model, state)
        return HFSampler(model, self.base_model, seed=seed)


def _load_adapter(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy saved adapter tensors into a PeftModel of the same rank and targets (ValueError if not)."""
    from peft import get_peft_model_state_dict

    own = get_peft_model_state_dict(model, save_embedding_layers=False)
    if set(own) != set(state):
        missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        raise ValueError(f"adapter tensors do not match the model (missing {missing[:3]}, unexpected {extra[:3]})")
    from peft import set_peft_model_state_dict

    shapes = {k: tuple(v.shape) for k, v in own.items()}
    for key, value in state.items():
        if shapes[key] != tuple(value.shape):
            raise ValueError(f"adapter {key}: shape {tuple(value.shape)} != model's {shapes[key]}")
    result = set_peft_model_state_dict(model, state)
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"adapter tensors {result.unexpected_keys[:3]} have no place in the model")


class HFSampler(_RealModelShape, Sampler):
    """Sampling from a real model (the base, or the base with adapters), batched, with a KV cache."""

    def __init__(self, model: Any, base_model: str, *, seed: int = 0):
        import random

        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.base_model = base_model.split(":", 1)[0]
        self._seeds = random.Random(seed)
        self._device = hf.device_and_dtype()[0]
        self._batch = _Batcher(self.model)

    @classmethod
    def from_checkpoint(cls, directory: Path, *, seed: int = 0) -> "HFSampler":
        meta = read_meta(directory)
        rank = int(meta["lora_rank"])
        if rank < 1:
            raise MachineFormatError(str(Path(directory) / "checkpoint.json"),
                                     f"{meta['base_model']} checkpoints hold LoRA adapters (rank >= 1)", field="lora_rank")
        targets = meta.get("targets") or {}
        model = hf.with_lora(rank, alpha=float(meta.get("lora_alpha") or default_alpha(rank)),
                             seed=int(meta.get("seed") or 0), attn=targets.get("attn", True),
                             mlp=targets.get("mlp", True), unembed=targets.get("unembed", False))
        path = Path(directory) / "adapter.safetensors"
        try:
            _load_adapter(model, read_tensors(path))
        except ValueError as exc:
            raise MachineFormatError(str(path), f"the adapter does not fit {meta['base_model']} at rank {rank}: {exc}") from None
        return cls(model, meta["base_model"], seed=seed)

    #: The server may run this sampler's requests at the same time: `sample` joins them into batches.
    concurrent = True

    def sample(self, ids: Sequence[int], num_samples: int, *, max_tokens: int | None, temperature: float,
               seed: int, stop: Any = None, top_k: int | None = None, top_p: float | None = None) -> list[Sample]:
        """`num_samples` continuations of `ids` (none for 0); sample i uses `seed + i`.

        Calls made at the same time (from several threads) run as one batch: rows of every
        waiting request, left-padded, share one KV cache and one forward pass per token.
        """
        if not ids:
            raise EngineError("the prompt is empty")
        if len(ids) >= self.block_size:
            raise EngineError(f"the prompt has {len(ids)} tokens; the context of {self.base_model} is "
                              f"{self.block_size} tokens (shorten the prompt)")
        rows = [Row(list(ids), max_tokens, float(temperature or 0.0), int(seed) + i, stop, top_k, top_p)
                for i in range(int(num_samples))]
        return self._batch.run(rows) if rows else []

    def sample_with_prompt_logprobs(self, ids: Sequence[int], num_samples: int, *, last_n: int | None = None,
                                    **params: Any) -> tuple[list[Sample], list[float | None]]:
        """`sample` (batched with other requests) and `prompt_logprobs` of the same prompt."""
        return self.sample(ids, num_samples, **params), self.prompt_logprobs(ids, last_n)

    @torch.inference_mode()
    def prompt_logprobs(self, ids: Sequence[int], last_n: int | None = None) -> list[float | None]:
        if len(ids) > self.block_size:
            raise EngineError(f"{len(ids)} tokens exceed the context of {self.base_model} ({self.block_size})")
        x = torch.tensor([list(ids)], dtype=torch.long, device=self._device)
        tgt = torch.tensor([list(ids[1:]) + [0]], dtype=torch.long, device=self._device)
        return prompt_logprobs_list(target_logprobs(self.model, x, tgt)[0, :-1].float().cpu().tolist(), last_n)


@dataclass
class Row:
    """One sequence to continue and how: the same settings a Tinker sampling request takes."""

    prompt: list[int]
    max_tokens: int | None
    temperature: float
    seed: int
    stop: Any = None
    top_k: int | None = None
    top_p: float | None = None


class _Batcher:
    """Joins the rows of requests that wait at the same time into one `generate_batch` call.

    The first caller to find no batch running runs one with every row waiting (after WINDOW_S,
    so requests sent together arrive); callers that come during it wait and go in the next.
    """

    WINDOW_S = 0.02
    MAX_ROWS = 64

    def __init__(self, model: Any):
        import threading

        self.model = model
        self._cond = threading.Condition()
        self._pending: list[tuple[list[Row], dict]] = []
        self._running = False

    def run(self, rows: list[Row]) -> list[Sample]:
        import time

        slot: dict = {}
        with self._cond:
            self._pending.append((rows, slot))
            while "result" not in slot and "error" not in slot:
                if not self._running:
                    self._running = True
                    break
                self._cond.wait()
            else:
                return self._answer(slot)
        try:  # this caller runs batches until its own rows are done
            while "result" not in slot and "error" not in slot:
                time.sleep(self.WINDOW_S)
                with self._cond:
                    taken, count = [], 0
                    while self._pending and (not taken or count + len(self._pending[0][0]) <= self.MAX_ROWS):
                        item = self._pending.pop(0)
                        taken.append(item)
                        count += len(item[0])
                try:
                    samples = generate_batch(self.model, [r for group, _ in taken for r in group])
                    for group, dest in taken:
                        dest["result"], samples = samples[:len(group)], samples[len(group):]
                except BaseException as exc:  # every request of the batch gets the error, an interruption too
                    for _, dest in taken:
                        dest["error"] = exc
                    if not isinstance(exc, Exception):
                        raise
                with self._cond:
                    self._cond.notify_all()
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()
        return self._answer(slot)

    @staticmethod
    def _answer(slot: dict) -> list[Sample]:
        if "error" in slot:
            raise slot["error"]
        return slot["result"]


@torch.inference_mode()
def generate_batch(model: Any, rows: Sequence[Row]) -> list[Sample]:
    """Continue every row's prompt (left-padded into one batch, one KV cache) until one of its stops,
    its max_tokens or the context; each row samples with its own generator seeded `row.seed`
    (temperature 0: greedy).

    Log-probabilities are those of the chosen tokens under the distribution sampled from
    (untempered logits when greedy); a matched stop stays at the end of the tokens, as on Tinker.
    No rows: no samples.
    """
    from transformers import DynamicCache

    if not rows:
        return []
    device = next(model.parameters()).device
    B = len(rows)
    stops = [split_stops(r.stop) for r in rows]
    token_stops = [[s for s in ts if s] for ts, _ in stops]
    text_stops = [xs for _, xs in stops]
    decode = hf.get_tokenizer().decode if any(text_stops) else None
    width = max(len(r.prompt) for r in rows)
    budgets = [hf.CONTEXT_LENGTH - len(r.prompt) if r.max_tokens is None
               else min(int(r.max_tokens), hf.CONTEXT_LENGTH - len(r.prompt)) for r in rows]
    ids = torch.full((B, width), hf.END_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r.prompt):] = torch.tensor(r.prompt, dtype=torch.long)
        mask[i, width - len(r.prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    gens = [torch.Generator(device="cpu").manual_seed(int(r.seed)) for r in rows]
    out_tokens: list[list[int]] = [[] for _ in range(B)]
    out_lp: list[list[float]] = [[] for _ in range(B)]
    reasons = ["length"] * B
    done = [b <= 0 for b in budgets]
    cache = DynamicCache()
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                   logits_to_keep=1).logits[:, -1]
    last_pos = pos[:, -1]
    while not all(done):
        lf = logits.float().cpu()
        chosen = []
        for i, r in enumerate(rows):
            if done[i]:
                chosen.append(hf.END_TOKEN_ID)
                continue
            tok, lp = choose(lf[i], r.temperature, gens[i], r.top_k, r.top_p)
            toks = out_tokens[i]
            toks.append(tok)
            out_lp[i].append(lp)
            chosen.append(tok)
            if any(len(s) <= len(toks) and toks[-len(s):] == s for s in token_stops[i]) or (
                    text_stops[i] and any(s in decode(toks) for s in text_stops[i])):
                reasons[i], done[i] = "stop", True
            elif len(toks) >= budgets[i]:
                done[i] = True
        if all(done):
            break
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        step = torch.tensor(chosen, dtype=torch.long, device=device)[:, None]
        logits = model(input_ids=step, attention_mask=mask, position_ids=last_pos[:, None], past_key_values=cache,
                       use_cache=True).logits[:, -1]
    return [Sample(out_tokens[i], out_lp[i], reasons[i]) for i in range(B)]


#: The training and sampling classes compute.py's Trainer and Sampler hand this backend's models to.
BACKEND = {"Trainer": HFTrainer, "Sampler": HFSampler}
