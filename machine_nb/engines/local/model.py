"""The local engine's model: a nanoGPT-style causal transformer and greedy/sampled generation.

Attention and MLP projections are separate nn.Linear modules with stable names (attn.q_proj,
attn.k_proj, attn.v_proj, attn.o_proj, mlp.fc_in, mlp.fc_out) so the engine's LoRA can wrap them;
training and sampling steps live in compute.py, pretraining in build.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Model shape. Defaults are the shipped model's (about 0.86M parameters)."""

    vocab_size: int = 418
    """Tokens in the vocabulary (7 special + 256 bytes + words); build.py sets it from the tokenizer."""
    block_size: int = 128
    """Longest sequence (prompt + reply) in tokens; 128 fits the chat prompts of the arithmetic corpus."""
    n_layer: int = 4
    """Transformer blocks (4: the prototype's size, enough for two-digit plus/minus)."""
    n_head: int = 4
    """Attention heads per block (4, of width 32)."""
    n_embd: int = 128
    """Residual width (128); MLPs are 4x wider with GELU."""
    bias: bool = True
    """Biases in Linear layers and LayerNorms (True, as GPT-2)."""

    def to_json(self) -> dict:
        """The config as plain data (what weights/config.json holds under "model")."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "GPTConfig":
        """The config from `to_json` output; unknown keys are ignored (older or newer files load)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: list | None) -> torch.Tensor:
    """Causal attention of queries q (B, h, T, d) over keys and values k, v; `cache` ([k, v] of the
    earlier positions, or [None, None] at the start) is extended in place, for incremental decoding."""
    T = q.shape[2]
    if cache is not None:
        if cache[0] is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        cache[0], cache[1] = k, v
    if k.shape[2] == T:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if T == 1:  # one new query attends to every position (no mask: the same result, half the time)
        return F.scaled_dot_product_attention(q, k, v)
    # new queries attend to every cached position and causally among themselves
    mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=q.device).tril(diagonal=k.shape[2] - T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(nn.Module):
    """Multi-head causal self-attention; `cache` ([k, v], filled in place) enables incremental decoding."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        B, T, C = x.shape
        h = self.n_head
        q = self.q_proj(x).view(B, T, h, C // h).transpose(1, 2)
        k = self.k_proj(x).view(B, T, h, C // h).transpose(1, 2)
        v = self.v_proj(x).view(B, T, h, C // h).transpose(1, 2)
        y = attend(q, k, v, cache)
        return self.o_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """fc_in (4x wider) -> GELU -> fc_out."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc_in = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.fc_out = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    """Pre-LayerNorm residual block: attention, then MLP."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer with learned positions and tied input/output embeddings."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("o_proj.weight", "fc_out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Parameters, counting the tied embedding once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, caches: list[list] | None = None, start_pos: int = 0) -> torch.Tensor:
        """Logits (B, T, vocab) for token ids `idx` (B, T).

        caches / start_pos: one [k, v] list per layer and the position of idx[:, 0], for
        incremental decoding (default None / 0: a plain full-sequence forward, as in training).
        """
        B, T = idx.shape
        if start_pos + T > self.config.block_size:
            raise ValueError(
                f"sequence of {start_pos + T} tokens is longer than the model's block size "
                f"({self.config.block_size}); shorten the prompt or max_tokens")
        pos = torch.arange(start_pos, start_pos + T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return F.linear(self.ln_f(x), self.wte.weight)


def _norm_args(ln: nn.LayerNorm) -> tuple:
    """The arguments after the input that nn.LayerNorm's forward gives F.layer_norm."""
    return ln.normalized_shape, ln.weight, ln.bias, ln.eps


def plain_forward(model: nn.Module) -> Callable[..., torch.Tensor] | None:
    """`model.forward` as one function over its weights, for decoding, or None when `model` is not a
    plain GPT.

    Decoding a token runs some 40 small modules, and calling a module costs about as much as its
    work at this size; this function makes the same torch calls on the same tensors in the same
    order, without the module calls, so its logits are identical, bit for bit. Plain means built
    of exactly these classes (GPT, Block, Attention, MLP, nn.Linear, nn.LayerNorm, nn.Embedding):
    a projection with an unmerged LoRA adapter or any other module gives None, and the caller uses
    the model itself. The unembedding's adapter (lora.UnembedLoRA, which merging keeps: its hooks
    add h @ A.T @ B.T * scale to the logits) is applied as its hooks apply it; the function holds
    the model's weight tensors, so an update in place is seen.
    """
    if type(model) is not GPT or type(model.ln_f) is not nn.LayerNorm:
        return None
    layers = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.fc_in, mlp.fc_out)
        if (type(block) is not Block or type(attn) is not Attention or type(mlp) is not MLP
                or any(type(m) is not nn.Linear for m in linears)
                or any(type(m) is not nn.LayerNorm for m in (block.ln_1, block.ln_2))):
            return None
        layers.append((_norm_args(block.ln_1), [(m.weight, m.bias) for m in linears], _norm_args(block.ln_2),
                       attn.n_head))
    unembed = getattr(model, "unembed_lora", None)
    cfg, wte, wpe, ln_f = model.config, model.wte.weight, model.wpe.weight, _norm_args(model.ln_f)

    def forward(idx: torch.Tensor, caches: list[list] | None = None, start_pos: int = 0) -> torch.Tensor:
        B, T = idx.shape
        if start_pos + T > cfg.block_size:
            return model(idx, caches=caches, start_pos=start_pos)  # the model's own error
        pos = torch.arange(start_pos, start_pos + T, device=idx.device)
        x = F.embedding(idx, wte) + F.embedding(pos, wpe)
        for i, (ln_1, (q_proj, k_proj, v_proj, o_proj, fc_in, fc_out), ln_2, h) in enumerate(layers):
            a = F.layer_norm(x, *ln_1)
            C = a.shape[-1]
            q = F.linear(a, *q_proj).view(B, T, h, C // h).transpose(1, 2)
            k = F.linear(a, *k_proj).view(B, T, h, C // h).transpose(1, 2)
            v = F.linear(a, *v_proj).view(B, T, h, C // h).transpose(1, 2)
            y = attend(q, k, v, None if caches is None else caches[i])
            x = x + F.linear(y.transpose(1, 2).contiguous().view(B, T, C), *o_proj)
            x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, *ln_2), *fc_in)), *fc_out)
        hidden = F.layer_norm(x, *ln_f)
        logits = F.linear(hidden, wte)
        if unembed is not None:
            logits = logits + (hidden @ unembed.lora_a.t() @ unembed.lora_b.t()) * unembed.scale
        return logits

    return forward


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the token that crosses top_p
        drop[..., 0] = False  # and always the most likely one (a top_p float32 reads as 0 would drop it)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def choose(logits: torch.Tensor, temperature: float, gen: torch.Generator | None, top_k: int | None,
           top_p: float | None) -> tuple[int, float]:
    """The next token from one position's logits, and its log-probability: greedy when temperature is
    0 (under the untempered logits), else drawn with `gen` from softmax(filtered logits / temperature);
    a temperature so small that the scaled logits overflow float32 is greedy too, as its limit is.
    top_k / top_p as `filter_logits` takes them (None, a top_k <= 0 or a top_p of 1.0: no filter; the
    most likely token is always kept)."""
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else None
    if scaled is not None and torch.isfinite(scaled[torch.isfinite(logits)]).all():
        scaled = filter_logits(scaled, top_k, top_p)
        tok = int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=gen))
        return tok, float(torch.log_softmax(scaled, dim=-1)[tok])
    tok = int(torch.argmax(filter_logits(logits, top_k, top_p)))
    return tok, float(torch.log_softmax(logits, dim=-1)[tok])


@torch.inference_mode()
def generate(
    model: GPT,
    prompt_ids: Sequence[int],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[Sequence[int] | int] | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_strings: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
    on_prompt: Callable[[torch.Tensor], None] | None = None,
    last_logits: torch.Tensor | None = None,
) -> tuple[list[int], list[float], str]:
    """Continue `prompt_ids` by up to `max_tokens` tokens: returns (tokens, logprobs, stop_reason).

    temperature: 0 (default) is greedy and deterministic; above 0 samples from softmax(logits / T)
        with a torch.Generator seeded by `seed` (None: a fresh random seed), so a seed repeats.
    stop: token-id sequences (or single ids) that end generation; the matched stop tokens are
        included in `tokens`, as the Tinker sampler returns them. Default None: only max_tokens.
    top_k / top_p: optional filters (None, -1 / 1.0 disable them, as in tinker.SamplingParams).
    stop_strings / decode: text stops, checked on `decode(tokens)` after each token (default none).
    on_prompt: called with the logits at every prompt position (T, vocab) of the forward pass over
        the prompt, so a caller that also wants the prompt's log-probabilities needs no second one.
    last_logits: the logits at the prompt's last position from a forward pass over it made before
        (vocab,); with max_tokens <= 1 nothing is decoded after the first token, so generate then
        runs no forward pass at all. ValueError with a larger max_tokens (decoding needs the pass's
        key/value cache).
    stop_reason is "stop" when a stop matched, else "length" (max_tokens reached, or the block size).
    logprobs are the log-probabilities of the chosen tokens under the distribution sampled from
    (untempered logits when greedy).
    Raises ValueError when the prompt is empty or does not fit the block size.
    """
    cfg = model.config
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("generate needs a non-empty prompt")
    if len(prompt) >= cfg.block_size:
        raise ValueError(
            f"prompt of {len(prompt)} tokens does not fit the local model's block size "
            f"({cfg.block_size} tokens, room for at least one new token)")
    stops = [[int(s)] if isinstance(s, int) else [int(t) for t in s] for s in (stop or [])]
    stops = [s for s in stops if s]
    budget = max(0, int(max_tokens))
    if last_logits is not None and budget > 1:
        raise ValueError("last_logits replaces the prompt's forward pass only for max_tokens <= 1")
    if stop_strings and decode is None:
        raise ValueError("stop_strings needs a decode function")
    gen = None
    if temperature > 0:
        gen = torch.Generator()
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(int(seed))
    if top_k is not None and top_k <= 0:
        top_k = None
    device = next(model.parameters()).device
    was_training = model.training
    if was_training:
        model.eval()
    forward = plain_forward(model) or model
    caches: list[list] = [[None, None] for _ in range(cfg.n_layer)]
    tokens: list[int] = []
    logprobs: list[float] = []
    reason = "length"
    try:
        if last_logits is None:
            logits = forward(torch.tensor([prompt], device=device), caches=caches, start_pos=0)[0]
            if on_prompt is not None:
                on_prompt(logits)
            logits = logits[-1]
        else:
            logits = last_logits
        pos = len(prompt)
        for _ in range(budget):
            if pos >= cfg.block_size:  # prompt + reply never exceed the block size (it could not be trained on)
                break
            tok, lp = choose(logits, temperature, gen, top_k, top_p)
            tokens.append(tok)
            logprobs.append(lp)
            if any(len(s) <= len(tokens) and tokens[-len(s):] == s for s in stops):
                reason = "stop"
                break
            if stop_strings and any(s in decode(tokens) for s in stop_strings):
                reason = "stop"
                break
            pos += 1
            if pos >= cfg.block_size or len(tokens) >= budget:  # no forward pass for a token never drawn
                break
            logits = forward(torch.tensor([[tok]], device=device), caches=caches, start_pos=pos - 1)[0, -1]
    finally:
        if was_training:
            model.train()
    return tokens, logprobs, reason
