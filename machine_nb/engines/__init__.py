"""Engines: where training and sampling run. `local` (this machine) or `tinker` (the service).

Both are reached through the real `tinker` SDK: the local engine is a server that speaks Tinker's
HTTP API (engines/local/server.py), started in this process on a free loopback port the first
time it is needed. So training (train.py) and evaluation (evaluate.py) run one code path, and the
only differences between the engines are the base URL, the key and the model.

Which engine a model or checkpoint belongs to is decided here, by its name: local models are
`local/…`, their checkpoints `tinker://local-…`; anything else is Tinker's. Higher layers reach the engines only through this module.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ..errors import EngineError

ENGINES = ("local", "tinker")
#: The key of this process's local server: random per process, sent by this process's own SDK
#: clients and handed to its training child processes (as TINKER_API_KEY), so no other user of
#: the machine can reach the server through its loopback port.
from .local.checkpoints import PROCESS_KEY as LOCAL_API_KEY  # noqa: E402  (names and paths only)


def engine_for(model_or_path: str) -> str:
    """"local" for a local model (`local/…`) or checkpoint (`tinker://local-…`), else "tinker"."""
    from .local.checkpoints import is_local_path

    name = str(model_or_path)
    if name.startswith("local/") or is_local_path(name):
        return "local"
    return "tinker"


def check_model(engine: str, model: str) -> None:
    """Raise EngineError when `engine` cannot serve `model` (a model name or checkpoint path).

    The local engine serves only its own `local/…` models. Tinker serves none of them, except
    at a base URL that is itself a local server (checked against its capabilities when the
    service is checked: `engines.tinker.check_tinker(models=…)`).
    """
    if engine not in ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use one of {', '.join(ENGINES)}.")
    if engine == "local" and engine_for(model) != "local":
        raise EngineError(
            f"The local engine serves only its own models (local/…, e.g. 'local/arith-tiny'); "
            f"{model!r} is a Tinker model: pass engine='tinker' (needs TINKER_API_KEY) or a local model.")


#: The shipped base model the local engine serves (see engines/local/MODEL_CARD.md).
from .local import DEFAULT_MODEL as DEFAULT_LOCAL_MODEL  # noqa: E402  (a cheap module: names and paths)


def default_model(engine: str) -> str:
    """The model `sft(model=None)` trains: the shipped one locally; Tinker has no default."""
    if engine == "local":
        return DEFAULT_LOCAL_MODEL
    raise EngineError("engine='tinker' needs a model name, e.g. model='thinkingmachines/Inkling-Small'.")


def local_base_url() -> str:
    """The URL of this process's local server (started on first use, stopped at exit)."""
    from .local.server import ensure_server

    return ensure_server().url


def base_url(engine: str, base_url: str | None = None) -> str:
    """The service URL for `engine`: the local server's, or `base_url` / $TINKER_BASE_URL / Tinker's."""
    if engine == "local":
        return local_base_url()
    from .tinker import tinker_base_url

    return tinker_base_url(base_url)


from .tinker import check_base_url, shown_url  # noqa: E402,F401  (a Tinker URL's checks; the module is light)


def check_service(engine: str, base_url: str | None = None, models: tuple[str, ...] = ()) -> str:
    """The service URL to hand the SDK, once the engine is known to answer as Tinker does.

    Args:
        engine: "local" | "tinker".
        base_url: Tinker only: the service URL (default $TINKER_BASE_URL, else Tinker's).
        models: Tinker only: models the service must list.

    Returns:
        The URL. Locally, this process's server (started on first use); on Tinker, after the key
        and the service were checked within seconds (EngineError otherwise), never left to the
        SDK's minutes of retries.
    """
    if engine == "local":
        return local_base_url()
    from .tinker import check_tinker

    return check_tinker(base_url, models=models)


def watchdog(engine: str, url: str | None = None) -> Any:
    """A context manager watching the service while work runs on it.

    Args:
        engine: "local" | "tinker".
        url: the service URL (default: Tinker's, from $TINKER_BASE_URL).

    Returns:
        On Tinker, a Watchdog whose `failed` says why the service stopped answering (callers stop
        the work and raise EngineError within seconds); locally, one that watches nothing (the
        server lives in this process).
    """
    if engine != "tinker":
        import contextlib

        return contextlib.nullcontext()
    from .tinker import Watchdog, tinker_base_url

    # once the work stopped on a dead service, the SDK clients kept for it go too
    return Watchdog(url or tinker_base_url(), on_failed=lambda dead: _drop_clients(dead, finish=False))


def model_context(model: str) -> int | None:
    """The context length of a local base model, in tokens; None for Tinker's (not listed offline)."""
    if not str(model).startswith("local/"):
        return None
    from .local import load_config

    return int(load_config(model).block_size)


def max_lora_rank(model: str) -> int | None:
    """The highest LoRA rank a local base model takes (its width); None for Tinker's (not listed offline)."""
    if not str(model).startswith("local/"):
        return None
    from .local import max_lora_rank as widest

    return widest(model)


def ensure_registered(model: str) -> dict:
    """Register a local model's tokenizer and renderer with tinker-cookbook; returns its names."""
    from .local import ensure_registered as register

    return register(model)


def use_local_models() -> list[str]:
    """Register every local model's tokenizer and renderer with tinker-cookbook; returns their names.

    Call it before tinker-cookbook code that looks a local model up by name
    (`tokenizer_utils.get_tokenizer("local/arith-tiny")`, `model_info`/renderer lookups), e.g. in a
    script run against `machine-nb serve`. machine_nb's own functions call it themselves.
    It also makes the tinker SDK's `SamplingClient.get_tokenizer()` for a local model answer at once
    in this process, with no network wait even without HF_HUB_OFFLINE (it loads those tokenizers).
    """
    from .local import use_local_models as register_all

    return register_all()


def server_key(key: str | None = None, key_file: str | None = None, environ: str | None = None) -> str | None:
    """The key a `machine-nb serve` server requires, from the first of `key`, `key_file` (its first
    line) and `environ` (the value of $MACHINE_NB_SERVER_KEY) that is given; None when none is (the
    server then uses its data dir's key file). EngineError naming the source when a key is unusable."""
    from .local.checkpoints import check_key, read_key_file

    if key is not None:
        return check_key(key)
    if key_file is not None:
        return read_key_file(key_file)
    if environ and environ.strip():
        try:
            return check_key(environ.strip())
        except EngineError as exc:
            raise EngineError(f"$MACHINE_NB_SERVER_KEY: {exc}") from None
    return None


def serve(host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve Tinker's HTTP API with the local engine until Ctrl-C (`machine-nb serve`).

    Args:
        host: the address to bind (any but loopback needs `key=`).
        port: the port (0: a free one).
        **options: data_dir, key, threads, verbose, announce (see engines/local/server.py `serve`).
    """
    from .local.server import serve as run_server

    run_server(host, port, **options)


_CLIENTS: dict[tuple, Any] = {}
_WATCHED: set[str] = set()  # URLs of in-process servers told to close our clients when they stop
_CLIENTS_LOCK = threading.Lock()


def _forget_clients_in_child() -> None:
    """In a forked child the kept SDK clients are the parent's (their threads did not come along):
    the child makes its own when it needs one, and never closes the parent's sessions."""
    global _CLIENTS_LOCK
    _CLIENTS.clear()
    _WATCHED.clear()
    _CLIENTS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_clients_in_child)


def service_client(engine: str = "local", *, base_url: str | None = None, timeout: float | None = None,
                   models: tuple[str, ...] = (), **kwargs: Any) -> Any:
    """A real `tinker.ServiceClient` for `engine` ("local" default: runs here, no cost).

    "local": pointed at this process's local server, with its key (`LOCAL_API_KEY`).
    "tinker": after `engines.tinker.check_tinker` (key set, and the service answers as Tinker
    within `timeout` seconds, default 5, serving `models`), never the SDK's ~5-minute hang.
    One client is kept per engine, URL and key (each keeps a session, its heartbeat and a few
    threads for the life of the process), unless other SDK arguments (`kwargs`) are given. A client
    is made with the key it was checked with (TINKER_API_KEY's value at that call), and when
    TINKER_API_KEY changes, the next call makes a client with the new key and closes those kept
    with the old one. A kept client is closed, its session finished, before an in-process server
    it talks to stops (at exit, or when stopped), and dropped once its service is found gone (a
    failed check here, or a `Watchdog` that saw it die), so no heartbeat of it keeps failing and
    warning. One that was closed (`with service_client() as c:` closes it), or whose session its
    service no longer knows (a restarted `machine-nb serve`), is replaced by a new one.
    """
    import hashlib

    import tinker

    if engine == "local":
        kwargs.setdefault("api_key", LOCAL_API_KEY)
        url = local_base_url()
    elif engine == "tinker":
        from .tinker import DEFAULT_TIMEOUT, check_tinker, tinker_base_url

        try:
            url = check_tinker(base_url, DEFAULT_TIMEOUT if timeout is None else timeout,
                               api_key=kwargs.get("api_key"), models=models)
        except EngineError:
            _drop_clients(tinker_base_url(base_url), finish=False)  # it does not answer: nothing to finish
            raise
    else:
        raise EngineError(f"Unknown engine {engine!r}: use one of {', '.join(ENGINES)}.")
    from_env = not kwargs.get("api_key")
    key = kwargs.get("api_key") or os.environ.get("TINKER_API_KEY", "")
    if from_env and key:  # bound to the key it was checked with, whatever the environment says later
        kwargs["api_key"] = key
    if set(kwargs) - {"api_key"}:  # other settings: a client of its own
        return tinker.ServiceClient(base_url=url, **kwargs)
    cache_key = (engine, url, hashlib.sha256(key.encode()).hexdigest(), from_env)
    with _CLIENTS_LOCK:
        kept = _CLIENTS.get(cache_key)
    if kept is not None and _stale(engine, url, kept, key, timeout):
        with _CLIENTS_LOCK:
            if _CLIENTS.get(cache_key) is kept:
                del _CLIENTS[cache_key]
        _close(kept, finish=False)  # closed already, or its session is gone: nothing to finish
    superseded: list = []
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(cache_key)
        if client is None:
            client = _CLIENTS[cache_key] = tinker.ServiceClient(base_url=url, **kwargs)
            if from_env:  # TINKER_API_KEY was changed: the clients of the key it had go
                old = [k for k in _CLIENTS if k[:2] == (engine, url) and k[3] and k != cache_key]
                superseded = [_CLIENTS.pop(k) for k in old]
        watch = url not in _WATCHED
        _WATCHED.add(url)
    for old_client in superseded:
        _close(old_client, finish=True)
    if watch:
        from .local.server import running_at

        server = running_at(url)
        if server is not None:
            server.on_stop(lambda: _drop_clients(url, finish=True))
    return client


def _stale(engine: str, url: str, client: Any, key: str, timeout: float | None) -> bool:
    """Whether a kept client can no longer work: closed (by its user, say `with service_client() as
    c:`), or, on Tinker, holding a session its service no longer knows (the server restarted)."""
    from .local.workarounds import sdk_client_closed, sdk_session_id

    if sdk_client_closed(client):
        return True
    session_id = sdk_session_id(client)
    if engine != "tinker" or session_id is None:
        return False
    from .tinker import DEFAULT_TIMEOUT, session_gone

    return session_gone(url, session_id, DEFAULT_TIMEOUT if timeout is None else timeout, key)


def close_clients(base_url: str | None = None) -> None:
    """Close the SDK clients `service_client` keeps, finishing their sessions on the server.

    Call it before stopping a `machine-nb serve` server this process used with engine="tinker":
    a kept client's heartbeat would otherwise go on failing against it, and after two minutes
    the SDK warns that "Tinker is down". (Clients of the process's own local server are closed
    when it stops, by itself.)

    Args:
        base_url: the service URL whose clients to close; default None closes every kept client.

    Returns:
        None. Also importable as `machine_nb.close_clients`.
    """
    with _CLIENTS_LOCK:
        urls = {k[1] for k in _CLIENTS} if base_url is None else {str(base_url).rstrip("/")}
    for url in urls:
        _drop_clients(url, finish=True)


def _drop_clients(url: str, *, finish: bool) -> None:
    """Close and forget the clients kept for `url`: with `finish`, their sessions are finished on
    the server first (it still answers); without, only their heartbeats and connections stop."""
    with _CLIENTS_LOCK:
        clients = [_CLIENTS.pop(k) for k in [k for k in _CLIENTS if k[1] == url]]
        _WATCHED.discard(url)
    for client in clients:
        _close(client, finish=finish)


def _close(client: Any, *, finish: bool) -> None:
    if finish:
        try:
            client.close("success").result(timeout=10)
            return
        except Exception:  # the server went away meanwhile: stop the client below without it
            pass
    # a finish request to a server that is gone would be retried for minutes: stop it sending nothing
    from .local.workarounds import stop_sdk_client

    stop_sdk_client(client)


def check_checkpoint(path: str) -> str:
    """`path` when it is a checkpoint path (`tinker://<run>/weights|sampler_weights/<name>`, local or
    Tinker's), else EngineError saying what one looks like."""
    from .local.checkpoints import TINKER_SCHEME, is_local_path, parse

    if is_local_path(path):
        parse(path)
    elif not isinstance(path, str) or not path.startswith(TINKER_SCHEME):
        raise EngineError(f"{path!r} is not a checkpoint path tinker://<run>/weights|sampler_weights/<name> "
                          "(a training run's result.checkpoint, or result.state_path for its training state)")
    return path


def checkpoint_base_model(path: str) -> str | None:
    """The base model a local checkpoint was trained from (None for Tinker checkpoints: ask Tinker).

    A `tinker://local-…` path is looked up in this process's local server's data dir; one that
    is not there (made by a separate `machine-nb serve`) raises EngineError saying to point
    engine="tinker" at the server that made it.
    """
    if engine_for(path) != "local":
        return None
    from .local.checkpoints import checkpoint_dir, default_data_dir, read_meta

    from .local.server import default_server

    server = default_server()
    data_dir = server.data_dir if server is not None else default_data_dir()
    directory = checkpoint_dir(data_dir, path)
    if not (directory / "checkpoint.json").is_file():
        raise EngineError(
            f"{path} is not a checkpoint of this process's local engine (its data dir {data_dir} does not hold "
            "it). A checkpoint made by a separate `machine-nb serve` is served by that server: pass "
            "engine='tinker' with TINKER_BASE_URL set to its URL and TINKER_API_KEY to that server's key "
            "(and model= the model it was trained from, e.g. 'local/arith-tiny').")
    return read_meta(directory)["base_model"]


def sdk_errors() -> tuple[type[BaseException], ...]:
    """The SDK's exceptions that mean "the request was refused" (for callers that translate them)."""
    import tinker

    return (tinker.APIStatusError, tinker.RequestFailedError)


#: The most characters of a server's message an error shows (an HTML error page can be megabytes).
MAX_SHOWN_CHARS = 2000


def explain(exc: BaseException) -> Exception:
    """An SDK error as machine_nb's: MachineFormatError when the server named a corrupt file,
    else EngineError with the server's message (never the SDK's long retry text).

    Any answer gives a short, readable error: a JSON object's `detail` (a validation error's list
    of messages joined), else the SDK's text; at most MAX_SHOWN_CHARS characters, never empty, and
    with this process's keys (TINKER_API_KEY's, the local server's) shown as `[redacted]`.
    """
    from ..errors import MachineFormatError

    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        detail = _detail(body.get("detail"))
        file = body.get("file")
        if body.get("error_type") == "MachineFormatError" and isinstance(file, str) and file:
            return MachineFormatError(file, _shown(_detail(body.get("reason")) or detail, exc))
        return EngineError(_shown(detail, exc))
    return EngineError(_shown("", exc))


def _detail(value: Any) -> str:
    """A server's `detail` as text: a list of validation errors ({loc, msg}) as "loc: msg; …"."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and all(isinstance(v, dict) and "msg" in v for v in value):
        return "; ".join((".".join(str(p) for p in v["loc"]) + ": " if isinstance(v.get("loc"), list) else "")
                         + str(v["msg"]) for v in value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _shown(detail: str, exc: BaseException) -> str:
    """`detail`, else the exception's own text, else its type: clipped, its keys redacted."""
    text = detail.strip()
    if not text:
        try:
            text = str(exc).strip()
        except Exception:  # an exception whose __str__ itself fails
            text = ""
    text = text or f"{type(exc).__name__} (the server gave no message)"
    for key in {os.environ.get("TINKER_API_KEY", "").strip(), LOCAL_API_KEY}:
        if len(key) >= 8:
            text = text.replace(key, "[redacted]")
    if len(text) > MAX_SHOWN_CHARS:
        text = f"{text[:MAX_SHOWN_CHARS]}… ({len(text) - MAX_SHOWN_CHARS:,} more characters)"
    return text
