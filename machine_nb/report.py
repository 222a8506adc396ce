"""Reports: execute a notebook with parameters and write a shareable, self-contained HTML.

Execution is papermill's (parameters injected after the cell tagged `parameters`, the
convention every notebook here follows). What leaves the machine is cleaned first: the value of
any secret-looking environment variable (TINKER_API_KEY, *_TOKEN, *_SECRET, …) is replaced
wherever it appears, and live-widget views are dropped from outputs that carry a static
`text/html` fallback, with the widget-state metadata GitHub refuses to render.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jsonl import atomic_write_text

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
REDACTED = "[redacted]"
# environment variables whose values must never reach a report
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
_MIN_SECRET_LEN = 8  # shorter values ("1", "true") would redact ordinary text


@dataclass
class Report:
    """Where a report went and how long it took."""

    notebook: Path
    html: Path
    executed: Path
    wall_s: float
    redactions: int

    def _repr_html_(self) -> str:
        return (f"<p>Report: <code>{self.html}</code> (executed notebook <code>{self.executed}</code>), "
                f"{self.wall_s:.1f} s</p>")


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of secret-looking environment variables, longest first."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v.strip()) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> tuple[str, int]:
    """Replace each secret (and its JSON-escaped form) with [redacted]; returns (text, count)."""
    count = 0
    for s in secrets:
        for form in {s, json.dumps(s)[1:-1]}:
            n = text.count(form)
            if n:
                text = text.replace(form, REDACTED)
                count += n
    return text, count


def clean_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """Drop live-widget views that have a static fallback, and the widget-state metadata.

    A widget view without its kernel renders as an error on GitHub/nbviewer; the `text/html` (and
    `image/png`) our widgets put beside it renders everywhere. Outputs with nothing but a widget
    view (a third-party widget) keep it, with a text note, so nothing silently disappears.
    """
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) or []:
            data = out.get("data")
            if not data or WIDGET_VIEW not in data:
                continue
            if any(k in data for k in ("text/html", "image/png")):
                del data[WIDGET_VIEW]
            else:
                data.setdefault("text/plain", "[interactive widget: open the notebook in Jupyter to use it]")
                del data[WIDGET_VIEW]
    return nb


def to_html(notebook_json: str) -> str:
    """A self-contained HTML page of an executed notebook's JSON text (images embedded)."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(nbformat.reads(notebook_json, as_version=4))
    return body


def run_report(notebook: str | os.PathLike, parameters: dict[str, Any] | None = None,
               output: str | os.PathLike | None = None, *, kernel_name: str = "python3",
               cwd: str | os.PathLike | None = None, progress_bar: bool = True,
               timeout: float | None = None) -> Report:
    """Execute `notebook` with `parameters` and write `<output>.html` and `<output>.ipynb`.

    output: the HTML path; default `reports/<notebook stem>.html` under the current directory.
    The executed notebook lands next to it with the same stem. cwd: the kernel's working
    directory; default the notebook's own folder (as Jupyter and nbval run it), so relative paths
    in the notebook mean the same everywhere. A failing cell still writes both files (the error
    shows in place) and then raises papermill's PapermillExecutionError.
    """
    import papermill

    notebook = Path(notebook).resolve()
    html_path = Path(output) if output else Path("reports") / f"{notebook.stem}.html"
    html_path = html_path.resolve()
    executed = html_path.with_suffix(".ipynb")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    secrets = secret_values()
    start = time.monotonic()
    error: BaseException | None = None
    try:
        papermill.execute_notebook(
            str(notebook), str(executed), parameters=parameters or {}, kernel_name=kernel_name,
            cwd=str(cwd or notebook.parent), progress_bar=progress_bar,
            **({"execution_timeout": timeout} if timeout else {}))
    except Exception as exc:  # keep going: the partial notebook shows where it failed
        error = exc
    wall = time.monotonic() - start
    if not executed.exists():
        raise error or RuntimeError(f"papermill wrote no executed notebook for {notebook}")
    nb = clean_notebook(json.loads(executed.read_text(encoding="utf-8")))
    text, n1 = scrub(json.dumps(nb, ensure_ascii=False, indent=1), secrets)
    atomic_write_text(executed, text + "\n", mode=0o644)
    page, n2 = scrub(to_html(text), secrets)
    atomic_write_text(html_path, page, mode=0o644)
    if error is not None:
        raise error
    return Report(notebook=notebook, html=html_path, executed=executed, wall_s=wall, redactions=n1 + n2)
