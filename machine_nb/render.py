"""Renderer glue: the tinker-cookbook tokenizer and renderer for a model name, offline-safe.

Every module that turns chat rows into tokens (token counts, validation, the previewer's token
view, training, evaluation) asks here, so a model is rendered one way everywhere. The local
engine's models ("local/…") register their tokenizer and renderer with tinker-cookbook on first
use; Inkling renders offline through tml_renderers; other models (Qwen, Llama, …) need the
Hugging Face hub, which is refused at once when offline instead of a ~50 s DNS retry.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from .errors import EngineError

LOCAL_PREFIX = "local/"


def base_model(model: str) -> str:
    """The model name without Tinker's ":peft:…" suffix (whose renderer and tokenizer it shares)."""
    return model.split(":", 1)[0]


def is_local_model(model: str) -> bool:
    return model.startswith(LOCAL_PREFIX)


def has_offline_tokenizer(model: str) -> bool:
    """Whether the model's real tokenizer is available with no network (exact token counts)."""
    name = base_model(model)
    return is_local_model(name) or name.startswith("thinkingmachines/Inkling")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def renderer_name(model: str) -> str:
    """The renderer tinker-cookbook recommends for a model (the local engine's own for local models)."""
    if is_local_model(model):
        from .engines.local import ensure_registered

        return ensure_registered(base_model(model))["renderer"]
    from tinker_cookbook import model_info

    try:
        return model_info.get_recommended_renderer_name(base_model(model))
    except Exception as exc:  # cookbook raises ConfigurationError / KeyError for unknown names
        raise EngineError(f"No renderer known for model {model!r}: {exc}") from exc


@lru_cache(maxsize=16)
def get_tokenizer(model: str) -> Any:
    """The model's tokenizer (tinker-cookbook's Tokenizer protocol: encode/decode/eos_token_id).

    Raises EngineError at once when it would need the Hugging Face hub while HF_HUB_OFFLINE is set.
    """
    name = base_model(model)
    if is_local_model(name):
        from .engines.local import ensure_registered

        ensure_registered(name)
    elif not has_offline_tokenizer(name) and _offline():
        raise EngineError(
            f"The tokenizer of {model!r} is not available offline (HF_HUB_OFFLINE is set and only "
            "Inkling and the local engine's models ship their tokenizers); token counts for it are estimates.")
    from tinker_cookbook import tokenizer_utils

    try:
        return tokenizer_utils.get_tokenizer(name)
    except OSError as exc:
        raise EngineError(f"Could not load the tokenizer of {model!r}: {exc}") from exc


@lru_cache(maxsize=16)
def get_renderer(model: str, name: str | None = None) -> Any:
    """The tinker-cookbook renderer for `model` (`name` overrides the recommended renderer)."""
    from tinker_cookbook import renderers

    tokenizer = get_tokenizer(model)
    return renderers.get_renderer(name or renderer_name(model), tokenizer, model_name=base_model(model))
