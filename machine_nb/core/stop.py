"""Stopping a notebook with a stated reason, never a traceback.

A notebook that cannot go on (no tag rows yet, a model the engine cannot serve, runs longer than
the model's context, …) calls `stop_notebook(reason)`: the reason is shown as the cell's output,
and every cell run after it in that kernel runs nothing and shows nothing. Each execution reply
stays "ok", which is what papermill, nbclient, nbval and `machine-nb report` read as a cell that
finished, so a headless run ends as a report whose last output is the reason, not a failed cell.

How the cells below are skipped: an IPython input transformer (the shell's public
`input_transformers_cleanup` list) replaces each later cell's code with `pass`. Running the
stopping cell again (the same cell where the front end names its cells, as JupyterLab does, or
the same source) lets it through and lifts the stop, so "fix it, then run from here" works.
"""

from __future__ import annotations

from typing import Any

#: Display metadata key of the reason's output: `{STOPPED_KEY: reason}` marks where a notebook stopped.
STOPPED_KEY = "machine_nb_stopped"


class NotebookStopped(RuntimeError):
    """Raised by `stop_notebook` outside IPython (a plain script has no cells to skip).

    reason: the stated reason.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def stop_html(reason: str) -> str:
    """The reason as the HTML block a stopped notebook ends with (light and dark themes, no TeX).

    Args:
        reason: the stated reason.

    Returns:
        The HTML.
    """
    from .theme import FG, ORANGE, escape, no_math, text_colour, tint

    return no_math(f"<div class='machine-nb-stopped' style='border-left:4px solid {ORANGE};background:{tint(ORANGE, 12)};"
                   f"color:{FG};padding:0.5em 0.9em;margin:0.3em 0'><b style='color:{text_colour(ORANGE)}'>"
                   f"Stopped here.</b> {escape(reason)}<br><small>The cells below did not run.</small></div>")


class _Stop:
    """The kernel's stop: which cell stopped, and the transformer that skips the others."""

    # IPython's completeness check (a console's "is this input complete?") skips transformers that
    # say so: asking must never lift the stop.
    has_side_effects = True

    def __init__(self, shell: Any):
        self.shell = shell
        self.source: str | None = None
        self.cell_id: str | None = None
        self.reason: str | None = None

    def request(self) -> dict:
        """The execute request being run (ipykernel's parent message; {} where there is none)."""
        kernel = getattr(self.shell, "kernel", None)
        get_parent = getattr(kernel, "get_parent", None)
        if get_parent is None:
            return {}
        try:
            return get_parent("shell") or {}
        except TypeError:  # an ipykernel whose get_parent takes no channel
            return get_parent() or {}

    def cell_id_now(self) -> str | None:
        """The id of the cell being run, where the front end sends one (JupyterLab's `cellId`)."""
        return (self.request().get("metadata") or {}).get("cellId")

    def arm(self, reason: str) -> None:
        history = getattr(getattr(self.shell, "history_manager", None), "input_hist_raw", None)
        self.source = history[-1].strip() if history else None
        self.cell_id = self.cell_id_now()
        self.reason = reason

    def __call__(self, lines: list[str]) -> list[str]:
        if self.reason is None or (self.request().get("content") or {}).get("silent"):
            return lines  # no stop, or a front end's own silent call (a variable explorer): untouched
        here = self.cell_id_now()
        same = (here is not None and here == self.cell_id) or "".join(lines).strip() == self.source
        if same:  # the stopping cell, run again: it checks again, the stop is lifted
            self.reason = None
            return lines
        return ["pass\n"]


def stop_notebook(reason: str) -> None:
    """Stop this notebook here, with a stated reason: show it, and run none of the cells after this one.

    For a step that cannot go on: say why and what to do ("no tag rows yet for helpdesk: tag some
    runs in the Tagger above, then run from here"). Call it last in its cell (the statements after
    it in the same cell still run). In a kernel, the cells run after it run nothing and show
    nothing, and each finishes cleanly, so papermill, nbclient and `machine-nb report` end the
    run as a finished report whose last output is the reason. Running the stopping cell again
    lifts the stop: it checks again, and the cells below run as usual.

    Args:
        reason: why the notebook cannot go on, and what to do instead.

    Returns:
        None (in a kernel).

    Raises:
        NotebookStopped: outside IPython (a script), carrying the reason.
    """
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or not hasattr(shell, "input_transformers_cleanup"):
        raise NotebookStopped(reason)
    from IPython.display import display

    display({"text/plain": f"Stopped here. {reason}\nThe cells below did not run.", "text/html": stop_html(reason)},
            raw=True, metadata={STOPPED_KEY: reason})
    stop = next((t for t in shell.input_transformers_cleanup if isinstance(t, _Stop)), None)
    if stop is None:
        stop = _Stop(shell)
        shell.input_transformers_cleanup.insert(0, stop)  # first: it sees the cell as the user wrote it
    stop.arm(reason)


__all__ = ["stop_notebook", "NotebookStopped", "STOPPED_KEY"]
