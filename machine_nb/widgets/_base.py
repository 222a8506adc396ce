"""What every machine_nb widget shares: a static fallback of its current state.

A widget's live view needs a kernel; a saved notebook read on GitHub, nbviewer or as an
nbconvert HTML export has none. So each widget's mime bundle carries, next to the widget view,
`text/html` of what it shows now (plots also `image/png`) and a stable one-line `text/plain`
(nbval compares text/plain; a repr with object ids would differ on every run).
"""

from __future__ import annotations

import base64
import html
from typing import Any


class StaticFallback:
    """Mixin for an ipywidgets DOMWidget subclass (put it first in the bases).

    Subclasses implement `static_html()`; plots also `static_png()`; `summary()` is the text/plain.
    """

    def static_html(self) -> str:  # pragma: no cover - every widget overrides it
        raise NotImplementedError

    def static_png(self) -> bytes | None:
        return None

    def summary(self) -> str:
        return f"<{type(self).__name__}>"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs)  # type: ignore[misc]  # the widget view
        data = dict(data or {})
        data["text/plain"] = self.summary()
        data["text/html"] = self.static_html()
        png = self.static_png()
        if png:
            data["image/png"] = base64.b64encode(png).decode("ascii")
        return data


def escape(value: Any) -> str:
    """HTML-escaped text of a value (None → empty)."""
    return "" if value is None else html.escape(str(value))
