"""Reports: execute a notebook with parameters and write a shareable, self-contained HTML.

Execution is papermill's (parameters injected after the cell tagged `parameters`, the
convention every notebook here follows). The notebook runs in memory (papermill saves it through
an in-memory handler, never to disk), so neither a run in progress nor one stopped by Ctrl-C or a
crash leaves an unredacted file anywhere; only the redacted notebook and HTML are written.

What is redacted (`[redacted]`), everywhere in the notebook (outputs, sources, metadata), in the
HTML and in the error a failing cell raises: what `machine_nb.redact` redacts (the rule's one
home; its docstring lists it: the values of secret-named environment variables, the report's
secret-named `parameters` too, URL passwords and key-shaped strings).
Local paths (path_rewriter), in the same pass over the notebook and the HTML, after the secrets:
a path under the notebook's folder is written relative to it (`cache/a.json`), one under the folder
above it (the project a `notebooks/` folder sits in) as `../…`, one elsewhere under the home folder
as `~/…`, so a report names no folder of the machine that made it (the raised error, read on this
machine, keeps them). Other text, path-like or not, is left as it is.
Live-widget views are dropped from outputs that carry a static `text/html` fallback, with the
widget-state metadata GitHub refuses to render; a machine_nb widget's live output goes whole, its
static twin holding the final state (clean_notebook).
"""

from __future__ import annotations

import html
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .compat import renamed
from .jsonl import atomic_write_text
from .progress import resolve_progress
from .redact import REDACTED, is_secret_name, scrub, secret_values  # noqa: F401  (the rule's home)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@dataclass
class Report:
    """Where a report went and how long it took.

    notebook: the notebook run. html: the HTML report written. executed: the executed notebook
    written beside it. wall_s: seconds the run took. redactions: secrets replaced.
    """

    notebook: Path
    html: Path
    executed: Path
    wall_s: float
    redactions: int

    @property
    def path(self) -> Path:
        """The HTML report written (the file to share)."""
        return self.html

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data.

        Returns:
            {notebook, html, executed (paths as strings), wall_s, redactions}.
        """
        return {"notebook": str(self.notebook), "html": str(self.html), "executed": str(self.executed),
                "wall_s": self.wall_s, "redactions": self.redactions}

    def _repr_html_(self) -> str:
        return (f"<p>Report: <code>{self.html}</code> (executed notebook <code>{self.executed}</code>), "
                f"{self.wall_s:.1f} s</p>")


# A character that continues a file name: a folder's path followed by one is another folder's name
# (a full stop too, unless it ends the sentence: `/home/me.bak` is another folder, `… in /home/me.` not).
_NAME_CHAR = r"[\w.~+\-]"
_NAME_GOES_ON = r"[\w~+\-]|\.[\w.~+\-]"


def path_rewriter(folder: str | os.PathLike, home: str | os.PathLike | None = None) -> Callable[[str], str]:
    """A function that writes this machine's absolute paths in a text as a reader elsewhere can read them.

    Args:
        folder: the notebook's folder. A path under it becomes relative (`<folder>/cache/a.json` ->
            `cache/a.json`, `<folder>/../runs` -> `../runs`, the folder itself `.`); a path under the
            folder above it becomes `../…` (unless that folder is `/` or holds the home folder).
        home: the home folder (default: the current user's, `~`); a path under it elsewhere becomes `~/…`.

    Returns:
        rewrite(text) -> text. Only those folders' own paths change, raw, JSON-escaped or HTML-escaped,
        where they stand as a path (`/data/home/me/x` or `<home>2/x` is not under `<home>`); symlinked
        folders are matched by both their given and their real path.
    """
    folder = Path(os.path.abspath(folder))
    home = Path(os.path.abspath(os.path.expanduser("~") if home is None else home))
    forms = lambda p: {str(p), os.path.realpath(p)}  # noqa: E731
    shown: dict[str, str] = {}

    def claim(base: Path | str, name: str) -> None:
        for form in forms(base):
            if Path(form).parent == Path(form):  # the root: every absolute path is under it
                continue
            for escaped in (form, json.dumps(form)[1:-1], html.escape(form)):
                shown.setdefault(escaped, name)

    claim(folder, ".")
    parent = folder.parent
    if not any(Path(h).is_relative_to(p) for h in forms(home) for p in forms(parent)):
        claim(parent, "..")
    claim(home, "~")
    # not after "scheme:/": `mysql://root:pw@h` names a user, not the folder /root
    pattern = re.compile(f"(?<!{_NAME_CHAR})(?<!:/)(" + "|".join(re.escape(b) for b in sorted(shown, key=len, reverse=True))
                         + f")(?:(/)|(?!{_NAME_GOES_ON}))")

    def replace(m: re.Match[str]) -> str:
        name, sep = shown[m.group(1)], m.group(2) or ""
        if name == "." and sep and re.match(_NAME_CHAR, m.string[m.end():m.end() + 1]):
            return ""  # <folder>/x -> x
        return name + sep

    return lambda text: pattern.sub(replace, text) if text else text


def _scrub_tree(value: Any, secrets: list[str],
                rewrite: Callable[[str], str] | None = None) -> tuple[Any, int]:
    """Every string in a JSON-like value (dict keys too) scrubbed in place, then rewritten by `rewrite`
    (path_rewriter's) when given; returns (value, secret replacements).

    Iterative, so an output nested however deep is scrubbed, never a RecursionError. Secrets go
    first: a secret value that holds a path is still found whole.
    """
    if rewrite is not None:
        def scrub_one(text: str, secrets: list[str]) -> tuple[str, int]:
            text, n = scrub(text, secrets)
            return rewrite(text), n
    else:
        scrub_one = scrub
    if isinstance(value, str):
        return scrub_one(value, secrets)
    total, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            items = list(enumerate(node))
        elif isinstance(node, dict):
            pairs = list(node.items())
            node.clear()
            for key, item in pairs:
                if isinstance(key, str):
                    key, n = scrub_one(key, secrets)
                    total += n
                node[key] = item
            items = list(node.items())
        else:
            continue
        for index, item in items:
            if isinstance(item, str):
                node[index], n = scrub_one(item, secrets)
                total += n
            elif isinstance(item, (list, dict)):
                stack.append(item)
    return value, total


def scrub_notebook(nb: dict[str, Any], secrets: list[str], folder: str | os.PathLike,
                   home: str | os.PathLike | None = None) -> tuple[dict[str, Any], int]:
    """Redact `secrets` (redact.scrub) and rewrite local paths (path_rewriter) in every string of a
    notebook: sources, every output's every mime type, error tracebacks, metadata, in place.

    Args:
        nb: the notebook as JSON-like data.
        secrets: values to redact (redact.secret_values), longest first.
        folder: the notebook's folder, which its paths are written relative to.
        home: the home folder (default `~`).

    Returns:
        (nb, number of secret redactions).
    """
    return _scrub_tree(nb, secrets, path_rewriter(folder, home))


# A machine_nb widget's static output (widgets/_base.py) names the widget's model id.
_STATIC_KEY = re.compile(r'data-mnb-static="([^"]+)"')


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else value if isinstance(value, str) else ""


def clean_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """Drop live-widget views that have a static fallback, and the widget-state metadata.

    A widget view without its kernel renders as an error on GitHub/nbviewer; the `text/html` (and
    `image/png`) our widgets put beside it renders everywhere. A machine_nb widget is shown as two
    outputs, its static view (kept up to date) and its live view, whose text/plain is the state it
    was first shown in: the live output goes whole, its stale text with it ("LossPlot: no metrics
    yet" beside the final curve). Outputs with nothing but a widget view (a third-party widget)
    keep it, with a text note, so nothing silently disappears.

    Args:
        nb: the notebook as a dict (nbformat 4 JSON), changed in place.

    Returns:
        The same notebook.
    """
    nb.get("metadata", {}).pop("widgets", None)
    cells = nb.get("cells", [])
    static = {key for cell in cells for out in cell.get("outputs", []) or []
              for key in _STATIC_KEY.findall(_text((out.get("data") or {}).get("text/html")))}
    for cell in cells:
        outputs = cell.get("outputs") or []
        live_twins = [out for out in outputs if isinstance((out.get("data") or {}).get(WIDGET_VIEW), dict)
                      and out["data"][WIDGET_VIEW].get("model_id") in static
                      and not _text(out["data"].get("text/html")).strip()]
        if live_twins:
            cell["outputs"] = outputs = [out for out in outputs if not any(out is twin for twin in live_twins)]
        for out in outputs:
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
    """A self-contained HTML page of an executed notebook (images embedded), by nbconvert.

    Args:
        notebook_json: the notebook's JSON text.

    Returns:
        The HTML page.
    """
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(embed_images=True)
    body, _ = exporter.from_notebook_node(nbformat.reads(notebook_json, as_version=4))
    return body


class _MemoryNotebooks:
    """A papermill I/O handler for `machine-nb-memory://…` paths: what papermill saves (after every
    cell, and the error-marked notebook when a cell fails) stays in this process's memory."""

    scheme = "machine-nb-memory://"

    def __init__(self) -> None:
        self._buffers: dict[str, str] = {}
        self._lock = threading.Lock()

    def read(self, path: str) -> str:
        with self._lock:
            return self._buffers[path]

    def write(self, buf: str, path: str) -> None:
        with self._lock:
            self._buffers[path] = buf

    def pop(self, path: str) -> str | None:
        with self._lock:
            return self._buffers.pop(path, None)

    def listdir(self, path: str) -> list[str]:
        return []

    def pretty_path(self, path: str) -> str:
        return path


_MEMORY = _MemoryNotebooks()
_registered = threading.Lock()


def _memory_path() -> str:
    from papermill.iorw import papermill_io

    path = f"{_MEMORY.scheme}{uuid.uuid4().hex}.ipynb"
    with _registered:
        if papermill_io.get_handler(path) is not _MEMORY:
            papermill_io.register(_MEMORY.scheme, _MEMORY)
    return path


def _redacted_error(exc: BaseException, secrets: list[str]) -> BaseException | None:
    """A copy of `exc` whose text holds no secret, or None when it held none (raise it as it is)."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(exc, PapermillExecutionError):
        fields, n = _scrub_tree([exc.source, exc.ename, exc.evalue, list(exc.traceback or [])], secrets)
        return PapermillExecutionError(exc.cell_index, exc.exec_count, *fields) if n else None
    text, n = scrub(str(exc), secrets)
    return RuntimeError(f"{type(exc).__name__}: {text}") if n else None


@renamed(progress_bar="progress")
def run_report(notebook: str | os.PathLike, parameters: dict[str, Any] | None = None,
               output: str | os.PathLike | None = None, *, kernel_name: str = "python3",
               cwd: str | os.PathLike | None = None, progress: bool | None = None,
               timeout: float | None = None) -> Report:
    """Execute a notebook with parameters and write a shareable report: `<output>.html` and
    `<output>.ipynb`, redacted, with local paths written relative to the notebook's folder or as
    `~/…` (this module's docstring).

    Args:
        notebook: the notebook to run (never overwritten).
        parameters: values injected after the cell tagged `parameters` (default None: none).
        output: the HTML path; default None: `reports/<notebook stem>.html` under the current
            directory. The executed notebook lands next to it with the same stem.
        kernel_name: the Jupyter kernel (default "python3").
        cwd: the kernel's working directory; default None: the notebook's own folder (as Jupyter
            and nbval run it), so relative paths in the notebook mean the same everywhere.
        progress: papermill's progress bar over cells (default None: on unless
            MACHINE_NB_PROGRESS=0).
        timeout: per-cell limit in seconds (default None: none).

    Returns:
        A Report (notebook, html, executed, wall_s, redactions).

    Raises:
        FileNotFoundError: a missing notebook, before anything is created.
        ValueError: the executed notebook would overwrite `notebook`.
        PapermillExecutionError: a failing cell, its text redacted, after both files are written
            (the error shows in place). A Ctrl-C writes nothing and re-raises.
    """
    import papermill

    folder = Path(os.path.abspath(notebook)).parent  # as given: path_rewriter adds its real path
    notebook = Path(notebook).resolve()
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook at {notebook}")
    html_path = Path(output) if output else Path("reports") / f"{notebook.stem}.html"
    html_path = html_path.resolve()
    executed = html_path.with_suffix(".ipynb")
    if executed == notebook:
        raise ValueError(f"the executed notebook would overwrite its input {notebook}: choose another output "
                         f"than {html_path.name}")
    parameters = dict(parameters or {})
    secrets = sorted(set(secret_values()) | set(secret_values({k: v for k, v in parameters.items()})),
                     key=len, reverse=True)
    memory = _memory_path()
    start = time.monotonic()
    error: BaseException | None = None
    try:
        try:
            papermill.execute_notebook(
                str(notebook), memory, parameters=parameters, kernel_name=kernel_name,
                cwd=str(cwd or notebook.parent),
                progress_bar=resolve_progress(progress),
                **({"execution_timeout": timeout} if timeout else {}))
        except Exception as exc:  # keep going: the partial notebook shows where it failed
            error = exc
        wall = time.monotonic() - start
        text = _MEMORY.pop(memory)
    finally:
        _MEMORY.pop(memory)  # Ctrl-C or a crash: drop the unredacted notebook
    if error is not None:
        safe = _redacted_error(error, secrets)
    if text is None:
        if error is None:
            raise RuntimeError(f"papermill saved no executed notebook for {notebook}")
        if safe is not None:
            raise safe from None
        raise error
    nb = clean_notebook(json.loads(text))
    nb.get("metadata", {}).get("papermill", {})["output_path"] = str(executed)
    nb, n1 = scrub_notebook(nb, secrets, folder)
    text = json.dumps(nb, ensure_ascii=False, indent=1)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(executed, text + "\n", mode=0o644)
    page, n2 = _scrub_tree(to_html(text), secrets, path_rewriter(folder))
    atomic_write_text(html_path, page, mode=0o644)
    if error is not None:
        if safe is not None:
            raise safe from None
        raise error
    return Report(notebook=notebook, html=html_path, executed=executed, wall_s=wall, redactions=n1 + n2)
