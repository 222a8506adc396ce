"""What every machine_nb widget shares: theme colours, and a static fallback of its current state.

A widget's live view needs a kernel; a saved notebook read on GitHub, nbviewer or as an
nbconvert HTML export has none. So each widget is shown as two outputs: first the `text/html` of
what it shows now (plots also `image/png`) with a stable one-line `text/plain` (nbval compares
text/plain; a repr with object ids would differ on every run), then the live view. The widget
re-sends the first whenever its state changes (`_static_changed`), so the saved notebook keeps
what the user did, not the first frame; while the live view is on screen a style rule inside it
hides its static twin. Updating the static output alone leaves the live view as it
is: re-sending a widget view makes JupyterLab build a new view each time (keyboard focus lost,
the old view kept alive).

Colours are JupyterLab's CSS variables (`--jp-…`), each with the light-theme value as fallback for
renderers without them (nbconvert's classic template, VS Code, GitHub strips styles anyway). Every
element that sets a background also sets its text colour from the same family, so a fallback
never pairs a light background with a dark theme's light text.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# ---- theme colours and text (core/theme.py) ------------------------------------------------------

from ..core.theme import GREEN, NO_MATH_CLASSES, RED, no_math, text_colour  # noqa: E402
from ..core.theme import escape as _escape_text  # noqa: E402

import ipywidgets as _w  # noqa: E402
import traitlets as _traitlets  # noqa: E402


def _has_dollar(value: str) -> bool:
    return "$" in value or "&#36;" in value or "&dollar;" in value


class NoMathHTML(_w.HTML):
    """An ipywidgets HTML whose value no math typesetter reads as TeX.

    ipywidgets typesets an HTML widget's content with the page's MathJax, so "$0.40 … $1.20"
    would render as italic math; a value holding a dollar sign has it written `&#36;` and is
    wrapped in `theme.no_math(...)` (MathJax skips what is inside); any other value is kept
    exactly as given.
    """

    @_traitlets.validate("value")
    def _no_math(self, proposal: Any) -> str:
        value = proposal["value"] or ""
        if _has_dollar(value) and not value.startswith(f'<div class="{NO_MATH_CLASSES}">'):
            return no_math(_dollars_as_entities(value))
        return value


# Text the widgets' controls draw, at a contrast of 4.5:1 or more in JupyterLab's light and dark
# themes: ipywidgets' coloured buttons put white text on the theme's accent colours (the success
# green and info cyan are fill colours, 3.5-4.1:1 against white), so buttons with the class
# `mnb-button` get the accent darkened; an accordion title of a widget with the class
# `mnb-strong-titles` gets the theme's strongest text colour.
WIDGET_CSS = """
.jupyter-button.mnb-button.mod-success { background-color: color-mix(in srgb, var(--jp-success-color1, #388e3c) 72%, #000); color: #fff; }
.jupyter-button.mnb-button.mod-info { background-color: color-mix(in srgb, var(--jp-info-color1, #0097a7) 62%, #000); color: #fff; }
.jupyter-button.mnb-button.mod-danger { background-color: color-mix(in srgb, var(--jp-error-color1, #d32f2f) 85%, #000); color: #fff; }
.jupyter-button.mnb-button.mod-warning { background-color: color-mix(in srgb, var(--jp-warn-color1, #f57c00) 55%, #000); color: #fff; }
.mnb-strong-titles .jupyter-widget-Collapse-header, .mnb-strong-titles .lm-Collapse-header,
.mnb-strong-titles .p-Collapse-header { color: var(--jp-ui-font-color0, #000); }
"""


def style_sheet() -> NoMathHTML:
    """A hidden HTML widget holding WIDGET_CSS (put it among a widget's children)."""
    return NoMathHTML(f"<style>{WIDGET_CSS}</style>", layout=_w.Layout(display="none"))


def strong_button(button: Any) -> Any:
    """Give a coloured ipywidgets Button the darkened accent of WIDGET_CSS (needs style_sheet() on the page)."""
    button.add_class("mnb-button")
    return button


def _dollars_as_entities(fragment: str) -> str:
    """An HTML fragment with each "$" written `&#36;` (the same text once parsed; the widgets'
    HTML holds no "$" in style sheets or scripts, where an entity would not be read)."""
    return fragment.replace("$", "&#36;")


def static_html_id(widget: Any) -> str:
    """The key that ties a widget's static output to its live view.

    Args:
        widget: an ipywidgets widget.

    Returns:
        Its model id (the object's id before it has one).
    """
    return str(getattr(widget, "model_id", "") or id(widget))


def _hide_rule(key: str) -> str:
    # `:has` also collapses JupyterLab's output wrapper (prompt and padding) of the hidden twin.
    return (f'<style>[data-mnb-static="{key}"]{{display:none!important}}'
            f'.jp-OutputArea-child:has([data-mnb-static="{key}"]){{display:none!important}}</style>')


def _orphan_rule(key: str) -> str:
    """A style rule, carried by the static twin, that hides the live output right after it while
    that output shows no widget: a notebook reopened with a new kernel (the widget's model is gone)
    would otherwise read "Error displaying widget: model not found" under the static view.

    The widget renderer of JupyterLab and Notebook 7 writes that line as the text of its output
    node and gives the node the class `jupyter-widgets` (a drawn view is a child with that class,
    never the output node itself). So the live output (displayed right after the static twin) is
    hidden exactly while it shows the error, and the static twin stays the one thing shown.
    """
    return (f'<style>.jp-OutputArea-child:has([data-mnb-static="{key}"]) + '
            f'.jp-OutputArea-child:has(> .jp-OutputArea-output.jupyter-widgets){{display:none!important}}</style>')


@dataclass
class _Shown:
    """One static output on screen: its display id and the request (cell run) that displayed it."""

    display_id: str
    parent: dict


# Keep at most this many static outputs per widget up to date (each re-run of a cell adds one;
# the old ones are gone from the page, so updating them is wasted messages).
MAX_DISPLAYS = 8


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - ipywidgets needs IPython
        return None
    ip = get_ipython()
    return ip if ip is not None and type(ip).__name__ == "ZMQInteractiveShell" else None


def widgets_inside(widgets: Iterable[Any], *, skip: Iterable[Any] = ()) -> list[Any]:
    """Widgets and everything inside them: children all the way down, and the layout and style
    each one carries (widgets too, each with a comm of its own).

    Args:
        widgets: widgets (anything else, None included, is left out).
        skip: widgets left out, with everything inside them (default none).

    Returns:
        Each widget once, a container before what it holds.
    """
    seen = {id(x) for x in skip}
    out: list[Any] = []
    todo = list(widgets)[::-1]
    while todo:
        x = todo.pop()
        if not isinstance(x, _w.Widget) or id(x) in seen:
            continue
        seen.add(id(x))
        out.append(x)
        todo += [getattr(x, "layout", None), getattr(x, "style", None), *reversed(getattr(x, "children", None) or ())]
    return out


def close_widgets(widgets: Iterable[Any], *, keep: Iterable[Any] = ()) -> None:
    """Close widgets a widget made, with everything inside them (see widgets_inside).

    Args:
        widgets: the widgets to close (a composite one among them also stops what it follows,
            through its own close()).
        keep: widgets left open, with everything inside them (parts still in use elsewhere;
            default none).
    """
    for x in widgets_inside(widgets, skip=widgets_inside(keep)):
        x.close()


class StaticFallback:
    """Mixin for an ipywidgets DOMWidget subclass (put it first in the bases).

    Subclasses implement `static_html()`; plots also `static_png()`; `summary()` is the text/plain.
    They call `_static_changed()` after any change a reader of the saved notebook should see.
    `close()` closes the widget's children all the way down (the widget made them; a widget that
    holds one it was handed keeps it out of `children`) and what `_made_widgets()` adds.
    """

    def _made_widgets(self) -> list[Any]:
        """Widgets this one made that are not among its children (yet) and close() closes too.

        Returns:
            The widgets (default none).
        """
        return []

    def close(self) -> None:
        """Close the widget, its children all the way down (with their layouts and styles) and
        `_made_widgets()`."""
        if getattr(self, "comm", None) is not None:  # not closed yet (nor half-made, from __del__)
            close_widgets([*getattr(self, "children", ()), *self._made_widgets()])
        super().close()  # type: ignore[misc]

    def static_html(self) -> str:  # pragma: no cover - every widget overrides it
        """What the widget shows now, as HTML that reads without a kernel.

        Returns:
            The HTML (every widget overrides this).
        """
        raise NotImplementedError

    def static_png(self) -> bytes | None:
        """What a plot shows now, as a PNG.

        Returns:
            The PNG bytes, or None for widgets that are not plots (the default).
        """
        return None

    def summary(self) -> str:
        """The static output's text/plain: one stable line (no object ids, so nbval can compare it).

        Returns:
            The line; the default is the class name.
        """
        return f"<{type(self).__name__}>"

    # ---- bundles

    def static_bundle(self) -> dict[str, Any]:
        """The static output as a display bundle.

        Returns:
            {"text/plain": summary(), "text/html": static_html() in a keyed div, "image/png":
            static_png() base64-encoded, for plots}.
        """
        key = static_html_id(self)
        data: dict[str, Any] = {
            "text/plain": self.summary(),
            "text/html": (f'<div class="mnb-static {NO_MATH_CLASSES}" data-mnb-static="{key}">{_orphan_rule(key)}'
                          f'{_dollars_as_entities(self.static_html())}</div>'),
        }
        png = self.static_png()
        if png:
            data["image/png"] = base64.b64encode(png).decode("ascii")
        return data

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        """The widget view and the static fallback in one bundle (for callers that ask for one)."""
        data = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]  # the widget view
        data = dict(data or {})
        data.update(self.static_bundle())
        return data

    # ---- display

    def _ensure_hider(self) -> None:
        """Put the style rule that hides the static twin inside the live view (once)."""
        import ipywidgets as w

        if getattr(self, "_mnb_hider", None) is None:
            self._mnb_hider = w.HTML(_hide_rule(static_html_id(self)), layout=w.Layout(display="none"))
        if self._mnb_hider not in self.children:  # type: ignore[attr-defined]
            self.children = (*self.children, self._mnb_hider)  # type: ignore[attr-defined]

    def _ipython_display_(self) -> None:
        from IPython.display import display

        ip = _shell()
        if ip is None:  # a terminal or a plain script: one bundle, nothing to keep up to date
            display(self._repr_mimebundle_(), raw=True)
            return
        parent = dict(getattr(ip.display_pub, "parent_header", {}) or {})
        shown: list[_Shown] = self.__dict__.setdefault("_mnb_shown", [])
        if parent.get("msg_id") and any(s.parent.get("msg_id") == parent.get("msg_id") for s in shown):
            # shown again by the same cell (e.g. `handle = display(w, display_id=True)` then
            # `handle.update(w)`): one output, brought up to date, not a second copy
            self._static_changed()
            return
        self._ensure_hider()
        # the static output first: readers of a saved notebook that take a cell's first output get it
        handle = display(self.static_bundle(), raw=True, display_id=True)
        live = dict(super()._repr_mimebundle_() or {})  # type: ignore[misc]
        # text/html "" keeps this output blank where there is no widget manager (the static twin
        # speaks); a fixed label, since this output is never re-sent and its state would go stale
        live.update({"text/plain": f"{type(self).__name__}: live view (its state is the output above)",
                     "text/html": ""})
        display(live, raw=True)
        shown.append(_Shown(handle.display_id, parent))
        del shown[:-MAX_DISPLAYS]

    def _static_within(self, owner: "StaticFallback") -> None:
        """Say that this widget is shown inside `owner`, whose static HTML holds this one's (a
        dashboard's previewer): each change here re-sends the owner's static output too, so the
        saved notebook shows what the reader stepped to inside it.

        Args:
            owner: the widget whose static output includes this one's.
        """
        self.__dict__["_mnb_owner"] = owner

    def _static_changed(self) -> None:
        """Re-send the static output(s) with the current state (`update_display_data` by display
        id: JupyterLab, nbclient and papermill apply it to the output wherever it is), and the
        owner's when this widget is shown inside another (`_static_within`)."""
        owner = self.__dict__.get("_mnb_owner")
        if owner is not None:
            owner._static_changed()
        shown: list[_Shown] = self.__dict__.get("_mnb_shown") or []
        if not shown or _shell() is None:
            return
        from IPython.display import update_display

        bundle = self.static_bundle()
        for s in list(shown):
            update_display(bundle, raw=True, display_id=s.display_id)


class FollowsPicker:
    """Mixin for a widget that follows a RunPicker's selection (its `link(picker)` sets `picker`
    and `_picker_handler`): `unlink()` stops following, and so does closing the widget, so a
    closed widget is no longer called, nor kept alive, by the picker. Put it before the widget base.
    """

    picker: Any = None
    _picker_handler: Any = None

    def unlink(self) -> None:
        """Stop following the picker (what the widget shows stays)."""
        if self.picker is not None and self._picker_handler is not None:
            self.picker.unobserve(self._picker_handler, names="selected_ids")
        self.picker, self._picker_handler = None, None

    def close(self) -> None:
        """Stop following the picker (it stays open: the caller's), then close the widget with
        the widgets it made (StaticFallback.close)."""
        if self._picker_handler is not None:
            self.unlink()
        super().close()  # type: ignore[misc]


class StaticPlot(StaticFallback):
    """StaticFallback for a widget drawn as one PNG: it keeps the last drawing in `_png` (empty
    before the first draw) and embeds it in its static HTML with `_img_html`."""

    _png: bytes = b""

    def static_png(self) -> bytes | None:
        """The plot as the saved notebook keeps it.

        Returns:
            The PNG, or None before the first draw.
        """
        return self._png or None

    def _img_html(self, alt: str) -> str:
        """The last drawing as an <img> that carries its own bytes (a saved notebook has no files
        beside it)."""
        img = base64.b64encode(self._png).decode("ascii")
        return f'<img alt="{escape(alt)}" src="data:image/png;base64,{img}"/>'


def escape(value: Any) -> str:
    """A value as HTML-escaped text.

    Args:
        value: anything (str() is taken).

    Returns:
        The escaped text ("$" as `&#36;`, see theme.escape); "" for None.
    """
    return "" if value is None else _escape_text(value)


def word_diff(a: str, b: str) -> list[tuple[str, str]]:
    """The word-level difference between two texts.

    Args:
        a: the first text (a reply, a baseline's output).
        b: the second (its rewrite, a checkpoint's output).

    Returns:
        (op, text) pieces in order, op "same", "removed" (in `a` only) or "added" (in `b` only);
        whitespace stays with the words before it.
    """
    import difflib
    import re

    x, y = re.findall(r"\S+\s*", a), re.findall(r"\S+\s*", b)
    out: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, x, y, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("same", "".join(y[j1:j2])))
            continue
        if i2 > i1:
            out.append(("removed", "".join(x[i1:i2])))
        if j2 > j1:
            out.append(("added", "".join(y[j1:j2])))
    return out


def diff_html(pieces: list[tuple[str, str]], keep: tuple[str, ...] = ("same", "removed", "added")) -> str:
    """word_diff pieces as HTML: removed words struck through in red, added ones underlined in green.

    Args:
        pieces: word_diff's (op, text) pieces.
        keep: the ops shown (default all; ("same", "removed") draws the first text alone).

    Returns:
        The escaped HTML (spans with the classes mnb-diff-removed / mnb-diff-added).
    """
    style = {"removed": f"color:{text_colour(RED)};text-decoration:line-through",
             "added": f"color:{text_colour(GREEN)};text-decoration:underline"}
    return "".join(escape(t) if op == "same" else f'<span class="mnb-diff-{op}" style="{style[op]}">{escape(t)}</span>'
                   for op, t in pieces if op in keep)
