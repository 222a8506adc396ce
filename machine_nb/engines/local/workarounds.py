"""The places machine_nb uses other libraries' private names, because no public API does the job.

Each is kept here, small, with the version it was written for (`WRITTEN_FOR`);
tests/test_server_workarounds.py fails when an installed version differs, so each is checked again on
an upgrade rather than found broken in a user's notebook.

- `before_executors_shut_down(fn)`: run `fn` as the interpreter begins to exit, before
  concurrent.futures refuses new work. The local server finishes its clients' SDK sessions then,
  which needs the SDK's executor; `atexit` handlers run only after every executor is shut.
  CPython has no public hook at that point: threading's own (`threading._register_atexit`, which
  concurrent.futures uses) runs its hooks in reverse order of registration, so one registered
  after concurrent.futures' (imported here first) runs before it.
- `executor_threads()`: the worker threads of concurrent.futures' executors, which a check for
  "a thread of the user's is still running" at exit leaves out (Python joins them itself).
- `stop_sdk_client(client)`: stop a `tinker.ServiceClient`'s heartbeat and connections without
  sending anything. Its public `close()` first sends "finish session", which the SDK retries for
  about five minutes against a server that is gone.
- `sdk_client_closed(client)` and `sdk_session_id(client)`: whether a `tinker.ServiceClient` was
  closed (its every call then raises "ServiceClient is closed"), and the id of the session it holds
  (None before its first call), so a kept client that is closed, or whose session its server no longer
  knows (the server restarted), is replaced. The SDK has no public way to ask either.
- `sdk_heartbeats()` and `stop_heartbeats_to(url)`: the session heartbeats the SDK runs in this
  process, and stopping those sent to one server. A local server stopping in this process ends
  them, whoever made the client (tinker-cookbook makes its own): otherwise each fails every 10 s
  for the life of the process and, after two minutes, logs "Tinker is down" every 10 s, under a
  later cell's output. The SDK keeps them as tasks of its one event loop
  (`internal_client_holder._internal_client_holder_thread_singleton._loop`), each running the
  holder's `_session_heartbeat` with the holder's `_base_url`; no public API lists them, and a
  client's public `close()` needs the client.
  Both stop a heartbeat by cancelling its task until it has ended (`cancel_until_done`): a single
  cancel, the SDK's own `close()` included, can be absorbed below the heartbeat's loop (whose only
  handler is `except Exception`, so something under its request turned the cancel into an ordinary
  error); the task then stays "cancelling", beats on against a closed holder, and logs "Tinker is down".
- `warm_sdk_tokenizer(name)`: fill the SDK's cache of `SamplingClient.get_tokenizer()` results for a
  local model, so that call answers at once. It loads by the sampler's base-model name
  (`sampling_client._load_tokenizer_from_model_info(name)`, an `lru_cache` keyed by that one
  argument), which for a local model resolves only from the hub cache (hubcache.py), and which
  outside offline mode first asks the hub: a network wait, or a DNS timeout on a machine without
  one. The warming call runs with huggingface_hub's offline switch (`constants.HF_HUB_OFFLINE`,
  read on each call by huggingface_hub and transformers) turned on around it alone: no public API
  passes `local_files_only` through the SDK. Other threads see offline mode for that short call
  (transformers is imported before it, so it is the loading of two small files).
  Given the model's tokenizer folder (`folder`: for a hub cache that cannot be written), the call
  loads from it instead: `AutoTokenizer.from_pretrained`, which the loader calls, is replaced for the
  call by one that reads `name` from that folder and passes every other name on unchanged.
- `deterministic_kernels()`: torch's deterministic-kernels switch without the import that
  `torch.use_deterministic_algorithms` makes of `torch._inductor.config` (and through it all of
  torch._dynamo, about as much work as importing torch itself) only to copy the switch into the
  compiler's settings. The engine never compiles, so each process that trains or samples is spared
  that import; the switch itself is the same call (`torch._C._set_deterministic_algorithms`), and
  the compiler's copy is still set when it is already imported.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures.thread
import os
import sys
import threading
from typing import Any, Callable

from ...core.tasks import cancel_and_wait

#: What each workaround was written against: the minor versions of Python, the tinker SDK,
#: huggingface_hub, transformers and torch.
WRITTEN_FOR = {"python": "3.11", "tinker": "0.38", "huggingface_hub": "1.33", "transformers": "5.5",
               "torch": "2.13"}


def before_executors_shut_down(fn: Callable[[], None]) -> None:
    """Call `fn` as the interpreter begins to exit, before executors refuse new work (falls back
    to `atexit` where the hook is missing or the interpreter is already exiting)."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading exit hooks")
        register(fn)
    except RuntimeError:
        atexit.register(fn)


def executor_threads() -> set:
    """The worker threads of concurrent.futures' thread pools still alive."""
    return set(getattr(concurrent.futures.thread, "_threads_queues", {}))


def stop_sdk_client(client: Any) -> None:
    """Mark a tinker.ServiceClient closed and close its holders (heartbeat, connections), sending
    nothing. Errors of a holder already closed, or of an SDK loop ended at exit, are ignored."""
    lock = getattr(client, "_lifecycle_lock", None)
    if lock is not None:
        with lock:
            client._closed = True
    for name in ("_session_holder", "_rest_holder"):
        holder = getattr(client, name, None)
        if holder is not None:
            try:
                holder.close()
            except Exception:  # already closed, or the SDK's loop has ended at exit
                pass
            heartbeat = getattr(holder, "_session_heartbeat_task", None)
            if heartbeat is not None:
                cancel_until_done(heartbeat)


def sdk_client_closed(client: Any) -> bool:
    """Whether a tinker.ServiceClient was closed (by `close()`, its `with` block, or `stop_sdk_client`)."""
    return bool(getattr(client, "_closed", False))


def sdk_session_id(client: Any) -> str | None:
    """The id of the session a tinker.ServiceClient holds on its server; None before its first call
    opened one."""
    holder = getattr(client, "_session_holder", None)
    session_id = getattr(holder, "_session_id", None)
    return session_id if isinstance(session_id, str) else None


def cancel_until_done(task: "asyncio.Task") -> None:
    """Cancel `task` (an SDK task, on the SDK's loop) until it has ended (`core.tasks.cancel_and_wait`,
    run on that loop); returns at once, from any thread (the SDK's own included). Errors of a loop
    ended at exit are ignored."""
    job = cancel_and_wait(task)
    try:
        asyncio.run_coroutine_threadsafe(job, task.get_loop())
    except RuntimeError:  # the loop is closed: the process is exiting, and its tasks with it
        job.close()


def sdk_heartbeats() -> list[tuple[str, Any]]:
    """(base URL, asyncio task) of each session heartbeat the tinker SDK runs in this process;
    empty when the SDK is not imported or its loop is not running."""
    module = sys.modules.get("tinker.lib.internal_client_holder")
    loop = getattr(getattr(module, "_internal_client_holder_thread_singleton", None), "_loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return []

    def heartbeats() -> list:  # read on the loop's own thread: its task set is not thread-safe
        return [t for t in asyncio.all_tasks(loop) if getattr(t.get_coro(), "__name__", "") == "_session_heartbeat"]

    async def listed() -> list:
        return heartbeats()

    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is loop:  # called from the SDK's own thread: waiting on it would never return
        tasks = heartbeats()
    else:
        tasks = asyncio.run_coroutine_threadsafe(listed(), loop).result(timeout=10)
    found = []
    for task in tasks:
        frame = task.get_coro().cr_frame
        holder = frame.f_locals.get("self") if frame is not None else None
        url = getattr(holder, "_base_url", None)
        if isinstance(url, str):
            found.append((url.rstrip("/"), task))
    return found


def stop_heartbeats_to(url: str) -> int:
    """Stop the SDK's session heartbeats to the server at `url` (its clients are left as they are).
    Returns how many were stopped; errors of an SDK loop ended at exit are ignored."""
    try:
        beats = [task for base, task in sdk_heartbeats() if base == url.rstrip("/")]
    except Exception:  # the SDK's loop ended while it was asked (interpreter exit)
        return 0
    for task in beats:
        cancel_until_done(task)
    return len(beats)


_OFFLINE_LOCK = threading.Lock()


def warm_sdk_tokenizer(name: str, folder: str | os.PathLike | None = None) -> Any:
    """Load model `name`'s tokenizer through the SDK's own cached loader, as
    `SamplingClient.get_tokenizer()` calls it for a sampler of that base model, with the hub in
    offline mode for the call: afterwards that call returns the cached tokenizer with no network.
    It is read from the hub cache by name, or from `folder` (the model's tokenizer folder) when
    given. Returns the tokenizer; raises what the loader raises (OSError when the hub cache lacks
    `name` and no folder is given)."""
    from huggingface_hub import constants
    from tinker.lib.public_interfaces import sampling_client
    from transformers.models.auto.tokenization_auto import AutoTokenizer  # imported outside the offline window

    with _OFFLINE_LOCK:
        was = constants.HF_HUB_OFFLINE
        own = vars(AutoTokenizer).get("from_pretrained")
        if folder is not None:
            load = AutoTokenizer.from_pretrained

            def from_folder(cls: type, path: Any, *args: Any, **kwargs: Any) -> Any:
                return load(os.fspath(folder) if path == name else path, *args, **kwargs)

            AutoTokenizer.from_pretrained = classmethod(from_folder)
        constants.HF_HUB_OFFLINE = True
        try:
            return sampling_client._load_tokenizer_from_model_info(name)
        finally:
            constants.HF_HUB_OFFLINE = was
            if folder is not None:
                if own is None:
                    del AutoTokenizer.from_pretrained
                else:
                    AutoTokenizer.from_pretrained = own


def deterministic_kernels() -> None:
    """Turn on torch's deterministic kernels (errors, not warnings, for an operation that has none),
    as `torch.use_deterministic_algorithms(True)` does, without importing torch's compiler."""
    import torch

    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = True
    torch._C._set_deterministic_algorithms(True, warn_only=False)
