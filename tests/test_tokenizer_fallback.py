"""The tinker SDK's `SamplingClient.get_tokenizer()` for a local model when the Hugging Face hub
cache cannot be written (read-only, full, or HF_HUB_CACHE pointing where no folder can be made) and
HF_HUB_OFFLINE is unset: the engine loads the tokenizer from the toolkit's own tokenizer folder into
the SDK's cache, so the call answers with no network, and one warning names the setting to change.

The hub cache stands at a path under a regular file (tests run as root, whom a read-only folder
does not stop), and every connection is refused and recorded."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest

from machine_nb.engines import local
from machine_nb.engines.local import DEFAULT_MODEL, SMOLLM2_MODEL

TEXTS = ["12+34=?", "What is the capital of France?", "  two  spaces\nand a line"]


@pytest.fixture
def unwritable_hub_no_network(tmp_path, monkeypatch):
    """A hub cache no folder can be made in, offline mode off, and no network: returns the list of
    connections attempted. The SDK's tokenizer cache and the engine's record of it start and end empty.

    Connections to this machine (127.0.0.1, ::1, localhost) go through: they are no network, and
    another thread of this test process (a kept local server's client) may make one meanwhile."""
    from huggingface_hub import constants
    from tinker.lib.public_interfaces import sampling_client

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    hub = blocker / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    attempts: list = []

    loopback = {"127.0.0.1", "::1", "localhost"}

    def host_of(what, args):
        if what == "getaddrinfo":
            return args[0] if args else None
        address = args[1] if what in ("connect", "connect_ex") and len(args) > 1 else (args[0] if args else None)
        return address[0] if isinstance(address, tuple) and address else None

    def refuse(what, original):
        def refused(*args, **kwargs):
            if host_of(what, args) in loopback:
                return original(*args, **kwargs)
            attempts.append((what, args[:2]))
            raise OSError(101, "Network is unreachable (blocked by the test)")
        return refused

    monkeypatch.setattr(socket, "create_connection", refuse("create_connection", socket.create_connection))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo", socket.getaddrinfo))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect", socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect_ex", socket.socket.connect_ex))

    def forget():
        local._SDK_WARM.clear()
        sampling_client._load_tokenizer_from_model_info.cache_clear()

    forget()
    yield attempts
    forget()


def sdk_get_tokenizer(name: str):
    """What `SamplingClient.get_tokenizer()` runs for a sampler of base model `name`."""
    from tinker.lib.public_interfaces.sampling_client import SamplingClient

    return SamplingClient.get_tokenizer(SimpleNamespace(_base_model=name))


@pytest.mark.parametrize("name", [SMOLLM2_MODEL, DEFAULT_MODEL])
def test_an_unwritable_hub_cache_still_gives_the_sdk_the_tokenizer_with_no_network(
        name, unwritable_hub_no_network, caplog):
    attempts = unwritable_hub_no_network
    with caplog.at_level(logging.WARNING):
        local.sdk_tokenizer(name)  # what the engine runs when a sampler of this model is created
        tok = sdk_get_tokenizer(name)
    assert attempts == []
    renderer_tok = local.get_tokenizer(name)
    assert [tok.encode(t, add_special_tokens=False) for t in TEXTS] == \
        [renderer_tok.encode(t, add_special_tokens=False) for t in TEXTS]
    # this package's warnings: another thread of the test process (an SDK client closing) may log its own
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("machine_nb")]
    assert len(warnings) == 1 and "HF_HUB_CACHE" in warnings[0] and "HF_HOME" in warnings[0], warnings
    assert "\n" not in warnings[0]
