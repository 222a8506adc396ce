"""The local engine: a server that speaks Tinker's HTTP API on this machine, with a tiny model
shipped in the package, so the real tinker SDK and tinker-cookbook run here unchanged.

This file names the models it serves, registers their tokenizer and renderer with tinker-cookbook
(`use_local_models`), and loads their weights. The server is server.py (protocol) over
compute.py (training and sampling in torch), wire.py (protobuf) and checkpoints.py (paths and
files). Importing this file is cheap: torch and tinker-cookbook load on the first call that needs them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "local/arith-tiny"
"""The shipped base model: answers two-digit plus/minus questions and a few facts, naturally
(see MODEL_CARD.md for what it was trained on and how well it does)."""

WEIGHTS_DIR = Path(__file__).parent / "weights"

# name -> directory holding config.json, vocab.json and model.safetensors
MODELS: dict[str, Path] = {DEFAULT_MODEL: WEIGHTS_DIR}


def _model_dir(name: str) -> Path:
    from ...errors import EngineError

    base = name.split(":", 1)[0]
    if base not in MODELS:
        raise EngineError(
            f"The local engine does not serve {name!r}; it serves {sorted(MODELS)}. "
            "Tinker models (e.g. thinkingmachines/Inkling-Small) need engine='tinker'.")
    return MODELS[base]


@lru_cache(maxsize=8)
def get_tokenizer(name: str = DEFAULT_MODEL) -> Any:
    """The model's LocalTokenizer (cached; it is immutable), from the vocab.json beside its weights."""
    from .tokenizer import LocalTokenizer

    return LocalTokenizer.load(_model_dir(name) / "vocab.json", name_or_path=name.split(":", 1)[0])


def tokenizer_dir(name: str = DEFAULT_MODEL) -> Path:
    """The model's tokenizer as a Hugging Face fast-tokenizer directory (loads offline with
    `AutoTokenizer.from_pretrained`); the server reports it as the model's `tokenizer_id`."""
    return _model_dir(name) / "tokenizer"


def use_local_models() -> list[str]:
    """Register every local model's tokenizer and renderer with tinker-cookbook; returns their names.

    Call it before tinker-cookbook code that looks a local model up by name
    (`tokenizer_utils.get_tokenizer("local/arith-tiny")`, `model_info`/renderer lookups), e.g. in a
    script run against `machine-nb serve`. machine_nb's own functions call it themselves.
    """
    for name in MODELS:
        ensure_registered(name)
    return sorted(MODELS)


def ensure_registered(name: str = DEFAULT_MODEL) -> dict:
    """Register the model's tokenizer and renderer with tinker-cookbook (idempotent).

    Returns {"renderer": "machine_nb/local_chat", "tokenizer": name}: afterwards
    `tokenizer_utils.get_tokenizer(name)` and `renderers.get_renderer("machine_nb/local_chat", tok)`
    work offline. Raises EngineError for a name this engine does not serve.
    """
    from tinker_cookbook import renderers, tokenizer_utils

    from .renderer import RENDERER_NAME, renderer_factory

    base = name.split(":", 1)[0]
    _model_dir(base)
    if not tokenizer_utils.is_tokenizer_registered(base):
        tokenizer_utils.register_tokenizer(base, lambda: get_tokenizer(base))
    if not renderers.is_renderer_registered(RENDERER_NAME):
        renderers.register_renderer(RENDERER_NAME, renderer_factory)
    return {"renderer": RENDERER_NAME, "tokenizer": base}


def load_config(name: str = DEFAULT_MODEL) -> Any:
    """The model's GPTConfig, from config.json beside its weights."""
    return _read_config(_model_dir(name))


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
    Raises EngineError for a name this engine does not serve.
    """
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
