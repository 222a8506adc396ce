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
Writers take a lock on the cache folder (an flock of the folder itself: no file is added for it), so
processes publishing at once take turns, and the one holding it removes the temporary copies that a
writer killed part-way left (`.<repository folder>.machine_nb-tmp-*` beside the repositories, and
`.snapshot.machine_nb-tmp-*` and `.ref.machine_nb-tmp-*` inside one of its own): huggingface_hub's
`scan_cache_dir` (`hf cache scan`) reports a stray folder beside the repositories as a corrupt one,
and a temporary file under `refs/` as a reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

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
        logger.warning("could not write %s's tokenizer to the Hugging Face hub cache %s: %s; point HF_HUB_CACHE "
                       "(or HF_HOME) at a folder this user can write to load it by that name offline", name,
                       cache_root(), exc)
        return None


#: What names a temporary copy `_publish` builds before renaming it into place.
_TMP = ".machine_nb-tmp-"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Hold an exclusive flock of the cache folder `root` (released when the process ends, however)."""
    from ...core.jsonl import held_folder

    with held_folder(root, required=True):
        yield


def _remove_leftovers(root: Path, folder: Path) -> None:
    """Remove the temporary copies of repository `folder` that a writer killed part-way left; call it
    holding `_locked(root)`. Inside the folder only when machine_nb made it."""
    places = [(root, f".{folder.name}{_TMP}")]
    if is_ours(folder):
        places += [(folder, f".snapshot{_TMP}"), (folder, f".ref{_TMP}")]
    for parent, prefix in places:
        with os.scandir(parent) as entries:
            left = [Path(e.path) for e in entries if e.name.startswith(prefix)]
        for path in left:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def _publish(name: str, files: dict[str, Path]) -> Path | None:
    rev = revision(files)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = repo_dir(name)
    with _locked(root):
        _remove_leftovers(root, folder)
        if not folder.exists():
            tmp = root / f".{folder.name}{_TMP}{secrets.token_hex(4)}"
            try:
                _write_snapshot(tmp / "snapshots" / rev, files)
                _write_text(tmp / "refs" / "main", rev)
                _write_text(tmp / MARKER, json.dumps({"made_by": "machine_nb", "repository": name}) + "\n")
                os.rename(tmp, folder)  # whole, or not at all
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        if not is_ours(folder):
            logger.info("%s holds a repository machine_nb did not make; its tokenizer is not written there", folder)
            return None
        snapshot = folder / "snapshots" / rev
        if not snapshot.is_dir():
            tmp = folder / f".snapshot{_TMP}{secrets.token_hex(4)}"
            try:
                _write_snapshot(tmp, files)
                (folder / "snapshots").mkdir(exist_ok=True)
                os.rename(tmp, snapshot)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        ref = folder / "refs" / "main"
        if not ref.is_file() or ref.read_text(encoding="utf-8").strip() != rev:
            # written beside refs/, not in it: a file left under refs/ would read as a reference
            tmp = folder / f".ref{_TMP}{secrets.token_hex(4)}"
            try:
                _write_text(tmp, rev, sync=True)
                ref.parent.mkdir(exist_ok=True)
                os.replace(tmp, ref)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
    return snapshot


def _write_snapshot(directory: Path, files: dict[str, Path]) -> None:
    directory.mkdir(parents=True)
    for name, source in files.items():
        shutil.copyfile(source, directory / name)


def _write_text(path: Path, text: str, *, sync: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        if sync:
            f.flush()
            os.fsync(f.fileno())
