"""Engines: where training and sampling run. `local` (this machine) or `tinker` (the service).

Both serve the `tinker` ServiceClient API, so training (train.py) and evaluation (evaluate.py)
run one code path on either. Which engine a model or checkpoint path belongs to is decided here,
by its name: local models are `local/…` and their checkpoints `local://…`; anything else is Tinker's.
"""

from __future__ import annotations

from typing import Any

from ..errors import EngineError

ENGINES = ("local", "tinker")


def engine_for(model_or_path: str) -> str:
    """"local" for a local model (`local/…`) or checkpoint (`local://…`), else "tinker"."""
    name = str(model_or_path)
    if name.startswith("local://") or name.startswith("local/"):
        return "local"
    return "tinker"


def check_model(engine: str, model: str) -> None:
    """Raise EngineError when `engine` cannot serve `model` (a model name or checkpoint path).

    The local engine serves only its own `local/…` models; Tinker serves none of them.
    """
    if engine not in ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use one of {', '.join(ENGINES)}.")
    owner = engine_for(model)
    if owner == engine:
        return
    if engine == "local":
        raise EngineError(
            f"The local engine serves only its own models (local/…, e.g. 'local/arith-tiny'); "
            f"{model!r} is a Tinker model: pass engine='tinker' (needs TINKER_API_KEY) or a local model.")
    raise EngineError(
        f"{model!r} is the local engine's model, which Tinker does not serve: pass engine='local', "
        "or a Tinker model such as 'thinkingmachines/Inkling-Small'.")


def default_model(engine: str) -> str:
    """The model `sft(model=None)` trains: the shipped one locally; Tinker has no default."""
    if engine == "local":
        from .local import DEFAULT_MODEL

        return DEFAULT_MODEL
    raise EngineError("engine='tinker' needs a model name, e.g. model='thinkingmachines/Inkling-Small'.")


def service_client(engine: str = "local", **kwargs: Any) -> Any:
    """A ServiceClient for `engine` ("local" default: runs here, no key, no cost).

    "local": `machine_nb.engines.local.service.ServiceClient(**kwargs)` (e.g. `log_dir=`, `seed=`).
    "tinker": `tinker.ServiceClient(**kwargs)` after a 5 s key-and-reachability check (never the
    SDK's ~5-minute hang); `timeout=` changes that limit.
    """
    if engine == "local":
        from .local.service import ServiceClient

        return ServiceClient(**kwargs)
    if engine == "tinker":
        from .tinker import service_client as tinker_service_client

        return tinker_service_client(**kwargs)
    raise EngineError(f"Unknown engine {engine!r}: use one of {', '.join(ENGINES)}.")
