"""Renderer glue: the tinker-cookbook tokenizer and renderer for a model name, offline-safe.

Every module that turns chat rows into tokens (token counts, validation, the previewer's token
view, training, evaluation) asks here, so a model is rendered one way everywhere. The local
engine's models ("local/…") register their tokenizer and renderer with tinker-cookbook on first
use; Inkling renders offline through tml_renderers; other models (Qwen, Llama, …) need the
Hugging Face hub. It is never waited on when it cannot answer: with HF_HUB_OFFLINE (or
TRANSFORMERS_OFFLINE) set, or when a bounded connection check (`hub_reachable`, 2 s) fails, the
lookup is refused at once with EngineError, and callers fall back to labelled estimates, instead
of waiting out the hub client's retries for each model.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from ..errors import EngineError

LOCAL_PREFIX = "local/"


def base_model(model: str) -> str:
    """The model a name's renderer and tokenizer come from.

    Args:
        model: a model name, perhaps with Tinker's ":peft:…" suffix.

    Returns:
        The name without the suffix.
    """
    return model.split(":", 1)[0]


def is_local_model(model: str) -> bool:
    """Whether the local engine serves this model.

    Args:
        model: a model name.

    Returns:
        True for the local engine's own names (`local/…`).
    """
    return model.startswith(LOCAL_PREFIX)


def has_offline_tokenizer(model: str) -> bool:
    """Whether the model's real tokenizer is available with no network (exact token counts).

    Args:
        model: a model name.

    Returns:
        True for the local engine's models and Inkling (whose renderer ships its tokenizer).
    """
    name = base_model(model)
    return is_local_model(name) or name.startswith("thinkingmachines/Inkling")


# Seconds the hub check waits for DNS + a TCP connection. A reachable hub answers in well under a
# second; the hub client's own retries, with backoff, take far longer to give up with no network.
HUB_CHECK_TIMEOUT_S = 2.0
# How long a check's answer is reused (a dropdown of models asks once, not per model).
HUB_CHECK_TTL_S = 60.0
_HUB_CHECKS: dict[tuple[str, int], tuple[float, bool]] = {}  # check_address() -> (monotonic time, reachable)


def offline_switch() -> str | None:
    """Which variable switches the Hugging Face hub off, for messages that say why.

    Returns:
        "HF_HUB_OFFLINE" or "TRANSFORMERS_OFFLINE", the first set to 1/true/yes/on; None when neither is.
    """
    return next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                 if os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}), None)


def offline() -> bool:
    """Whether the Hugging Face hub is switched off.

    Returns:
        True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to 1/true/yes/on.
    """
    return offline_switch() is not None


_offline = offline


def hub_address() -> tuple[str, int]:
    """Where the Hugging Face hub is.

    Returns:
        (host, port) of HF_ENDPOINT (default https://huggingface.co, port 443).
    """
    parts = urlsplit(os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co")
    return parts.hostname or "huggingface.co", parts.port or (80 if parts.scheme == "http" else 443)


def check_address() -> tuple[str, int]:
    """Where hub_reachable connects: the hub, or the proxy the hub client goes through.

    Returns:
        (host, port) of the proxy that HTTPS_PROXY / HTTP_PROXY / ALL_PROXY (either case) name for
        HF_ENDPOINT's scheme, unless NO_PROXY exempts the hub; else hub_address().
    """
    import urllib.request

    host, port = hub_address()
    scheme = urlsplit(os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co").scheme or "https"
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):
        return host, port
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return parts.hostname or host, parts.port or {"http": 80, "https": 443}.get(parts.scheme, 1080)


def hub_reachable(timeout: float = HUB_CHECK_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub accepts a TCP connection, checked in bounded time.

    Behind a proxy (HTTPS_PROXY, …, which the hub client uses) the proxy is what is asked
    (check_address): the hub itself may be unreachable but through it. DNS and the connection run
    in a daemon thread, so a resolver that never answers costs at most `timeout`. The answer is
    reused for HUB_CHECK_TTL_S (60 s).

    Args:
        timeout: seconds to wait. Default HUB_CHECK_TIMEOUT_S (2 s).

    Returns:
        False at once when offline() is set; else whether the connection was made in time.
    """
    if offline():
        return False
    address = check_address()
    seen = _HUB_CHECKS.get(address)
    if seen is not None and time.monotonic() - seen[0] < HUB_CHECK_TTL_S:
        return seen[1]
    result = {"ok": False}

    def connect() -> None:
        try:
            with socket.create_connection(address, timeout=timeout):
                result["ok"] = True
        except (OSError, ValueError):
            pass

    worker = threading.Thread(target=connect, name="machine-nb-hub-check", daemon=True)
    worker.start()
    worker.join(timeout)
    ok = result["ok"] and not worker.is_alive()
    _HUB_CHECKS[address] = (time.monotonic(), ok)
    return ok


def renderer_name(model: str) -> str:
    """The renderer a model's prompts are formatted with.

    Args:
        model: a model name.

    Returns:
        The name of the renderer tinker-cookbook recommends for it (the local engine's own for
        its models).

    Raises:
        EngineError: no renderer is known for the model.
    """
    if is_local_model(model):
        from ..engines import ensure_registered

        return ensure_registered(base_model(model))["renderer"]
    from tinker_cookbook import model_info

    try:
        return model_info.get_recommended_renderer_name(base_model(model))
    except Exception as exc:  # cookbook raises ConfigurationError / KeyError for unknown names
        raise EngineError(f"No renderer known for model {model!r}: {exc}") from exc


def renderer_messages(messages: list[dict]) -> list[dict]:
    """A conversation as tinker-cookbook's renderers take it: each message as written, its OpenAI
    tool calls as the cookbook's `ToolCall` (Qwen3's renderer reads `call.function`, Inkling's
    takes either) and a None content beside them as "" (OpenAI's form for a call with no text;
    Qwen3's renderer needs text, Inkling's renders both alike). A call keeps its id, name and
    arguments; other keys of it are left out (the renderers write nothing else of a call, and
    `ToolCall` refuses unknown keys).

    Args:
        messages: chat messages, as check_row accepts them (rows sft trains on, validate renders
            and evaluations prompt with: each goes through this one rule).

    Returns:
        The messages (copies where tool calls were converted).
    """
    from tinker_cookbook.renderers import ToolCall

    def call(value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # a ToolCall already
        fn = value["function"]
        cid = value.get("id")
        return ToolCall(id=cid if isinstance(cid, str) else None,
                        function=ToolCall.FunctionBody(name=fn["name"], arguments=fn["arguments"]))

    out = []
    for m in messages:
        if isinstance(m.get("tool_calls"), list):
            m = {**m, "tool_calls": [call(c) for c in m["tool_calls"]]}
            if m.get("content") is None:
                m["content"] = ""
        out.append(m)
    return out


@lru_cache(maxsize=16)
def get_tokenizer(model: str) -> Any:
    """The model's tokenizer, cached per model.

    Args:
        model: a model name.

    Returns:
        tinker-cookbook's tokenizer for it (its Tokenizer protocol: encode, decode, eos_token_id).

    Raises:
        EngineError: at once, without contacting the hub, when the tokenizer needs the Hugging
            Face hub and the hub is switched off (offline()) or does not answer
            (hub_reachable()); or when it cannot be loaded.
    """
    name = base_model(model)
    if is_local_model(name):
        from ..engines import ensure_registered

        ensure_registered(name)
    elif not has_offline_tokenizer(name):
        if offline():
            raise EngineError(
                f"The tokenizer of {model!r} is not available offline ({offline_switch()} is set and only "
                "Inkling and the local engine's models ship their tokenizers); token counts for it are estimates.")
        if not hub_reachable():
            host, port = check_address()
            via = "" if (host, port) == hub_address() else "the proxy "
            raise EngineError(
                f"The tokenizer of {model!r} needs the Hugging Face hub, which cannot be reached ({via}{host}:{port} "
                f"did not answer within {HUB_CHECK_TIMEOUT_S:g} s); token counts for it are estimates. "
                "Set HF_HUB_OFFLINE=1 to skip this check.")
    from tinker_cookbook import tokenizer_utils

    try:
        return tokenizer_utils.get_tokenizer(name)
    except OSError as exc:
        raise EngineError(f"Could not load the tokenizer of {model!r}: {exc}") from exc


@lru_cache(maxsize=16)
def get_renderer(model: str, name: str | None = None) -> Any:
    """The tinker-cookbook renderer for a model, cached per model and name.

    Args:
        model: a model name.
        name: a renderer name (default None: the one renderer_name recommends).

    Returns:
        The renderer (build_generation_prompt, parse_response, get_stop_sequences, …).

    Raises:
        EngineError: no renderer or tokenizer is available for the model.
    """
    from tinker_cookbook import renderers

    tokenizer = get_tokenizer(model)
    return renderers.get_renderer(name or renderer_name(model), tokenizer, model_name=base_model(model))
