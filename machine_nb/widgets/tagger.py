"""Tagger: step through runs and their turns and mark each good / bad / good-with-a-rewrite.

Every click writes one row through `machine_nb.tag()` (store/tags.py decides the row's shape
and file, exactly as Machine's /good and /bad do); "Undo last" removes, through `untag()`, only
a row this widget wrote. Which runs to tag is RunPicker's job: `Tagger(picker)` follows its
selection. A turn's existing tags (read once from the store through `tagged()`, matched by machine
and run id) are shown, and a button that would add another row for a tagged turn asks for a
second click first.
"""

from __future__ import annotations

import html
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as w
import numpy as np

from ..core.chat import content_text
from ..core.redact import redacted, secret_values
from ..errors import MachineFormatError, user_stacklevel
from ..core.theme import FG_MUTED, GREEN, GREY, ORANGE, RED, text_colour
from ._base import FollowsPicker, NoMathHTML, diff_html, strong_button, style_sheet, word_diff, StaticFallback, escape
from .cards import text_html

# Rows listed under "recently tagged" (the newest first).
RECENT = 5
# Characters of the answer shown in the recent list (enough to recognise it).
PREVIEW_CHARS = 60
# The tagger's keys (pressed with the tagger focused: click in it first; not while typing in the
# note or rewrite box), modelled on the previewer's arrow keys: key -> what its button does.
KEYS = {"ArrowLeft": "prev_run", "ArrowRight": "next_run", "ArrowUp": "prev_turn", "ArrowDown": "next_turn",
        "g": "good", "b": "bad", "w": "rewrite", "u": "undo"}
KEYS_HINT = "keys (click the tagger first): ← → run · ↑ ↓ turn · g good · b bad · w good with rewrite · u undo"
# Characters of a stored rewrite shown in the "already tagged" line.
REWRITE_CHARS = 120


# ---------------------------------------------------------------- pure helpers over plain data

def run_messages(run: dict) -> list[dict]:
    """A Run's messages in order: history (earlier turns) then trajectory (this run's turn), the
    same order `machine_nb.messages()` numbers them.

    Args:
        run: a Run record.

    Returns:
        The messages.
    """
    return list(run.get("history") or []) + list(run.get("trajectory") or [])


def _text(content: Any) -> str:
    """A message's text as the tagger shows it: text parts joined by newlines."""
    return content_text(content, sep="\n")


def split_turns(messages: Sequence[dict]) -> list[dict]:
    """The turns of a conversation: each starts at a user message and runs to the next one.

    Args:
        messages: the conversation's messages.

    Returns:
        One dict per turn: start (index of the user message; 0 when the conversation opens
        without one), end (exclusive), user (its text), answer (the text of the turn's last
        assistant message that is not a tool call; "" when the turn has none), answer_index (None
        then) and steps (the messages between the user message and the answer: tool calls and results).
    """
    if not messages:
        return [{"start": 0, "end": 0, "user": "", "answer": "", "answer_index": None, "steps": []}]
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not starts or starts[0] != 0 and any(m.get("role") == "assistant" for m in messages[:starts[0]]):
        starts = [0] + starts  # an opening without a user message is a turn of its own
    turns = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(messages)
        span = range(start, end)
        answers = [i for i in span if messages[i].get("role") == "assistant"
                   and not messages[i].get("toolInput") and not messages[i].get("tool_calls")
                   and _text(messages[i].get("content")).strip()]
        answer_index = answers[-1] if answers else None
        first = start + 1 if messages[start].get("role") == "user" else start
        last = answer_index if answer_index is not None else end
        turns.append({
            "start": start, "end": end,
            "user": _text(messages[start].get("content")) if messages[start].get("role") == "user" else "",
            "answer": _text(messages[answer_index].get("content")) if answer_index is not None else "",
            "answer_index": answer_index,
            "steps": [messages[i] for i in range(first, last)],
        })
    return turns


def turn_run(run: dict, messages: Sequence[dict], turn: dict) -> dict:
    """The Run record cut at the end of a turn: earlier messages become history, the turn is the
    trajectory. For the run's last turn this is the run itself (its ids and machine kept), so
    `tag()` records the turn with its run's provenance, as Machine's /good does for a session.

    Args:
        run: the Run record.
        messages: its messages (run_messages).
        turn: one of split_turns' turns.

    Returns:
        The cut Run record.
    """
    return {**run, "history": list(messages[:turn["start"]]),
            "trajectory": list(messages[turn["start"]:turn["end"]])}


def rewrite_diff(original: str, rewrite: str) -> list[tuple[str, str]]:
    """The word-level difference between a reply and its rewrite (see `word_diff`).

    Args:
        original: the turn's reply.
        rewrite: the answer written to replace it.

    Returns:
        (op, text) pieces in order, op "same", "removed" (in the reply only) or "added" (in the
        rewrite only).
    """
    return word_diff(original, rewrite)


def rewrite_diff_html(original: str, rewrite: str) -> str:
    """rewrite_diff as HTML: removed words struck through in red, added ones underlined in green."""
    if not rewrite.strip():
        return ""
    parts = diff_html(rewrite_diff(original, rewrite))
    return (f'<div class="mnb-rewrite-diff" style="white-space:pre-wrap;overflow-wrap:anywhere;margin:2px 0">'
            f'<b>rewrite vs reply</b>: {parts}</div>')


class DuplicateTagWarning(UserWarning):
    """A tag row was written for a turn that already had one."""


def row_run(row: dict) -> tuple[Any, Any]:
    """The run a tag row names.

    Args:
        row: a tag row.

    Returns:
        (machine, run id): its `machine` and `run` keys (else the id of a `source` of `<id>.json`).
    """
    rid = row.get("run")
    if not isinstance(rid, str):
        src = row.get("source")
        rid = src[:-5] if isinstance(src, str) and src.endswith(".json") else None
    return row.get("machine"), rid


def row_user(row: dict) -> str:
    """The text of a tag row's last user message (the turn it tags).

    Args:
        row: a tag row.

    Returns:
        The text ("" without one).
    """
    for m in reversed(row.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return _text(m.get("content"))
    return ""


def tags_turn(row: dict, turn: dict) -> bool:
    """Whether a tag row of a turn's run is about that turn.

    A row keeps the turn's user message and its reply (a rewrite row the reply it replaced), not
    the turn's place, so both are compared: turns that repeat a user text ("continue") differ by
    their replies. A row without the reply it replaced matches by the user text alone. Texts are
    compared trimmed: `tag()` stores them trimmed, as Machine does, while a typed message often
    ends in a newline.

    Args:
        row: a tag row of the run.
        turn: one of split_turns' turns.

    Returns:
        True when the row's user text and reply are the turn's.
    """
    from ..store.tags import REPLACED

    if row_user(row).strip() != turn["user"].strip():
        return False
    answer = turn["answer"].strip()
    if row.get("rewritten"):
        replaced = row.get(REPLACED)
        return replaced is None or _text(replaced).strip() == answer
    msgs = [m for m in row.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"
            and _text(m.get("content")).strip()]
    return not msgs or _text(msgs[-1].get("content")).strip() == answer


def same_run(row: dict, run: dict) -> bool:
    """Whether a tag row is about a run (ids repeat across machines, so the machine counts too).

    Args:
        row: a tag row (`run`/`source`, `machine` keys).
        run: a Run record (`id`, `machine`).

    Returns:
        True for the same id and, when both name one, the same machine.
    """
    machine, rid = row_run(row)
    if rid is None or str(rid) != str(run.get("id")):
        return False
    return machine is None or run.get("machine") is None or str(machine) == str(run.get("machine"))


def store_rows(store: Any) -> list[dict]:
    """Every tag row of a store, read through `tagged()`.

    Args:
        store: the store directory; None for `store_dir()` (as `tag()` defaults).

    Returns:
        The parsed rows in file order; [] when the store does not exist yet.

    Raises:
        MachineFormatError: the store kept changing while it was read (tagged() lists the rows,
            then each is read from its line: a file rewritten in between is read again, twice).
    """
    from pathlib import Path

    from ..store.tags import resolve_store, tagged

    root = resolve_store(store)
    tries = 3
    while True:
        if not root.is_dir():
            return []
        frame = tagged(store=root)
        if "row" not in frame.columns:
            return frame.to_dict("records")
        try:
            return [r for r in frame["row"] if isinstance(r, dict)]
        except MachineFormatError:  # another writer rewrote a store file since tagged() listed it
            tries -= 1
            if not tries:
                raise


class _Runs(Sequence):
    """The runs a Tagger steps through. From a load_runs frame the records are read one at a time,
    when shown (an indexed frame's `run` column reads each from its file), and (machine, id) come
    from the frame's own columns, so following a picker over a million runs reads only what is
    on screen."""

    def __init__(self, column: Any, keys: list[tuple[Any, Any]]):
        self._column, self.keys = column, keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        record = self._column.iloc[i] if hasattr(self._column, "iloc") else self._column[i]
        if not isinstance(record, dict):
            raise ValueError(f"Tagger: run {i} is a {type(record).__name__}, not a Run record (dict)")
        return record


def _records(runs: Any) -> _Runs:
    """The runs of a load_runs frame (its `run` column, read on demand), one row, a Run dict or a list."""
    if hasattr(runs, "columns"):
        if "run" not in runs.columns:
            raise ValueError("Tagger needs load_runs' `run` column (the parsed Run records); "
                             f"the frame has {list(runs.columns)}")
        if {"machine", "id"} <= set(runs.columns):
            keys = list(zip(runs["machine"].tolist(), runs["id"].tolist()))
            return _Runs(runs["run"], keys)
        records = list(runs["run"])
    elif isinstance(runs, dict):
        records = [runs]
    else:
        records = list(runs)
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"Tagger: run {i} is a {type(r).__name__}, not a Run record (dict)")
    return _Runs(records, [(r.get("machine"), r.get("id")) for r in records])


# ---------------------------------------------------------------- the widget

class Tagger(FollowsPicker, StaticFallback, w.VBox):
    """Step through runs and turns; Good / Bad / Good with rewrite (+ note) write through `tag()`.

    Args:
        runs: a load_runs DataFrame (or `RunPicker.selected`), a Run dict, a list of them, or a
            RunPicker to follow (its picked runs; see `link`).
        store: the tag store passed to `tag()`/`untag()` and read for existing tags. Default
            None: the library's default store for this project (as `tag()` itself defaults).
        trace: passed to `tag()`. Default False: the turn's user message and final answer, as /good.
        **kwargs: passed to ipywidgets.VBox (layout, …).

    The run on screen is read once (an indexed frame reads it from its run file) and kept until
    another run is shown; its texts are shown redacted and cut when huge (cards.text_html), the rows
    written keep them as they are. A run that cannot be read (its file gone or broken since the
    frame was loaded) is shown with the reason and is not tagged. `.written` lists the rows this
    widget wrote that are still in the store (oldest first; a row `untag()` removed anywhere in this
    process leaves it); `undo()` removes the newest of them from the store and never touches any
    other row (one another process removed meanwhile is forgotten, and said so). `existing_tags()`
    lists the current run's tag rows (a rewrite row with its stored answer). A button press on a turn that already
    has a row only warns; pressing it again writes (the methods `good()` / `bad()` write at once,
    with a DuplicateTagWarning). A rewrite identical to the turn's reply is refused.

    One store, every view: rows written or removed by any `tag()` / `untag()` in this process (another
    Tagger, a cell) show here at once, and a RunPicker this tagger follows is lent its store, so
    the picker's tags column and "(untagged)" filter follow the buttons.

    Keys (the tagger focused: click in it; not while typing in a text box): ← / → previous /
    next run, ↑ / ↓ previous / next turn, g Good, b Bad, w Good with rewrite, u Undo last.
    """

    def __init__(self, runs: Any, *, store: Any = None, trace: bool = False, **kwargs: Any) -> None:
        from .previewer import is_picker

        picker = runs if is_picker(runs) else None
        if picker is not None:
            self._check_picker(picker)
        self._runs = _Runs([], []) if picker is not None else _records(runs)
        if picker is None and not self._runs:
            raise ValueError("Tagger: no runs to tag (the frame is empty)")
        self._frame_tags = self._tags_column(runs) if picker is None else {}
        self.store = store
        self.trace = trace
        self.written: list[dict] = []
        self.picker = None
        self._picker_handler: Callable | None = None
        self._known: list[dict] | None = None  # the store's rows, read on first need
        self._confirm: tuple | None = None  # (run, turn, button) a first press warned about
        self._run_pos = 0
        self._run_error = ""  # why the run on screen could not be read ("" when it was)
        self._run: dict | None = self._read(0) if self._runs else None  # the run on screen, read once
        self._msgs = run_messages(self._run) if self._run is not None else []
        self._turns = split_turns(self._msgs)
        self._turn_pos = len(self._turns) - 1  # the run's own turn, as go_to opens it

        def button(desc: str, tip: str, style: str = "", icon: str = "") -> w.Button:
            return strong_button(w.Button(description=desc, tooltip=tip, button_style=style, icon=icon,
                                          layout=w.Layout(width="auto")))

        self._b_prev_run = button("‹ run", "previous run (← key)")
        self._b_next_run = button("run ›", "next run (→ key)")
        self._b_prev_turn = button("‹ turn", "previous turn of this run (↑ key)")
        self._b_next_turn = button("turn ›", "next turn of this run (↓ key)")
        self._b_good = button("Good", "tag this turn good (g key)", "success", "thumbs-up")
        self._b_bad = button("Bad", "tag this turn bad (b key)", "danger", "thumbs-down")
        self._b_rewrite = button("Good with rewrite", "tag good with the answer replaced by the rewrite (w key)", "info")
        self._b_undo = button("Undo last", "remove the last row this tagger wrote (u key)", "warning", "undo")
        # width auto (stretched by the box), not 100%: 100% plus the widget's own margins overflowed the cell
        self.note = w.Text(placeholder="note (optional)", layout=w.Layout(width="auto", max_width="100%"))
        self.rewrite = w.Textarea(placeholder="the answer you want the model to learn",
                                  layout=w.Layout(width="auto", max_width="100%", height="6em"))
        self._header = NoMathHTML()
        self._turn_view = NoMathHTML()
        self._recent = NoMathHTML()
        self._status = NoMathHTML()
        self._diff = NoMathHTML()  # the rewrite against the reply, as it is typed
        self.rewrite.observe(lambda _: self._show_diff(), names="value")
        self._b_prev_run.on_click(lambda _: self.prev_run())
        self._b_next_run.on_click(lambda _: self.next_run())
        self._b_prev_turn.on_click(lambda _: self.prev_turn())
        self._b_next_turn.on_click(lambda _: self.next_turn())
        self._b_good.on_click(lambda _: self._press("Good", self.good, self.note.value or None))
        self._b_bad.on_click(lambda _: self._press("Bad", self.bad, self.note.value or None))
        self._b_rewrite.on_click(lambda _: self._press("Good with rewrite", self.good_with_rewrite,
                                                       self.rewrite.value, self.note.value or None))
        self._b_undo.on_click(lambda _: self._guarded(self.undo))
        from .previewer import KeyPager

        self._keys = KeyPager(target=".mnb-tagger-live", key_names=list(KEYS))
        self._keys.on_msg(self._on_key)
        hint = NoMathHTML(f'<span class="mnb-tagger-keys" style="color:{FG_MUTED};font-size:90%">{escape(KEYS_HINT)}</span>')
        children = [
            w.HBox([self._b_prev_run, self._b_next_run, self._b_prev_turn, self._b_next_turn, self._header]),
            self._turn_view, self.note, self.rewrite, self._diff,
            w.HBox([self._b_good, self._b_bad, self._b_rewrite, self._b_undo, self._status]),
            self._recent, hint, self._keys, style_sheet(),
        ]
        super().__init__(children=children, **kwargs)
        self.add_class("mnb-tagger-live")
        from ..store.tags import observe_store

        self._stop_following = observe_store(self._on_store)
        if picker is not None:
            self.link(picker)
        else:
            self._draw()

    def close(self) -> None:
        """Stop following the tag store and the picker (which stays open) and close the tagger
        with its controls."""
        stop, self._stop_following = getattr(self, "_stop_following", None), None  # None: half-made
        if stop is not None:
            stop()
        super().close()

    def _show_diff(self) -> None:
        answer = self._turns[self._turn_pos]["answer"] if self._runs else ""
        self._diff.value = rewrite_diff_html(answer, self.rewrite.value or "")

    def _on_key(self, _widget: Any, content: dict, _buffers: Any) -> None:
        """A key pressed in the tagger (see KEYS): what its button does."""
        action = KEYS.get(content.get("key")) if isinstance(content, dict) else None
        button = {"prev_run": self._b_prev_run, "next_run": self._b_next_run, "prev_turn": self._b_prev_turn,
                  "next_turn": self._b_next_turn, "good": self._b_good, "bad": self._b_bad,
                  "rewrite": self._b_rewrite, "undo": self._b_undo}.get(action)
        if button is not None and not button.disabled:
            button.click()

    @staticmethod
    def _tags_column(runs: Any) -> dict[tuple, list[str]]:
        """(machine, id) -> the `tags` column of a load_runs frame, when it has one."""
        if not hasattr(runs, "columns") or "tags" not in runs.columns or "id" not in runs.columns:
            return {}
        machines = runs["machine"] if "machine" in runs.columns else [None] * len(runs)
        return {(str(m), str(i)): [str(x) for x in t] for m, i, t in zip(machines, runs["id"], runs["tags"])
                if isinstance(t, (list, tuple, np.ndarray)) and len(t)}  # an array: a list read back from parquet

    # ------------------------------------------------------------ following a picker

    @staticmethod
    def _check_picker(picker: Any) -> None:
        """Refuse a picker whose runs cannot be tagged, before its selection reaches the tagger
        (a refusal there would fail the picker's click)."""
        frame = getattr(picker, "runs", None)
        if hasattr(frame, "columns") and "run" not in frame.columns:
            raise ValueError("Tagger needs load_runs' `run` column (the parsed Run records) in the picker's frame; "
                             f"it has {list(frame.columns)}: make the RunPicker from load_runs(...) with `run` kept")

    def link(self, picker: Any) -> Callable:
        """Follow a RunPicker: tag the runs of `picker.selected`, now and at every change of its
        selection (a newly picked run is shown). `unlink()` stops following.

        Args:
            picker: the RunPicker.

        Returns:
            The handler `picker.observe_selection` registered.

        Raises:
            ValueError: the picker's frame has no `run` column (its runs could not be tagged).
        """
        self._check_picker(picker)
        self.unlink()
        self.picker = picker
        if getattr(picker, "store", None) is None and hasattr(picker, "follow_store"):
            picker.follow_store(self.store)  # one store: the picker's tags column shows what this tags
        self._picker_handler = picker.observe_selection(self.set_runs)
        self.set_runs(picker.selected)
        return self._picker_handler

    def set_runs(self, runs: Any) -> None:
        """Tag other runs: a newly added run is shown first, else the run on screen when it is still
        there (at the turn shown, with the note and rewrite typed so far).

        Args:
            runs: a load_runs frame or Run dicts (may be empty).
        """
        before = set(self._runs.keys) if self._runs else set()
        on_screen = self._runs.keys[self._run_pos] if self._runs else None
        records = _records(runs) if len(runs) else _Runs([], [])
        self._frame_tags = self._tags_column(runs)
        self._runs = records
        keys = records.keys
        new = [i for i, k in enumerate(keys) if k not in before]
        pos = new[0] if new else (keys.index(on_screen) if on_screen in keys else 0)
        if records and keys[pos] == on_screen and self._run is not None:
            # the same run stays on screen as it is (turn, note, rewrite): its record is not read again
            self._run_pos = pos
            self._draw()
            return
        self._run = None
        if records:
            self.go_to(pos)
        else:
            self._run_pos, self._run, self._msgs, self._run_error = 0, None, [], ""
            self._turns = split_turns([])
            self._turn_pos = 0
            self._confirm = None
            self._draw()

    # ------------------------------------------------------------ navigation

    def _read(self, pos: int) -> dict:
        """The run at a position, read (from its file, for an indexed frame); a run that cannot be
        read (its file gone or broken since the frame was loaded) is shown as an empty run with
        the reason in `_run_error`, so a picker's click that picked it does not fail."""
        try:
            run, self._run_error = self._runs[pos], ""
            return run
        except (MachineFormatError, ValueError) as exc:
            machine, rid = self._runs.keys[pos]
            self._run_error = redacted(f"could not read run {rid} ({machine}): {exc}")
            return {"id": rid, "machine": machine, "history": [], "trajectory": []}

    def _need_run(self) -> dict:
        if not self._runs or self._run is None:
            raise ValueError("Tagger: no run to tag (select runs in the picker)")
        return self._run

    @property
    def current(self) -> dict:
        """The turn on screen.

        Returns:
            {run_id, machine, run (position), turn (position), n_turns, user, answer}; run_id None
            when there is no run (a picker with nothing picked).
        """
        if not self._runs:
            return {"run_id": None, "machine": None, "run": -1, "turn": -1, "n_turns": 0, "user": "", "answer": ""}
        run, turn = self._need_run(), self._turns[self._turn_pos]
        return {"run_id": run.get("id"), "machine": run.get("machine"), "run": self._run_pos,
                "turn": self._turn_pos, "n_turns": len(self._turns), "user": turn["user"],
                "answer": turn["answer"]}

    def go_to(self, run: int | str, turn: int | None = None) -> None:
        """Show a run at one of its turns.

        Args:
            run: a position, or a run id (text; a numeric id is matched by its text).
            turn: the turn's position (default None: its last turn, the one the run itself answered).
        """
        if not self._runs:
            raise ValueError("Tagger: no run to tag (select runs in the picker)")
        if isinstance(run, str):
            ids = [str(k[1]) for k in self._runs.keys]  # ids of a frame read from CSV are numbers
            if run not in ids:
                raise KeyError(f"Tagger: no run with id {run!r}")
            run = ids.index(run)
        if not 0 <= run < len(self._runs):
            raise IndexError(f"Tagger: run position {run} is outside 0..{len(self._runs) - 1}")
        if run != self._run_pos or self._run is None:  # the run on screen is not read again
            self._run = self._read(run)
        self._run_pos = run
        self._msgs = run_messages(self._run)
        self._turns = split_turns(self._msgs)
        last = len(self._turns) - 1
        self._turn_pos = last if turn is None else max(0, min(turn, last))
        self.rewrite.value = ""
        self.note.value = ""
        self._confirm = None
        self._draw()

    def next_run(self) -> None:
        """Go to the next run (its last turn); stays on the last run."""
        self.go_to(min(self._run_pos + 1, len(self._runs) - 1))

    def prev_run(self) -> None:
        """Go to the previous run (its last turn); stays on the first."""
        self.go_to(max(self._run_pos - 1, 0))

    def next_turn(self) -> None:
        """Go to this run's next turn (stays on the last)."""
        self._turn_pos = min(self._turn_pos + 1, len(self._turns) - 1)
        self._confirm = None
        self._draw()

    def prev_turn(self) -> None:
        """Go to this run's previous turn (stays on the first)."""
        self._turn_pos = max(self._turn_pos - 1, 0)
        self._confirm = None
        self._draw()

    # ------------------------------------------------------------ existing tags

    def _store_rows(self) -> list[dict]:
        if self._known is None:
            try:
                self._known = store_rows(self.store)
            except Exception as exc:  # noqa: BLE001 - an unreadable store must not stop tagging
                self._known = []
                self._status.value = (f'<span style="color:{text_colour(ORANGE)}">could not read the tag store '
                                      f'for existing tags: {escape(exc)}</span>')
        return self._known

    def _on_store(self, store: Any, event: str, row: dict) -> None:
        """A row was written to or removed from some store (by this tagger, another one, or `tag()`
        in a cell): when it is this tagger's store, its known rows and the turn on screen follow."""
        from ..store.tags import same_store

        if not same_store(store, self.store):
            return
        if self._known is None:
            self._store_rows()  # read now, with this row in it
            if event == "untag":
                self._known = [r for r in self._known if r.get("id") != row.get("id")]
        elif event == "tag":
            if all(r.get("id") != row.get("id") for r in self._known):
                self._known.append(row)
        else:
            self._known = [r for r in self._known if r.get("id") != row.get("id")]
        mine = event == "untag" and any(r.get("id") == row.get("id") for r in self.written)
        if mine:  # a row this tagger wrote, removed (its Undo, or untag() anywhere): not listed, counted or undone
            self.written[:] = [r for r in self.written if r.get("id") != row.get("id")]
        if mine or self._runs and self._run is not None and same_run(row, self._run):
            self._draw()

    def existing_tags(self) -> list[dict]:
        """The current run's tag rows in the store (and those this widget wrote).

        Returns:
            One dict per row: id, tag, note, rewrite (the answer a rewrite row stores; "" for the
            others), user (the turn's user text), this_turn (whether it tags the turn on screen).
        """
        if not self._runs:
            return []
        run, turn = self._need_run(), self._turns[self._turn_pos]
        out = []
        for row in self._store_rows():
            if same_run(row, run):
                user = row_user(row)
                msgs = row.get("messages") or []
                rewrite = (_text(msgs[-1].get("content")) if row.get("rewritten") and msgs
                           and isinstance(msgs[-1], dict) else "")
                out.append({"id": row.get("id"), "tag": row.get("tag"), "note": row.get("note") or "",
                            "rewrite": rewrite, "user": user, "this_turn": tags_turn(row, turn)})
        return out

    def _existing_html(self) -> str:
        rows = self.existing_tags()
        key = (str(self.current["machine"]), str(self.current["run_id"]))
        if not rows:
            listed = self._frame_tags.get(key)
            if listed:  # the frame's `tags` (maybe another store): shown, not counted as duplicates
                return (f'<div class="mnb-existing-tags" style="color:{text_colour(ORANGE)}">tags listed for this '
                        f'run: {escape(", ".join(listed))}</div>')
            return ""
        counts: dict[tuple, int] = {}
        for r in rows:
            where = "this turn" if r["this_turn"] else f"turn “{r['user'][:40]}”"
            note = f", note “{r['note'][:60]}”" if r["note"] else ""
            if r["rewrite"]:
                cut = " ".join(r["rewrite"].split())
                note += f", rewrite “{cut[:REWRITE_CHARS]}{'…' if len(cut) > REWRITE_CHARS else ''}”"
            key = (str(r["tag"]), where, note)
            counts[key] = counts.get(key, 0) + 1
        items = [f"{escape(tag)}{f' ×{n}' if n > 1 else ''} ({escape(where)}{escape(note)})"
                 for (tag, where, note), n in counts.items()]
        colour = ORANGE if any(r["this_turn"] for r in rows) else GREY
        return (f'<div class="mnb-existing-tags" style="color:{text_colour(colour)}">already tagged: '
                f'{"; ".join(items)}</div>')

    def _duplicates(self) -> list[dict]:
        return [r for r in self.existing_tags() if r["this_turn"]]

    def _press(self, button: str, fn: Any, *args: Any) -> None:
        """A button: on a turn that already has a row, the first press warns, the second writes."""
        dups = self._duplicates() if self._runs else []
        want = (self._run_pos, self._turn_pos, button)
        if dups and self._confirm != want:
            self._confirm = want
            tags = ", ".join(sorted({str(d["tag"]) for d in dups}))
            self._status.value = (f'<span class="mnb-duplicate" style="color:{text_colour(ORANGE)}">⚠ this turn is '
                                  f'already tagged {escape(tags)} ({len(dups)} row(s)); press '
                                  f'{escape(button)} again to add another row</span>')
            self._static_changed()
            return
        self._confirm = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DuplicateTagWarning)  # the press was the confirmation
            self._guarded(fn, *args)

    # ------------------------------------------------------------ tagging

    def _tag(self, tag: str, note: str | None, rewrite: str | None) -> dict:
        from ..store import tags  # tags.tag: the one writer of tag rows

        write_tag = tags.tag

        run, turn = self._need_run(), self._turns[self._turn_pos]
        if self._run_error:
            raise ValueError(f"{self._run_error}; nothing tagged")
        dups = self._duplicates()
        if turn["answer_index"] is None and not rewrite:
            raise ValueError("this turn has no assistant answer to tag (write a rewrite and use "
                             "'Good with rewrite', or pick another turn)")
        # an unanswered turn is tagged with its rewrite as the answer, and no `replaced` reply
        row = write_tag(turn_run(run, self._msgs, turn), tag=tag, note=note or None, rewrite=rewrite or None,
                        trace=self.trace, store=self.store)
        self.written.append(row)  # the store's rows learn of it through _on_store
        if dups:
            warnings.warn(DuplicateTagWarning(
                f"run {run.get('id')} ({run.get('machine')}): this turn was already tagged "
                f"{', '.join(sorted({str(d['tag']) for d in dups}))}; wrote another {tag} row {row.get('id')}"),
                stacklevel=user_stacklevel())
        self._status.value = f"wrote {escape(tag)} row {escape(row.get('id'))}"
        self.note.value = ""
        self._draw()
        return row

    def good(self, note: str | None = None) -> dict:
        """Tag the turn on screen good.

        Args:
            note: a note kept on the row (default None).

        Returns:
            The row `tag()` wrote.
        """
        return self._tag("good", note, None)

    def bad(self, note: str | None = None) -> dict:
        """Tag the turn on screen bad.

        Args:
            note: a note kept on the row (default None).

        Returns:
            The row `tag()` wrote.
        """
        return self._tag("bad", note, None)

    def good_with_rewrite(self, rewrite: str, note: str | None = None) -> dict:
        """Tag the turn good with its answer replaced by a rewrite (Machine's /good --as); a turn with no
        answer yet is tagged with the rewrite as its answer.

        Args:
            rewrite: the answer the model should learn (not empty, and not the turn's own reply:
                that is a plain Good; whitespace is not a difference).
            note: a note kept on the row (default None).

        Returns:
            The row `tag()` wrote.
        """
        if not (rewrite or "").strip():
            raise ValueError("the rewrite is empty: type the answer you want the model to learn")
        if self._runs and " ".join(rewrite.split()) == " ".join(self._turns[self._turn_pos]["answer"].split()):
            raise ValueError("the rewrite is the reply as it is: edit it into the answer you want, "
                             "or tag the turn Good")
        row = self._tag("good", note, rewrite)
        self.rewrite.value = ""
        return row

    def undo(self) -> dict | None:
        """Remove the newest row this widget wrote (through `untag`). Rows written by anything else are
        never touched.

        Returns:
            The removed row; None when it wrote none (or all are undone).

        Raises:
            KeyError: the newest row is no longer in the store (removed by another process); it is
                forgotten, so the next undo removes the row before it.
        """
        from ..store.tags import store_dir, untag

        if not self.written:
            self._status.value = "nothing to undo"
            return None
        row = self.written[-1]
        try:
            untag(row["id"], store=self.store)  # _on_store drops it from the known rows and from .written
        except KeyError:
            self.written[:] = [r for r in self.written if r.get("id") != row["id"]]
            if self._known is not None:
                self._known = [r for r in self._known if r.get("id") != row["id"]]
            self._draw()
            where = self.store if self.store is not None else store_dir()
            raise KeyError(f"row {row['id']} is no longer in the store at {where} (removed elsewhere); nothing "
                           "was undone, and the next undo removes the row before it") from None
        self.written[:] = [r for r in self.written if r.get("id") != row["id"]]
        self._status.value = f"removed row {escape(row.get('id'))}"
        self._draw()
        return row

    def _guarded(self, fn: Any, *args: Any) -> None:
        """Button handlers: show an error in the widget instead of a traceback in the log."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - shown to the user, who can fix and retry
            # a KeyError's str() is the repr of its message: its message is shown as written
            text = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else exc
            self._status.value = f'<span style="color:{text_colour(RED)}">{escape(type(exc).__name__)}: {escape(text)}</span>'
            self._static_changed()

    # ------------------------------------------------------------ view

    def _header_text(self) -> str:
        c = self.current
        if not self._runs:
            return "no run: select runs in the picker"
        return (f"run {c['run'] + 1} of {len(self._runs)} · {c['run_id']} · {c['machine']} · "
                f"turn {c['turn'] + 1} of {c['n_turns']}")

    def _turn_html(self) -> str:
        if not self._runs:
            return "<p><i>Select runs in the picker to tag them.</i></p>"
        if self._run_error:
            return f'<div class="mnb-tagger-turn" style="color:{text_colour(RED)}">{escape(self._run_error)}</div>'
        turn = self._turns[self._turn_pos]
        secrets = secret_values()  # the run's texts are shown redacted (the saved notebook keeps them)
        steps = ""
        if turn["steps"]:
            items = "".join(
                f"<li><b>{escape(m.get('role'))}</b>{' ' + escape(m.get('name')) if m.get('name') else ''}: "
                f"{text_html(_text(m.get('content')) or str(m.get('toolInput') or ''), secrets, limit=300)}</li>"
                for m in turn["steps"])
            steps = f"<details><summary>{len(turn['steps'])} step(s) before the answer</summary><ul>{items}</ul></details>"
        answer = text_html(turn["answer"], secrets) if turn["answer_index"] is not None else "<i>(no answer)</i>"
        box = "white-space:pre-wrap;overflow-wrap:anywhere;border-left:3px solid {};padding:2px 8px;margin:4px 0"
        return (f'<div class="mnb-tagger-turn">{self._existing_html()}'
                f'<div style="{box.format(GREY)}"><b>user</b>\n{text_html(turn["user"], secrets)}</div>'
                f'{steps}<div style="{box.format(GREEN)}"><b>assistant</b>\n{answer}</div></div>')

    def recent_rows(self) -> list[dict]:
        """The newest rows this widget wrote (at most RECENT), newest first.

        Returns:
            One dict per row: id, tag, note, preview (the answer's first PREVIEW_CHARS characters,
            redacted).
        """
        out = []
        for row in reversed(self.written[-RECENT:]):
            msgs = row.get("messages") or []
            last = _text(msgs[-1].get("content")) if msgs and isinstance(msgs[-1], dict) else ""
            preview = " ".join(redacted(last[:PREVIEW_CHARS + 4096]).split())  # past the cut: a secret across it
            out.append({"id": row.get("id"), "tag": row.get("tag"), "note": row.get("note") or "",
                        "preview": preview[:PREVIEW_CHARS] + ("…" if len(preview) > PREVIEW_CHARS else "")})
        return out

    def _recent_html(self) -> str:
        rows = self.recent_rows()
        if not rows:
            return f'<p style="color:{FG_MUTED}"><i>nothing tagged yet in this tagger</i></p>'
        body = "".join(f"<tr><td>{escape(r['id'])}</td><td>{escape(r['tag'])}</td><td>{escape(r['note'])}</td>"
                       f"<td>{escape(r['preview'])}</td></tr>" for r in rows)
        return ("<p><b>recently tagged</b> (newest first)</p><table class=\"dataframe\"><thead><tr><th>id</th>"
                f"<th>tag</th><th>note</th><th>answer</th></tr></thead><tbody>{body}</tbody></table>")

    def _draw(self) -> None:
        self._header.value = html.escape(self._header_text())
        self._turn_view.value = self._turn_html()
        self._recent.value = self._recent_html()
        self._b_undo.disabled = not self.written
        none = not self._runs
        self._b_prev_run.disabled = none or self._run_pos == 0
        self._b_next_run.disabled = none or self._run_pos == len(self._runs) - 1
        self._b_prev_turn.disabled = none or self._turn_pos == 0
        self._b_next_turn.disabled = none or self._turn_pos == len(self._turns) - 1
        for b in (self._b_good, self._b_bad, self._b_rewrite):
            b.disabled = none
        self._show_diff()  # against the reply of the turn now on screen
        self._static_changed()

    def summary(self) -> str:
        """The widget's state in one line (its text/plain view).

        Returns:
            "Tagger: run i of n, turn j of m, k tagged here".
        """
        c = self.current
        if not self._runs:
            return f"Tagger: no run selected, {len(self.written)} tagged here"
        return (f"Tagger: run {c['run'] + 1} of {len(self._runs)}, turn {c['turn'] + 1} of {c['n_turns']}, "
                f"{len(self.written)} tagged here")

    def static_html(self) -> str:
        """The widget as static HTML (what a report without a kernel shows).

        Returns:
            An HTML fragment: the run and turn on screen, existing tags, status, recent rows.
        """
        status = f"<p>{self._status.value}</p>" if self._status.value else ""
        return (f'<div class="mnb-tagger"><p><b>{escape(self._header_text())}</b> · '
                f'{len(self.written)} tagged here</p>{self._turn_html()}{status}{self._recent_html()}</div>')
