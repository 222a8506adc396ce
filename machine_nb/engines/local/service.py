"""The local engine: the `tinker` client API (ServiceClient, TrainingClient, SamplingClient) on this CPU.

tinker-cookbook's SFT loop (train.py runs it) and the evaluator call exactly these methods; they
return the SDK's own types (`tinker.ForwardBackwardOutput`, `SampleResponse`, …) and its future
class (`AwaitableConcurrentFuture`: `.result()`, `await`, `.result_async()`), so code written for
Tinker runs here unchanged. Each client does its work in order on one worker thread. Checkpoints
are directories under the run's log dir, addressed as `local://<abs log dir>/weights/<name>`
(training state) and `local://<abs log dir>/sampler_weights/<name>` (what a sampling client loads);
each holds `checkpoint.json` (base model, LoRA rank/alpha/targets, renderer) and the adapter (or,
with rank 0, the full weights) as safetensors. The model itself is C1's (model.py, build.py).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import os
import random
import secrets
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from ...errors import EngineError
from . import lora as _lora

SCHEME = "local://"
FORMAT = "machine-nb-local/1"
#: torch threads when MACHINE_NB_THREADS is unset: 1, because 2 threads next to any other busy
#: process slowed a step ~5x here and 1 vs 2 threads change results from the 4th decimal.
DEFAULT_THREADS = 1


# ---------------------------------------------------------------------------------------------
# set-up and small helpers


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
    torch.use_deterministic_algorithms(True)
    return threads


def _done(value: Any) -> AwaitableConcurrentFuture:
    """An already-finished SDK future holding `value`."""
    fut: Future = Future()
    fut.set_result(value)
    return AwaitableConcurrentFuture(fut)


class _Worker:
    """One thread that runs a client's requests in submission order, returning SDK futures."""

    def __init__(self, name: str, threads: int):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._threads = threads

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> AwaitableConcurrentFuture:
        def run():
            configure_torch(self._threads)
            return fn(*args, **kwargs)

        return AwaitableConcurrentFuture(self._pool.submit(run))


class _ClientResult:
    """`.result()` / `.result_async()` on a client itself.

    SDK 0.38 returns client-creation futures that double as the client; code written either way
    (`sc.create_sampling_client(…).sample(…)` or `….result().sample(…)`) works here.
    """

    def result(self, timeout: float | None = None):
        return self

    async def result_async(self, timeout: float | None = None):
        return self


def parse_path(path: str) -> Path:
    """The checkpoint directory of a `local://<absolute dir>` path; EngineError if it is not one."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise EngineError(
            f"{path!r} is not a local engine checkpoint (local://…); Tinker checkpoints (tinker://…) "
            "need engine='tinker'.")
    directory = Path(path[len(SCHEME):])
    if not directory.is_absolute():
        raise EngineError(f"{path!r}: a local checkpoint path names an absolute directory (local:///…)")
    meta = directory / "checkpoint.json"
    if not meta.is_file():
        raise EngineError(f"No local checkpoint at {path}: {meta} does not exist (wrong path, or the run "
                          "was interrupted before it saved this checkpoint).")
    return directory


def read_checkpoint_meta(path: str) -> dict:
    """The `checkpoint.json` of a `local://` checkpoint (base model, LoRA rank/alpha, renderer…)."""
    meta_path = parse_path(path) / "checkpoint.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineError(f"{meta_path}: unreadable checkpoint description ({exc})") from exc
    for key in ("base_model", "lora_rank"):
        if key not in meta:
            raise EngineError(f"{meta_path}: missing field {key!r}")
    return meta


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise EngineError(f"Checkpoint name {name!r} must be a plain, non-empty file name")
    return name


def _load_base(base_model: str):
    from . import MODELS, load_base

    if base_model not in MODELS:
        raise EngineError(f"The local engine has no model {base_model!r}; it serves: {', '.join(sorted(MODELS))}.")
    model = load_base(base_model)
    model.eval()  # no dropout; gradients still flow
    return model


def _check_local_model(base_model: str) -> None:
    from .. import check_model

    check_model("local", base_model)


def _tokens_of(datum: types.Datum, key: str, i: int) -> np.ndarray:
    value = datum.loss_fn_inputs.get(key)
    if value is None:
        raise EngineError(f"datum {i}: loss_fn_inputs has no {key!r} (cross_entropy needs target_tokens and weights)")
    return np.asarray(value.to_numpy()).reshape(-1)


def _write_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    os.chmod(path, 0o600)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


# ---------------------------------------------------------------------------------------------
# sampling


class SamplingClient(_ClientResult):
    """Samples from a base model or a checkpoint: `sample`, `compute_logprobs`, sync and async.

    Requests run one at a time on the client's worker thread, so concurrent callers (the evaluator
    gathers many rows) are safe and a given request gives the same tokens however many are queued.
    """

    def __init__(self, model: torch.nn.Module, base_model: str, *, model_path: str | None = None,
                 threads: int | None = None, seed: int = 0):
        self._model = model.eval().requires_grad_(False)
        self._base_model = base_model
        self.model_path = model_path
        self._threads = configure_torch(threads)
        self._worker = _Worker("local-sampler", self._threads)
        self._seeds = random.Random(seed)  # seeds for requests that give none: repeatable per client
        self._seed_lock = threading.Lock()
        self._ids = 0

    # -- tinker API
    def get_base_model(self) -> str:
        return self._base_model

    async def get_base_model_async(self) -> str:
        return self._base_model

    def get_tokenizer(self):
        from ...render import get_tokenizer

        return get_tokenizer(self._base_model)

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
               **unsupported: Any) -> AwaitableConcurrentFuture:
        """`num_samples` continuations of `prompt` → future of `tinker.SampleResponse`.

        Honours SamplingParams.max_tokens (None: up to the model's block size), temperature (0:
        greedy), seed (None: the next of this client's own seeded sequence, so runs repeat), stop
        (strings, token ids, or token-id lists; the matched stop is kept at the end of `tokens`,
        as Tinker does), top_k (-1: off) and top_p (1: off). Sample i uses seed + i.
        `include_prompt_logprobs` adds `prompt_logprobs` (None for the first token).
        """
        extra = [k for k, v in unsupported.items() if v not in (None, 0, False)]
        if extra:
            raise EngineError(f"The local engine does not support sample(…, {', '.join(extra)}=…)")
        if topk_prompt_logprobs:
            raise EngineError("The local engine does not return top-k prompt logprobs")
        if num_samples < 1:
            raise EngineError(f"num_samples must be at least 1, got {num_samples}")
        with self._seed_lock:
            base_seed = sampling_params.seed
            if base_seed is None:
                base_seed = self._seeds.randrange(2**31)
            self._ids += 1
            request = self._ids
        ids = prompt.to_ints()
        return self._worker.submit(self._sample, ids, int(num_samples), sampling_params, int(base_seed),
                                   bool(include_prompt_logprobs), request)

    async def sample_async(self, prompt: types.ModelInput, num_samples: int,
                           sampling_params: types.SamplingParams, include_prompt_logprobs: bool = False,
                           topk_prompt_logprobs: int = 0, **unsupported: Any) -> types.SampleResponse:
        """`sample`, awaited: returns the `tinker.SampleResponse` itself (as SDK 0.38 does)."""
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs,
                                 topk_prompt_logprobs, **unsupported).result_async()

    def compute_logprobs(self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
                         ) -> AwaitableConcurrentFuture:
        """Future of the log-probability of each prompt token given the ones before (first: None)."""
        ids = prompt.to_ints()
        return self._worker.submit(self._prompt_logprobs, ids, prompt_logprobs_last_n)

    async def compute_logprobs_async(self, prompt: types.ModelInput,
                                     prompt_logprobs_last_n: int | None = None) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n).result_async()

    # -- work, on the worker thread
    def _stops(self, stop: Any) -> tuple[list[list[int]], list[str]]:
        if stop is None:
            return [], []
        if isinstance(stop, str):
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

    def _sample(self, ids: list[int], num_samples: int, params: types.SamplingParams, base_seed: int,
                with_prompt_logprobs: bool, request: int) -> types.SampleResponse:
        from .model import generate

        block = self._model.config.block_size
        if not ids:
            raise EngineError("sample: the prompt is empty")
        if len(ids) >= block:
            raise EngineError(f"sample: the prompt has {len(ids)} tokens; the local model's context is "
                              f"{block} tokens (shorten the prompt)")
        max_tokens = params.max_tokens if params.max_tokens is not None else block - len(ids)
        token_stops, text_stops = self._stops(params.stop)
        decode = None
        if text_stops:
            tokenizer = self.get_tokenizer()
            decode = tokenizer.decode
        sequences = []
        for i in range(num_samples):
            try:
                tokens, logprobs, reason = generate(
                    self._model, ids, int(max_tokens), temperature=float(params.temperature or 0.0),
                    seed=base_seed + i, stop=token_stops, top_k=params.top_k, top_p=params.top_p,
                    stop_strings=text_stops, decode=decode)
            except ValueError as exc:
                raise EngineError(f"sample: {exc}") from exc
            sequences.append(types.SampledSequence(
                stop_reason=reason, sequence_id=f"local-{request}-{i}",
                tokens_np=np.asarray(tokens, dtype=np.int32), logprobs_np=np.asarray(logprobs, dtype=np.float32)))
        prompt_lp = None
        if with_prompt_logprobs:
            lp = self._prompt_logprobs(ids, None)
            prompt_lp = np.asarray([np.nan if x is None else x for x in lp], dtype=np.float32)
        return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_lp)

    @torch.no_grad()
    def _prompt_logprobs(self, ids: list[int], last_n: int | None) -> list[float | None]:
        if len(ids) > self._model.config.block_size:
            raise EngineError(f"compute_logprobs: {len(ids)} tokens exceed the local model's context "
                              f"({self._model.config.block_size})")
        x = torch.tensor([ids], dtype=torch.long)
        logp = torch.log_softmax(self._model(x)[0].float(), dim=-1)
        out: list[float | None] = [None]
        out += [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
        if last_n is not None:
            out = [None] * max(0, len(out) - last_n) + out[max(0, len(out) - last_n):]
        return out


def _sampling_model(directory: Path, meta: dict) -> torch.nn.Module:
    """The base model with a checkpoint's weights folded in (LoRA merged; full weights loaded)."""
    model = _load_base(meta["base_model"])
    rank = int(meta["lora_rank"])
    if rank > 0:
        targets = meta.get("targets", {})
        _lora.apply_lora(model, rank, alpha=float(meta.get("lora_alpha", _lora.default_alpha(rank))),
                         attn=targets.get("attn", True), mlp=targets.get("mlp", True))
        try:
            _lora.load_adapter_state(model, _read_safetensors(directory / "adapter.safetensors"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"{directory}: cannot load the adapter ({exc})") from exc
        _lora.merge_lora(model)
    else:
        try:
            model.load_state_dict(_read_safetensors(directory / "model.safetensors"))
        except (OSError, RuntimeError) as exc:
            raise EngineError(f"{directory}: cannot load the weights ({exc})") from exc
    return model


# ---------------------------------------------------------------------------------------------
# training


class TrainingClient(_ClientResult):
    """LoRA (or, with rank 0, full) fine-tuning of a local model: the tinker TrainingClient API.

    Gradients from `forward_backward` accumulate until `optim_step` applies them (AdamW with the
    step's AdamParams: learning rate, betas, eps, weight decay, grad clip) and clears them, as on
    Tinker. Requests run in submission order on one worker thread; every method returns at once.
    """

    def __init__(self, service: "ServiceClient", base_model: str, rank: int, *, seed: int,
                 train_attn: bool = True, train_mlp: bool = True, user_metadata: dict | None = None):
        if rank < 0:
            raise EngineError(f"LoRA rank must be 0 (full fine-tuning) or more, got {rank}")
        self._service = service
        self.base_model = base_model
        self.rank = int(rank)
        self.seed = int(seed)
        self.targets = {"attn": bool(train_attn), "mlp": bool(train_mlp)}
        self.user_metadata = dict(user_metadata or {})
        self.model_id = f"local-{secrets.token_hex(4)}"
        self._threads = configure_torch(service.threads)
        # the base weights are loaded, not drawn; the adapters are drawn from their own seeded
        # generator (lora.apply_lora), so the global torch RNG is left alone
        self._model = _load_base(base_model)
        if self.rank > 0:
            if not (train_attn or train_mlp):
                raise EngineError("LoRA needs train_attn or train_mlp (or both)")
            self.alpha = _lora.default_alpha(self.rank)
            _lora.apply_lora(self._model, self.rank, alpha=self.alpha, seed=self.seed,
                             attn=train_attn, mlp=train_mlp)
        else:
            self.alpha = None
            self._model.requires_grad_(True)
        self._params = [p for p in self._model.parameters() if p.requires_grad]
        self._optimizer: torch.optim.Optimizer | None = None
        self._worker = _Worker("local-train", self._threads)

    # -- information
    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse(
            model_data=types.ModelData(arch="gpt", model_name=self.base_model, tokenizer_id=self.base_model),
            model_id=self.model_id, is_lora=self.rank > 0, lora_rank=self.rank or None,
            model_name=self.base_model)

    async def get_info_async(self) -> types.GetInfoResponse:
        return self.get_info()

    def get_tokenizer(self):
        from ...render import get_tokenizer

        return get_tokenizer(self.base_model)

    def num_trainable(self) -> int:
        """Trainable parameters (adapters, or the whole model at rank 0)."""
        return sum(p.numel() for p in self._params)

    # -- forward / backward
    def forward_backward(self, data: list[types.Datum], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict | None = None) -> AwaitableConcurrentFuture:
        """Future of `ForwardBackwardOutput`; gradients of sum_i sum_t -w[i,t] * logp[i,t] accumulate.

        `loss_fn`: only "cross_entropy" (per-token `weights` and `target_tokens` from each datum's
        `loss_fn_inputs`). Each output has per-datum `logprobs` and `elementwise_loss`;
        metrics has `loss:sum`.
        """
        self._check_loss(loss_fn, loss_fn_config)
        return self._worker.submit(self._run, list(data), True)

    def forward(self, data: list[types.Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> AwaitableConcurrentFuture:
        """`forward_backward` without gradients (evaluation)."""
        self._check_loss(loss_fn, loss_fn_config)
        return self._worker.submit(self._run, list(data), False)

    async def forward_backward_async(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self.forward_backward(data, loss_fn, loss_fn_config)

    async def forward_async(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self.forward(data, loss_fn, loss_fn_config)

    @staticmethod
    def _check_loss(loss_fn: str, loss_fn_config: dict | None) -> None:
        if loss_fn != "cross_entropy":
            raise EngineError(f"The local engine supports loss_fn='cross_entropy' only, not {loss_fn!r}")
        if loss_fn_config:
            raise EngineError("The local engine's cross_entropy takes no loss_fn_config")

    def _run(self, data: list[types.Datum], backward: bool) -> types.ForwardBackwardOutput:
        if not data:
            raise EngineError("forward_backward: empty batch")
        block = self._model.config.block_size
        inputs, targets, weights = [], [], []
        for i, datum in enumerate(data):
            ids = datum.model_input.to_ints()
            tgt = _tokens_of(datum, "target_tokens", i).astype(np.int64)
            w = _tokens_of(datum, "weights", i).astype(np.float32)
            if not (len(ids) == len(tgt) == len(w)):
                raise EngineError(f"datum {i}: model_input has {len(ids)} tokens, target_tokens {len(tgt)}, "
                                  f"weights {len(w)}; they must be equal")
            if len(ids) > block:
                raise EngineError(f"datum {i}: {len(ids)} tokens exceed the local model's context of {block} "
                                  "tokens; set max_length (or shorten the example)")
            inputs.append(ids)
            targets.append(tgt)
            weights.append(w)
        width = max(len(x) for x in inputs)
        idx = torch.zeros(len(data), width, dtype=torch.long)
        tgt_t = torch.zeros(len(data), width, dtype=torch.long)
        w_t = torch.zeros(len(data), width, dtype=torch.float32)
        for i, (x, t, w) in enumerate(zip(inputs, targets, weights)):
            idx[i, :len(x)] = torch.tensor(x, dtype=torch.long)
            tgt_t[i, :len(t)] = torch.from_numpy(t)
            w_t[i, :len(w)] = torch.from_numpy(w)
        vocab = self._model.config.vocab_size
        if int(tgt_t.max()) >= vocab or int(idx.max()) >= vocab:
            raise EngineError(f"a token id is outside the local model's vocabulary of {vocab}")
        with torch.set_grad_enabled(backward):
            logits = self._model(idx)
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt_t.unsqueeze(-1)).squeeze(-1)
            elementwise = -w_t * logp
            loss = elementwise.sum()
            if backward:
                loss.backward()
        logp_np = logp.detach().numpy()
        el_np = elementwise.detach().numpy()
        outputs = [{"logprobs": types.TensorData.from_numpy(logp_np[i, :len(x)].astype(np.float32)),
                    "elementwise_loss": types.TensorData.from_numpy(el_np[i, :len(x)].astype(np.float32))}
                   for i, x in enumerate(inputs)]
        return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": float(loss.detach())})

    # -- optimiser
    def optim_step(self, optim_params: types.AdamParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> AwaitableConcurrentFuture:
        """Future of `OptimStepResponse`: one AdamW step with these AdamParams, then gradients cleared.

        Honours learning_rate, beta1, beta2, eps, weight_decay (decoupled, as torch AdamW and Tinker)
        and grad_clip_norm (0: no clipping). Metrics: `grad_norm` (before clipping).
        """
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("The local engine's optim_step takes tinker.AdamParams")
        return self._worker.submit(self._step, params)

    async def optim_step_async(self, optim_params=None, *, adam_params=None):
        return self.optim_step(optim_params, adam_params=adam_params)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self._params, lr=1e-4, foreach=False)

    def _step(self, p: types.AdamParams) -> types.OptimStepResponse:
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        for group in self._optimizer.param_groups:
            group.update(lr=float(p.learning_rate), betas=(float(p.beta1), float(p.beta2)),
                         eps=float(p.eps), weight_decay=float(p.weight_decay))
        grads = [q.grad for q in self._params if q.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        if p.grad_clip_norm and p.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(self._params, float(p.grad_clip_norm), foreach=False)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        return types.OptimStepResponse(metrics={"grad_norm": norm})

    # -- checkpoints
    def _meta(self, kind: str, name: str, user_metadata: dict | None) -> dict:
        return {"format": FORMAT, "kind": kind, "name": name, "base_model": self.base_model,
                "lora_rank": self.rank, "lora_alpha": self.alpha, "targets": self.targets,
                "seed": self.seed, "model_id": self.model_id,
                "user_metadata": {**self.user_metadata, **(user_metadata or {})},
                "saved_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    def _weights(self) -> tuple[str, dict[str, torch.Tensor]]:
        if self.rank > 0:
            return "adapter.safetensors", _lora.adapter_state(self._model)
        return "model.safetensors", {k: v.detach().clone() for k, v in self._model.state_dict().items()}

    def _save(self, kind: str, name: str, user_metadata: dict | None) -> str:
        sub = "weights" if kind == "state" else "sampler_weights"
        parent = self._service.ensure_log_dir() / sub
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        final = parent / name
        tmp = parent / f".{name}.tmp-{secrets.token_hex(3)}"
        tmp.mkdir(mode=0o700)
        try:
            filename, tensors = self._weights()
            _write_safetensors(tensors, tmp / filename)
            if kind == "state" and self._optimizer is not None:
                torch.save(self._optimizer.state_dict(), tmp / "optimizer.pt")
                os.chmod(tmp / "optimizer.pt", 0o600)
            meta_path = tmp / "checkpoint.json"
            meta_path.write_text(json.dumps(self._meta(kind, name, user_metadata), indent=1), encoding="utf-8")
            os.chmod(meta_path, 0o600)
            if final.exists():  # a rerun after an interrupted save rewrites that checkpoint
                old = parent / f".{name}.old-{secrets.token_hex(3)}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return SCHEME + str(final)

    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False,
                   user_metadata: dict | None = None) -> AwaitableConcurrentFuture:
        """Future of `SaveWeightsResponse(path="local://<log dir>/weights/<name>")`: weights + optimizer.

        `ttl_seconds` is accepted and ignored (files stay until deleted). An existing checkpoint of
        that name is replaced (Tinker refuses unless overwrite=True; here a run resumed after a
        Ctrl-C rewrites the step it was saving).
        """
        _check_name(name)
        return self._worker.submit(lambda: types.SaveWeightsResponse(path=self._save("state", name, user_metadata)))

    async def save_state_async(self, name, ttl_seconds=None, overwrite=False, user_metadata=None):
        return self.save_state(name, ttl_seconds, overwrite, user_metadata)

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None,
                                 user_metadata: dict | None = None) -> AwaitableConcurrentFuture:
        """Future of `SaveWeightsForSamplerResponse(path="local://<log dir>/sampler_weights/<name>")`."""
        _check_name(name)
        return self._worker.submit(
            lambda: types.SaveWeightsForSamplerResponse(path=self._save("sampler", name, user_metadata)))

    async def save_weights_for_sampler_async(self, name, ttl_seconds=None, user_metadata=None):
        return self.save_weights_for_sampler(name, ttl_seconds, user_metadata)

    def _load(self, path: str, optimizer: bool) -> types.LoadWeightsResponse:
        directory = parse_path(path)
        meta = read_checkpoint_meta(path)
        if meta["base_model"] != self.base_model or int(meta["lora_rank"]) != self.rank:
            raise EngineError(f"{path} holds {meta['base_model']} at LoRA rank {meta['lora_rank']}; this "
                              f"client trains {self.base_model} at rank {self.rank}")
        filename, _ = self._weights()
        state = _read_safetensors(directory / filename)
        try:
            if self.rank > 0:
                _lora.load_adapter_state(self._model, state)
            else:
                self._model.load_state_dict(state)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"{path}: cannot load its weights ({exc})") from exc
        if optimizer:
            opt_file = directory / "optimizer.pt"
            self._optimizer = self._make_optimizer()
            if opt_file.exists():
                self._optimizer.load_state_dict(torch.load(opt_file, weights_only=True))
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def load_state(self, path: str, weights_access_token: str | None = None) -> AwaitableConcurrentFuture:
        """Future: load a `local://…/weights/<name>` checkpoint's weights (fresh optimizer)."""
        return self._worker.submit(self._load, path, False)

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None
                                  ) -> AwaitableConcurrentFuture:
        """Future: load a checkpoint's weights and its optimizer state (to resume training)."""
        return self._worker.submit(self._load, path, True)

    async def load_state_async(self, path, weights_access_token=None):
        return self.load_state(path)

    async def load_state_with_optimizer_async(self, path, weights_access_token=None):
        return self.load_state_with_optimizer(path)

    # -- sampling from the current weights
    def _snapshot(self) -> SamplingClient:
        import copy

        model = copy.deepcopy(self._model)
        if self.rank > 0:
            _lora.merge_lora(model)
        return SamplingClient(model, self.base_model, threads=self._threads, seed=self.seed)

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config: Any = None,
                                             record_stability_info: bool = False, kind: str = "snapshot"
                                             ) -> SamplingClient:
        """A SamplingClient of the current weights (after queued steps); saved as `name` when given."""
        if name is not None:
            path = self.save_weights_for_sampler(name).result()
            return self._service.create_sampling_client(model_path=path.path)
        return self._worker.submit(self._snapshot).result()

    async def save_weights_and_get_sampling_client_async(self, name: str | None = None, retry_config: Any = None,
                                                         record_stability_info: bool = False,
                                                         kind: str = "snapshot") -> SamplingClient:
        if name is not None:
            saved = await self.save_weights_for_sampler(name).result_async()
            return self._service.create_sampling_client(model_path=saved.path)
        return await self._worker.submit(self._snapshot).result_async()

    def create_sampling_client(self, model_path: str, retry_config: Any = None,
                               record_stability_info: bool = False) -> SamplingClient:
        return self._service.create_sampling_client(model_path=model_path)

    async def create_sampling_client_async(self, model_path: str, retry_config: Any = None,
                                           record_stability_info: bool = False) -> SamplingClient:
        return self.create_sampling_client(model_path)


# ---------------------------------------------------------------------------------------------
# REST (checkpoint metadata) and the service


class RestClient:
    """The few RestClient calls tinker-cookbook makes: a checkpoint's run metadata, deleting one."""

    def __init__(self, service: "ServiceClient"):
        self._service = service

    def _run_of(self, path: str) -> types.TrainingRun:
        meta = read_checkpoint_meta(path)
        directory = parse_path(path)
        when = _dt.datetime.fromtimestamp((directory / "checkpoint.json").stat().st_mtime, _dt.timezone.utc)
        return types.TrainingRun(
            training_run_id=meta.get("model_id", "local"), base_model=meta["base_model"], model_owner="local",
            is_lora=int(meta["lora_rank"]) > 0, lora_rank=int(meta["lora_rank"]) or None,
            last_request_time=when, user_metadata=meta.get("user_metadata") or None)

    def get_training_run_by_tinker_path(self, tinker_path: str) -> AwaitableConcurrentFuture:
        try:
            return _done(self._run_of(tinker_path))
        except EngineError as exc:
            raise ValueError(str(exc)) from exc  # the cookbook treats ValueError as "no metadata"

    async def get_training_run_by_tinker_path_async(self, tinker_path: str) -> types.TrainingRun:
        return await self.get_training_run_by_tinker_path(tinker_path).result_async()

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> AwaitableConcurrentFuture:
        directory = parse_path(tinker_path)
        if directory.parent.name not in ("weights", "sampler_weights"):
            raise EngineError(f"{tinker_path} is not a checkpoint directory of a local run")
        shutil.rmtree(directory)
        return _done(None)

    async def delete_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        return await self.delete_checkpoint_from_tinker_path(tinker_path).result_async()


class ServiceClient:
    """The local engine's `tinker.ServiceClient`: training and sampling clients for local models.

    `log_dir`: where checkpoints are written (default None: a fresh `runs/local-<time>-<hex>`
    under the current directory, made at the first save; `sft()` passes the run's log dir).
    `seed`: default 0; initialises LoRA adapters (unless create_lora_training_client gets its own)
    and the seeds of sampling requests that give none, so runs repeat exactly.
    `threads`: torch threads (default None = $MACHINE_NB_THREADS, else 1).
    Tinker's arguments (`base_url`, `api_key`, `user_metadata`, `project_id`, `display_name`) are
    accepted and ignored: the engine runs in this process and needs no key.
    """

    def __init__(self, user_metadata: dict | None = None, project_id: str | None = None, *,
                 display_name: str | None = None, base_url: str | None = None, api_key: str | None = None,
                 log_dir: str | os.PathLike | None = None, seed: int = 0, threads: int | None = None,
                 **kwargs: Any):
        self.user_metadata = dict(user_metadata or {})
        self.seed = int(seed)
        self.threads = configure_torch(threads)
        self._log_dir = None if log_dir is None else Path(log_dir).absolute()
        self._lock = threading.Lock()

    # the SDK's context-manager and close() forms (cookbook 0.6 uses them)
    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def close(self, status: str = "success", detail: str | None = None) -> AwaitableConcurrentFuture:
        return _done(None)

    @property
    def log_dir(self) -> Path | None:
        return self._log_dir

    def ensure_log_dir(self) -> Path:
        """The log dir, created (0700) if needed."""
        with self._lock:
            if self._log_dir is None:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                self._log_dir = Path("runs").absolute() / f"local-{stamp}-{secrets.token_hex(2)}"
            self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            return self._log_dir

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        from . import MODELS

        return types.GetServerCapabilitiesResponse(
            supported_models=[types.SupportedModel(model_name=m) for m in sorted(MODELS)])

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self.get_server_capabilities()

    def create_rest_client(self) -> RestClient:
        return RestClient(self)

    # -- training clients
    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict | None = None, optimizer: Any = None) -> TrainingClient:
        """A TrainingClient with LoRA adapters of `rank` (default 32, Tinker's) on attention and MLP.

        alpha = 2 * rank. `rank=0` is full fine-tuning (a local-engine extension; Tinker has none).
        `seed`: default None = the service's seed. `train_unembed` is accepted and ignored: the
        local models tie input and output embeddings, which stay frozen under LoRA.
        `optimizer`: None or AdamW (tinker.AdamOptimizerConfig), the only one here.
        """
        _check_local_model(base_model)
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise EngineError(f"The local engine trains with AdamW only, not {optimizer!r}")
        return TrainingClient(self, base_model, int(rank), seed=self.seed if seed is None else int(seed),
                              train_attn=train_attn, train_mlp=train_mlp,
                              user_metadata={**self.user_metadata, **(user_metadata or {})})

    async def create_lora_training_client_async(self, base_model: str, rank: int = 32, seed: int | None = None,
                                                train_mlp: bool = True, train_attn: bool = True,
                                                train_unembed: bool = True, user_metadata: dict | None = None,
                                                optimizer: Any = None) -> TrainingClient:
        return await asyncio.to_thread(self.create_lora_training_client, base_model, rank, seed, train_mlp,
                                       train_attn, train_unembed, user_metadata, optimizer)

    def _from_state(self, path: str, base_model: str | None, user_metadata: dict | None,
                    optimizer: bool) -> TrainingClient:
        meta = read_checkpoint_meta(path)
        if base_model is not None and base_model != meta["base_model"]:
            raise EngineError(f"{path} was trained from {meta['base_model']}, not {base_model}")
        targets = meta.get("targets", {})
        client = TrainingClient(self, meta["base_model"], int(meta["lora_rank"]), seed=int(meta.get("seed", self.seed)),
                                train_attn=targets.get("attn", True), train_mlp=targets.get("mlp", True),
                                user_metadata={**(meta.get("user_metadata") or {}), **(user_metadata or {})})
        client._load(path, optimizer)
        return client

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict | None = None, weights_access_token: str | None = None,
                                          optimizer: Any = None) -> TrainingClient:
        """A TrainingClient with a `local://…/weights/<name>` checkpoint's weights and a fresh optimizer."""
        return self._from_state(path, base_model, user_metadata, False)

    async def create_training_client_from_state_async(self, path, base_model=None, user_metadata=None,
                                                      weights_access_token=None, optimizer=None):
        return await asyncio.to_thread(self._from_state, path, base_model, user_metadata, False)

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata: dict | None = None,
                                                         weights_access_token: str | None = None) -> TrainingClient:
        """A TrainingClient resumed from a checkpoint: weights and optimizer state."""
        return self._from_state(path, base_model, user_metadata, True)

    async def create_training_client_from_state_with_optimizer_async(self, path, base_model=None,
                                                                     user_metadata=None,
                                                                     weights_access_token=None):
        return await asyncio.to_thread(self._from_state, path, base_model, user_metadata, True)

    # -- sampling clients
    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any = None, record_stability_info: bool = False) -> SamplingClient:
        """A SamplingClient of a checkpoint (`model_path="local://…/sampler_weights/<name>"`) or a base model."""
        if (model_path is None) == (base_model is None):
            raise EngineError("create_sampling_client needs exactly one of model_path= or base_model=")
        if model_path is not None:
            if not str(model_path).startswith(SCHEME):
                _check_local_model(str(model_path))  # a tinker:// path: say which engine serves it
            meta = read_checkpoint_meta(model_path)
            model = _sampling_model(parse_path(model_path), meta)
            return SamplingClient(model, meta["base_model"], model_path=model_path, threads=self.threads,
                                  seed=self.seed)
        _check_local_model(base_model)
        return SamplingClient(_load_base(base_model), base_model, threads=self.threads, seed=self.seed)

    async def create_sampling_client_async(self, model_path: str | None = None, base_model: str | None = None,
                                           retry_config: Any = None, record_stability_info: bool = False
                                           ) -> SamplingClient:
        return await asyncio.to_thread(self.create_sampling_client, model_path, base_model)
