"""One progress bar for every long call (training steps, eval rows, validating big files).

In a Jupyter kernel it is a single HTML line updated in place (`display(..., display_id=…)`),
so the saved notebook keeps one clean, static line ("sft: 60/60 steps · loss 0.12 · 1.4 s")
and no widget state that GitHub cannot render. In a terminal it is tqdm; where stderr is not a
terminal (a CI log, a file) tqdm redraws only every PROGRESS_LOG_INTERVAL_S, since each redraw
there is another line of the log. `enabled=False` (or MACHINE_NB_PROGRESS=0) silences it.

Every call that takes `progress: bool | None` decides with `resolve_progress`: True or False
decide; None shows a bar unless the environment variable MACHINE_NB_PROGRESS is "0" (or "false",
"no", "off", in any case).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any


#: The environment variable that turns `progress=None` bars off when it is "0" (or "false", "no", "off").
PROGRESS_ENV = "MACHINE_NB_PROGRESS"

#: PROGRESS_ENV's values that mean off, compared stripped and lower-cased.
PROGRESS_OFF = frozenset({"0", "false", "no", "off"})

#: Seconds between redraws where stderr is not a terminal (a CI log keeps every one as a line).
PROGRESS_LOG_INTERVAL_S = 30.0


def resolve_progress(value: bool | None = None, *, worth_a_bar: bool = True) -> bool:
    """Whether a call shows a progress bar: the one rule behind every `progress: bool | None` argument.

    Args:
        value: the caller's `progress` argument. True or False decide; None (default) leaves it
            to the rule.
        worth_a_bar: what None means for this call before the environment is asked (default
            True; False for work too small to need a bar, e.g. counting the tokens of a short file).

    Returns:
        `value` when it is True or False; else `worth_a_bar`, unless MACHINE_NB_PROGRESS is "0"
        (or "false", "no", "off", in any case).
    """
    if value is not None:
        return bool(value)
    return worth_a_bar and os.environ.get(PROGRESS_ENV, "1").strip().lower() not in PROGRESS_OFF


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel: IPython's ZMQInteractiveShell or a subclass of it
    (Colab's shell is one), by class name so that IPython is never imported here."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:
        return False
    return ip is not None and any(c.__name__ == "ZMQInteractiveShell" for c in type(ip).__mro__)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # a stream without isatty, or a closed one
        return False


class progress:  # noqa: N801 - used like a function: `with progress(total=60, desc="sft") as bar:`
    """A progress bar: `update(n=1, **postfix)`, `set_postfix(**values)`, `close()`; a context manager.

    Also wraps an iterable: `for row in progress(rows, desc="eval"): …`. This class decides
    whether a bar shows for every call that takes `progress: bool | None` (evaluate, probe,
    evaluate_cases, sft, …): they pass their value as `enabled`.

    Args:
        iterable: items to yield, counting each (default None: count with update()).
        total: the count at the end (default None: len(iterable) when it has one, else unknown).
        desc: the label before the count (default "").
        unit: what is counted, e.g. "row", "steps" (default "it").
        enabled: show the bar. Default None: on (an HTML line in a Jupyter kernel, tqdm on
            stderr elsewhere) unless MACHINE_NB_PROGRESS=0 (resolve_progress); False draws
            nothing but still counts. Where stderr is not a terminal, tqdm redraws every
            PROGRESS_LOG_INTERVAL_S.
    """

    min_interval = 0.2  # seconds between redraws in a notebook

    def __init__(self, iterable: Any = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", enabled: bool | None = None) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.unit, self.n = total, desc, unit, 0
        self.postfix: dict[str, Any] = {}
        self.start = time.monotonic()
        self._last = 0.0
        self._closed = False
        self._elapsed: float | None = None  # set when the bar closes: its time stays as drawn
        enabled = resolve_progress(enabled)
        self._mode = "off" if not enabled else ("html" if in_kernel() else "tqdm")
        self._handle = None
        self._tqdm = None
        if self._mode == "html":
            from IPython.display import HTML, display
            self._handle = display(HTML(self._html()), display_id=True)
        elif self._mode == "tqdm":
            from tqdm import tqdm
            interval = {} if _is_terminal(sys.stderr) else {"mininterval": PROGRESS_LOG_INTERVAL_S,
                                                            "maxinterval": PROGRESS_LOG_INTERVAL_S}
            self._tqdm = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=True, **interval)

    def __iter__(self) -> Iterator[Any]:
        try:
            for item in self.iterable:
                yield item
                self.update()
        finally:  # a loop left by `break` or an error closes the bar too
            self.close()

    @property
    def closed(self) -> bool:
        """Whether the bar has finished (closed by `close()`, the end of a `with`, or the end of iteration)."""
        return self._closed

    def __enter__(self) -> progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, **values: Any) -> None:
        """Show values after the count ("loss 0.12"), kept until replaced.

        Args:
            **values: name -> value (floats shown to 4 significant digits).
        """
        self.postfix.update(values)
        if self._tqdm is not None:
            self._tqdm.set_postfix({k: _fmt(v) for k, v in self.postfix.items()}, refresh=False)
        self._draw()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Count finished items and redraw (at most every `min_interval` seconds in a notebook).

        Args:
            n: items finished since the last update (default 1).
            **postfix: values to show after the count, as set_postfix.
        """
        self.n += n
        if postfix:
            self.postfix.update(postfix)
            if self._tqdm is not None:
                self._tqdm.set_postfix({k: _fmt(v) for k, v in self.postfix.items()}, refresh=False)
        if self._tqdm is not None:
            self._tqdm.update(n)
        self._draw()

    def close(self) -> None:
        """Finish the bar: its last state is drawn and stays (calling again does nothing)."""
        if self._closed:
            return
        self._closed = True
        self._elapsed = time.monotonic() - self.start
        if self._tqdm is not None:
            self._tqdm.close()
        self._draw(force=True)

    def text(self) -> str:
        """The bar as one line of text, as the notebook shows it.

        Returns:
            e.g. "sft: 60/60 steps · loss 0.12 · 1.4 s" (a closed bar's time is the time it ran).
        """
        elapsed = self._elapsed if self._elapsed is not None else time.monotonic() - self.start
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        parts = [f"{self.desc}: {count} {self.unit}" if self.desc else f"{count} {self.unit}"]
        parts += [f"{k} {_fmt(v)}" for k, v in self.postfix.items()]
        parts.append(f"{elapsed:.1f} s")
        return " · ".join(parts)

    def _html(self) -> str:
        frac = min(1.0, self.n / self.total) if self.total else (1.0 if self._closed else 0.0)
        from .theme import escape, no_math

        return no_math(f'<div class="machine-nb-progress" style="font-family:monospace;font-size:12px">'
                       f'<progress value="{frac:.3f}" max="1" style="width:12em;vertical-align:middle"></progress> '
                       f"{escape(self.text())}</div>")

    def _draw(self, force: bool = False) -> None:
        if self._handle is None:
            return
        now = time.monotonic()
        if force or now - self._last >= self.min_interval:
            from IPython.display import HTML
            self._handle.update(HTML(self._html()))
            self._last = now


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


Progress = progress  # the public name (`machine_nb.Progress`); `machine_nb.core.progress` is this module
