"""ExamplePreviewer: one training example at a time, as chat cards and as the tokens trained on.

The token view renders the line through the model's real tinker-cookbook renderer and colours
each token by its loss weight; a second check renders the generation prompt the model sees at
sampling time before each trained message and flags what training shows that sampling never
does (tinker-cookbook PR #885: `*_disable_thinking` renderers trained on reasoning absent from
the prompt). Which messages are trained follows Machine's export: see `trained_indices`.
A previewer can follow a RunPicker (`ExamplePreviewer(picker)` or `.link(picker)`): it then shows
the training lines of the picked runs, the newest pick first.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anywidget
import ipywidgets as widgets
import traitlets

from ..checks.render import renderer_messages
from ..errors import MachineFormatError
from ..core.redact import redacted
from ..core.theme import FG_MUTED, GREEN, ORANGE, RED, text_colour
from ._base import FollowsPicker, NoMathHTML, StaticFallback, escape
from .cards import chat_cards, token_view

if TYPE_CHECKING:
    import pandas as pd

# Diff at most this many trained messages per example: each needs its own generation prompt
# rendered and compared; a whole run with hundreds of steps would stall the view.
MAX_DIFF_MESSAGES = 50


# ---- plain functions over training lines -------------------------------------------------------

def load_lines(data: Any) -> list[dict]:
    """Training lines from any form the previewer takes.

    Args:
        data: a list of line dicts (or one dict), a JSONL path, a DataFrame of lines, or a runs
            DataFrame (no `messages` column: it goes through `machine_nb.training_lines(runs)`).

    Returns:
        The lines, each an object with a `messages` list whose messages have a "role".

    Raises:
        MachineFormatError: a line of another shape, naming the file, line and field.
    """
    source = "<lines>"
    if isinstance(data, (str, os.PathLike)):
        from ..core.jsonl import iter_jsonl

        source = str(data)
        pairs = list(iter_jsonl(Path(data)))
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # a DataFrame
        if "messages" in data.columns:
            pairs = list(enumerate(data.to_dict("records"), start=1))
        else:
            from .. import training_lines

            pairs = list(enumerate(training_lines(data), start=1))
            source = "<training_lines(runs)>"
    elif isinstance(data, dict):
        pairs = [(1, data)]
    else:
        pairs = list(enumerate(data, start=1))
    lines = []
    for line_no, value in pairs:
        if not isinstance(value, dict):
            raise MachineFormatError(source, f"expected a JSON object, got {type(value).__name__}", line=line_no)
        msgs = value.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise MachineFormatError(source, "expected a list of messages, each with a 'role'",
                                     line=line_no, field="messages")
        lines.append(value)
    return lines


_MODES = {"customized", "last_assistant_message", "all_assistant_messages"}


def trainer_refusal(line: dict, model: str | None = None) -> str:
    """Why `machine_nb.sft` would refuse this line.

    Args:
        line: a training line.
        model: the model sft would train (default None: the checks that need no renderer).

    Returns:
        The first reason sft's own checks give, in their order: the row's shape
        (chat.check_row), its trainable flags (chat.train_messages), then validate.preflight on
        the messages sft trains (secrets; with a model, rendering, length and "no token has loss
        weight > 0"). "" when sft would train the line.
    """
    from ..core.chat import check_row, train_messages

    try:
        check_row(line, "train")
        messages = train_messages(line)
    except MachineFormatError as exc:
        return exc.reason
    from ..checks.validate import preflight

    errors = preflight([{"messages": messages}], model, train_on_what=_sft_mode(line), raise_errors=False).errors()
    return "" if errors.empty else str(errors["message"].iloc[0])


def _sft_mode(line: dict) -> str:
    from ..core.chat import is_flagged

    return "customized" if is_flagged(line) else "last_assistant_message"


def _trainer_plan(line: dict) -> tuple[list[dict], str] | None:
    """The messages and mode `machine_nb.sft` would train this line with, or None when its row
    checks refuse the line (chat.check_row: a bad shape; chat.train_messages: nothing trainable)."""
    from ..core.chat import check_row, train_messages

    try:
        check_row(line, "train")
        return train_messages(line), _sft_mode(line)
    except MachineFormatError:
        return None


def trained_indices(line: dict, train_on_what: Any = None) -> list[int]:
    """Indices of the messages a line trains on.

    Args:
        line: a training line.
        train_on_what: default None: exactly what `machine_nb.sft` trains (chat.trained_indices,
            Machine's rule: a whole-run line (`"whole_run": true`) trains its assistant messages
            flagged `"trainable": true` (no flag: not trained); any other line its last assistant
            message, or its flags when it carries some). "customized" (the same flag rule),
            "last_assistant_message" or "all_assistant_messages" (or the cookbook's TrainOnWhat)
            show a trainer configured otherwise.

    Returns:
        The indices; an empty list when sft's row checks would refuse the line.
    """
    from ..core.chat import trained_indices as trained

    whole_run = bool(line.get("whole_run"))
    if train_on_what is None:
        plan = _trainer_plan(line)
        return [] if plan is None else trained(plan[0], plan[1], whole_run=whole_run)
    mode = str(getattr(train_on_what, "value", train_on_what))
    if mode not in _MODES:
        raise ValueError(f"train_on_what {mode!r} is not one the previewer can show; use one of {sorted(_MODES)}")
    return trained(line["messages"], mode, whole_run=whole_run)


def render_plan(line: dict, train_on_what: Any = None) -> tuple[list[dict], Any]:
    """What to hand the renderer for this line, so it trains what `trained_indices` says.

    Args:
        line: a training line.
        train_on_what: as in trained_indices (default None: as sft trains it).

    Returns:
        (messages, TrainOnWhat). CUSTOMIZED gets an explicit boolean `trainable` on every
        message (the cookbook's generic renderers assert one is present); the other modes get
        no `trainable` keys (they assert none is).
    """
    from tinker_cookbook.renderers import TrainOnWhat

    keep = set(trained_indices(line, train_on_what))
    mode = str(getattr(train_on_what, "value", train_on_what or ""))
    if train_on_what is None:
        plan = _trainer_plan(line)
        mode = plan[1] if plan else "customized"  # refused by the trainer: nothing is trained
    if mode == "customized":
        return ([{**m, "trainable": i in keep} for i, m in enumerate(line["messages"])], TrainOnWhat.CUSTOMIZED)
    return _strip_trainable(line["messages"]), TrainOnWhat(mode)


def _strip_trainable(messages: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "trainable"} for m in messages]


def supervised_tokens(line: dict, renderer: Any, train_on_what: Any = None) -> tuple[list[int], list[float]]:
    """The line's supervised rendering (renderer.build_supervised_example).

    Args:
        line: a training line.
        renderer: the model's tinker-cookbook renderer.
        train_on_what: as in trained_indices (default None: as sft trains it).

    Returns:
        (token ids, loss weights), one weight per token; all weights 0 when nothing is trained.
    """
    if not trained_indices(line, train_on_what):
        # Nothing trained: some renderers (tml_v0) refuse a sequence without a target, so render
        # every assistant message as a target for the token text, then show all weights as 0.
        from tinker_cookbook.renderers import TrainOnWhat

        model_input, weights = renderer.build_supervised_example(
            renderer_messages(_strip_trainable(line["messages"])), train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
        return list(model_input.to_ints()), [0.0] * len(weights)
    messages, train_on_what = render_plan(line, train_on_what)
    model_input, weights = renderer.build_supervised_example(renderer_messages(messages), train_on_what=train_on_what)
    return list(model_input.to_ints()), [float(w) for w in weights.tolist()]


def token_frame(line: dict, renderer: Any, tokenizer: Any, train_on_what: Any = None) -> pd.DataFrame:
    """The supervised rendering as a DataFrame, one row per token.

    Args:
        line: a training line.
        renderer: the model's tinker-cookbook renderer.
        tokenizer: its tokenizer (decodes each token alone).
        train_on_what: as in trained_indices (default None: as sft trains it).

    Returns:
        Columns position (int), token_id (int), text (the token decoded alone), weight (float
        loss weight; 0 = context, > 0 = trained on).
    """
    import pandas as pd

    ids, weights = supervised_tokens(line, renderer, train_on_what)
    return pd.DataFrame({
        "position": range(len(ids)),
        "token_id": ids,
        "text": [tokenizer.decode([t]) for t in ids],
        "weight": weights,
    })


def _has_reasoning(messages: list[dict]) -> bool:
    return any(isinstance(m.get("content"), list) and
               any(isinstance(p, dict) and p.get("type") == "thinking" for p in m["content"])
               for m in messages)


def prompt_diffs(line: dict, renderer: Any, tokenizer: Any, *, ids: list[int] | None = None,
                 weights: list[float] | None = None, train_on_what: Any = None) -> pd.DataFrame:
    """Generation prompt vs supervised rendering, for each trained message.

    For trained message k, the generation prompt of messages[:k] (what the model sees when it
    samples that message) is aligned with the supervised tokens (what training shows it); at
    most MAX_DIFF_MESSAGES messages are checked.

    Args:
        line: a training line.
        renderer: the model's tinker-cookbook renderer.
        tokenizer: its tokenizer (decodes the differing tokens).
        ids, weights: the line's supervised tokens and loss weights, when already rendered
            (default None: rendered here with supervised_tokens).
        train_on_what: as in trained_indices (default None: as sft trains it).

    Returns:
        A DataFrame, one row per trained message: message (k), prompt_tokens, matches (the
        prompt is a token-for-token prefix of the supervised rendering), training_only (tokens
        training shows that the prompt never does), trained_unseen (how many of those carry
        loss weight > 0), sampling_only (prompt tokens absent from training),
        training_only_text, sampling_only_text, flag (a sentence, "" when fine).
    """
    import pandas as pd

    if ids is None or weights is None:
        ids, weights = supervised_tokens(line, renderer, train_on_what)
    messages = line["messages"]
    trained = trained_indices(line, train_on_what)
    # The end of each trained span, so message k is aligned only against training up to its own
    # target (a later message's tokens would otherwise match the prompt's tail by accident).
    ends = [j + 1 for j in range(len(weights)) if weights[j] > 0 and (j + 1 == len(weights) or weights[j + 1] <= 0)]
    rows = []
    for n, k in enumerate(trained[:MAX_DIFF_MESSAGES]):
        gen = list(renderer.build_generation_prompt(renderer_messages(_strip_trainable(messages[:k]))).to_ints())
        upto = ends[n] if len(ends) == len(trained) else len(ids)
        sup = ids[:upto]
        extra: list[int] = []  # positions in the supervised tokens that the prompt lacks
        missing: list[int] = []  # prompt tokens with no counterpart in training
        matcher = difflib.SequenceMatcher(None, gen, sup, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal" or i1 >= len(gen):
                continue  # past the end of the prompt: the sampled completion itself
            missing.extend(range(i1, i2))
            if i2 < len(gen) or tag == "insert":
                extra.extend(range(j1, j2))
            # else: the prompt's tail differs and training continues with the target instead
        trained_unseen = sum(1 for j in extra if weights[j] > 0)
        reasoning = _has_reasoning(messages[: k + 1])
        flag = ""
        if trained_unseen and reasoning:
            flag = (f"trained on reasoning the model never sees at sampling time "
                    f"({trained_unseen} trained tokens absent from the generation prompt)")
        elif trained_unseen:
            flag = f"trained on {trained_unseen} tokens the generation prompt never shows"
        elif missing and reasoning:
            tail = tokenizer.decode([gen[i] for i in missing])
            flag = (f"trained on reasoning the model never sees at sampling time: the generation prompt "
                    f"shows {tail!r} where training shows this message's reasoning differently")
        elif extra or missing:
            flag = (f"context differs from sampling: {len(extra)} tokens only in training, "
                    f"{len(missing)} only in the generation prompt")
        rows.append({
            "message": k,
            "prompt_tokens": len(gen),
            "matches": not extra and not missing,
            "training_only": len(extra),
            "trained_unseen": trained_unseen,
            "sampling_only": len(missing),
            "training_only_text": tokenizer.decode([ids[j] for j in extra]) if extra else "",
            "sampling_only_text": tokenizer.decode([gen[i] for i in missing]) if missing else "",
            "flag": flag,
        })
    return pd.DataFrame(rows, columns=["message", "prompt_tokens", "matches", "training_only", "trained_unseen",
                                       "sampling_only", "training_only_text", "sampling_only_text", "flag"])


def diff_html(diffs: pd.DataFrame | None) -> str:
    """The prompt-vs-training check as HTML.

    Args:
        diffs: prompt_diffs' frame, or None.

    Returns:
        One line per trained message (flagged ones in red or orange, with the differing text), or
        a sentence when there is no trained message.
    """
    if diffs is None or len(diffs) == 0:
        return f'<div style="color:{FG_MUTED}">No trained message to check.</div>'
    out = ['<div class="mnb-diff" style="font-size:13px"><b>Generation prompt vs supervised render</b>']
    for r in diffs.to_dict("records"):
        if r["matches"]:
            out.append(f'<div style="color:{text_colour(GREEN)}">message #{r["message"]}: the generation prompt '
                       f'({r["prompt_tokens"]} tokens) is a prefix of the training tokens ✓</div>')
            continue
        colour = text_colour(RED if r["trained_unseen"] else ORANGE)
        out.append(f'<div class="mnb-flag" style="color:{colour}">⚠ message #{r["message"]}: {escape(r["flag"])}</div>')
        if r["training_only_text"]:
            out.append(f'<div style="margin-left:16px">only in training: <code style="white-space:pre-wrap">'
                       f'{escape(r["training_only_text"][:1000])}</code></div>')
        if r["sampling_only_text"]:
            out.append(f'<div style="margin-left:16px">only at sampling: <code style="white-space:pre-wrap">'
                       f'{escape(r["sampling_only_text"][:1000])}</code></div>')
    out.append("</div>")
    return "".join(out)


# ---- the widget ---------------------------------------------------------------------------------

def is_picker(value: Any) -> bool:
    """Whether `value` is a run picker to follow.

    Args:
        value: anything a widget was given as its data.

    Returns:
        True when it has `.selected` and `.observe_selection` (RunPicker's public API) and is not a DataFrame.
    """
    import pandas as pd

    return hasattr(value, "observe_selection") and hasattr(value, "selected") and not isinstance(value, pd.DataFrame)


def line_text(line: dict) -> str:
    """The text a filter searches in a line.

    Args:
        line: a training line.

    Returns:
        Its run id, machine and every message's text (reasoning included) and tool calls,
        lower-cased.
    """
    from .cards import message_text, tool_calls

    parts = [str(line.get("run", "")), str(line.get("machine", ""))]
    for m in line["messages"]:
        parts.append(message_text(m, reasoning=True))
        for _id, name, arguments in tool_calls(m):
            parts.append(f'{"" if name is None else name} {"" if arguments is None else arguments}')
    return "\n".join(parts).lower()


def filter_lines(lines: list[dict], text: str) -> list[int]:
    """The lines a text filter keeps.

    Args:
        lines: training lines (dicts with `messages`).
        text: whitespace-separated terms; each must appear (case-insensitive) in `line_text`.

    Returns:
        Indices into `lines`, in order (all of them for an empty `text`).
    """
    terms = text.lower().split()
    if not terms:
        return list(range(len(lines)))
    return [i for i, line in enumerate(lines) if all(t in line_text(line) for t in terms)]


_KEYS_ESM = """
// Keys of a widget (the previewer's arrows, the tagger's letters): a keydown listener on the
// widget's own element (focused by clicking in it or on one of its buttons); typing in a text box
// is left alone.
function render({ model, el }) {
  let root = null, frame = 0, tries = 0;
  const onKey = (event) => {
    if (!model.get("key_names").includes(event.key) || event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    const t = event.target;
    if (t && t.closest && t.closest("input, textarea, select, [contenteditable='true']")) return;
    event.preventDefault();
    event.stopPropagation();
    model.send({ event: "key", key: event.key });
  };
  const attach = () => {
    root = el.closest(model.get("target"));
    if (!root) {
      if (tries++ < 600) frame = requestAnimationFrame(attach);  // not in the page yet
      return;
    }
    if (!root.hasAttribute("tabindex")) root.setAttribute("tabindex", "0");
    root.addEventListener("keydown", onKey);
  };
  attach();
  return () => { cancelAnimationFrame(frame); if (root) root.removeEventListener("keydown", onKey); };
}
export default { render };
"""


class KeyPager(anywidget.AnyWidget):
    """Sends the keys in `key_names` pressed inside the element matching `target` (without modifiers,
    and not while typing in a text box) as {"event": "key", "key": …} messages.

    Args:
        target: a CSS selector of the element whose keys are sent (default ".mnb-previewer").
        key_names: the `KeyboardEvent.key` values sent (default the previewer's: ArrowLeft, ArrowRight,
            Home, End).
    """

    _esm = _KEYS_ESM
    target = traitlets.Unicode(".mnb-previewer").tag(sync=True)
    key_names = traitlets.List(traitlets.Unicode(), ["ArrowLeft", "ArrowRight", "Home", "End"]).tag(sync=True)


class ExamplePreviewer(FollowsPicker, StaticFallback, widgets.VBox):
    """Step through training examples: chat cards, then the tokens the model's renderer trains on.

    Args:
        data: training lines (list of dicts), a JSONL path, a DataFrame of lines, a runs
            DataFrame (converted with `machine_nb.training_lines`), or a RunPicker to follow
            (its picked runs' lines; see `link`).
        model: model whose renderer draws the token view (e.g. "thinkingmachines/Inkling-Small").
            Default None: cards only, since tokens depend on the model.
        renderer, tokenizer: a tinker-cookbook renderer/tokenizer to use instead of the model's
            (default None: `machine_nb.checks.render.get_renderer(model)` / `get_tokenizer(model)`).
        index: the example shown first. Default 0.
        train_on_what: which messages the trainer trains (see `trained_indices`). Default None:
            as `machine_nb.sft` trains them (whole runs: flagged messages; others: the last
            assistant message).
        **kwargs: passed to ipywidgets.VBox.

    Keys: ← / → page through the examples (Home / End: first / last) once the previewer has
    focus (click in it, or on a button). The filter box keeps the examples containing every word
    typed (run id, machine, message text; applied on Enter); "jump" shows a run's first example.
    `.current` (trait) is the index of the line shown in `.lines`; `.matches` the indices the
    filter keeps; `.line` the current line; `.tokens` its token frame and `.diffs` its prompt
    check (None without a model).
    """

    current = traitlets.Int(0)

    def __init__(self, data: Any = None, model: str | None = None, *, renderer: Any = None,
                 tokenizer: Any = None, index: int = 0, train_on_what: Any = None, **kwargs: Any) -> None:
        picker = data if is_picker(data) else None
        self.lines = [] if picker is not None or data is None else load_lines(data)
        self.matches = list(range(len(self.lines)))
        self.filter_text = ""
        self.picker = None
        self._picker_handler: Callable | None = None
        self.train_on_what = train_on_what
        self.model = model
        self._renderer, self._tokenizer = renderer, tokenizer
        self.tokens = None
        self.diffs = None
        self.token_error = ""
        self.note = ""  # why nothing is shown (no lines, nothing matches, a picker with nothing picked)
        self._hold = False
        self._prev = widgets.Button(description="◀ prev", tooltip="previous example (← key)",
                                    layout=widgets.Layout(width="80px"))
        self._next = widgets.Button(description="next ▶", tooltip="next example (→ key)",
                                    layout=widgets.Layout(width="80px"))
        # continuous_update=False: the value changes on Enter/blur, not per keystroke (on_submit is
        # deprecated); the placeholders say so
        self._filter = widgets.Text(placeholder="filter by words (Enter)", continuous_update=False,
                                    layout=widgets.Layout(width="240px"))
        self._jump = widgets.Text(placeholder="jump to run id (Enter)", continuous_update=False,
                                  layout=widgets.Layout(width="200px"))
        self._status = NoMathHTML()
        self._cards = NoMathHTML()
        self._token_html = NoMathHTML()
        self._keys = KeyPager()
        self._keys.on_msg(self._on_key)
        self._prev.on_click(lambda _: self.prev())
        self._next.on_click(lambda _: self.next())
        self._jump.observe(lambda ch: ch["new"].strip() and self.jump(ch["new"]), names="value")
        self._filter.observe(lambda ch: self.set_filter(ch["new"]), names="value")
        sections = [self._cards]
        if model is not None or renderer is not None:
            sections.append(self._token_html)
        bar = widgets.HBox([self._prev, self._next, self._filter, self._jump, self._status, self._keys],
                           layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        super().__init__(children=[bar, *sections], **kwargs)
        self.add_class("mnb-previewer")
        self.observe(self._refresh, names="current")
        self._hold = True
        self.current = max(0, min(index, len(self.lines) - 1)) if self.lines else 0
        self._hold = False
        if picker is not None:
            self.link(picker)
        else:
            self._refresh()

    def _made_widgets(self) -> list[Any]:
        """The token view's HTML, a child only when there is a model to render with."""
        return [self._token_html]

    # following a picker
    def link(self, picker: Any) -> Callable:
        """Follow a RunPicker: show the training lines of `picker.selected`, now and at every change
        of its selection (a newly picked run's first example is shown); `unlink()` stops following.

        Args:
            picker: a RunPicker (anything with `.selected` and `.observe_selection`).

        Returns:
            The handler `picker.observe_selection` registered.
        """
        self.unlink()
        self.picker = picker
        self._picker_handler = picker.observe_selection(self._on_picked)
        self._on_picked(picker.selected)
        return self._picker_handler

    def _on_picked(self, frame: Any) -> None:
        # runs are told apart by machine and id: ids are unique within a machine only
        def key(x: dict) -> tuple[str, str]:
            return str(x.get("machine")), str(x.get("run"))

        before = {key(x) for x in self.lines}
        try:
            lines = load_lines(frame) if len(frame) else []
            note = "" if len(frame) else "Select runs in the picker to preview their training examples."
            if len(frame) and not lines:
                note = f"The {len(frame)} picked run(s) give no training example (no assistant answer)."
        except Exception as exc:  # a frame training_lines cannot read: say so in the widget
            lines, note = [], redacted(f"Could not make training lines of the picked runs: {type(exc).__name__}: {exc}")
        cols = getattr(frame, "columns", ())
        if len(frame) and "id" in cols:
            machines = frame["machine"].astype(str) if "machine" in cols else [None] * len(frame)
            picked = list(zip(machines, frame["id"].astype(str)))
        else:
            picked = []
        # a frame without a machine column names runs by id alone
        seen = before if all(m is not None for m, _ in picked) else {r for _, r in before}
        new = {k for k in picked if (k if k[0] is not None else k[1]) not in seen}
        new_keys = {k if k[0] is not None else k[1] for k in new}
        target = next((i for i, x in enumerate(lines)
                       if key(x) in new_keys or key(x)[1] in new_keys), None)
        if target is None and self.line is not None:  # keep the run on screen when it is still picked
            target = next((i for i, x in enumerate(lines) if key(x) == key(self.line)), None)
        self.set_lines(lines, index=target or 0, note=note)

    def set_lines(self, lines: Any, index: int = 0, *, note: str = "") -> None:
        """Show other training lines.

        Args:
            lines: any `data` the constructor takes except a picker.
            index: the example shown first (default 0; the first match when the filter hides it).
            note: why nothing is shown, when `lines` is empty (default "").
        """
        self.lines = load_lines(lines)
        self.note = note
        self.matches = filter_lines(self.lines, self.filter_text)
        start = max(0, min(int(index), len(self.lines) - 1)) if self.lines else 0
        if self.matches and start not in self.matches:
            start = self.matches[0]
        self._hold = True
        try:
            self.current = start
        finally:
            self._hold = False
        self._refresh()

    # navigation
    @property
    def line(self) -> dict | None:
        """The training line shown now (None when there are none, or none matches the filter)."""
        if not self.lines or not self.matches:
            return None
        return self.lines[self.current]

    @property
    def position(self) -> int | None:
        """Where the current line is among `.matches` (0-based; None when nothing is shown)."""
        return self.matches.index(self.current) if self.line is not None and self.current in self.matches else None

    def show(self, index: int) -> None:
        """Show one example.

        Args:
            index: its position in `.lines` (clamped to the valid range); a filter that hides it
                is cleared, as `jump` does.
        """
        if self.lines:
            index = max(0, min(int(index), len(self.lines) - 1))
            hidden = index not in self.matches
            if hidden:
                self._hold = True  # one redraw, below
                try:
                    self.set_filter("")
                finally:
                    self._hold = False
            if self.current != index:
                self.current = index
            elif hidden:
                self._refresh()

    def next(self) -> None:
        """Show the next example the filter keeps (stays on the last)."""
        pos = self.position
        if pos is not None and pos + 1 < len(self.matches):
            self.current = self.matches[pos + 1]

    def prev(self) -> None:
        """Show the previous example the filter keeps (stays on the first)."""
        pos = self.position
        if pos:
            self.current = self.matches[pos - 1]

    def _on_key(self, _widget: Any, content: dict, _buffers: Any) -> None:
        key = content.get("key") if isinstance(content, dict) else None
        if key == "ArrowRight":
            self.next()
        elif key == "ArrowLeft":
            self.prev()
        elif key in ("Home", "End") and self.matches:
            self.current = self.matches[0 if key == "Home" else -1]

    def set_filter(self, text: str) -> None:
        """Keep only the examples that contain every word of a text.

        Args:
            text: whitespace-separated words, matched case-insensitively (see line_text); ""
                keeps all.
        """
        self.filter_text = str(text or "").strip()
        if self._filter.value.strip() != self.filter_text:
            self._filter.value = self.filter_text  # calls back here once, with the same text
            return
        self.matches = filter_lines(self.lines, self.filter_text)
        if self.matches and self.current not in self.matches:
            self._hold = True
            try:
                self.current = self.matches[0]
            finally:
                self._hold = False
        self._refresh()

    def jump(self, run_id: str, machine: str | None = None) -> bool:
        """Show the first example of a run, clearing a filter that hides it.

        Args:
            run_id: the run's id.
            machine: the run's machine (default None: any; ids are unique within a machine only).

        Returns:
            True when shown; False (and a note in the status line) when no line has the run.
        """
        run_id = str(run_id).strip()
        for i, line in enumerate(self.lines):
            if str(line.get("run")) == run_id and (machine is None or str(line.get("machine")) == str(machine)):
                if i not in self.matches:
                    self.set_filter("")
                self.show(i)
                return True
        where = " among the picked runs" if self.picker is not None else ""
        self._status.value = f'<span style="color:{text_colour(RED)}">no example of run {escape(run_id)}{where}</span>'
        return False

    # rendering
    def _tools(self) -> tuple[Any, Any]:
        if self._renderer is None:
            from ..checks.render import get_renderer, get_tokenizer

            self._tokenizer = self._tokenizer or get_tokenizer(self.model)
            self._renderer = get_renderer(self.model)
        if self._tokenizer is None:
            self._tokenizer = self._renderer.tokenizer
        return self._renderer, self._tokenizer

    def _compute_tokens(self) -> None:
        self.tokens = self.diffs = None
        self.token_error = ""
        if self.line is None or (self.model is None and self._renderer is None):
            return
        try:
            renderer, tokenizer = self._tools()
            self.tokens = token_frame(self.line, renderer, tokenizer, self.train_on_what)
            self.diffs = prompt_diffs(self.line, renderer, tokenizer, ids=self.tokens["token_id"].tolist(),
                                      weights=self.tokens["weight"].tolist(), train_on_what=self.train_on_what)
        except Exception as exc:  # a renderer refusing a line is something to show, not a crash
            self.token_error = redacted(f"{type(exc).__name__}: {exc}")  # its text may quote the line

    def _refresh(self, _change: Any = None) -> None:
        if self._hold:
            return
        self._compute_tokens()
        pos = self.position
        self._prev.disabled = not pos  # None (nothing shown) or 0 (the first)
        self._next.disabled = pos is None or pos + 1 >= len(self.matches)
        self._status.value = escape(self.summary())
        self._cards.value = self._cards_html()
        self._token_html.value = self._tokens_html()
        self._static_changed()

    def _cards_html(self) -> str:
        if self.line is None:
            if self.lines and not self.matches:
                return f"<i>No example contains every word of {escape(repr(self.filter_text))}.</i>"
            return f"<i>{escape(self.note or 'No training lines.')}</i>"
        return chat_cards(self.line["messages"], trained_indices(self.line, self.train_on_what))

    def _tokens_html(self) -> str:
        if self.model is None and self._renderer is None or self.line is None:
            return ""
        title = f'<h4 style="margin:8px 0 2px">Tokens as {escape(self.model or "the given renderer")} trains on them</h4>'
        if self.token_error:
            return (f'{title}<div style="color:{text_colour(RED)}">Could not render this example: '
                    f'{escape(self.token_error)}</div>')
        if self.tokens is None:
            return ""
        empty = ""
        if not (self.tokens["weight"] > 0).any():  # the Unsloth "all labels are -100" trap
            why = trainer_refusal(self.line, self.model) if self.train_on_what is None else ""
            empty = (f'<div class="mnb-flag" style="color:{text_colour(RED)}">⚠ no token of this example carries loss '
                     f'weight: training on it teaches nothing{" (sft refuses it: " + escape(why) + ")" if why else ""}</div>')
        return title + empty + token_view(self.tokens.to_dict("records")) + diff_html(self.diffs)

    def summary(self) -> str:
        """The saved notebook's text/plain.

        Returns:
            One line: which example of how many, its run, machine, kind, messages and trained
            messages (or why none is shown).
        """
        if self.line is None:
            if self.lines:
                return f"ExamplePreviewer: no example of {len(self.lines)} matches {self.filter_text!r}"
            return f"ExamplePreviewer: {self.note or 'no training lines'}"
        line = self.line
        kind = "whole run" if line.get("whole_run") else "step"
        pos = self.position
        shown = (f" · filter {self.filter_text!r}: {pos + 1} of {len(self.matches)} matching"
                 if self.filter_text and pos is not None else "")
        # a field the line lacks (lines of a JSONL file carry no run or machine) is left out, not "?"
        where = "".join(f" · {name} {line[name]}" for name in ("run", "machine") if line.get(name) not in (None, ""))
        return (f"ExamplePreviewer: example {self.current + 1}/{len(self.lines)}{where} · {kind} · "
                f"{len(line['messages'])} messages, {len(trained_indices(line, self.train_on_what))} trained{shown}")

    def static_html(self) -> str:
        """The example shown now, for the saved notebook and HTML exports.

        Returns:
            The summary line, the chat cards, and (with a model) the token view and prompt check.
        """
        return (f'<div class="mnb-previewer-static"><div style="font-weight:600">{escape(self.summary())}</div>'
                f'{self._cards_html()}{self._tokens_html()}</div>')
