"""The tinker SDK's `SamplingClient.get_tokenizer()` for a local model, offline and with no network
wait: the SDK loads it by the model's name (`AutoTokenizer.from_pretrained("local/arith-tiny")`),
which the engine makes resolvable from the Hugging Face hub cache (engines/local/hubcache.py), and
in a process that runs the engine or called `use_local_models()` it answers from the SDK's own
cache even without HF_HUB_OFFLINE (workarounds.warm_sdk_tokenizer).

The raw SDK is used as a user's script uses it: a separate process talking to `machine-nb serve`,
and in this process against an in-process server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tinker

from machine_nb.engines.local import DEFAULT_MODEL, get_tokenizer, hubcache
from machine_nb.engines.local.server import LocalServer

from serving import TEST_KEY, FakeHub, start_server, stop_server

TEXTS = ["12+34=?", "What is the capital of France?", "  two  spaces\nand a line", "<|end|>"]

#: A script that uses the raw SDK alone (machine_nb is not imported): the tokenizer's ids as JSON.
RAW_SDK = textwrap.dedent("""
    import json, sys
    import tinker
    url, key, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    sampler = tinker.ServiceClient(base_url=url, api_key=key).create_sampling_client(
        base_model="local/arith-tiny").result()
    tok = sampler.get_tokenizer()
    assert "machine_nb" not in sys.modules
    print(json.dumps([tok.encode(t, add_special_tokens=False) for t in texts]))
""")


def engine_ids(texts: list[str]) -> list[list[int]]:
    tok = get_tokenizer(DEFAULT_MODEL)
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`machine-nb serve` with its own, empty hub cache (what it writes there is all there is)."""
    tmp = tmp_path_factory.mktemp("serve-tokenizer")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_CACHE", str(tmp / "hub"))
        s = start_server(tmp)
    s.hub = tmp / "hub"
    yield s
    assert stop_server(s) == 0


def run_script(code: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_raw_sdk_script_against_machine_nb_serve_loads_the_tokenizer_by_name_offline(served):
    entry = served.hub / "models--local--arith-tiny"
    assert hubcache.is_ours(entry) and (entry / "refs" / "main").is_file()  # written when the server started
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(served.hub)}
    done = run_script(RAW_SDK, served.url, TEST_KEY, json.dumps(TEXTS), env=env)
    assert json.loads(done.stdout.splitlines()[-1]) == engine_ids(TEXTS)


def test_without_offline_mode_use_local_models_makes_get_tokenizer_ask_no_network(served):
    """HF_HUB_OFFLINE unset: the SDK would ask the hub first (a DNS wait on a machine without it)."""
    hub = FakeHub()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_HUB_CACHE=str(served.hub), HF_ENDPOINT=hub.url)
    code = "import machine_nb; machine_nb.use_local_models()\n" + RAW_SDK.replace(
        'assert "machine_nb" not in sys.modules', "").replace(
        "print(", "from tinker.lib.public_interfaces import sampling_client as sdk\n"
                  "print(json.dumps(sdk._load_tokenizer_from_model_info.cache_info()._asdict()))\nprint(")
    try:
        done = run_script(code, served.url, TEST_KEY, json.dumps(TEXTS), env=env)
    finally:
        hub.close()
    *_, info, ids = done.stdout.splitlines()
    assert json.loads(ids) == engine_ids(TEXTS)
    assert json.loads(info)["hits"] == 1  # get_tokenizer() was answered from the cache use_local_models filled
    assert hub.connections == 0


def test_with_the_engine_in_process_get_tokenizer_answers_from_the_sdk_cache(monkeypatch):
    """Offline mode off (the SDK's loader would ask the hub): the engine fills the SDK's cache."""
    from huggingface_hub import constants
    from tinker.lib.public_interfaces import sampling_client as sdk

    hub = FakeHub()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server = LocalServer().start()
    try:
        client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
        sampler = client.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=120)
        before = sdk._load_tokenizer_from_model_info.cache_info()
        tok = sampler.get_tokenizer()
        after = sdk._load_tokenizer_from_model_info.cache_info()
        # a hit and no miss: no loader ran, so nothing could ask the network
        assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)
        assert [tok.encode(t, add_special_tokens=False) for t in TEXTS] == engine_ids(TEXTS)
        assert tok.decode(tok.encode(TEXTS[0], add_special_tokens=False)) == TEXTS[0]
        client.close("success").result(timeout=60)  # its session ends before the server does
    finally:
        server.stop()
        hub.close()
    assert hub.connections == 0


def test_in_offline_mode_sampling_in_process_loads_no_tokenizer_and_get_tokenizer_still_works():
    """HF_HUB_OFFLINE=1: the SDK's loader reads the hub cache itself, so sampling through the
    in-process engine does not load the tokenizer (nor import transformers' tokenizer classes) for
    a `get_tokenizer()` that may never come; when it comes, it answers offline."""
    code = textwrap.dedent("""
        import json, sys
        import tinker
        from machine_nb.engines.local.server import LocalServer
        server = LocalServer().start()
        client = tinker.ServiceClient(base_url=server.url, api_key=server.key)
        sampler = client.create_sampling_client(base_model="local/arith-tiny").result(timeout=120)
        print("transformers.models.auto.tokenization_auto" in sys.modules)
        tok = sampler.get_tokenizer()
        print(json.dumps([tok.encode(t, add_special_tokens=False) for t in json.loads(sys.argv[1])]))
        client.close("success").result(timeout=60)
        server.stop()
    """)
    done = run_script(code, json.dumps(TEXTS), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    *_, loaded, ids = done.stdout.splitlines()
    assert loaded == "False"
    assert json.loads(ids) == engine_ids(TEXTS)


def test_the_hub_cache_entry_is_updated_when_ours_and_a_foreign_one_is_left_alone(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    source = tmp_path / "src"
    source.mkdir()
    (source / "tokenizer.json").write_text('{"v": 1}')
    (source / "config.json").write_text("{}")
    files = {"tokenizer.json": source / "tokenizer.json", "config.json": source / "config.json"}

    first = hubcache.publish("local/one", files)
    assert first is not None and hubcache.published("local/one") == first
    assert (first / "tokenizer.json").read_text() == '{"v": 1}'
    stamp = (first.parent.parent / "refs" / "main").stat().st_mtime_ns
    assert hubcache.publish("local/one", files) == first  # the same files: nothing rewritten
    assert (first.parent.parent / "refs" / "main").stat().st_mtime_ns == stamp
    (source / "tokenizer.json").write_text('{"v": 2}')
    second = hubcache.publish("local/one", files)
    assert second != first and hubcache.published("local/one") == second
    assert (second / "tokenizer.json").read_text() == '{"v": 2}' and first.is_dir()

    foreign = tmp_path / "models--local--two"
    (foreign / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (foreign / "snapshots" / ("a" * 40) / "tokenizer.json").write_text("theirs")
    before = sorted(p.relative_to(foreign) for p in foreign.rglob("*"))
    assert hubcache.publish("local/two", files) is None
    assert sorted(p.relative_to(foreign) for p in foreign.rglob("*")) == before
    assert (foreign / "snapshots" / ("a" * 40) / "tokenizer.json").read_text() == "theirs"
    assert hubcache.published("local/two") is None
    assert not [p for p in tmp_path.iterdir() if "tmp" in p.name]  # no temporary folder left behind
