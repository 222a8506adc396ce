"""machine_nb.engines.local.workarounds: the only uses of other libraries' private names. These fail
when Python or the tinker SDK moves to a version the workarounds were not written for, so each
is checked again then."""

from __future__ import annotations

import sys
import threading

import pytest
import tinker

from machine_nb.engines.local import workarounds
from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local.server import LocalServer

from serving import FakeHub


def test_the_versions_are_those_the_workarounds_were_written_for():
    import huggingface_hub
    import transformers

    assert f"{sys.version_info.major}.{sys.version_info.minor}" == workarounds.WRITTEN_FOR["python"]
    assert ".".join(tinker.__version__.split(".")[:2]) == workarounds.WRITTEN_FOR["tinker"]
    assert ".".join(huggingface_hub.__version__.split(".")[:2]) == workarounds.WRITTEN_FOR["huggingface_hub"]
    assert ".".join(transformers.__version__.split(".")[:2]) == workarounds.WRITTEN_FOR["transformers"]
    import torch

    assert ".".join(torch.__version__.split(".")[:2]) == workarounds.WRITTEN_FOR["torch"]


def test_the_private_names_are_there():
    import concurrent.futures.thread

    assert callable(threading._register_atexit)
    assert hasattr(concurrent.futures.thread, "_threads_queues")
    client = tinker.ServiceClient(base_url="http://127.0.0.1:9", api_key="tml-not-a-real-key-0000")
    for name in ("_lifecycle_lock", "_closed", "_session_holder", "_rest_holder"):
        assert hasattr(client, name), name
    from tinker.lib import internal_client_holder

    assert hasattr(internal_client_holder._internal_client_holder_thread_singleton, "_loop")
    assert hasattr(internal_client_holder.InternalClientHolder, "_session_heartbeat")
    import inspect

    assert "self._session_heartbeat_task" in inspect.getsource(internal_client_holder.InternalClientHolder.__init__)
    from huggingface_hub import constants
    from tinker.lib.public_interfaces import sampling_client

    assert callable(sampling_client._load_tokenizer_from_model_info.cache_info)
    assert isinstance(constants.HF_HUB_OFFLINE, bool)
    import torch

    assert callable(torch._C._set_deterministic_algorithms)


def test_warm_sdk_tokenizer_loads_offline_and_restores_the_offline_switch(monkeypatch):
    from huggingface_hub import constants, is_offline_mode
    from tinker.lib.public_interfaces import sampling_client

    from machine_nb.engines.local import hub_tokenizer

    assert hub_tokenizer(DEFAULT_MODEL) is not None
    hub = FakeHub()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert not is_offline_mode()  # huggingface_hub and transformers read the switch on each call
    sampling_client._load_tokenizer_from_model_info.cache_clear()
    tok = workarounds.warm_sdk_tokenizer(DEFAULT_MODEL)
    assert constants.HF_HUB_OFFLINE is False
    info = sampling_client._load_tokenizer_from_model_info.cache_info()
    assert (info.misses, info.currsize) == (1, 1)
    assert sampling_client._load_tokenizer_from_model_info(DEFAULT_MODEL) is tok  # the key get_tokenizer() uses
    hub.close()
    assert hub.connections == 0


def test_stop_sdk_client_stops_a_client_of_a_server_that_is_gone_without_waiting():
    server = LocalServer().start()
    client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
    client.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=60)
    server.stop()
    stopping = threading.Thread(target=workarounds.stop_sdk_client, args=(client,))
    stopping.start()
    stopping.join(120)  # the public close() would retry its finish request for about five minutes
    assert not stopping.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        client.create_sampling_client(base_model=DEFAULT_MODEL)


def _within(check, seconds: float = 10) -> bool:
    """Whether `check()` is true, polling for up to `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


def test_a_local_server_stopping_ends_the_sdk_heartbeats_sent_to_it():
    """A client the server's owner never sees (tinker-cookbook makes its own), left open: once the
    server stops, no heartbeat of its session keeps failing against it."""
    server = LocalServer().start()
    client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
    client.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=60)
    assert [url for url, _ in workarounds.sdk_heartbeats()].count(server.url) == 1
    server.stop()
    assert _within(lambda: server.url not in [url for url, _ in workarounds.sdk_heartbeats()])
    assert workarounds.stop_heartbeats_to(server.url) == 0


def test_deterministic_kernels_turns_the_switch_on_without_importing_the_compiler():
    """In a fresh process (this one may have imported the compiler already): the switch is on, in
    error mode as torch's own switch sets it, and neither torch._inductor nor torch._dynamo was
    imported."""
    import subprocess

    code = ("import sys, torch\n"
            "from machine_nb.engines.local.workarounds import deterministic_kernels\n"
            "deterministic_kernels()\n"
            "assert torch.are_deterministic_algorithms_enabled()\n"
            "assert not torch.is_deterministic_algorithms_warn_only_enabled()\n"
            "print(sorted(m for m in ('torch._inductor', 'torch._dynamo') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_deterministic_kernels_also_sets_the_compilers_copy_once_it_is_imported(monkeypatch):
    import torch
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "deterministic", False)
    workarounds.deterministic_kernels()
    assert inductor_config.deterministic is True and torch.are_deterministic_algorithms_enabled()


def _heartbeat_that_survives_one_cancel(monkeypatch) -> None:
    """The SDK's heartbeat as it was seen to run when a cancel is absorbed below its loop: the
    first cancel does not end it, and it beats on."""
    import asyncio

    from tinker.lib import internal_client_holder

    async def _session_heartbeat(self, session_id):
        survived = False
        while True:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                if survived:
                    raise
                survived = True

    monkeypatch.setattr(internal_client_holder.InternalClientHolder, "_session_heartbeat", _session_heartbeat)




def test_stop_sdk_client_ends_a_heartbeat_that_survives_the_first_cancel(monkeypatch):
    _heartbeat_that_survives_one_cancel(monkeypatch)
    server = LocalServer().start()
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
        client.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=60)
        (beat,) = [task for url, task in workarounds.sdk_heartbeats() if url == server.url]
        workarounds.stop_sdk_client(client)
        assert _within(beat.done)
    finally:
        server.stop()


def test_a_local_server_stopping_ends_a_heartbeat_that_survives_the_first_cancel(monkeypatch):
    _heartbeat_that_survives_one_cancel(monkeypatch)
    server = LocalServer().start()
    client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
    client.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=60)
    (beat,) = [task for url, task in workarounds.sdk_heartbeats() if url == server.url]
    server.stop()
    assert _within(beat.done)
    workarounds.stop_sdk_client(client)
