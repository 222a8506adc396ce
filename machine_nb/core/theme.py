"""Theme colours for every HTML view machine_nb draws: JupyterLab's CSS variables, so each view
reads in light and dark themes, with a light-theme fallback where no variable is set (an HTML
export read outside JupyterLab).
"""

from __future__ import annotations

FG = "var(--jp-content-font-color1, #111)"
FG_MUTED = "var(--jp-content-font-color2, #4b5563)"
BG = "var(--jp-layout-color0, #fff)"
BG_ALT = "var(--jp-layout-color2, #eceff3)"
BORDER = "var(--jp-border-color2, #d1d5db)"
BORDER_STRONG = "var(--jp-border-color1, #9ca3af)"
GREEN = "var(--jp-success-color1, #16a34a)"
RED = "var(--jp-error-color1, #dc2626)"
ORANGE = "var(--jp-warn-color1, #d97706)"
BLUE = "var(--jp-brand-color1, #2563eb)"
CYAN = "var(--jp-info-color1, #0891b2)"
GREY = "var(--jp-layout-color4, #6b7280)"
# The theme's strongest text colour: black in a light theme, white in a dark one.
_INK = "var(--jp-content-font-color0, #000)"


def text_colour(hue: str) -> str:
    """A hue made readable as text on the page: mixed 30% toward the theme's text colour.

    JupyterLab's accent colours are tuned as fills: its light-theme green is under 4.5:1 on white
    and its dark-theme red under 4.5:1 on #111; the mix darkens them on light pages and lightens
    them on dark ones (all above 4.5:1 in both themes, see tests/test_browser.py).
    """
    return f"color-mix(in srgb, {hue} 70%, {_INK})"


def tint(hue: str, percent: int = 22) -> str:
    """A background tinted with `hue` over the page colour (text on it uses FG)."""
    return f"color-mix(in srgb, {hue} {percent}%, {BG})"


# Classes MathJax 2 (`tex2jax_ignore`) and MathJax 3 (`mathjax_ignore`, and its default
# `ignoreHtmlClass`) skip: JupyterLab, classic Notebook and nbviewer typeset math in HTML outputs,
# so "$0.40 … $1.20" would otherwise render as italic math.
NO_MATH_CLASSES = "tex2jax_ignore mathjax_ignore"


def escape(text: object) -> str:
    """`text` as HTML text that no math typesetter reads as TeX: HTML-escaped, `$` as `&#36;`.

    The entity alone is not enough where a typesetter reads the DOM's text; every view also sits
    inside `no_math(...)`.
    """
    import html

    return html.escape(str(text), quote=True).replace("$", "&#36;")


def no_math(fragment: str, tag: str = "div") -> str:
    """Wrap HTML (or Markdown) in an element that math typesetters skip, so `$` stays a dollar sign.

    JupyterLab, nbviewer and exported reports typeset text between two `$` as TeX: "costs $0.40
    and $0.32" shows as math. Every view of machine_nb sits inside this wrapper; use it for
    a summary cell of your own: `display(Markdown(mnb.no_math("\n\n- cost: &#36;0.40\n\n")))`
    (write `$` as `&#36;`, and surround Markdown with blank lines so it is read inside the element).

    Args:
        fragment: the HTML or Markdown to wrap.
        tag: the wrapping element (default "div"; "span" inside a line).

    Returns:
        The fragment inside `<tag class="tex2jax_ignore mathjax_ignore">`. Also importable as
        `machine_nb.no_math`.
    """
    return f'<{tag} class="{NO_MATH_CLASSES}">{fragment}</{tag}>'
