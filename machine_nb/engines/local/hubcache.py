"""Each local model's tokenizer in the Hugging Face hub cache, under the model's own name.

The tinker SDK's `SamplingClient.get_tokenizer()` loads a sampler's tokenizer with
`AutoTokenizer.from_pretrained(<base model name>)`. "local/arith-tiny" is no repository on the hub,
so that resolves only from the hub cache (`huggingface_hub.constants.HF_HUB_CACHE`), and without a
network wait only in offline mode (`HF_HUB_OFFLINE=1`). `publish` writes a model's tokenizer files
there as a repository of that name (`models--local--arith-tiny/`: `refs/main`, `snapshots/<rev>/`),
so any process on the machine in offline mode loads it by name, e.g. a script using the raw SDK
against `machine-nb serve`. (In a process that runs the engine or called `use_local_models()`, the
SDK's own cache is filled as well: workarounds.warm_sdk_tokenizer.)

Only repositories made here are ever written: a new one is built whole beside the cache's folders
and renamed into place, with a `machine_nb.json` marker; an existing folder is updated only when it
holds that marker, and one without it (a real download of that name) is left alone. The revision is
a hash of the files, so a changed tokenizer gets a new snapshot and `refs/main` moves to it with an
atomic replace; a reader sees the old snapshot or the new one, never a half-written one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

#: The file that marks a hub-cache repository as made by machine_nb (the only ones it writes).
MARKER = "machine_nb.json"


def cache_root() -> Path:
    """The hub cache this process reads (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_dir(name: str) -> Path:
    """The cache folder of repository `name` (`models--local--arith-tiny` for "local/arith-tiny")."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_root() / repo_folder_name(repo_id=name, repo_type="model")


def revision(files: dict[str, Path]) -> str:
    """A 40-hex revision naming this exact content (the hub resolves `refs/main` only to such names)."""
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode("utf-8") + b"\0" + Path(files[name]).read_bytes() + b"\0")
    return digest.hexdigest()


def is_ours(folder: Path) -> bool:
    """Whether a hub-cache repository folder was made by machine_nb (holds the marker)."""
    return (folder / MARKER).is_file()


def published(name: str) -> Path | None:
    """The snapshot folder `refs/main` names in repository `name`, when machine_nb made it; else None."""
    folder = repo_dir(name)
    try:
        rev = (folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    snapshot = folder / "snapshots" / rev
    return snapshot if is_ours(folder) and rev and snapshot.is_dir() else None


def publish(name: str, files: dict[str, Path]) -> Path | None:
    """Write `files` (file name in the repository -> source file) as repository `name` of the hub
    cache, so `AutoTokenizer.from_pretrained(name)` loads them offline. Returns the snapshot folder,
    or None when the folder exists and machine_nb did not make it (left alone) or the cache cannot be
    written (logged; loading by name then needs the tokenizer folder's path instead).

    Idempotent: the same files give the same revision, and nothing is written when `refs/main`
    names it already."""
    try:
        return _publish(name, {k: Path(v) for k, v in files.items()})
    except OSError as exc:
        logger.warning("could not write %s's tokenizer to the Hugging Face hub cache %s: %s", name,
                       cache_root(), exc)
        return None


def _publish(name: str, files: dict[str, Path]) -> Path | None:
    rev = revision(files)
    folder = repo_dir(name)
    if not folder.exists():
        cache_root().mkdir(parents=True, exist_ok=True)
        tmp = folder.parent / f".{folder.name}.machine_nb-tmp-{secrets.token_hex(4)}"
        try:
            _write_snapshot(tmp / "snapshots" / rev, files)
            _write_text(tmp / "refs" / "main", rev)
            _write_text(tmp / MARKER, json.dumps({"made_by": "machine_nb", "repository": name}) + "\n")
            try:
                os.rename(tmp, folder)  # whole, or not at all; fails when another process got there first
            except OSError:
                if not folder.exists():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    if not is_ours(folder):
        logger.info("%s holds a repository machine_nb did not make; its tokenizer is not written there", folder)
        return None
    snapshot = folder / "snapshots" / rev
    if not snapshot.is_dir():
        tmp = folder / f".snapshot.machine_nb-tmp-{secrets.token_hex(4)}"
        try:
            _write_snapshot(tmp, files)
            (folder / "snapshots").mkdir(exist_ok=True)
            try:
                os.rename(tmp, snapshot)
            except OSError:
                if not snapshot.is_dir():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    ref = folder / "refs" / "main"
    if not ref.is_file() or ref.read_text(encoding="utf-8").strip() != rev:
        from ...core.jsonl import atomic_write_text

        atomic_write_text(ref, rev, mode=0o644)
    return snapshot


def _write_snapshot(directory: Path, files: dict[str, Path]) -> None:
    directory.mkdir(parents=True)
    for name, source in files.items():
        shutil.copyfile(source, directory / name)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
