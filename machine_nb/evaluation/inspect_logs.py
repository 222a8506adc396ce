"""Eval results as Inspect AI logs, and Inspect AI logs as eval results.

Inspect AI (`inspect_ai`) is the evaluation framework whose log viewer (`inspect view`) and
published tasks many readers already use. This module converts in both directions through
inspect_ai's own log API, never by writing its file format by hand:

- `build_log` turns one result (its per-row records and summary: evaluate, evaluate_cases or
  probe) into an `EvalLog` with one sample per row (input, target, output, the score with its
  match mode, token usage) and the run (model, checkpoint, settings) in its spec; `write_log`
  writes it atomically as a `.eval` file.
- `read_log` reads any Inspect log (ours or one Inspect wrote) back as per-row records and a
  summary in the shape of evaluate()'s results, so compare() pairs them like its own. A `.eval`
  log from elsewhere is checked first (`check_archive`): Inspect decompresses each zip member
  whole into memory, so a zip bomb, a huge member or a member path that leaves the archive is
  refused by name before Inspect reads it.

The conversion is plain data in and out (results.py wraps it in an EvalResult); inspect_ai loads
on the first call, and its absence is an ImportError that says how to install it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import math
import os
import struct
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from ..core.chat import content_text, prompt_text
from ..core.redact import redacted
from ..errors import MachineFormatError, user_stacklevel

INSTALL_HINT = 'pip install "machine_nb[inspect]"'

SCORE_NAME = "match"
"""The score a log written here carries per sample: C / I, with the match mode in its metadata."""

PROBE_SCORE = "bled"
"""A probe's score per sample: 1 when the checkpoint's reply has the format and the base model's has not."""

PROVIDER = "tinker-sampling"
"""The model-name prefix of our logs: tinker-cookbook's Inspect model API, which inspect_eval runs through."""

SAMPLE_COLUMNS = ["sample_id", "epoch", "score", "scorer"]
"""Columns a result read from an Inspect log adds after evaluate()'s: sample_id (the sample's id),
epoch (1-based), score (the score's value as a number, Inspect's value_to_float), scorer (its name)."""

MAX_MEMBER_BYTES = 256 << 20
"""The most one member of a `.eval` log may hold decompressed (256 MiB): Inspect reads each member
whole into memory, so a larger one (or one that decompresses past the size its zip entry declares,
a zip bomb) is refused before Inspect reads it. Raise it here to read a log you trust."""

MAX_LOG_BYTES = 4 << 30
"""The most a `.eval` log may hold decompressed in all (4 GiB), for the same reason."""

_STOP_TO_INSPECT = {"stop": "stop", "length": "max_tokens"}
_STOP_FROM_INSPECT = {"stop": "stop", "max_tokens": "length", "model_length": "length"}


# Inspect's opt-in hooks that import user code which may reach a server (telemetry, key lookups).
NETWORK_HOOKS = ("INSPECT_TELEMETRY", "INSPECT_API_KEY_OVERRIDE", "INSPECT_REQUIRED_HOOKS")


@contextlib.contextmanager
def offline_inspect() -> Iterator[None]:
    """Inspect's network hooks switched off for the duration (their variables restored after).

    Yields:
        Nothing.
    """
    saved = {k: os.environ.pop(k) for k in NETWORK_HOOKS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def require_inspect(what: str) -> Any:
    """inspect_ai, imported, or an ImportError that says how to install it.

    Args:
        what: the function that needs it, named in the error.

    Returns:
        The inspect_ai module.

    Raises:
        ImportError: inspect_ai is not installed.
    """
    try:
        import inspect_ai
    except ImportError:
        raise ImportError(f"{what} needs Inspect AI (inspect_ai), which is not installed: {INSTALL_HINT}") from None
    return inspect_ai


def is_inspect_log(path: str | os.PathLike) -> bool:
    """Whether a file is an Inspect log by its name: `.eval` (Inspect's zip format).

    Args:
        path: the file.

    Returns:
        True for a `.eval` file (an Inspect `.json` log is recognised when read: it has "eval").
    """
    return Path(path).suffix.lower() == ".eval"


# --------------------------------------------------------------------------- writing

def _plain(value: Any) -> Any:
    """A JSON-safe copy of a cell or summary value (NaN → None, numpy scalars → Python)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, (str, bool, int)):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return str(value)


def _inspect_tool_call(call: Any, index: int) -> Any:
    """An OpenAI-style tool call ({"id", "function": {"name", "arguments": JSON text}}) as Inspect's
    ToolCall; arguments that are not a JSON object keep their text in its parse_error."""
    import json

    from inspect_ai.tool import ToolCall

    fn = call.get("function") if isinstance(call.get("function"), Mapping) else {}
    raw, arguments, problem = fn.get("arguments"), {}, None
    if isinstance(raw, Mapping):
        arguments = dict(raw)
    else:
        try:
            decoded = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            arguments = decoded
        else:
            problem = f"the arguments are not a JSON object: {raw!r}"
    cid = call.get("id")
    return ToolCall(id=cid if isinstance(cid, str) and cid else f"call_{index}", function=str(fn.get("name") or ""),
                    arguments=arguments, parse_error=problem)


def inspect_messages(messages: Any) -> list:
    """Chat messages ({"role", "content"}, with OpenAI tool calls and tool results) as Inspect's.

    Args:
        messages: the messages of a row: system, user, assistant (its "tool_calls" kept as
            Inspect ToolCalls) and tool messages (their "tool_call_id" and "name" kept); other
            roles and non-dicts are left out.

    Returns:
        The inspect_ai ChatMessages. A tool call whose arguments are not a JSON object has its
        text in the ToolCall's parse_error and empty arguments.
    """
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser

    out: list = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, Mapping):
            continue
        role, text = m.get("role"), content_text(m.get("content"))
        if role == "system":
            out.append(ChatMessageSystem(content=text))
        elif role == "user":
            out.append(ChatMessageUser(content=text))
        elif role == "assistant":
            calls = [c for c in (m.get("tool_calls") or []) if isinstance(c, Mapping)]
            out.append(ChatMessageAssistant(content=text, tool_calls=[_inspect_tool_call(c, i)
                                                                      for i, c in enumerate(calls)] or None))
        elif role == "tool":
            cid, name = m.get("tool_call_id"), m.get("name")
            out.append(ChatMessageTool(content=text, tool_call_id=cid if isinstance(cid, str) else None,
                                       function=name if isinstance(name, str) else None))
    return out


def _chat_messages(messages: Any, prompt: str) -> list:
    """Inspect chat messages for a row's messages (or its prompt text alone)."""
    from inspect_ai.model import ChatMessageUser

    return inspect_messages(messages) or [ChatMessageUser(content=str(prompt or ""))]


def _usage(prompt_tokens: Any, output_tokens: Any) -> Any:
    from inspect_ai.model import ModelUsage

    i, o = int(_plain(prompt_tokens) or 0), int(_plain(output_tokens) or 0)
    return ModelUsage(input_tokens=i, output_tokens=o, total_tokens=i + o)


def build_log(records: list[dict], summary: dict) -> Any:
    """An Inspect EvalLog of one result: a sample per row, the run in its spec.

    Args:
        records: the result's rows as dicts: evaluate()'s (RESULT_COLUMNS; "messages", "line",
            "format", "case" where present), evaluate_cases' (with "case" and "trial": sample id
            case + 1, epoch trial + 1) or probe's (PROBE_COLUMNS: output is the checkpoint's
            reply, the base model's goes in the metadata, the score is `bled`); a row's `correct`
            is a bool (EvalResult.write_inspect_log checks it with results.correct_values). Rows
            whose `row` numbers repeat (several results joined) are numbered by position.
        summary: the result's summary (name, model, checkpoint, engine, renderer, parameters,
            data, times, ...); kept whole in the log's metadata under "machine_nb".

    Returns:
        The inspect_ai.log.EvalLog (not written).

    Raises:
        ValueError: two rows are the same sample and epoch (their sample_id and epoch, or case
            and trial), naming both rows: Inspect's log would keep only one of them.
    """
    require_inspect("write_inspect_log")
    from inspect_ai.log import (EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalPlan, EvalPlanStep, EvalResults,
                                EvalSample, EvalScore, EvalSpec, EvalStats)
    from inspect_ai.model import ChatMessageAssistant, GenerateConfig, ModelOutput
    from inspect_ai.scorer import CORRECT, INCORRECT, Score

    summary = _plain(dict(summary))
    probe = "checkpoint_output" in (records[0] if records else {}) or "bled" in summary
    model_name = f"{PROVIDER}/{summary.get('model') or 'unknown'}"
    params = summary.get("parameters") or {}
    cases = bool(records) and all(r.get("case") is not None and r.get("trial") is not None for r in records)
    plain = [_plain(raw) for raw in records]
    numbers = [int(r["row"]) if r.get("row") is not None else i for i, r in enumerate(plain)]
    if len(set(numbers)) != len(numbers):  # rows of several results joined: numbered by position instead
        numbers = list(range(len(plain)))
    keys = []
    for r, row in zip(plain, numbers):
        sid, epoch = (int(r["case"]) + 1, int(r["trial"]) + 1) if cases else (row + 1, 1)
        if r.get("sample_id") is not None:  # read from an Inspect log: keep its id and epoch
            sid, epoch = r["sample_id"], int(r.get("epoch") or 1)
        keys.append((sid, epoch))
    first: dict = {}
    for i, (sid, epoch) in enumerate(keys):
        # Inspect's writer keeps one sample per id (1 and "1" alike) and epoch: refuse, not drop one
        key = (str(sid), epoch)
        if key in first:
            raise ValueError(f"sample {sid} epoch {epoch} is on rows {first[key]} and {i}: an Inspect log holds "
                             "each sample and epoch once; write the results apart, or give each row its own "
                             "sample_id")
        first[key] = i
    samples, total_in, total_out = [], 0, 0
    for r, row, (sid, epoch) in zip(plain, numbers, keys):
        text_in = _chat_messages(r.get("messages"), r.get("prompt") or r.get("input") or "")
        output = r.get("checkpoint_output") if probe else r.get("output")
        stop = _STOP_TO_INSPECT.get(r.get("stop_reason") or "", "stop" if r.get("stop_reason") is None else "unknown")
        model_output = ModelOutput.from_content(model_name, str(output or ""), stop_reason=stop)
        usage = _usage(r.get("prompt_tokens"), r.get("output_tokens"))
        model_output.usage = usage
        total_in, total_out = total_in + usage.input_tokens, total_out + usage.output_tokens
        meta = {k: r[k] for k in ("row", "match", "format", "format_ok", "latency_s", "stop_reason", "error", "case",
                                  "trial", "line", "input", "baseline_output", "bled") if k in r}
        meta["row"] = row
        if probe:
            bled = r.get("bled")
            scores = {} if bled is None else {PROBE_SCORE: Score(
                value=1 if bled else 0, answer=str(output or ""),
                explanation="the checkpoint's reply has the format and the base model's has not" if bled else
                "no bleed", metadata={"format": summary.get("format")})}
        else:
            correct = bool(r.get("correct"))
            scores = {SCORE_NAME: Score(
                value=CORRECT if correct else INCORRECT, answer=str(output or ""),
                explanation=(f"{r.get('match')} match against {r.get('expected')!r}" if r.get("match") else None),
                metadata={"match": r.get("match"), "expected": r.get("expected"), "format_ok": r.get("format_ok")})}
        target = r.get("expected")
        samples.append(EvalSample(
            id=sid, epoch=epoch, input=text_in, target="" if target is None else (target if isinstance(target, list) else str(target)),
            messages=[*text_in, ChatMessageAssistant(content=str(output or ""), model=model_name)],
            output=model_output, scores=scores, metadata=meta, model_usage={model_name: usage},
            total_time=r.get("latency_s"), working_time=r.get("latency_s")))
    n = len(samples)
    if probe:
        bled = [s.scores[PROBE_SCORE].value for s in samples if PROBE_SCORE in (s.scores or {})]
        metrics = {"mean": EvalMetric(name="mean", value=(sum(bled) / len(bled)) if bled else 0.0)}
        scorer = PROBE_SCORE
    else:
        acc = (sum(bool(_plain(r.get("correct"))) for r in records) / n) if n else 0.0
        stderr = math.sqrt(acc * (1 - acc) / (n - 1)) if n > 1 else 0.0
        metrics = {"accuracy": EvalMetric(name="accuracy", value=acc), "stderr": EvalMetric(name="stderr", value=stderr)}
        scorer = SCORE_NAME
    data = summary.get("data") or {}
    started = summary.get("started_at") or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    finished = summary.get("finished_at") or started
    epochs = max((s.epoch for s in samples), default=1)
    spec = EvalSpec(
        created=started, task=str(summary.get("name") or "results"), task_attribs={},
        dataset=EvalDataset(name=Path(data["path"]).stem if data.get("path") else None, location=data.get("path"),
                            samples=len({s.id for s in samples}), sample_ids=list(dict.fromkeys(s.id for s in samples))),
        model=model_name,
        model_args={k: summary.get(k) for k in ("checkpoint", "engine", "renderer") if summary.get(k) is not None},
        model_generate_config=GenerateConfig(max_tokens=params.get("max_tokens"), temperature=params.get("temperature"),
                                             seed=params.get("seed")),
        config=EvalConfig(epochs=epochs),
        packages={"machine_nb": _version()},
        metadata={"machine_nb": summary})
    return EvalLog(
        version=2, status="success", eval=spec,
        plan=EvalPlan(name="plan", steps=[EvalPlanStep(solver="generate", params={})]),
        results=EvalResults(total_samples=n, completed_samples=n,
                            scores=[EvalScore(name=scorer, scorer=scorer, scored_samples=n, metrics=metrics)]),
        stats=EvalStats(started_at=started, completed_at=finished,
                        model_usage={model_name: _usage(total_in, total_out)}),
        samples=samples)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("machine_nb")
    except PackageNotFoundError:
        return "unknown"


def write_log(log: Any, path: str | os.PathLike) -> str:
    """Write an EvalLog with inspect_ai's log API, atomically (a temporary file, then a rename).

    Args:
        log: the EvalLog.
        path: the `.eval` (or `.json`) file; its folder is created.

    Returns:
        The path written.
    """
    from inspect_ai.log import write_eval_log

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix or ".eval", dir=path.parent)
    os.close(fd)
    try:
        write_eval_log(log, tmp, format="json" if path.suffix.lower() == ".json" else "eval")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return os.fspath(path)


# --------------------------------------------------------------------------- checking a .eval archive

_CHUNK = 1 << 20
_STORED, _DEFLATED, _ZSTD = 0, 8, 93  # the zip compression methods Inspect reads


def _expanded(fh: Any, info: zipfile.ZipInfo, limit: int) -> Iterator[bytes]:
    """A member's decompressed bytes in chunks, stopping once more than `limit` have come."""
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise ValueError("its local header is missing (a damaged archive)")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    fh.seek(info.header_offset + 30 + name_len + extra_len)
    left = info.compress_size

    def raw() -> Iterator[bytes]:
        nonlocal left
        while left > 0:
            block = fh.read(min(_CHUNK, left))
            if not block:
                raise ValueError("its data is cut short (a truncated archive)")
            left -= len(block)
            yield block

    done = 0
    if info.compress_type == _STORED:
        chunks: Iterator[bytes] = raw()
    elif info.compress_type == _DEFLATED:
        def inflate() -> Iterator[bytes]:
            d = zlib.decompressobj(-15)
            for block in raw():
                while block:
                    yield d.decompress(block, _CHUNK)
                    block = d.unconsumed_tail
        chunks = inflate()
    elif info.compress_type == _ZSTD:
        import zstandard  # inspect_ai's own dependency, for its zstd members

        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(b"".join(raw())))
        chunks = iter(lambda: reader.read(_CHUNK), b"")
    else:
        raise ValueError(f"it is compressed with zip method {info.compress_type}, which Inspect does not read")
    for chunk in chunks:
        done += len(chunk)
        yield chunk
        if done > limit:
            return


def check_archive(path: str | os.PathLike) -> None:
    """Refuse a `.eval` file Inspect should not be given: not a complete zip, a member path that
    leaves the archive (`../`, absolute), a member over MAX_MEMBER_BYTES or the whole over
    MAX_LOG_BYTES decompressed, a member that decompresses past its declared size (a zip bomb) or
    whose bytes do not match its checksum. Each member is decompressed once, in bounded chunks.

    Args:
        path: the `.eval` file.

    Raises:
        MachineFormatError: naming the file and, where one is at fault, the member.
    """
    from ..core.jsonl import open_regular

    fh = open_regular(path)  # a folder, a FIFO or a device is refused without waiting on it
    try:
        archive = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        fh.close()
        raise MachineFormatError(path, f"not an Inspect eval log: not a complete zip archive ({exc}); a truncated "
                                       "or damaged copy, or not a .eval file: copy the log again") from None
    with archive, fh:
        total = 0
        for info in archive.infolist():
            name = info.filename
            if name.startswith(("/", "\\")) or ".." in PurePosixPath(name.replace("\\", "/")).parts:
                raise MachineFormatError(path, "a member's path leaves the archive; not a log Inspect wrote",
                                         field=name)
            if info.file_size > MAX_MEMBER_BYTES:
                raise MachineFormatError(path, f"the member holds {info.file_size:,} bytes decompressed, more than "
                                               f"inspect_logs.MAX_MEMBER_BYTES ({MAX_MEMBER_BYTES:,}); raise it to "
                                               "read a log you trust", field=name)
            total += info.file_size
            if total > MAX_LOG_BYTES:
                raise MachineFormatError(path, f"the log holds more than inspect_logs.MAX_LOG_BYTES "
                                               f"({MAX_LOG_BYTES:,}) bytes decompressed; raise it to read a log you trust")
            size, crc = 0, 0
            try:
                for chunk in _expanded(fh, info, info.file_size):
                    size, crc = size + len(chunk), zlib.crc32(chunk, crc)
            except Exception as exc:  # zlib.error, zstandard.ZstdError, a cut-short member
                raise MachineFormatError(path, f"a damaged member: {exc}", field=name) from None
            if size > info.file_size:
                raise MachineFormatError(path, f"the member decompresses to more than the {info.file_size:,} bytes "
                                               "it declares (a zip bomb, or a damaged archive)", field=name)
            if size != info.file_size or crc != info.CRC:
                raise MachineFormatError(path, "a damaged member: its bytes do not match its size and checksum",
                                         field=name)


def log_run(path: str | os.PathLike) -> dict | None:
    """The run a log written by this toolkit records (build_log's summary: model, checkpoint, ...).

    Args:
        path: an Inspect log file.

    Returns:
        The summary dict, or None for any other file (a foreign log, not a log, unreadable).
    """
    from inspect_ai.log import read_eval_log

    try:
        if is_inspect_log(path):
            check_archive(path)
        header = read_eval_log(os.fspath(path), header_only=True)
    except Exception:
        return None
    meta = header.eval.metadata if isinstance(header.eval.metadata, dict) else {}
    return meta["machine_nb"] if isinstance(meta.get("machine_nb"), dict) else None


# --------------------------------------------------------------------------- reading

def _target_text(target: Any) -> Any:
    if isinstance(target, list):
        return target[0] if len(target) == 1 else list(target)
    return target


def _input_messages(value: Any) -> list[dict]:
    """A sample's input as our chat messages ({"role", "content"}; an assistant's tool calls as
    OpenAI's "tool_calls", their arguments as compact JSON, as the model API renders them; a tool
    result's "tool_call_id" and "name")."""
    import json

    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out = []
    for m in value:
        message = {"role": m.role, "content": m.text if hasattr(m, "text") else content_text(m.content)}
        calls = getattr(m, "tool_calls", None) if m.role == "assistant" else None
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function, "arguments": json.dumps(c.arguments, separators=(",", ":"))}} for c in calls]
        if m.role == "tool":
            for key, attr in (("tool_call_id", "tool_call_id"), ("name", "function")):
                if getattr(m, attr, None) is not None:
                    message[key] = getattr(m, attr)
        out.append(message)
    return out


def _read_error(path: str | os.PathLike, exc: Exception) -> MachineFormatError:
    """inspect_ai's error on reading a file, as one naming the file and, for a field its log format
    refuses, the field (and in a `.eval` log the member holding it)."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or not exc.errors():
        return MachineFormatError(path, f"not an Inspect eval log: {type(exc).__name__}: {exc}")
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    member = _member_at_fault(path, exc.title) if is_inspect_log(path) else None
    return MachineFormatError(path, f"{first['msg']} (Inspect's log format refuses it: a damaged log, or one "
                                    "this inspect_ai's version does not read)",
                              field=f"{member}: {field}" if member else field)


def _member_at_fault(path: str | os.PathLike, model: str) -> str | None:
    """The member of a `.eval` log that Inspect's `model` (EvalLog or EvalSample) refuses, if one does."""
    import json

    from inspect_ai.log import EvalSample
    from pydantic import ValidationError

    with zipfile.ZipFile(path) as archive, open(path, "rb") as fh:
        names = archive.namelist()
        if model == "EvalLog":
            return next((n for n in ("header.json", "_journal/start.json") if n in names), None)
        if model != "EvalSample":
            return None
        for info in archive.infolist():
            if info.filename.startswith("samples/") and info.filename.endswith(".json"):
                try:
                    EvalSample.model_validate(json.loads(b"".join(_expanded(fh, info, info.file_size))))
                except (ValidationError, ValueError):
                    return info.filename
    return None


def _grade(value: Any, to_float: Any) -> float | None:
    """A score's value as a number from 0 to 1 by Inspect's value_to_float (C, yes, True: 1; P: 0.5;
    I, N, no, False: 0; numbers as they are), or None for no score (None, NaN).

    Raises:
        ValueError: a value that is no grade: text value_to_float does not know (it would give 0 with
            only a log line), a list, or a number outside 0 to 1 (right or wrong cannot be read from it).
    """
    from inspect_ai.scorer import INCORRECT, NOANSWER

    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        number = float(value)
    elif isinstance(value, str):
        number = float(to_float(value))
        if number == 0.0 and value not in (INCORRECT, NOANSWER) and value.strip().lower() not in ("no", "false"):
            try:
                known = float(value) == 0.0
            except ValueError:
                known = False
            if not known:
                raise ValueError(f"the score {value!r} is not a grade Inspect reads as a number (C, I, P, N, "
                                 "yes, no, true, false or a number)")
    else:
        raise ValueError(f"the score {value!r} is a {type(value).__name__}, not one grade")
    if math.isnan(number):
        return None
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"the score {number:g} is outside 0 to 1, so right or wrong cannot be read from it")
    return number


def _mode(score: Any, meta: dict) -> str | None:
    """A foreign sample's match mode where its score or sample metadata names one (eval_task's do)."""
    for where in ((score.metadata if score is not None else None) or {}, meta):
        if isinstance(where.get("match"), str):
            return where["match"]
    return None


def read_log(source: Any) -> tuple[list[dict], dict]:
    """Any Inspect log (ours or another's) as per-row records and a summary, evaluate()'s shape.

    Rows are ordered by dataset order then epoch (a log written here keeps its rows' order).
    A row's prompt_tokens and output_tokens are the evaluated model's (a grader model's usage in
    the same sample is left out; a sample that does not name the evaluated model sums them all).
    Every row is scored by the log's first score (its results' first scorer, or the key it names
    in a scorer with several values; without results, the first scorer a sample has): `score` is
    its value as a number from 0 to 1 (Inspect's value_to_float: C, yes, True 1; P 0.5; I, N, no,
    False 0) and `correct` whether that is full marks. A sample without that score (it errored, or
    its score is None or NaN) has score None and counts as wrong, as evaluate() counts a failed
    request, said in a warning. A log from a newer Inspect log format is read where this
    inspect_ai reads it, with a warning.

    Args:
        source: the `.eval` or `.json` log file, or an inspect_ai EvalLog in memory.

    Returns:
        (records with RESULT_COLUMNS + SAMPLE_COLUMNS, plus "messages", and for our logs their
        "case", "trial", "format", "line" where they had them (a probe's log: PROBE_COLUMNS +
        SAMPLE_COLUMNS + "messages", and no accuracy; "error" redacted); summary with name, model,
        checkpoint, engine, renderer, parameters, data, n, correct, accuracy, format_rate,
        errors, prompt_tokens, output_tokens, started_at, finished_at, and "inspect": the
        task, eval and run ids, status, scorer and its metrics).

    Raises:
        MachineFormatError: the file is missing, not a regular file (a FIFO, a device) or not an
            Inspect log (check_archive's refusals; a field Inspect's log format refuses, named),
            holds no samples (saying why: not logged, none run, or the eval's error), holds a
            sample twice, or a score that is no grade (naming the sample and scorer).
    """
    require_inspect("load_results")
    from inspect_ai.log import EvalLog, read_eval_log
    from inspect_ai.scorer import value_to_float

    if isinstance(source, (str, os.PathLike)):
        path = source
        if not os.path.exists(path):
            raise MachineFormatError(path, "file not found")
        if is_inspect_log(path):
            check_archive(path)
        else:
            from ..core.jsonl import open_regular

            open_regular(path).close()  # a FIFO or a device is refused, not waited on
        try:
            log = read_eval_log(os.fspath(path))
        except Exception as exc:  # inspect_ai raises ValueError / zipfile / pydantic errors on a bad file
            raise _read_error(path, exc) from None
    else:
        log, path = source, source.location or None
    where = os.fspath(path) if path else f"the Inspect log of {log.eval.task}"
    newest = EvalLog.model_fields["version"].default
    if isinstance(log.version, int) and isinstance(newest, int) and log.version > newest:
        warnings.warn(f"{where}: written in Inspect's log format version {log.version}, newer than the {newest} "
                      "this inspect_ai writes; fields it does not know are left out (upgrade inspect_ai to read "
                      "them)", stacklevel=user_stacklevel())
    if not log.samples:
        if log.error is not None:
            why = redacted(f"the eval stopped with an error: {log.error.message}")  # an SDK's text may quote a key
        elif log.eval.config.log_samples is False or (log.results is not None and log.results.total_samples):
            why = "run the eval with samples logged (log_samples=True)"
        else:
            why = "the eval ran no samples (an empty dataset, or a limit or sample_id that left none)"
        raise MachineFormatError(path, f"the Inspect log holds no samples (status {log.status!r}); {why}",
                                 field="samples")
    meta_eval = log.eval.metadata if isinstance(log.eval.metadata, dict) else {}
    ours = meta_eval.get("machine_nb") if isinstance(meta_eval.get("machine_nb"), dict) else None  # build_log's
    run = meta_eval.get("machine_nb_run") if isinstance(meta_eval.get("machine_nb_run"), dict) else {}  # inspect_eval's
    order = [s.name for s in (log.results.scores if log.results and log.results.scores else [])]
    if order:  # a scorer with several values is listed by key, with the scorer's own name beside it
        first = log.results.scores[0]
        scorer_key, value_key = first.scorer or first.name, first.name
    else:
        scorer_key = next((name for s in log.samples for name in (s.scores or {})), None)
        value_key = None
    label = order[0] if order else scorer_key
    ids = list(log.eval.dataset.sample_ids or []) if log.eval.dataset else []
    position = {str(x): i for i, x in enumerate(ids)}
    to_float = value_to_float()

    def key(s: Any) -> tuple:
        meta = s.metadata or {}
        if ours is not None and isinstance(meta.get("row"), int):
            return (0, meta["row"], 0, "")
        return (1, position.get(str(s.id), len(position)), s.epoch, str(s.id))

    samples = sorted(log.samples, key=key)
    seen: dict[tuple[str, int], int] = {}
    for s in samples:
        seen[(str(s.id), s.epoch)] = seen.get((str(s.id), s.epoch), 0) + 1
    twice = next(((sid, epoch, k) for (sid, epoch), k in seen.items() if k > 1), None)
    if twice:
        raise MachineFormatError(path, f"sample {twice[0]} epoch {twice[1]} appears {twice[2]} times; a log holds "
                                       "each sample and epoch once", field="samples")
    records = []
    for i, s in enumerate(samples):
        meta = dict(s.metadata or {})
        scores = s.scores or {}
        score = scores.get(scorer_key, scores.get(value_key) if value_key else None)
        value = None if score is None else score.value
        try:
            if isinstance(value, dict):
                if value_key in value or len(value) == 1:
                    value = value[value_key] if value_key in value else next(iter(value.values()))
                else:
                    raise ValueError(f"the score has several values ({', '.join(map(str, value))}) and the log "
                                     "names none of them first")
            number = _grade(value, to_float)
        except ValueError as exc:
            raise MachineFormatError(path, f"{exc}; fix the log, or read it with inspect_ai.log.read_eval_log",
                                     field=f"samples[id {s.id}, epoch {s.epoch}].scores.{scorer_key}") from None
        by_model = s.model_usage or {}
        # the evaluated model's tokens; a model-graded scorer's or another role's are not the row's
        usage = [by_model[log.eval.model]] if log.eval.model in by_model else list(by_model.values())
        output = s.output.completion if s.output is not None else ""
        stop = s.output.stop_reason if s.output is not None and s.output.choices else None
        messages = _input_messages(s.input)
        error = (s.error.message if s.error is not None else None) or (meta.get("error") if ours is not None else None)
        rec = {
            "row": i, "prompt": prompt_text(messages), "expected": _target_text(s.target),
            "match": meta.get("match") if ours is not None else _mode(score, meta),
            "output": output, "correct": number is not None and number >= 1.0,
            "format_ok": meta.get("format_ok") if ours is not None else
            ((score.metadata or {}).get("format_ok") if score is not None else None),  # rows_scorer's
            "prompt_tokens": sum(int(u.input_tokens or 0) for u in usage),
            "output_tokens": sum(int(u.output_tokens or 0) for u in usage),
            "latency_s": meta.get("latency_s") if ours is not None else s.total_time,
            "stop_reason": meta.get("stop_reason") if ours is not None else _STOP_FROM_INSPECT.get(stop or "", stop),
            "error": redacted(error) if error else None,  # a sample's error text may quote a key
            "sample_id": s.id, "epoch": s.epoch, "score": number, "scorer": label, "messages": messages,
        }
        if ours is not None:
            for k in ("case", "trial", "input", "format", "line"):
                if k in meta:
                    rec[k] = meta[k]
            if "baseline_output" in meta:  # a probe's row: PROBE_COLUMNS, no answer to be right about
                rec = {"prompt": rec["prompt"], "baseline_output": meta["baseline_output"], "checkpoint_output": output,
                       "bled": meta.get("bled"), "error": rec["error"],
                       **{k: rec[k] for k in ("sample_id", "epoch", "score", "scorer", "messages")}}
        records.append(rec)
    n = len(records)
    probe = bool(records) and "baseline_output" in records[0]
    unscored = sum(1 for r in records if r["score"] is None)
    if unscored and not probe:  # a probe's row without a format has no score by design
        what = f"{label!r} score" if label else "score"
        warnings.warn(f"{where}: {unscored} of {n} sample(s) have no {what} (they errored, or were not scored) "
                      "and count as wrong", stacklevel=user_stacklevel())
    correct = None if probe else sum(r["correct"] for r in records)
    with_format = [bool(r["format_ok"]) for r in records if r.get("format_ok") is not None]
    cfg = log.eval.model_generate_config
    args = log.eval.model_args or {}
    metrics = {}
    if log.results and log.results.scores:
        metrics = {m.name: m.value for m in log.results.scores[0].metrics.values()}
    base = dict(ours) if ours is not None else {k: v for k, v in run.items()
                                                 if k in ("model", "checkpoint", "engine", "renderer", "parameters")}
    summary = {
        **base,
        "name": base.get("name") or log.eval.task, "model": base.get("model") or log.eval.model,
        "checkpoint": base.get("checkpoint", args.get("checkpoint")), "engine": base.get("engine", args.get("engine")),
        "renderer": base.get("renderer", args.get("renderer")),
        "parameters": base.get("parameters") or {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                                                 "seed": cfg.seed},
        "data": base.get("data") or {"path": log.eval.dataset.location if log.eval.dataset else None, "sha256": None},
        "n": n, "correct": correct, "accuracy": correct / n if n and correct is not None else None,
        "format_rate": (sum(with_format) / len(with_format)) if with_format else None,
        "errors": sum(1 for r in records if r["error"]),
        "prompt_tokens": sum(r.get("prompt_tokens") or 0 for r in records),
        "output_tokens": sum(r.get("output_tokens") or 0 for r in records),
        "started_at": base.get("started_at") or (log.stats.started_at if log.stats else None) or log.eval.created,
        "finished_at": base.get("finished_at") or (log.stats.completed_at if log.stats else None),
        "inspect": {"task": log.eval.task, "eval_id": log.eval.eval_id, "run_id": log.eval.run_id,
                    "status": log.status, "model": log.eval.model, "scorer": label,
                    "metrics": metrics, "location": None if path is None else os.fspath(path)},
    }
    return records, summary


__all__ = ["NETWORK_HOOKS", "offline_inspect", "inspect_messages", "INSTALL_HINT", "SCORE_NAME", "PROBE_SCORE", "PROVIDER", "SAMPLE_COLUMNS", "require_inspect",
           "MAX_MEMBER_BYTES", "MAX_LOG_BYTES", "is_inspect_log", "build_log", "write_log", "check_archive", "log_run",
           "read_log"]
