"""Graded runs as fine-tuning data: Machine's `conversation`, `stepExamples`, `wholeRunExample`,
`trainingLines` and `uniformContent`, in tinker-cookbook's chat JSONL shape (`{"messages": [...]}` a
line, which `sft` trains on). Which runs to export is decided in `select.py`; writing the file is
`machine_nb.write_jsonl` (atomic).

Pure functions over plain dicts: a Run is Machine's JSON record, a chat message is
`{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?, "trainable"?}` where content is a
string, or parts `[{"type": "thinking", "thinking"}, {"type": "text", "text"}]` when the
assistant's reasoning is kept (the cookbook's ThinkingPart/TextPart).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..core.chat import content_text, frame_rows, text_key
from ..errors import user_stacklevel
from ..store.workspace import resolve_machine

# The message rules live in the store layer (the tag store reads turns with them); export's names
# for them stay importable from here.
from ..store.messages import (FailedPredicate, default_failed, is_tool_call, result_after,  # noqa: F401
                             result_positions, to_chat, tool_results, without_thinking)

# Half of a UTF-16 pair: a run's text cut at a UTF-16 length holds one
_SURROGATE = re.compile("[\ud800-\udfff]")

# Harnesses that send a step's whole reply back to the model, reasoning included (chat completions).
RESENDS_REASONING = frozenset({"tinker", "openrouter", "openai", "chat-completions"})


def _step_calls(messages: Sequence[dict], i: int) -> list[tuple[dict, str | None, int]]:
    """The tool calls of the step at index i, as (call, call id, position of the message making
    it): chat `tool_calls`, or the run of consecutive Machine tool-call messages that make one
    step (from i onwards)."""
    m = messages[i]
    if m.get("tool_calls"):
        return [(tc, tc.get("id"), i) for tc in m["tool_calls"]]
    calls = []
    j = i if is_tool_call(m) else i + 1
    while j < len(messages) and is_tool_call(messages[j]):
        calls.append((messages[j], messages[j].get("toolCallId"), j))
        j += 1
    return calls


def step_failed(messages: Sequence[dict], i: int, failed: FailedPredicate | None = None,
                results: dict[str, dict] | None = None) -> bool:
    """Whether the assistant step at index `i` made tool calls and every one of them failed.

    Works on chat messages (a step is one assistant message with `tool_calls`) and on Machine
    Messages (a step is an assistant message plus the consecutive tool-call messages after it).
    A call's result is the first tool result after it with its id (store.messages.result_after:
    a harness may reuse an id in later steps); a call with no result counts as not failed.
    Machine's rule: steps whose tool calls all failed are not trained on, but stay in later
    steps' context.

    Args:
        messages: the conversation.
        i: the index of the assistant step.
        failed: the failed-tool predicate (default None: `default_failed`, an error flag or
            "Error…" content on the result).
        results: tool results by call id, when already collected (default None: each call's
            own result, found by result_after).

    Returns:
        True when the step made calls and all of them failed.
    """
    failed = failed or default_failed
    calls = _step_calls(messages, i)
    if not calls:
        return False
    positions = result_positions(messages) if results is None else None
    for call, cid, at in calls:
        result = results.get(cid) if results is not None else result_after(messages, positions, cid, at)
        if result is None or not failed(call, result):
            return False
    return True


def run_case(run: dict) -> str:
    """The case a run belongs to (Machine's `caseOf`, whose body was not seen).

    Rule used here: `run["case"]` when the record carries one (conversations record the case
    they started from), else `run["input"]`, else "" (a run with no input is its own empty case).

    Args:
        run: a Run record.

    Returns:
        The case text.
    """
    case = run.get("case")
    if isinstance(case, str):
        return case
    inp = run.get("input")
    return inp if isinstance(inp, str) else ""


def _run_messages(run: dict) -> list[dict]:
    return list(run.get("history") or []) + list(run.get("trajectory") or [])


def conversation(run: dict, instructions: str | None = None,
                 reasoning: bool | Callable[[str], str] | None = True,
                 failed: FailedPredicate | None = None) -> list[dict]:
    """A run as one chat conversation: the system instructions, its history, its trajectory.

    Earlier turns (history) carry no reasoning: harnesses do not send it back across turns. See
    `to_chat` for tool calls.

    Args:
        run: a Run record.
        instructions: the system message; default None: the run's own `instructions` (what it ran
            under), and no system message when neither is set.
        reasoning: True (default) keeps reasoning as thinking parts, a function rewrites it,
            False/None drops it.
        failed: the failed-tool predicate (default None: `default_failed`).

    Returns:
        The chat messages.
    """
    return _conversation(run, instructions, reasoning, failed)[0]


def _conversation(run: dict, instructions: str | None, reasoning: Any,
                  failed: FailedPredicate | None) -> tuple[list[dict], list[bool]]:
    system = instructions if instructions is not None else run.get("instructions")
    history = list(run.get("history") or [])
    hist_chat, hist_flags = to_chat(history, reasoning=False, failed=failed)
    traj_chat, traj_flags = to_chat(list(run.get("trajectory") or []), reasoning=reasoning, failed=failed)
    msgs = hist_chat + traj_chat
    flags = hist_flags + traj_flags
    if system and not (msgs and msgs[0]["role"] == "system"):
        msgs = [{"role": "system", "content": system}] + msgs
        flags = [False] + flags
    return msgs, flags


def _last_user(messages: Sequence[dict]) -> int:
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)


def step_examples(messages: Sequence[dict], *, failed_steps: Sequence[bool] | None = None,
                  keep_step_reasoning: bool = False, skip_failed_steps: bool = True,
                  failed: FailedPredicate | None = None) -> list[list[dict]]:
    """One example per assistant step after the last user message: the context the model saw at that
    step, ending with what it produced (trained on the last message only).

    Messages up to the last user message lose their reasoning. Steps whose tool calls all failed
    are left out, so the model is not taught to repeat them, but stay in later steps' context.

    Args:
        messages: the chat conversation.
        failed_steps: which messages are failed steps (from `to_chat`); default None: judged with
            `step_failed` and `failed`.
        keep_step_reasoning: later steps of the same run keep their reasoning in context (default
            False; training_lines turns it on for harnesses that resend reasoning).
        skip_failed_steps: leave failed steps out as targets (default True).
        failed: the failed-tool predicate when failed_steps is not given (default None: `default_failed`).

    Returns:
        The examples, each a list of chat messages.
    """
    last_user = _last_user(messages)
    out = []
    for i in range(last_user + 1, len(messages)):
        if messages[i].get("role") != "assistant":
            continue
        bad = failed_steps[i] if failed_steps is not None else step_failed(messages, i, failed)
        if skip_failed_steps and bad:
            continue
        ctx = [m if (keep_step_reasoning and j > last_user) else without_thinking(m)
               for j, m in enumerate(messages[:i])]
        out.append(ctx + [messages[i]])
    return out


def whole_run_example(messages: Sequence[dict], *, failed_steps: Sequence[bool] | None = None,
                      failed: FailedPredicate | None = None) -> list[dict]:
    """A whole run as one example, as Machine's wholeRunExample builds it.

    Every assistant message after the last user message carries `trainable` (False for steps
    whose tool calls all failed); other messages carry none (a trainer using tinker-cookbook's
    CUSTOMIZED mode treats a missing flag as False). Messages up to the last user message lose
    their reasoning.

    Args:
        messages: the chat conversation.
        failed_steps: which messages are failed steps (default None: judged with `failed`).
        failed: the failed-tool predicate (default None: `default_failed`).

    Returns:
        The example's messages.
    """
    last_user = _last_user(messages)
    out = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and i > last_user:
            bad = failed_steps[i] if failed_steps is not None else step_failed(messages, i, failed)
            out.append({**m, "trainable": not bad})
        else:
            out.append(without_thinking(m) if i <= last_user else m)
    return out


def whole_runs_for(base_model: str) -> bool:
    """Whether a base model's training data can be whole runs (verified by Machine for Inkling's renderer).

    Args:
        base_model: the model to be trained.

    Returns:
        True for Inkling models.
    """
    return base_model.startswith("thinkingmachines/Inkling")


def tool_specs(tools: Iterable[dict] | None) -> list[dict]:
    """Tools as export-line ToolSpecs.

    Args:
        tools: Machine tools (`inputSchema`), ToolSpecs, or OpenAI `{type: "function", function:
            {…}}` declarations (None: none). A key set to None (as a frame read back through
            pyarrow gives every tool every key) counts as absent.

    Returns:
        `[{name, description, parameters}]` (parameters: the input JSON schema).

    Raises:
        ValueError: a tool that is not an object or has no string name, naming its index.
    """
    out = []
    for i, t in enumerate(tools or []):
        f = t.get("function", t) if isinstance(t, Mapping) and t.get("type") == "function" else t
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
            raise ValueError(f"tools[{i}] ({str(t)[:60]}) needs a string 'name': give each tool as "
                             "{'name', 'description', 'inputSchema'} (Machine's), a ToolSpec or an OpenAI "
                             "function declaration")
        schema = next((f[k] for k in ("parameters", "inputSchema", "input_schema") if f.get(k) is not None),
                      {"type": "object"})
        out.append({"name": f["name"], "description": f.get("description") or "", "parameters": schema})
    return out


def uniform_content(lines: list[dict]) -> list[dict]:
    """Make every message's content the same kind across all lines: all strings, or, when any
    message carries parts (reasoning), all parts: a string becomes one text part, "" included
    (no part at all renders differently); other content (None beside tool calls) is kept.

    A dataset loader (Hugging Face `datasets`, which FromConversationFileBuilder uses) needs one
    type per field across the whole file; mixing strings and part lists breaks it.

    Args:
        lines: training lines.

    Returns:
        The lines (copies where content changed).
    """
    if not any(isinstance(m.get("content"), list) for line in lines for m in line["messages"]):
        return lines
    out = []
    for line in lines:
        msgs = [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str)
                else m for m in line["messages"]]
        out.append({**line, "messages": msgs})
    return out


def run_records(runs: Any) -> list[dict]:
    """The Run records of runs in any of the forms the API takes.

    Args:
        runs: a load_runs DataFrame (its `run` column; without one, the run files its `path`
            column names), a row (Series or dict; a row without `run`, or whose `run` is not a
            record, as in a frame saved as CSV, read from its `path`), or a list of rows or Run
            dicts.

    Returns:
        The Run dicts, in order.

    Raises:
        ValueError: a frame with neither a `run` nor a `path` column, or a row whose `run` is not
            a record and that has no `path`.
        MachineFormatError: a run file read from `path` that is missing or bad.
    """
    if hasattr(runs, "columns"):
        from ..store.records import load_run_records

        return load_run_records(runs) if len(runs) else []
    if hasattr(runs, "to_dict") or (isinstance(runs, dict)):
        return [_row_record(runs)]
    return [_row_record(r) if isinstance(r, dict) or hasattr(r, "to_dict") else r for r in runs]


def _row_record(item: Any) -> dict:
    """The Run record of one item: a load_runs row (Series or dict: its `run`, else the file its
    `path` names: a row without `run`, or whose `run` is not a record, as a frame saved as CSV
    holds it as text) or a Run dict (a dict with no `run` key)."""
    row = item if isinstance(item, dict) else dict(item)
    if isinstance(row.get("run"), dict):
        return row["run"]
    if "run" not in row and isinstance(item, dict):
        return row  # a Run dict
    if isinstance(row.get("path"), str):
        from ..store.workspace import read_run

        return read_run(row["path"])
    if "run" in row:
        raise ValueError(f"a row's `run` is not a Run record ({type(row['run']).__name__}) and the row has no "
                         "`path` to read it from: load the runs again with load_runs")
    return row


def training_lines(runs: Any, machine: dict | str | None = None, *, tools: Iterable[dict] | None = None,
                   whole_runs: bool | None = None, base_model: str | None = None,
                   reasoning: bool | Callable[[str], str] = True, instructions: str | None = None,
                   failed: FailedPredicate | None = None, workspace: str | os.PathLike | None = None) -> list[dict]:
    """Training lines (Machine's ExportLine) from selected runs.

    Each line: `{"messages", "tools"? (when the machine has tools), "machine", "run", "score",
    "whole_run"?: true}`. One line per assistant step (see `step_examples`; harnesses in
    RESENDS_REASONING keep earlier steps' reasoning), or with whole runs one line per run of such
    a harness (see `whole_run_example`); runs of other harnesses still give step lines.

    Args:
        runs: the runs to export: a load_runs frame (e.g. select_runs' result), a row, or Run dicts.
        machine: the machine's definition dict or name (its definition read from `workspace`).
            Default None: the machine all of `runs` belong to, its definition read from the
            workspace they were loaded from when it has one (only its name otherwise); runs of
            several machines use no definition.
        tools: tool declarations (Machine tools or ToolSpecs); default None: the machine's.
        whole_runs: one line per whole run. Default None: `whole_runs_for(base_model)` when
            base_model is given, else False. True with a non-Inkling base model (base_model, else
            the machine's model) is an error: Machine verified whole runs only for Inkling's renderer.
        base_model: the model to be trained (default None: the machine's model where needed).
        reasoning: True (default) keeps reasoning as thinking parts (rewritten by the definition's
            `transform_reasoning` function when it has one, Machine's transformReasoning); False
            drops it; a function rewrites it.
        instructions: the system message; default None: the machine's instructions, else each
            run's own.
        failed: the failed-tool predicate (default None: `default_failed`).
        workspace: where a machine given by name is defined (default None: the runs' workspace).

    Returns:
        The lines, with uniform content (see `uniform_content`).
    """
    mdef = resolve_machine(machine, workspace, runs=runs, undefined="name" if machine is None else "raise")
    if whole_runs is None:
        whole_runs = bool(base_model) and whole_runs_for(base_model)
    elif whole_runs and base_model is None and isinstance(mdef.get("model"), str) \
            and not mdef["model"].startswith("tinker://"):  # a checkpoint's base is not known here
        base_model = mdef["model"]  # the machine's model is the one to be trained
    if whole_runs and base_model and not whole_runs_for(base_model):
        raise ValueError(f"whole_runs is verified only for Inkling base models (thinkingmachines/Inkling…), "
                         f"not {base_model!r}: export step examples instead (whole_runs=False).")
    if reasoning is True and callable(mdef.get("transform_reasoning")):
        reasoning = mdef["transform_reasoning"]
    specs = tool_specs(tools if tools is not None else mdef.get("tools"))
    system = instructions if instructions is not None else mdef.get("instructions")
    extra = {"tools": specs} if specs else {}
    lines: list[dict] = []
    for run in run_records(runs):
        name = mdef.get("name") or run.get("machine")
        score = (run.get("scorecard") or {}).get("total")
        msgs, flags = _conversation(run, system, reasoning, failed)
        resends = run.get("harness") in RESENDS_REASONING
        if whole_runs and resends:
            lines.append({"messages": whole_run_example(msgs, failed_steps=flags), **extra,
                          "machine": name, "run": run.get("id"), "score": score, "whole_run": True})
            continue
        for example in step_examples(msgs, failed_steps=flags, keep_step_reasoning=resends):
            lines.append({"messages": example, **extra, "machine": name, "run": run.get("id"), "score": score})
    return uniform_content(lines)


def estimate_tokens(lines: Iterable[dict]) -> int:
    """An ESTIMATE (not a count) of the tokens a training file holds, by Machine's rule.

    Characters of the messages and tool declarations as compact JSON (JavaScript's
    JSON.stringify lengths, UTF-16 units; a lone surrogate counts as its 6-character escape),
    divided by 2.5: a deliberate over-estimate, kept from Machine (how far it is from exact
    counts: benchmarks/bench_tokens.py). Exact counts come from `machine_nb.count_tokens`.

    Args:
        lines: training lines (`messages`, `tools`?).

    Returns:
        The estimated tokens, rounded up.
    """
    def units(value: Any) -> int:
        s = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        if s.isascii():
            return len(s)
        # JSON.stringify writes a lone surrogate (half a character) as a 6-character \uXXXX escape
        return len(s.encode("utf-16-le", "surrogatepass")) // 2 + 5 * len(_SURROGATE.findall(s))

    total = 0
    for line in lines:
        total += units(line["messages"]) + (units(line["tools"]) if line.get("tools") else 0)
    return math.ceil(total / 2.5)


# ---------------------------------------------------------------------------------------------
# held-out inputs and tagged rows


class HeldOutExcluded(UserWarning):
    """Training data was left out because its input is a held-out case (never shown to a trainer)."""


def case_key(text: Any) -> str:
    """How inputs are compared against held-out cases: as validate compares prompts
    (core.chat.text_key: Unicode spelling, invisible characters, case and whitespace runs set
    aside), so "What is 2 + 2?" and "what is 2 + 2? " are the same case, and "Café?" with its é as
    e + accent.

    Args:
        text: the input.

    Returns:
        The key.
    """
    return text_key(str(text))


def one_or_many(values: Any) -> Any:
    """A lone string (or case dict) as a list of one, so a single name is not read as its
    characters (or a dict as its keys); anything else as given.

    Args:
        values: a string, a dict, or an iterable of them.

    Returns:
        `[values]` for a str or dict, else `values`.
    """
    return [values] if isinstance(values, (str, dict)) else values


def held_out_keys(exclude: Iterable[Any] | None) -> set[str]:
    """The case keys of held-out cases.

    Args:
        exclude: strings, `{input}` dicts or a load_cases frame; a single string or dict is one
            case (None: none).

    Returns:
        The set of case_key values.

    Raises:
        ValueError: a case dict without an "input", a case whose input is missing (None, NaN),
            naming it, or a frame without an `input` column (its column names are not cases).
    """
    if exclude is None:
        return set()
    if hasattr(exclude, "columns"):
        if "input" not in exclude.columns:
            raise ValueError(f"the held-out cases frame has no 'input' column (columns: {list(exclude.columns)}): "
                             "pass a load_cases frame, or the case inputs as a list of strings")
        exclude = list(exclude["input"])
    keys = set()
    for i, e in enumerate(one_or_many(exclude)):
        if isinstance(e, dict) and "input" not in e:
            raise ValueError(f"held-out case {i} ({str(e)[:60]}) has no 'input': give the case's input text, "
                             "or a {'input': ...} dict")
        text = e["input"] if isinstance(e, dict) else e
        if text is None or (isinstance(text, float) and text != text):  # an empty cell: no case to hold out
            raise ValueError(f"held-out case {i} has no input (an empty cell, or null): every held-out case needs "
                             "its input text")
        keys.add(case_key(text))
    return keys


def say_excluded(n: int, total: int, what: str, source: str) -> None:
    """One HeldOutExcluded warning saying how many of `total` were left out and why (none when n is 0).

    Args:
        n: how many were left out.
        total: how many there were.
        what: what they are ("run(s)", "tagged row(s)", …).
        source: where the held-out cases came from.
    """
    if n:
        import warnings

        warnings.warn(HeldOutExcluded(
            f"left out {n} of {total} {what} whose input is a held-out case ({source}): held-out cases are "
            "never trained on, so the measurement on them stays honest"), stacklevel=user_stacklevel())


class TaggedLines(list):
    """Training lines from tag rows (a list, ready for `write_jsonl` or `sft`), plus what was left out.

    excluded: the tag rows left out because their input is a held-out case.
    skipped: (row, reason) for rows not trained on for another reason (another tag, another
    machine, no assistant reply, a message that is not an object, a duplicate of an earlier row).
    """

    def __init__(self, lines: Iterable[dict] = (), excluded: list[dict] | None = None,
                 skipped: list[tuple[dict, str]] | None = None):
        super().__init__(lines)
        self.excluded = list(excluded or [])
        self.skipped = list(skipped or [])


def tag_rows(frame: Any) -> list[Any]:
    """The tag rows of a frame: its `row` column (a tagged() frame; one read back through pyarrow
    holds numpy arrays and None-filled keys) or its own rows, each as core.chat.frame_rows reads
    it.

    Args:
        frame: a tagged() frame, one saved and read back, or a frame of tag rows.

    Returns:
        The rows as dicts; a `row` value that is not a dict kept as it is (its reader skips it as
        a row with no messages).
    """
    if "row" not in frame.columns:
        return list(frame_rows(frame))
    import pandas as pd

    given = list(frame["row"])
    dicts = [dict(r) for r in given if isinstance(r, Mapping)]
    plain = iter(frame_rows(pd.DataFrame(dicts)) if dicts else ())
    return [next(plain) if isinstance(r, Mapping) else r for r in given]


def tagged_lines(rows: Any, machine: dict | str | None = None, *, workspace: Any = None,
                 exclude: Iterable[Any] | None = None, instructions: str | None = None,
                 include: Iterable[str] = ("good",)) -> TaggedLines:
    """Training lines from tag-store rows (what `/good`, `/good --as` and `/good --trace` saved).

    Args:
        rows: a `tagged()` DataFrame (its `row` column; also one saved and read back, e.g. as
            Parquet), a DataFrame of tag rows (an empty cell is a field the row lacks), or tag row
            dicts.
        machine: a machine name (its definition is read from `workspace`) or a definition dict
            (`name`, `instructions`, `holdout`, as load_machine returns). Rows that name another
            machine are skipped; rows that name none are kept only when machine is None (left
            out otherwise, with one warning saying how many).
            Default None: every row, no instructions, no held-out cases known.
        workspace: where a machine given by name is defined (default None: only its name is known).
        exclude: held-out cases whose inputs are never trained on (strings, `{input}` dicts or a
            load_cases frame; one string is one case). Default None: the machine's holdout cases.
            `()` excludes nothing.
            Rows left out are listed in `.excluded` and counted in one HeldOutExcluded warning.
        instructions: the system message each line starts with (tag rows store only the turn).
            Default None: the machine's instructions (what it runs with), none when unknown;
            "" adds none.
        include: tags to train on, or one tag (default ("good",): /bad rows keep the rejected
            shape out of SFT).

    Returns:
        A TaggedLines list of `{"messages", "machine"?, "run"?, "tag_id"}` lines: one per row,
        trained on its last assistant message (a rewrite's answer for `/good --as` rows). A row
        whose messages repeat an earlier row's (the turn tagged twice, a row copied into another
        store file) gives no second line: it is listed in `.skipped` as a duplicate.
    """
    if hasattr(rows, "columns"):  # each row without its empty cells, its arrays as lists (frame_rows)
        rows = tag_rows(rows)
    mdef = resolve_machine(machine, workspace)
    name = mdef.get("name")
    held = held_out_keys(mdef.get("holdout") if exclude is None else exclude)
    system = mdef.get("instructions") if instructions is None else instructions
    wanted = set(one_or_many(include))
    lines, excluded, skipped = [], [], []
    first: dict[str, Any] = {}  # messages as canonical JSON -> the id of the first row with them
    unnamed = 0  # rows of a wanted tag left out for naming no machine
    for row in rows:
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list):
            skipped.append((row, "no messages"))
            continue
        stray = next((i for i, m in enumerate(msgs) if not isinstance(m, dict)), None)
        if stray is not None:  # a hand-edited row: no line can be made of it
            skipped.append((row, f"messages[{stray}] is not a message object"))
            continue
        if row.get("tag") not in wanted:
            skipped.append((row, f"tag {row.get('tag')!r} is not trained on"))
            continue
        if name is not None and row.get("machine") != name:
            skipped.append((row, f"machine {row.get('machine')!r}, not {name!r}"))
            unnamed += row.get("machine") is None
            continue
        if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in msgs):
            skipped.append((row, "no assistant reply"))
            continue
        key = json.dumps(msgs, sort_keys=True, ensure_ascii=False, default=str)
        if key in first:  # the turn tagged twice, or a row copied into another file: trained on once
            skipped.append((row, f"duplicate of tag row {first[key]!r}"))
            continue
        first[key] = row.get("id")
        users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
        if held and any(case_key(content_text(m.get("content"))) in held for m in users):
            excluded.append(row)
            continue
        chat = [dict(m) for m in msgs]
        if system and not (chat and chat[0].get("role") == "system"):
            chat = [{"role": "system", "content": system}] + chat
        line: dict[str, Any] = {"messages": chat}
        for key in ("machine", "run"):
            if row.get(key) is not None:
                line[key] = row[key]
        line["tag_id"] = row.get("id")
        lines.append(line)
    if unnamed:
        import warnings

        warnings.warn(f"left out {unnamed} tag row(s) that name no machine (Machine's own /good rows record none), "
                      f"training only on rows tagged for {name!r}: pass machine=None to train on every row",
                      stacklevel=user_stacklevel())
    say_excluded(len(excluded), len(excluded) + len(lines), "tagged row(s)",
                 f"{name}'s holdout.json" if exclude is None and name else "the exclude list")
    return TaggedLines(uniform_content(lines), excluded, skipped)
