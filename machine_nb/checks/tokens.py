"""Exact token counts per chat row, from the model's real tinker-cookbook renderer.

A row is rendered as `train.sft` feeds it to the cookbook's SFT loop (`renderer.build_supervised_example`,
the core of `conversation_to_datum`, with sft's choice of trained messages): tokens = the model
input's length, trained_tokens = tokens with loss weight > 0. Models whose tokenizer needs the
Hugging Face hub while it is off or unreachable (render.get_tokenizer never waits on it) get
Machine's 2.5-characters-per-token estimate instead, labelled `exact=False` with one line saying
why; their trained tokens are estimated the same way from the messages sft would train.
Prices are applied in pricing.py; validate.py uses `render_row` for its renderer checks.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..core.chat import frame_rows, is_flagged, refuse_jsonl_text, trainable_flags, trained_indices
from ..errors import EngineError, MachineFormatError, user_stacklevel
from ..core.jsonl import iter_jsonl, open_regular
from .render import renderer_messages

if TYPE_CHECKING:
    import pandas as pd

CHARS_PER_TOKEN = 2.5  # Machine's deliberate over-estimate (how far off it is: benchmarks/bench_tokens.py)
PROGRESS_MIN_ROWS = 2000  # show a progress bar past this many rows

COLUMNS = ["line", "tokens", "trained_tokens", "exact", "error"]
"""count_tokens' columns: line (1-based line in the file, or index+1 in a list of rows), tokens,
trained_tokens (loss weight > 0), exact (real renderer or estimate), error (why a row fell back
to the estimate, else None)."""


# count_tokens results for files, keyed by (path, mtime, size, model, options, why counts are estimates):
# re-pricing is instant, and estimates made while a tokenizer was out of reach are not served once it is there.
_CACHE: dict[tuple, object] = {}
_CACHE_SIZE = 8


class TokenEstimateWarning(UserWarning):
    """Counts are 2.5-chars-per-token estimates, not the model's tokenizer."""


def _estimate(row: Mapping[str, Any]) -> int:
    """export.estimate_tokens of one row (half of a UTF-16 pair counts as the escape
    JSON.stringify writes for it, as there)."""
    from ..data.export import estimate_tokens

    return estimate_tokens([row])


def machine_estimate(row: Mapping[str, Any]) -> int:
    """Machine's estimate for one row: characters of the JSON of messages (+ tools) / 2.5, rounded up
    (`export.estimate_tokens`, the same rule the export step reports)."""
    return _estimate(row)


def estimate_trained(messages: list[Mapping[str, Any]], train_on_what: Any = None, *, whole_run: bool = False) -> int:
    """Machine's estimate of a row's trained tokens: the characters of the messages sft trains, as
    `sft_view` hands them over (in CUSTOMIZED mode each with `"trainable": true`, otherwise without
    the key), as compact JSON / 2.5. Only the text's length matters, so the cookbook (a slow
    import) is not needed for it.

    Args:
        messages: the row's messages.
        train_on_what: the cookbook's TrainOnWhat or its value (default None: sft's choice).
        whole_run: the row is a whole run (default False).

    Returns:
        The estimate (0 when nothing is trained).
    """
    keep = trained_indices(messages, train_on_what, whole_run=whole_run)
    if not keep:
        return 0
    mode = str(getattr(train_on_what, "value", train_on_what)) if train_on_what is not None else None
    customized = mode == "customized" or (mode is None and is_flagged({"messages": messages, "whole_run": whole_run}))
    flag = {"trainable": True} if customized else {}
    return _estimate({"messages": [{**{k: v for k, v in messages[i].items() if k != "trainable"}, **flag}
                                   for i in keep]})


def iter_rows(data: str | os.PathLike | Iterable[Mapping[str, Any]], *, on_error: str = "raise",
              skipped: list | None = None) -> Iterator[tuple[int, Any]]:
    """The rows of a JSONL file or of rows in memory, numbered.

    Args:
        data: a JSONL path (streamed), rows, or a DataFrame of rows.
        on_error: for unreadable JSONL lines: "raise" (default), "warn" or "skip" (see jsonl.iter_jsonl).
        skipped: where "skip" collects the unreadable lines' errors (default None).

    Returns:
        An iterator of (line, row): 1-based file lines, or positions (index + 1) in memory. A
        DataFrame's row leaves out its missing cells (NaN, None): pandas fills every key some row
        has into every row (`pd.read_json(lines=True)`), and a NaN `whole_run` or `tools` would
        read as set.
    """
    if isinstance(data, (str, os.PathLike)):
        refuse_jsonl_text(data)
        yield from iter_jsonl(data, on_error=on_error, skipped=skipped)
    else:
        yield from enumerate(frame_rows(data), start=1)


def count_lines(data: Any) -> int | None:
    """How many rows there are to go through, for a progress bar's total.

    Args:
        data: a file path (its newlines are counted, cheaply) or rows.

    Returns:
        The count, or None for an iterable without a length.

    Raises:
        MachineFormatError: a path that is missing or not a regular file (a folder; a named pipe,
            which is refused at once rather than waited on for a writer).
    """
    if isinstance(data, (str, os.PathLike)):
        n = 0
        with open_regular(data) as fh:
            for block in iter(lambda: fh.read(1 << 16), b""):
                n += block.count(b"\n")
        return n
    return len(data) if hasattr(data, "__len__") else None


def sft_view(messages: list[Mapping[str, Any]], train_on_what: Any = None, *,
             whole_run: bool = False) -> tuple[list[Mapping[str, Any]], Any]:
    """The messages and TrainOnWhat that `train.sft` hands the cookbook for one row.

    Default (train_on_what None): a row with no `trainable` flags and not a whole run trains its
    last assistant message (LAST_ASSISTANT_MESSAGE); otherwise CUSTOMIZED with a flag on every
    message (the cookbook's renderers assert all or none), as chat.trainable_flags gives them. An
    explicit CUSTOMIZED applies the same rule; any other explicit mode drops the flags (the
    renderers assert none is present).

    Args:
        messages: the row's messages.
        train_on_what: the cookbook's TrainOnWhat or its value (default None: sft's choice).
        whole_run: the row is a whole run (default False).

    Returns:
        (messages as the cookbook gets them, the TrainOnWhat); the renderer takes them through
        render.renderer_messages, as sft's dataset gives them.
    """
    from tinker_cookbook.renderers import TrainOnWhat

    msgs = [m for m in messages if isinstance(m, Mapping)]
    flagged = whole_run or is_flagged({"messages": msgs})
    mode = TrainOnWhat(train_on_what) if train_on_what is not None else (
        TrainOnWhat.CUSTOMIZED if flagged else TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    if mode != TrainOnWhat.CUSTOMIZED:
        return [{k: v for k, v in m.items() if k != "trainable"} if "trainable" in m else m for m in msgs], mode
    flags = trainable_flags(msgs, whole_run=whole_run)
    return [{**m, "trainable": flag} for m, flag in zip(msgs, flags)], mode


def render_row(renderer: Any, messages: list[Mapping[str, Any]], train_on_what: Any = None, *,
               whole_run: bool = False) -> tuple[int, int]:
    """One conversation's token counts through the renderer, as `train.sft` renders it.

    Args:
        renderer: the model's tinker-cookbook renderer.
        messages: the row's messages.
        train_on_what: the cookbook's TrainOnWhat (default None: sft's choice, see sft_view).
        whole_run: the row is a whole run (default False).

    Returns:
        (tokens, trained tokens: those with loss weight > 0).

    Raises:
        Whatever the renderer raises for a conversation it cannot render (callers report it).
    """
    msgs, mode = sft_view(messages, train_on_what, whole_run=whole_run)
    model_input, weights = renderer.build_supervised_example(renderer_messages(msgs), train_on_what=mode)
    return int(model_input.length), int((weights > 0).sum())


def offline_note(model: str, reason: str) -> str:
    """The one line that says why counts are estimates.

    Args:
        model: the model.
        reason: why its renderer is not available.

    Returns:
        "<model>: <reason>; counts are 2.5-chars-per-token estimates (exact=False)".
    """
    return f"{model}: {reason}; counts are 2.5-chars-per-token estimates (exact=False)"


def renderer_or_reason(model: str) -> tuple[Any, str | None]:
    """The model's renderer, or why it is not available; never waits on the hub offline.

    Args:
        model: the model.

    Returns:
        (renderer, None), or (None, one line saying why: offline_note).
    """
    from .render import get_renderer

    try:
        return get_renderer(model), None
    except EngineError as exc:
        from .render import has_offline_tokenizer, offline_switch

        switch = offline_switch()
        if switch and not has_offline_tokenizer(model):
            return None, offline_note(model, f"tokenizer needs the Hugging Face hub ({switch} is set)")
        return None, offline_note(model, str(exc).split("; token counts")[0].rstrip("."))
    except Exception as exc:  # an unknown model name, a renderer that fails to build
        return None, offline_note(model, f"no renderer ({type(exc).__name__}: {exc})")


def count_tokens(data: str | os.PathLike | Iterable[Mapping[str, Any]], model: str, *,
                 train_on_what: Any = None, on_error: str = "raise", progress: bool | None = None) -> pd.DataFrame:
    """Tokens per chat row for `model`.

    Exact counts need the model's tokenizer offline (Inkling; the local engine's models) or a
    reachable hub. Otherwise every row is estimated (`exact=False`; trained_tokens from the
    messages sft trains, the same 2.5-characters rule), `df.attrs["note"]` says why in one line, and a
    TokenEstimateWarning repeats it. A row the renderer rejects falls back to the estimate with its
    reason in `error`.

    Args:
        data: a chat JSONL path (streamed) or rows `{"messages": [...], ...}`.
        model: the model whose renderer counts.
        train_on_what: the cookbook's TrainOnWhat (default None: what `train.sft` uses, see
            sft_view: the last assistant message, or per-message `trainable` flags on flagged and
            whole-run rows).
        on_error: for unreadable JSONL lines, "raise" (default: a cost must not silently drop
            rows), "warn" or "skip" (see jsonl.iter_jsonl).
        progress: show a progress bar (default None: past 2,000 rows, unless MACHINE_NB_PROGRESS=0).

    Returns:
        A DataFrame with COLUMNS (line, tokens, trained_tokens, exact, error).

    Raises:
        MachineFormatError: a missing file or one that is not a regular file, or a row without a
            `messages` list (file, line, field).
        ValueError: JSONL text given instead of a file's path.
    """
    import pandas as pd

    from ..core.progress import progress as bar, resolve_progress

    path = data if isinstance(data, (str, os.PathLike)) else None
    key = None
    if path is not None:
        refuse_jsonl_text(path)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise MachineFormatError(path, "file not found") from None
    renderer, note = renderer_or_reason(model)
    if path is not None:
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size, model, str(train_on_what), on_error, note)
        if key in _CACHE:  # a cost meter re-prices the same file on every slider move
            cached = _CACHE[key]
            if note:
                warnings.warn(TokenEstimateWarning(note), stacklevel=user_stacklevel())
            return cached.copy()
    total = count_lines(data)
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    show = resolve_progress(progress, worth_a_bar=(total or 0) > PROGRESS_MIN_ROWS)
    with bar(total=total, desc=f"tokens {model}", unit="rows", enabled=show) as pb:
        for line, row in iter_rows(data, on_error=on_error):
            messages = row.get("messages") if isinstance(row, Mapping) else None
            if not isinstance(messages, list):
                raise MachineFormatError(path, "each row needs a 'messages' list", line=line, field="messages")
            error = None
            if renderer is not None:
                try:
                    tokens, trained = render_row(renderer, messages, train_on_what,
                                                 whole_run=bool(row.get("whole_run")))
                    exact = True
                except Exception as exc:  # reported per row; the estimate keeps the total an upper-ish bound
                    from ..core.redact import redacted  # its text may quote the row (a media part's path)

                    error = redacted(f"renderer failed: {type(exc).__name__}: {exc}")
            if renderer is None or error is not None:
                tokens, exact = machine_estimate(row), False
                trained = min(tokens, estimate_trained(messages, train_on_what,
                                                       whole_run=bool(row.get("whole_run"))))
            cols["line"].append(line)
            cols["tokens"].append(tokens)
            cols["trained_tokens"].append(trained)
            cols["exact"].append(exact)
            cols["error"].append(error)
            pb.update()
    df = pd.DataFrame(cols, columns=COLUMNS).astype({"line": "int64", "tokens": "int64",
                                                     "trained_tokens": "int64", "exact": "bool"})
    df.attrs["model"] = model
    df.attrs["note"] = note or ""
    if key is not None:
        while len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = df.copy()
    if note:
        warnings.warn(TokenEstimateWarning(note), stacklevel=user_stacklevel())
    return df


def count_prompt_tokens(data: str | os.PathLike | Iterable[Mapping[str, Any]], model: str, *,
                        on_error: str = "raise") -> pd.DataFrame:
    """Generation-prompt tokens per eval row (what sampling prefills).

    Rendered with `renderer.build_generation_prompt(messages)`; estimated (exact=False, note in
    `df.attrs["note"]`) when the renderer is not available offline.

    Args:
        data: an eval JSONL path (streamed) or rows.
        model: the model whose renderer counts.
        on_error: for unreadable JSONL lines (default "raise"; see jsonl.iter_jsonl).

    Returns:
        A DataFrame with columns line, prompt_tokens, exact.

    Raises:
        MachineFormatError: a row without a `messages` list (file, line, field).
    """
    import pandas as pd

    renderer, note = renderer_or_reason(model)
    path = data if isinstance(data, (str, os.PathLike)) else None
    out: list[tuple[int, int, bool]] = []
    for line, row in iter_rows(data, on_error=on_error):
        messages = row.get("messages") if isinstance(row, Mapping) else None
        if not isinstance(messages, list):
            raise MachineFormatError(path, "each row needs a 'messages' list", line=line, field="messages")
        try:
            if renderer is None:
                raise LookupError
            out.append((line, int(renderer.build_generation_prompt(renderer_messages(list(messages))).length), True))
        except Exception:
            out.append((line, machine_estimate(row), False))
    df = pd.DataFrame(out, columns=["line", "prompt_tokens", "exact"])
    df.attrs["note"] = note or ""
    if note:
        warnings.warn(TokenEstimateWarning(note), stacklevel=user_stacklevel())
    return df


__all__ = ["count_tokens", "count_prompt_tokens", "render_row", "TokenEstimateWarning", "CHARS_PER_TOKEN",
           "COLUMNS"]
