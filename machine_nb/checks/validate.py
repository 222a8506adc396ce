"""The gate before a single paid step: check a chat JSONL training or eval file row by row.

Shape (a `messages` list, known roles, content, tool calls matched by results), renderer readiness
(each row rendered with the model's tinker-cookbook renderer: failures, rows over max_length, rows
with nothing to train on, Machine's token-length histogram), train/eval overlap and secrets. Every
problem is a finding with its line; nothing stops at the first one. The file is streamed, so a
100,000-row file costs little more memory than its longest line. Token counting lives in tokens.py.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import numbers
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.chat import ROLES, content_text, row_findings, text_key
from ..core.jsonl import dumps_line, iter_jsonl, not_regular, open_regular
from ..core.redact import SECRET_PATTERNS, connection_passwords, mask, redacted
from .tokens import estimate_trained
from ..evaluation.scoring import MATCH_MODES

if TYPE_CHECKING:
    import pandas as pd

BUCKETS = (512, 2048, 8192, 16384, 32768, 65536)  # Machine's token-length buckets (its dataset validator's)
DEFAULT_MAX_LENGTH = 32768  # the cookbook's usual SFT max_length; longer rows are truncated by it
MAX_FINDINGS_PER_CODE = 200  # beyond this a code is summarised, so a broken 100k-row file stays readable
FINDING_COLUMNS = ["line", "severity", "code", "message"]
"""findings' columns: line (1-based; <NA> for the whole file), severity (error|warning|info),
code (a stable short name, e.g. render_failed), message (what and where, secrets redacted)."""


def bucket_label(tokens: int) -> str:
    """Machine's token-length histogram bucket for a count (the buckets of its dataset validator).

    Args:
        tokens: a row's tokens.

    Returns:
        "<=512" … "<=65536", then ">65536".
    """
    for b in BUCKETS:
        if tokens <= b:
            return f"<={b}"
    return f">{BUCKETS[-1]}"


def empty_histogram() -> dict[str, int]:
    """A histogram with every bucket at zero.

    Returns:
        {bucket label: 0} for each of BUCKETS and the one above them.
    """
    return {**{f"<={b}": 0 for b in BUCKETS}, f">{BUCKETS[-1]}": 0}


def _prompt_text(content: Any) -> str:
    """A message's content as the overlap checks compare it: its text, normalised, and each
    image or audio part as its JSON, so the same question about another picture is another prompt."""
    text = text_key(content_text(content, sep=" "))
    if not isinstance(content, list):
        return text
    media = [json.dumps(part, sort_keys=True, ensure_ascii=False, default=str) for part in content
             if isinstance(part, Mapping) and part.get("type") in ("image", "audio")]
    return "\n".join([text, *media]) if media else text


def prompt_of(messages: list[Any]) -> list[Any]:
    """The prompt of a row.

    Args:
        messages: the row's messages.

    Returns:
        Its messages up to (not including) the trailing assistant messages.
    """
    end = len(messages)
    while end and isinstance(messages[end - 1], Mapping) and messages[end - 1].get("role") == "assistant":
        end -= 1
    return messages[:end]


def prompt_keys(messages: list[Any]) -> tuple[bytes, bytes | None]:
    """Digests for overlap checks: text compared with Unicode spelling, invisible characters, case
    and whitespace runs set aside; image and audio parts compared whole.

    Args:
        messages: the row's messages.

    Returns:
        (digest of the whole prompt, digest of its last user text; None without one).
    """
    prompt = [m for m in prompt_of(messages) if isinstance(m, Mapping)]
    # "surrogatepass": a text cut inside a character (validate's bad_text) still has a digest
    full = hashlib.blake2b(dumps_line([[m.get("role"), _prompt_text(m.get("content"))] for m in prompt])
                           .encode("utf-8", "surrogatepass"), digest_size=12).digest()
    users = [m for m in prompt if m.get("role") == "user"]
    last = hashlib.blake2b(_prompt_text(users[-1].get("content")).encode("utf-8", "surrogatepass"),
                           digest_size=12).digest() if users else None
    return full, last


def shape_findings(row: Any, kind: str) -> list[tuple[str, str, str]]:
    """Shape problems of one row as (severity, code, message); pure, no renderer.

    Args:
        row: one row as read from JSONL.
        kind: "train" (the last message must be the assistant's, the target) or "eval" (the
            last message is the user's and the row needs `expected` and a known `match`).

    Returns:
        Every problem chat.row_findings finds (the rules sft, evaluate and the previewer apply
        too), without the field each is in.
    """
    return [(f.severity, f.code, f.message) for f in row_findings(row, kind)]


def empty_reply_findings(row: Any) -> list[tuple[str, str, str]]:
    """A training row whose target (its last message, the assistant's) says nothing.

    A reply that is empty or only whitespace, with no tool call, trains the model to answer with
    nothing (an empty `/good --as ""` rewrite writes such a row).

    Args:
        row: one training row as read.

    Returns:
        [("error", "empty_reply", message)] for such a row, else [].
    """
    messages = row.get("messages") if isinstance(row, Mapping) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], Mapping):
        return []
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls") or last.get("toolInput") is not None:
        return []
    if content_text(last.get("content")).strip():
        return []
    return [("error", "empty_reply", f"the assistant reply (message {len(messages)}, the target) is empty: training "
                                     "on it teaches the model to answer with nothing; give it the answer to learn or "
                                     "drop the row")]


# `\/` not preceded by an escaped backslash: JSON's optional escape of "/", which Python's
# unicode_escape codec does not know
_ESCAPED_SLASH = re.compile(r"(?<!\\)((?:\\\\)*)\\/")


def unescaped(raw: str) -> str:
    """A JSON line's text with its strings' escapes decoded, as the secret scan reads it.

    A key written `sk-\\u0061…` or wholly as `\\uXXXX` escapes is the same key, and in the raw text
    `\\n` puts the letter n before a key on a new line, where `\\b` finds no word start. The
    structure (quotes, commas) stays, so no match runs from one string into the next. A line with
    no backslash is returned as it is; the decoding runs in the codecs, not per character here.

    Args:
        raw: a row's JSON text (or, for a row JSON cannot write, its repr).

    Returns:
        The text with `\\uXXXX` (surrogate pairs joined), `\\/`, `\\n`, `\\"`, `\\\\` and the other
        escapes decoded; `raw` itself when it holds none, or when it is not escaped text.
    """
    if "\\" not in raw:
        return raw
    text = _ESCAPED_SLASH.sub(r"\1/", raw) if "\\/" in raw else raw
    try:
        text = text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:  # not JSON's escapes (a repr cut short): scan it as written
        return raw
    if "\\ud" in raw or "\\uD" in raw:  # a character beyond U+FFFF, written as two escapes
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def secret_findings(raw: str, extra: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """Secrets in a raw line, each reported masked (redact.mask), severity error.

    Args:
        raw: the row's JSON text; its strings are read decoded (`unescaped`), so a key written
            with JSON escapes is found, once, as a plain one is.
        extra: literal secrets to look for too (default none).

    Returns:
        (severity, code "secret", message) per secret found (a key found by its shape is not
        reported again as a literal secret); a password in a URL or a DSN/JDBC `password=`
        setting is a warning (code "password": it may be a made-up example).
    """
    out, found = [], []
    text = unescaped(raw)
    for name, pattern in SECRET_PATTERNS:
        for m in pattern.finditer(text):
            shown = m.group(0) if name == "private key" else mask(m.group(0))
            out.append(("error", "secret", f"{name} in the row: {shown}; remove it before training"))
            found.append(m.group(0))
    for value in extra:
        # a key already reported by its shape (a tml-… $TINKER_API_KEY) is one secret, one finding
        if value and value in text and not any(value in key for key in found):
            out.append(("error", "secret", f"the value of $TINKER_API_KEY is in the row: {mask(value)}"))
    if "=" in text or "://" in text:
        for value in connection_passwords(text):
            out.append(("warning", "password", f"a password in a connection string or URL in the row: {mask(value)}; "
                                               "remove it (or write a placeholder) unless it is a made-up example"))
    return out


@dataclass
class ValidationResult:
    """What validate found: `findings` (DataFrame line, severity, code, message), `summary`, `ok`.

    summary: path, model, kind (train|eval), rows, errors, warnings, infos, tokens (for eval files:
    generation-prompt tokens), trained_tokens (train files; without the renderer, estimated from
    the messages sft trains, as count_tokens does), max_tokens, exact (real renderer counts),
    histogram (bucket -> rows, rows that rendered), max_length.
    ok: no error findings.
    """

    path: Path | None  # None for preflight's in-memory rows
    model: str | None
    findings: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    ok: bool = True

    def errors(self) -> pd.DataFrame:
        """The error findings only.

        Returns:
            The rows of `findings` whose severity is "error".
        """
        return self.findings[self.findings["severity"] == "error"]

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (e.g. for `machine-nb validate --json`).

        Returns:
            {path (a string, or None for in-memory rows), model, ok, summary, findings (records;
            line None for the whole file)}.
        """
        findings = [{**r, "line": None if _isna(r["line"]) else int(r["line"])}
                    for r in self.findings.to_dict("records")]
        return {"path": None if self.path is None else str(self.path), "model": self.model, "ok": self.ok,
                "summary": dict(self.summary), "findings": findings}

    def __repr__(self) -> str:
        s = self.summary
        return (f"ValidationResult({str(self.path or 'in-memory rows')!r}, model={self.model!r}, ok={self.ok}, rows={s.get('rows')}, "
                f"errors={s.get('errors')}, warnings={s.get('warnings')}, tokens={s.get('tokens')})")

    def _repr_html_(self) -> str:
        from ..core.theme import GREEN, RED, escape, no_math, text_colour  # the widgets' palette (light and dark themes)

        s = self.summary
        colour = text_colour(GREEN if self.ok else RED)
        verdict = "ready" if self.ok else f"{s['errors']} error(s)"
        hist = " · ".join(f"{k}: {v}" for k, v in s["histogram"].items() if v)
        kind = "exact" if s.get("exact") else "estimated"
        head = (f"<div class='machine-nb-validate'><b style='color:{colour}'>{escape(verdict)}</b> "
                f"<code>{escape(str(self.path or 'in-memory rows'))}</code> ({s['kind']}, {escape(str(self.model))}): "
                f"{s['rows']} rows · {s['tokens']:,} tokens ({kind})"
                + (f" · {s['trained_tokens']:,} trained" if s["kind"] == "train" else "")
                + f" · {s['warnings']} warning(s)<br><small>tokens per row: {escape(hist) or '—'}</small>")
        if len(self.findings):
            rows = "".join(
                f"<tr><td>{'' if _isna(r.line) else int(r.line)}</td><td>{escape(r.severity)}</td>"
                f"<td>{escape(r.code)}</td><td style='text-align:left'>{escape(r.message)}</td></tr>"
                for r in self.findings.head(50).itertuples())
            more = f"<br><small>… {len(self.findings) - 50} more in .findings</small>" if len(self.findings) > 50 else ""
            head += ("<table><thead><tr><th>line</th><th>severity</th><th>code</th><th>message</th></tr></thead>"
                     f"<tbody>{rows}</tbody></table>{more}")
        return no_math(head + "</div>")


def _isna(v: Any) -> bool:
    import pandas as pd

    return v is None or v is pd.NA or (isinstance(v, float) and v != v)


def _not_a_file(path: Path) -> tuple[str, str] | None:
    """(code, message) when `path` cannot be read as a JSONL file, else None. Only stat is asked:
    opening a named pipe would wait for a writer."""
    try:
        what = not_regular(os.stat(path).st_mode)
    except FileNotFoundError:
        return "no_file", f"{path} does not exist"
    except OSError as exc:
        return "no_file", f"{path} cannot be read: {exc.strerror}"
    if what is None:
        return None
    return "not_a_file", f"{path} is {what}, not a regular file: give the path of a JSONL file"


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))  # UTF-32 first: its little-endian mark starts as UTF-16's does


def _wide_encoding(path: Path) -> tuple[str, str] | None:
    """(code, message) when a regular file starts with a UTF-16 or UTF-32 byte order mark (as
    Windows PowerShell's `>` writes text), else None: no line of it reads as UTF-8 JSON."""
    with open_regular(path) as fh:
        head = fh.read(4)
    name = next((name for bom, name in _WIDE_BOMS if head.startswith(bom)), None)
    if name is None:
        return None
    return "bad_encoding", (f"{path} is {name} text (it starts with a {name} byte order mark, as Windows "
                            "PowerShell's `>` writes files): JSONL is UTF-8; save it as UTF-8")


def _detect_kind(path: Path) -> str:
    """"eval" when the first readable object row has "expected", else "train"."""
    for _, row in iter_jsonl(path, on_error="skip", skipped=[]):
        if isinstance(row, Mapping):
            return "eval" if "expected" in row else "train"
    return "train"


def _held_out_name(eval_data: Any, line: int | None = None) -> str:
    """How findings name the held-out data ("the eval file PATH", or "the eval rows given"), or
    one row of it ("line 3 of the eval file PATH", "row 3 of the eval rows given")."""
    if isinstance(eval_data, (str, os.PathLike)):
        return f"{'' if line is None else f'line {line} of '}the eval file {os.fspath(eval_data)}"
    return f"{'' if line is None else f'row {line} of '}the eval rows given"


def _load_prompt_keys(eval_data: Any) -> tuple[tuple[dict[bytes, int], dict[bytes, int]],
                                                 list[tuple[None, str, str, str]]]:
    """The held-out prompts' digests, each with the first line (or row) that has it, and a warning
    for each reason some may be missing (unreadable lines, no rows): a prompt that is not read is
    not checked for overlap."""
    from .tokens import iter_rows

    if not isinstance(eval_data, (str, os.PathLike)) and (isinstance(eval_data, (bytes, Mapping)) or not (
            hasattr(eval_data, "__iter__") or hasattr(eval_data, "columns"))):
        raise TypeError(f"eval_data takes a JSONL path or a list of eval rows (dicts with \"messages\"), not "
                        f"{type(eval_data).__name__}")
    full: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    rows, skipped = 0, []
    for line, row in iter_rows(eval_data, on_error="skip", skipped=skipped):
        rows += 1
        if isinstance(row, Mapping) and isinstance(row.get("messages"), list):
            f, u = prompt_keys(row["messages"])
            full.setdefault(f, line)
            if u is not None:
                last.setdefault(u, line)
    name, notes = _held_out_name(eval_data), []
    if skipped:
        first, more = skipped[0], "; …" if len(skipped) > 1 else ""
        notes.append((None, "warning", "eval_unreadable",
                      f"{len(skipped)} line(s) of {name} cannot be read (line {first.line}: "
                      f"{first.reason}{more}): their prompts are not checked for overlap"))
    if rows == 0:
        notes.append((None, "warning", "eval_unreadable", f"{name} has no rows: there is nothing to check overlap "
                                                          "against"))
    return (full, last), notes


def model_context(model: str | None) -> int | None:
    """The most tokens a model can hold, where known.

    Args:
        model: the model (None: none).

    Returns:
        A local model's block size (128 for local/arith-tiny); None for other models (Tinker's
        contexts are not listed offline).
    """
    if not model:
        return None
    from .. import engines
    from .render import base_model

    return engines.model_context(base_model(model))


def resolve_max_length(model: str | None, max_length: int | str | None = "auto") -> tuple[int | None, int | None]:
    """The length limit rows are held to (see validate's `max_length`).

    Args:
        model: the model (its context caps every limit).
        max_length: an integer (a numpy one too), "auto" (default: the context where known, else
            DEFAULT_MAX_LENGTH) or None (the context only).

    Returns:
        (the limit, the model's context), either None when there is none.

    Raises:
        TypeError / ValueError: a max_length that is not an integer of at least 1, "auto" or None.
    """
    if max_length is not None and not (isinstance(max_length, str) and max_length == "auto"):
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
            raise TypeError(f"max_length must be an integer, 'auto' or None, got {max_length!r}")
        max_length = int(max_length)  # a numpy integer (a limit computed from a frame) as Python's
    if isinstance(max_length, int) and max_length < 1:
        raise ValueError(f"max_length must be at least 1 (or None, or 'auto'), got {max_length}")
    context = model_context(model)
    if max_length == "auto":
        return (context if context is not None else DEFAULT_MAX_LENGTH), context
    if max_length is None:
        return context, context
    return (max_length if context is None else min(max_length, context)), context


# --------------------------------------------------------------------------- the steps
# validate and preflight are compositions of these: resolve the settings, prepare what every row
# is checked against, read the rows, find each row's problems and count its tokens, sum up.


@dataclass(frozen=True)
class ValidateSettings:
    """What one validation checks, resolved once from validate's or preflight's arguments.

    model: the model rows are rendered for (None: shape, overlap and secret checks only).
    kind: "train" or "eval" (what a row must look like).
    max_length: the token limit rows are held to (None: none); context: the model's context
    where known (a row over it is an error whatever max_length says).
    train_on_what: the cookbook's TrainOnWhat for trained-token counts (None: as sft chooses).
    eval_data: a held-out file (or held-out rows in memory) whose prompts must not be trained on
    (None: no overlap check).
    """

    model: str | None
    kind: str
    max_length: int | None
    context: int | None
    train_on_what: Any = None
    eval_data: Any = None


def resolve_settings(model: str | None, max_length: int | str | None = "auto", kind: str = "train",
                     train_on_what: Any = None, eval_data: Any = None) -> ValidateSettings:
    """validate's arguments, resolved.

    Args:
        model: the model (or None).
        max_length: an integer, "auto" or None (see resolve_max_length; default "auto").
        kind: "train" (default) or "eval".
        train_on_what: the cookbook's TrainOnWhat (default None).
        eval_data: the held-out file, or held-out rows in memory (default None).

    Returns:
        The ValidateSettings.

    Raises:
        TypeError / ValueError: a max_length that is not an integer of at least 1, "auto" or None.
    """
    limit, context = resolve_max_length(model, max_length)
    return ValidateSettings(model, kind, limit, context, train_on_what, eval_data)


@dataclass
class Prepared:
    """What every row is checked against, made once before reading.

    renderer: the model's tinker-cookbook renderer (None: no model, or none offline).
    eval_keys: ({whole-prompt digest: its first line}, {last-question digest: its first line}) of
    the held-out data (None: no check).
    extra_secrets: literal secrets to look for (the value of $TINKER_API_KEY).
    findings: the file-level findings preparing made (line None): no model, estimated counts,
    a missing held-out file, held-out lines that cannot be read or no held-out rows.
    """

    renderer: Any = None
    eval_keys: tuple[dict[bytes, int], dict[bytes, int]] | None = None
    extra_secrets: tuple[str, ...] = ()
    findings: list[tuple[None, str, str, str]] = field(default_factory=list)


def prepare(settings: ValidateSettings) -> Prepared:
    """The renderer, the held-out prompts and the secrets to look for.

    Args:
        settings: the resolved settings.

    Returns:
        The Prepared checks, with a finding for each thing that could not be prepared.

    Raises:
        ValueError: JSONL text given for the held-out file instead of its path.
        TypeError: held-out data that is neither a path nor rows.
    """
    from .tokens import refuse_jsonl_text, renderer_or_reason

    refuse_jsonl_text(settings.eval_data)
    out = Prepared()
    if settings.model is None:
        out.findings.append((None, "info", "no_model", "no model given: renderer checks and exact token counts "
                                                       "skipped (token counts are 2.5-chars-per-token estimates)"))
    else:
        out.renderer, note = renderer_or_reason(settings.model)
        if note:
            out.findings.append((None, "warning", "estimated_tokens", note))
    if settings.eval_data is not None:
        unreadable = _not_a_file(Path(settings.eval_data)) if isinstance(settings.eval_data, (str, os.PathLike)) \
            else None
        if unreadable is None:
            out.eval_keys, notes = _load_prompt_keys(settings.eval_data)
            out.findings.extend(notes)
        else:
            out.findings.append((None, "error", "no_file", f"eval file {unreadable[1]} (overlap not checked)"))
    api_key = os.environ.get("TINKER_API_KEY", "").strip()
    out.extra_secrets = (api_key,) if len(api_key) >= 8 else ()
    return out


def iter_file_rows(path: str | os.PathLike, *, progress: bool | None = None,
                   bad: list | None = None) -> Iterator[tuple[int, Any, str]]:
    """A JSONL file's rows, streamed, each with its raw text (for the secret scan).

    Args:
        path: the file.
        progress: a progress bar (default None: past 2,000 rows, unless MACHINE_NB_PROGRESS=0).
        bad: where unreadable lines go, each a MachineFormatError with its line, in file order
            (default None: dropped). The caller takes them as they come, before the next row.

    Returns:
        An iterator of (line number, value, the line's text).
    """
    from ..core.progress import progress as bar, resolve_progress
    from .tokens import PROGRESS_MIN_ROWS, count_lines

    path = Path(path)
    total = count_lines(path)
    skipped: list = [] if bad is None else bad
    show = resolve_progress(progress, worth_a_bar=total > PROGRESS_MIN_ROWS)
    with open_regular(path) as raw_fh, bar(total=total, desc=f"validate {path.name}", unit="rows", enabled=show) as pb:
        raw_lines = iter(enumerate(raw_fh, start=1))
        for line, row in iter_jsonl(path, on_error="skip", skipped=skipped):
            # the raw text of this line, for the secret scan (the same file, read in step)
            for n, raw in raw_lines:
                if n == line:
                    break
            pb.update()
            yield line, row, raw.decode("utf-8", "replace")


def row_problems(row: Any, raw: str, settings: ValidateSettings, prepared: Prepared) -> list[tuple[str, str, str]]:
    """The problems of one row that need no renderer (pure): secrets, shape, held-out overlap.

    Args:
        row: the row as read.
        raw: its JSON text (the secret scan reads it).
        settings: the resolved settings (kind, eval_data).
        prepared: the extra secrets and held-out prompts.

    Returns:
        (severity, code, message) in that order: secrets, shape problems, overlap.
    """
    out = secret_findings(raw, prepared.extra_secrets)
    out += shape_findings(row, settings.kind)
    if settings.kind == "train":
        out += empty_reply_findings(row)
    if prepared.eval_keys is not None and isinstance(row, Mapping) and isinstance(row.get("messages"), list) \
            and row["messages"]:
        full, last = prompt_keys(row["messages"])
        if full in prepared.eval_keys[0]:
            where = _held_out_name(settings.eval_data, prepared.eval_keys[0][full])
            out.append(("error", "eval_overlap", f"this prompt is also in {where}: the held-out score would be "
                                                 "measured on trained data"))
        elif last is not None and last in prepared.eval_keys[1]:
            where = _held_out_name(settings.eval_data, prepared.eval_keys[1][last])
            out.append(("warning", "eval_overlap_question",
                        f"the last user question is also in {where} (in another context)"))
    return out


def count_row(row: Mapping[str, Any], settings: ValidateSettings,
              prepared: Prepared) -> tuple[int | None, int, list[tuple[str, str, str]]]:
    """The tokens of one well-shaped row, and the problems counting finds.

    Args:
        row: a row with a non-empty `messages` list and no shape error.
        settings: the resolved settings (model, kind, max_length, context, train_on_what).
        prepared: the renderer (None: the 2.5-chars-per-token estimate).

    Returns:
        (tokens, trained tokens, problems): tokens None when the renderer cannot render the row
        (the problem says why); without a renderer, the estimate and 0 trained tokens (Tally
        estimates those for its summary); problems: render_failed, too_long, no_trainable_tokens.
    """
    from .render import renderer_messages
    from .tokens import machine_estimate, render_row

    messages, renderer = row["messages"], prepared.renderer
    tokens = trained = None
    if renderer is not None:
        try:
            if settings.kind == "train":
                tokens, trained = render_row(renderer, messages, settings.train_on_what,
                                             whole_run=bool(row.get("whole_run")))
            else:
                tokens, trained = int(renderer.build_generation_prompt(renderer_messages(list(messages))).length), 0
        except Exception as exc:  # its text may quote the row (a media part's path): redacted like the rest
            return None, 0, [("error", "render_failed", f"the {settings.model} renderer cannot render this row: "
                                                        f"{type(exc).__name__}: {redacted(str(exc))[:300]}")]
    estimated = tokens is None
    if estimated:
        tokens, trained = machine_estimate(row), 0
    problems = []
    if settings.max_length is not None and tokens > settings.max_length:
        # an estimated count runs high on purpose (a cost bound): over the limit, the row may fit
        severity, count = ("warning", f"about {tokens} tokens (estimated)") if estimated else ("error", f"{tokens} tokens")
        if settings.max_length == settings.context:
            problems.append((severity, "too_long", f"{count}, over {settings.model}'s context of "
                                                   f"{settings.context} tokens: the model cannot hold this row"))
        else:
            problems.append((severity, "too_long", f"{count}, over max_length {settings.max_length}: the "
                                                   "cookbook truncates it and cuts the target"))
    if renderer is not None and settings.kind == "train" and trained == 0:
        problems.append(("error", "no_trainable_tokens", "no token has loss weight > 0 (no trainable assistant "
                                                         "message): the row teaches nothing"))
    return tokens, trained or 0, problems


_NOT_SHAPE = frozenset({"secret", "eval_overlap", "eval_overlap_question"})  # row_problems' other codes


class Tally:
    """The findings and numbers of one validation, row by row, summed up by `result()`."""

    def __init__(self, path: Any, settings: ValidateSettings, prepared: Prepared | None = None):
        self.path, self.settings = path, settings
        self.findings: list[tuple[Any, str, str, str]] = []
        self.per_code: dict[str, int] = {}
        self.counts = {"error": 0, "warning": 0, "info": 0}
        self.summary: dict[str, Any] = {
            "path": str(path), "model": settings.model, "kind": settings.kind, "rows": 0, "errors": 0,
            "warnings": 0, "infos": 0, "tokens": 0, "trained_tokens": 0, "max_tokens": 0,
            "exact": prepared is not None and prepared.renderer is not None, "histogram": empty_histogram(),
            "max_length": settings.max_length}
        self.rows_with_tools = self.rows_flagged = 0
        for finding in (prepared.findings if prepared is not None else []):
            self.add(*finding)

    def add(self, line: int | None, severity: str, code: str, message: str) -> None:
        """Record one finding (beyond MAX_FINDINGS_PER_CODE of a code, only counted).

        Args:
            line: the row's line (None: the whole file).
            severity: "error", "warning" or "info".
            code: the finding's stable short name.
            message: what and where. It is redacted (redact.redacted) before it is kept: shape
                findings quote the field they are about (a role, a tool_call_id, `expected`),
                and that value may be a key the secret finding reports masked.
        """
        n = self.per_code[code] = self.per_code.get(code, 0) + 1
        if n <= MAX_FINDINGS_PER_CODE:
            self.findings.append((line, severity, code, redacted(message)))
        self.counts[severity] += 1

    def bad_line(self, line: int | None, reason: str) -> None:
        """Record a line that is not a JSON value.

        Args:
            line: its line.
            reason: why (jsonl's reason).
        """
        self.add(line, "error", "bad_json", reason)

    def row(self, line: int, row: Any, raw: str, prepared: Prepared) -> None:
        """Check one row (row_problems, then count_row when it is well shaped) and count it.

        Args:
            line: its line (or position).
            row: the row.
            raw: its JSON text.
            prepared: what rows are checked against.
        """
        self.summary["rows"] += 1
        problems = row_problems(row, raw, self.settings, prepared)
        for severity, code, message in problems:
            self.add(line, severity, code, message)
        if not isinstance(row, Mapping) or not isinstance(row.get("messages"), list) or not row["messages"]:
            return
        if row.get("tools"):
            self.rows_with_tools += 1
        if row.get("whole_run") or any(isinstance(m, Mapping) and "trainable" in m for m in row["messages"]):
            self.rows_flagged += 1
        if any(p[0] == "error" and p[1] not in _NOT_SHAPE for p in problems):
            return  # the renderer would only repeat the shape error
        tokens, trained, counted = count_row(row, self.settings, prepared)
        if tokens is not None and prepared.renderer is None and self.settings.kind == "train":
            trained = min(tokens, estimate_trained(row["messages"], self.settings.train_on_what,
                                                   whole_run=bool(row.get("whole_run"))))  # as count_tokens'
        if tokens is not None:
            s = self.summary
            s["tokens"] += tokens
            s["trained_tokens"] += trained
            s["max_tokens"] = max(s["max_tokens"], tokens)
            s["histogram"][bucket_label(tokens)] += 1
        for severity, code, message in counted:
            self.add(line, severity, code, message)

    def result(self, empty: str = "has no rows") -> ValidationResult:
        """The ValidationResult, with the file-level findings added (no rows, tools, trainable flags).

        Args:
            empty: how to say there are no rows (default "has no rows").

        Returns:
            The ValidationResult, findings sorted by line.
        """
        if self.summary["rows"] == 0:
            name = self.path if self.path is not None else "the data"
            self.add(None, "error", "empty_file", f"{name} {empty if self.counts['error'] == 0 else 'has no readable rows'}")
        if self.rows_with_tools:
            self.add(None, "info", "tools_ignored", f"{self.rows_with_tools} row(s) carry 'tools'; tinker-cookbook's "
                                                    "FromConversationFileBuilder trains on 'messages' only")
        if self.rows_flagged:
            self.add(None, "info", "trainable_flags", f"{self.rows_flagged} row(s) are whole runs or carry per-message "
                                                      "'trainable' flags: in them only assistant messages flagged true "
                                                      "are trained (as sft does)")
        return self.finish()

    def finish(self) -> ValidationResult:
        """The ValidationResult of what was recorded so far (no file-level findings added).

        Returns:
            The ValidationResult, findings sorted by line.
        """
        import pandas as pd

        self.summary.update(errors=self.counts["error"], warnings=self.counts["warning"], infos=self.counts["info"])
        findings = list(self.findings)
        for code, n in self.per_code.items():
            if n > MAX_FINDINGS_PER_CODE:
                findings.append((None, "info", "truncated",
                                 f"{n - MAX_FINDINGS_PER_CODE} more '{code}' finding(s) not listed ({n} in all)"))
        df = pd.DataFrame(findings, columns=FINDING_COLUMNS)
        df["line"] = pd.array(df["line"].tolist(), dtype="Int64")
        df = df.sort_values("line", kind="stable", na_position="first").reset_index(drop=True)
        return ValidationResult(Path(self.path) if self.path is not None else None, self.settings.model, df,
                                self.summary, ok=self.counts["error"] == 0)


# --------------------------------------------------------------------------- the compositions

def validate(data: Any, model: str | None = None, max_length: int | str | None = "auto",
             eval_data: Any = None, *, kind: str = "auto", train_on_what: Any = None,
             progress: bool | None = None) -> ValidationResult:
    """Check a chat JSONL training or eval file; every problem becomes a finding with its line.

    Args:
        data: the JSONL file (streamed), or rows in memory (a list of `{"messages": …}` dicts or a
            DataFrame of them; findings' lines are 1-based positions, as preflight's).
        model: renders each row with this model's tinker-cookbook renderer (default None: shape,
            overlap and secret checks only, with an info finding saying so). A model whose
            tokenizer is not available offline gets estimated counts and a warning saying why.
        max_length: rows longer than this many tokens are errors (the cookbook would truncate
            them and cut the target). Default "auto": the model's context where it is known
            (model_context: 128 for local/arith-tiny), else 32768, the cookbook's usual SFT
            max_length. An integer is capped at the model's context (no setting makes the model
            hold more); None drops the max_length check, keeping only the context's.
        eval_data: a held-out file, or held-out rows in memory (a list of eval rows or a DataFrame
            of them); a training prompt equal to one of its prompts is an error, the same last
            question under a different context a warning (default None: no overlap check). Prompts
            are compared with Unicode spelling (NFKC), invisible characters, case and whitespace
            set aside, image and audio parts whole. Held-out lines that cannot be read, or no
            held-out rows at all, are a warning (eval_unreadable): their prompts go unchecked.
        kind: "train", "eval" or "auto" (default: "eval" when rows carry `expected`, else
            "train", as the summary of a file that cannot be read says).
        train_on_what: the cookbook's TrainOnWhat for trained-token counts (default None: as count_tokens).
        progress: progress bar (default None: past 2,000 rows, unless MACHINE_NB_PROGRESS=0).

    Returns:
        A ValidationResult: findings (line, severity, code, message), summary, ok. A path that is
        missing (no_file) or not a regular file (not_a_file: a folder, a named pipe), or a file
        in UTF-16 or UTF-32 (bad_encoding), is one finding.

    Raises:
        ValueError: JSONL text given for `data` or `eval_data` instead of a path; a kind or
            max_length no validation can use.
        TypeError: data or eval_data that is neither a path nor rows.
    """
    from .tokens import refuse_jsonl_text

    if kind not in ("train", "eval", "auto"):
        raise ValueError(f"kind must be 'train', 'eval' or 'auto', got {kind!r}")
    if not isinstance(data, (str, os.PathLike)):
        return _validate_rows(data, model, max_length, eval_data, kind, train_on_what)
    refuse_jsonl_text(data)
    path = Path(data)
    unreadable = _not_a_file(path) or _wide_encoding(path)
    if unreadable is not None:
        tally = Tally(path, resolve_settings(model, max_length, "train" if kind == "auto" else kind))
        tally.add(None, "error", *unreadable)
        return tally.finish()
    if kind == "auto":
        kind = _detect_kind(path)
    settings = resolve_settings(model, max_length, kind, train_on_what, eval_data)
    prepared = prepare(settings)
    tally = Tally(path, settings, prepared)
    bad: list = []
    for line, row, raw in iter_file_rows(path, progress=progress, bad=bad):
        while bad:
            err = bad.pop(0)
            tally.bad_line(err.line, err.reason)
        tally.row(line, row, raw, prepared)
    while bad:
        err = bad.pop(0)
        tally.bad_line(err.line, err.reason)
    return tally.result()


def _validate_rows(data: Any, model: str | None, max_length: int | str | None, eval_data: Any, kind: str,
                   train_on_what: Any) -> ValidationResult:
    """validate() over rows in memory (a list of row dicts, or a DataFrame of them)."""
    from .tokens import iter_rows

    if isinstance(data, (bytes, Mapping)) or not (hasattr(data, "__iter__") or hasattr(data, "columns")):
        raise TypeError(f"validate() takes a JSONL path or a list of rows (dicts with \"messages\"), not "
                        f"{type(data).__name__}")
    rows = list(iter_rows(data))
    if kind == "auto":
        first = next((r for _, r in rows if isinstance(r, Mapping)), None)
        kind = "eval" if first is not None and "expected" in first else "train"
    if kind not in ("train", "eval"):
        raise ValueError(f"kind must be 'train', 'eval' or 'auto', got {kind!r}")
    settings = resolve_settings(model, max_length, kind, train_on_what, eval_data)
    prepared = prepare(settings)
    tally = Tally(None, settings, prepared)
    for line, row in rows:
        try:
            raw = dumps_line(row)
        except (TypeError, ValueError):  # not JSON-able: its text still goes through the secret scan
            raw = repr(row)
        tally.row(line, row, raw, prepared)
    return tally.result(empty="holds no rows")


def preflight(data: Any, model: str | None = None, max_length: int | str | None = "auto", *,
              eval_data: Any = None, train_on_what: Any = None,
              raise_errors: bool = True) -> ValidationResult:
    """validate()'s checks on training rows in memory, before a trainer spends a step on them.

    Args:
        data: training rows (`{"messages": [...], ...}` dicts, in order; a DataFrame of export
            lines is read row by row). Line numbers in findings are 1-based positions.
        model: the model the rows are for; default None checks shape and secrets only (as validate).
        max_length: as in validate (default "auto": the model's context where known, else 32768).
        eval_data: a held-out eval file, or held-out rows in memory, whose prompts must not be
            trained on (default None; compared as in validate).
        train_on_what: the cookbook's TrainOnWhat for trained-token counts (default None: as sft).
        raise_errors: default True: raise ValidationFailed when there is any error finding;
            False returns the result whatever it holds.

    Returns:
        The ValidationResult validate() gives for the same rows written to a file: the same
        findings (line, severity, code, message) and summary (path None).

    Raises:
        ValidationFailed: (a MachineFormatError) with raise_errors, naming the first rows that
            fail and carrying the whole result in `.result`.
    """
    from .tokens import iter_rows

    settings = resolve_settings(model, max_length, "train", train_on_what, eval_data)
    prepared = prepare(settings)
    tally = Tally(None, settings, prepared)
    for line, row in iter_rows(data):
        try:
            raw = dumps_line(row)
        except (TypeError, ValueError):  # not JSON-able: its text still goes through the secret scan
            raw = repr(row)
        tally.row(line, row, raw, prepared)
    result = tally.result(empty="holds no rows")
    if raise_errors and not result.ok:
        raise _refused(result, model)
    return result


def _refused(result: ValidationResult, model: str | None) -> Exception:
    """The ValidationFailed preflight raises: the first rows that fail, the whole result attached."""
    from ..errors import ValidationFailed

    errors = result.errors()
    lines = errors["line"].dropna()
    listed = "; ".join(("" if _isna(r.line) else f"line {int(r.line)}: ") + f"{r.code}: {r.message}"
                       for r in errors.head(5).itertuples())
    more = f"; … {len(errors) - 5} more" if len(errors) > 5 else ""
    return ValidationFailed(f"{result.summary['errors']} error(s) in {result.summary['rows']} training row(s) for "
                            f"{model}; validate() would reject them: {listed}{more}", result,
                            line=int(lines.iloc[0]) if len(lines) else None)


__all__ = ["validate", "preflight", "model_context", "resolve_max_length", "ValidationResult", "shape_findings",
           "secret_findings", "empty_reply_findings", "prompt_keys", "bucket_label", "BUCKETS", "ROLES", "MATCH_MODES",
           "FINDING_COLUMNS", "SECRET_PATTERNS", "ValidateSettings", "resolve_settings", "Prepared", "prepare",
           "iter_file_rows", "row_problems", "count_row", "Tally", "unescaped"]
