"""Where the local server keeps what a session writes, and how a checkpoint path names its files.

A local training run is `local-<hex>:train:<n>` (the SDK's own `{session_id}:train:{seq}` shape,
with a session id the server makes), so its checkpoints are ordinary Tinker paths
`tinker://local-<hex>:train:<n>/weights/<name>` (training state) and `…/sampler_weights/<name>`
(what a sampling client loads), stored under the data dir:

    <data dir>/runs/<run id>/run.json                      what the run is (base model, rank, …)
    <data dir>/runs/<run id>/{weights,sampler_weights}/<name>/checkpoint.json + weights

The `tinker://local-` prefix is how a checkpoint string says which engine serves it
(`engines.engine_for`). The server never deletes or writes outside its data dir (`is_inside`).
run.json and checkpoint.json are read through `read_run_record` and `read_meta`, which check each
field's type (`_FIELDS`): a damaged file is refused naming the file and field, never half used.
Directories are 0700 and files 0600: runs hold what was trained on.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Callable

from ...errors import EngineError, MachineFormatError

TINKER_SCHEME = "tinker://"
RUN_PREFIX = "local-"
KINDS = {"weights": "training", "sampler_weights": "sampler"}
#: What every checkpoint.json this toolkit writes says it is.
FORMAT = "machine-nb-local/1"
#: Largest model_seq_id a run id holds (a signed 64-bit number, as the SDK counts).
MAX_MODEL_SEQ_ID = 2**63 - 1
_RUN_ID = re.compile(r"local-[0-9a-f]{8,64}:train:\d{1,19}")  # whole names: fullmatch; a folder name stays short
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def cache_folder(env_var: str, name: str) -> Path:
    """The folder `$env_var` names, else `name` in the user's cache folder for machine_nb
    ($XDG_CACHE_HOME/machine_nb, or ~/.cache/machine_nb); absolute."""
    env = os.environ.get(env_var, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).absolute() / "machine_nb" / name


def default_data_dir() -> Path:
    """$MACHINE_NB_DATA_DIR, else a per-user cache directory (`~/.cache/machine_nb/tinker-server`)."""
    return cache_folder("MACHINE_NB_DATA_DIR", "tinker-server")


def ensure_private_dir(path: Path) -> Path:
    """`path` created 0700, and so is each missing folder above it; an existing folder keeps its mode.
    EngineError naming `path` when it cannot be made (a file in its way, no permission, a full disk)."""
    missing = []
    for p in (Path(path), *Path(path).parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            pass
        except OSError as exc:
            raise EngineError(f"{path}: the folder cannot be made ({exc.strerror or exc}: {p}); pass another "
                              "data dir") from None
    if not Path(path).is_dir():
        raise EngineError(f"{path} is not a folder; pass another data dir")
    return Path(path)


#: The data dir's file holding the key its servers require when none is given (0600).
KEY_FILE = "server.key"


def check_key(key: str) -> str:
    """A server key: the SDK sends only keys that start with `tml-`; at least 12 characters, no spaces.
    EngineError otherwise (it never quotes the key)."""
    if not isinstance(key, str) or not key.startswith("tml-") or len(key) < 12 or any(c.isspace() for c in key):
        raise EngineError("a server key must start with 'tml-' (the tinker SDK sends no other API key), have at "
                          "least 12 characters and no spaces")
    return key


def new_key() -> str:
    """A fresh random server key."""
    import secrets

    return "tml-" + secrets.token_urlsafe(32)


#: The key of this process's own server (`server.ensure_server`): random per process, sent by the
#: process's own SDK clients and handed to its training child processes.
PROCESS_KEY = new_key()


def read_key_file(path: str | os.PathLike) -> str:
    """The key in a key file (its first line); EngineError naming the file when it is unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineError(f"{path}: cannot read the key file ({exc.strerror or exc})") from None
    key = (text.splitlines() or [""])[0].strip()
    try:
        return check_key(key)
    except EngineError as exc:
        raise EngineError(f"{path}: {exc}") from None


def _place(tmp: Path, path: Path) -> bool:
    """Put the finished file `tmp` at `path` unless a file is there already: hard-linked (which
    fails when one is), or, on a file system without hard links (some network and FUSE ones),
    renamed unless one has appeared meanwhile. Returns whether it was put there."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        if path.exists():
            return False
        os.replace(tmp, path)
        return True


def data_dir_key(data_dir: Path) -> tuple[str, Path]:
    """(key, file) of the data dir's server key, created (0600, random) the first time. Refuses a
    file that other users can read or write (`chmod 600` it).

    The file appears whole or not at all: the key is written to a temporary file beside it, then
    hard-linked into place, which fails when the file exists (another server made it first: its
    key is the one read). A write that fails (a full disk) leaves no empty key file behind. On a
    file system without hard links the temporary file is renamed into place instead, unless the
    file has appeared meanwhile."""
    import secrets

    path = Path(data_dir) / KEY_FILE
    if not path.exists():
        key = new_key()
        tmp = Path(data_dir) / f".{KEY_FILE}.tmp-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(key + "\n")
            if _place(tmp, path):
                return key, path
        finally:
            tmp.unlink(missing_ok=True)
    mode = path.stat().st_mode
    if mode & 0o077:
        raise EngineError(f"{path}: other users can read or change this key file (mode {mode & 0o777:o}); "
                          f"run `chmod 600 {path}`")
    return read_key_file(path), path


def run_ids(data_dir: Path, log: Callable[[str], None]) -> list[str]:
    """The ids of the runs under `<data dir>/runs`, sorted; anything else there (a stray file or
    folder, a name that is not a run id, a damaged run.json: `read_run_record`) is skipped, and `log`
    says so, naming the file and field."""
    root = Path(data_dir) / "runs"
    try:
        entries = sorted(root.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        log(f"{root}: not readable ({exc.strerror or exc}); no runs listed")
        return []
    out = []
    for p in entries:
        if not _RUN_ID.fullmatch(p.name) or not p.is_dir():
            log(f"{p}: not a training run (skipped)")
            continue
        if (p / "run.json").exists():
            try:
                read_run_record(p)
            except MachineFormatError as exc:
                log(f"{exc}; run skipped")
                continue
        out.append(p.name)
    return out


def is_local_path(path: str) -> bool:
    """Whether a checkpoint path is served by the local engine (`tinker://local-…`)."""
    return isinstance(path, str) and path.startswith(TINKER_SCHEME + RUN_PREFIX)


def check_name(name: str) -> str:
    """A checkpoint name is a plain file name (letters, digits, `._-`) that does not start with a
    dot: a save's temporary folders do (`.<name>.tmp-…`), and listings leave such folders out.
    EngineError otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("."):
        raise EngineError(f"checkpoint name {name!r} must be 1-128 letters, digits, '.', '_' or '-', not "
                          "starting with '.'")
    return name


def tinker_path(run_id: str, kind: str, name: str) -> str:
    return f"{TINKER_SCHEME}{run_id}/{kind}/{name}"


def parse(path: str) -> tuple[str, str, str]:
    """(run id, kind, name) of a local `tinker://` checkpoint path; EngineError naming what is wrong."""
    if not isinstance(path, str):
        raise EngineError(f"a checkpoint path is a string, got {type(path).__name__}")
    parts = path[len(TINKER_SCHEME):].split("/") if path.startswith(TINKER_SCHEME) else []
    if len(parts) != 3 or parts[1] not in KINDS:
        raise EngineError(f"{path!r} is not a checkpoint path tinker://<run>/weights|sampler_weights/<name>")
    run_id, kind, name = parts
    if not (run_id.startswith(RUN_PREFIX)):
        raise EngineError(f"{path!r} is a Tinker checkpoint, not one of the local engine's (tinker://local-…): "
                          "use engine='tinker' for it")
    check_name(name)
    return run_id, kind, name


def is_inside(path: Path, root: Path) -> bool:
    """Whether `path`, links resolved, lies under `root` (the only place the server deletes or writes)."""
    try:
        return Path(path).resolve().is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def not_a_checkpoint(directory: Path) -> str | None:
    """None when `directory` holds a checkpoint this toolkit wrote, else what is missing from it.

    Such a checkpoint has a `checkpoint.json` saying `"format": FORMAT` with its base model and
    LoRA rank, and its weights file beside it (`adapter.safetensors`, or `model.safetensors` at rank 0).
    Whether the weights themselves are readable is checked when they are loaded.
    """
    if not (Path(directory) / "checkpoint.json").is_file():
        return "it has no checkpoint.json"
    try:
        meta = read_meta(directory)
    except MachineFormatError as exc:
        return f"its checkpoint.json is damaged: {describe(exc)}"
    if meta.get("format") != FORMAT:
        return f"its checkpoint.json does not say \"format\": \"{FORMAT}\""
    weights = Path(directory) / ("adapter.safetensors" if meta["lora_rank"] > 0 else "model.safetensors")
    if not weights.is_file():
        return f"it has no {weights.name}"
    return None


def run_dir(data_dir: Path, run_id: str) -> Path:
    """The directory of a run: `<data dir>/runs/<run id>`."""
    if not _RUN_ID.fullmatch(run_id):
        raise EngineError(f"{run_id!r} is not a local run id (local-<hex>:train:<n>)")
    return Path(data_dir) / "runs" / run_id


def checkpoint_dir(data_dir: Path, path: str) -> Path:
    """The directory holding a local checkpoint (it may not exist)."""
    run_id, kind, name = parse(path)
    return run_dir(data_dir, run_id) / kind / name


#: 10000-01-01 in seconds since 1970: the first time Python's datetime cannot hold.
_YEAR_10000 = 253402300800

#: What each field of a run.json or checkpoint.json holds when present and not null: (test, what
#: it must be). A field of another type is a damaged file, refused naming the file and the field
#: before any code uses the value.
_FIELDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "base_model": (lambda v: isinstance(v, str) and v != "", "a model name (a non-empty string)"),
    "lora_rank": (lambda v: type(v) is int and v >= 0, "a whole number >= 0"),
    "lora_alpha": (lambda v: type(v) in (int, float) and math.isfinite(v), "a number"),
    "seed": (lambda v: type(v) is int and -(2**63) <= v < 2**63, "a whole number from -2**63 to 2**63 - 1"),
    "targets": (lambda v: isinstance(v, dict) and all(isinstance(x, bool) for x in v.values()),
                "an object of true/false values (attn, mlp, unembed)"),
    "user_metadata": (lambda v: isinstance(v, dict), "an object"),
    "training_run_id": (lambda v: isinstance(v, str), "a string"),
    "created": (lambda v: type(v) in (int, float) and 0 <= v < _YEAR_10000,
                f"a time in seconds since 1970 (0 to {_YEAR_10000 - 1})"),
}


def _read_record(path: Path, what: str, required: tuple[str, ...], way_out: str) -> dict:
    """The JSON object in `path`, each of its `_FIELDS` checked (`required` ones present and not
    null); MachineFormatError naming the file and the field otherwise. Only a regular file is read:
    a named pipe or a device (`/dev/zero` through a link) is refused without waiting on it."""
    from ...core.jsonl import open_regular

    try:
        with open_regular(path) as f:
            value = json.loads(f.read().decode("utf-8"))
    except MachineFormatError as exc:  # missing, not a regular file, or not readable
        if not os.path.exists(path):
            raise MachineFormatError(str(path), f"no {what} here (the file does not exist)") from None
        raise MachineFormatError(str(path), f"unreadable {what} ({exc.reason}); {way_out}") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise MachineFormatError(str(path), f"unreadable {what} ({exc}); {way_out}") from None
    if not isinstance(value, dict):
        raise MachineFormatError(str(path), f"a {what} is a JSON object, got {type(value).__name__}; {way_out}")
    for key in required:
        if value.get(key) is None:
            raise MachineFormatError(str(path), f"missing; {way_out}", field=key)
    for key, (ok, want) in _FIELDS.items():
        if value.get(key) is not None and not ok(value[key]):
            raise MachineFormatError(str(path), f"must be {want}, got {_short(value[key])}; {way_out}", field=key)
    return value


def describe(exc: MachineFormatError) -> str:
    """What is wrong with a file, naming the field when there is one (not the file itself)."""
    return f"field {exc.field!r} {exc.reason}" if exc.field else exc.reason


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_meta(directory: Path) -> dict:
    """A checkpoint directory's `checkpoint.json`: base model and LoRA rank present, and every field
    of `_FIELDS` it has of the right type; MachineFormatError naming the file and field otherwise."""
    return _read_record(Path(directory) / "checkpoint.json", "checkpoint description", ("base_model", "lora_rank"),
                        "save the checkpoint again, or delete its folder")


def read_run_record(directory: Path) -> dict:
    """A run directory's `run.json`: its base model present, and every field of `_FIELDS` it has of
    the right type; MachineFormatError naming the file and field otherwise."""
    return _read_record(Path(directory) / "run.json", "run record", ("base_model",),
                        "fix the file, or delete the run's folder")


def checkpoint_files(directory: Path) -> tuple[int, float] | None:
    """(bytes in its files, when its checkpoint.json was written) of a checkpoint folder, or None when
    it has no checkpoint.json: not a checkpoint, or one deleted while this was reading it."""
    meta = Path(directory) / "checkpoint.json"
    try:
        if not meta.is_file():
            return None
        when = meta.stat().st_mtime
        size = 0
        for f in Path(directory).iterdir():
            if f.is_file():
                size += f.stat().st_size
    except (FileNotFoundError, NotADirectoryError):
        return None
    return size, when
