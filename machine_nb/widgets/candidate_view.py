"""CandidateView: a candidate's report (live vs candidate on the held-out cases, the flipped cases,
the gate's rule and decision) and a Commit button that obeys the same gate.

The decision is `candidate.py`'s (Gate.decide, made when the candidate was measured); the button
only calls `Candidate.commit()`, so a refused candidate stays refused here too and nothing is
written. Forcing a refused candidate is a deliberate `commit(force=True)` in code, not a click.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from ..core.redact import redacted
from ._base import NoMathHTML, strong_button, style_sheet, StaticFallback, escape

if TYPE_CHECKING:
    from ..evaluation.candidate import Candidate


class CandidateView(StaticFallback, widgets.VBox):
    """A candidate's report with a Commit button.

    The candidate is the one record of its state (`candidate.committed`): the view follows it,
    whether the Commit button, `view.commit()` or `candidate.commit()` in code made the commit,
    and every view of the same candidate shows the same. `.status` is `candidate.status` once
    committed, else why the last click did not commit ("" before any); `.committed` the version
    id (None until then). After a commit the button is disabled, and `commit()` again returns the
    version id without writing or complaining.

    Args:
        candidate: a `machine_nb.Candidate` (from `machine_nb.candidate(…)`).
        note: kept in the committed version's source (default None).
        **kwargs: passed to ipywidgets.VBox.
    """

    def __init__(self, candidate: Candidate, *, note: str | None = None, **kwargs: Any) -> None:
        from ..evaluation.candidate import report_html

        self.candidate = candidate
        self.note = note
        self._attempt = ""  # why the last click did not commit
        self._report_html = report_html
        self._report = NoMathHTML(self._body())
        self._button = strong_button(widgets.Button(description="Commit", icon="check",
                                      button_style="success" if candidate.passed else "",
                                      tooltip="make this candidate the live version (only if it passed the gate)"))
        self._status = NoMathHTML()
        self._button.on_click(self._on_click)
        if candidate.committed:
            self._button.disabled = True
        super().__init__(children=[self._report, widgets.HBox([self._button, self._status]), style_sheet()], **kwargs)
        self._show_status()
        self._stop_following = candidate.observe(self._on_candidate)

    def close(self) -> None:
        """Stop following the candidate and close the view (the candidate stops calling it)."""
        stop = getattr(self, "_stop_following", None)  # also called for a half-made view
        if stop is not None:
            stop()
        super().close()

    @property
    def status(self) -> str:
        """The outcome line: the candidate's status once committed, else why the last click did
        not commit ("" before any click)."""
        return self.candidate.status if self.candidate.committed else self._attempt

    def _on_candidate(self, _candidate: Any) -> None:
        """The candidate's state changed (committed here, in another view or in code): follow it."""
        self._button.disabled = bool(self.candidate.committed)
        self._report.value = self._body()
        self._show_status()

    @property
    def committed(self) -> str | None:
        """The version id the candidate was committed as (by the button or in code), or None."""
        return self.candidate.committed

    def _body(self) -> str:
        c = self.candidate
        if c.report is None:
            return f"<p>{escape(c.summary())}</p>"
        return self._report_html(c.report, c.gate, c.passed, c.reason, committed=c.committed)

    def commit(self) -> str | None:
        """What the button does: commit the candidate through its gate.

        Returns:
            The new version id, or None when the gate refused it or the machine changed since it
            was measured (the reason is shown and kept in `.status`).
        """
        from ..evaluation.candidate import CommitConflict, CommitRefused

        if self.candidate.committed:
            return self.committed  # committed already (a click, another view, code): nothing to do
        try:
            self.candidate.commit(note=self.note)  # the views follow through _on_candidate
        except CommitRefused as exc:
            self._attempt = f"Not committed: {exc.reason}"
        except CommitConflict as exc:
            self._attempt = f"Not committed: {exc}"
        self._report.value = self._body()
        self._show_status()
        return self.committed

    def _on_click(self, _button: Any) -> None:
        """A click: commit, and say in the view why not when the commit meets a file it cannot
        read or write (a damaged versions.json, a folder it may not write): a button's exception
        would reach only the log, never the view."""
        from ..errors import MachineFormatError

        try:
            self.commit()
        except (MachineFormatError, OSError) as exc:
            self._attempt = redacted(f"Not committed: {exc}")
            self._show_status()

    def _show_status(self) -> None:
        ok = self.status.startswith("Committed")
        colour = "var(--jp-success-color1, #15803d)" if ok else "var(--jp-error-color1, #b91c1c)"
        self._status.value = (f"<span class='mnb-candidate-status' style='color:{colour};margin-left:8px'>"
                              f"{escape(self.status)}</span>" if self.status else "")
        if self.status:
            self._static_changed()  # the saved notebook shows the outcome, not the state before the click

    def summary(self) -> str:
        """The saved notebook's text/plain.

        Returns:
            One line: the candidate's summary.
        """
        return f"CandidateView: {self.candidate.summary()}"

    def static_html(self) -> str:
        """The view as it stands, for the saved notebook and HTML exports.

        Returns:
            The report, then whether and as what the candidate was committed.
        """
        text = self.status or self.candidate.status
        status = f"<p class='mnb-candidate-status' style='color:var(--jp-ui-font-color2, #4b5563)'>{escape(text)}</p>"
        return f"{self._body()}{status}"
