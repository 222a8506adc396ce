"""Start a real JupyterLab on localhost and drive it with headless Chromium (for browser tests).

The recipe: --allow-root, a token, a free port, a settings dir without the "Jupyter news?" toast
and with every notebook cell drawn (no windowing, so off-screen outputs can be measured), the
server in its own process group, waiting for "| Idle" before Run > Run All. Any test module can
reuse it:

    with lab_server(tmp) as lab, lab_page(lab) as page:
        write_notebook(tmp / "x.ipynb", ["print('ok')"])
        open_and_run_all(page, lab, "x.ipynb")

Starting Lab and Chromium and loading Lab's page cost seconds, so a test process keeps one of
each: the `lab` fixture (tests/conftest.py) gives each test its own folder of the process's one
Lab and shuts the test's kernels when the test ends; `lab_page(lab)` lends the process's one Lab
page (loaded once, in a workspace of its own), where `open_and_run_all` opens each test's notebook
with Lab's `docmanager:open`, so each test's notebook has its own panel, widget manager and new
kernel. When the block ends every document is closed unsaved (the files stay as the test left them)
and the theme is Lab's default again; a block that fails closes the page's browser context
instead, so the next test loads Lab afresh. `chromium_page()` opens a fresh browser context (no
cookies, storage or tabs of an earlier test) for pages that are not Lab. The process's one
Chromium stops once the next test is not a browser test (a running Playwright marks an asyncio
loop as running, which other tests' asyncio would trip on).

Lab switches themes without a reload, so one run of a notebook can be checked in both themes:
`set_theme(page, "JupyterLab Dark")` between the checks, each inside `screenshot_after(page, path)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# Debian's chromium (CI installs it with `make setup`); Playwright drives it, no `playwright install`.
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Generous waits: under CPU load Lab takes far longer than Playwright's 5 s default.
TIMEOUT_MS = 90_000


def chromium_path() -> str:
    """The Chromium executable; fails (not skips: CI installs it) with what to run when missing."""
    import pytest

    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make setup` (installs Debian's chromium) "
                    "or set CHROMIUM to a Chromium/Chrome executable", pytrace=False)
    return CHROMIUM


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    """Write code cells as a notebook in plain JSON (`import nbformat` costs seconds at collection)."""
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                     "source": c} for c in cells],
          "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    for i, cell in enumerate(nb["cells"]):
        cell["id"] = f"cell-{i}"
    path.write_text(json.dumps(nb))
    return path


@dataclass
class Lab:
    """A running JupyterLab: `url(notebook)` opens a notebook under root with the token.

    `folder(name)` is the same server seen from its subfolder `name`: its root is that folder, and
    its urls open notebooks there in a Lab workspace of that name (a fresh layout: no tab another
    folder's test left open is restored, so no kernel of theirs starts)."""

    base: str
    token: str
    root: Path
    process: subprocess.Popen
    prefix: str = ""  # the root's path under the server's root ("" for the server's root)

    def url(self, notebook: str) -> str:
        if not self.prefix:
            return f"{self.base}/lab/tree/{notebook}?token={self.token}"
        return f"{self.base}/lab/workspaces/{self.prefix}/tree/{self.prefix}/{notebook}?token={self.token}"

    def folder(self, name: str) -> Lab:
        """This server rooted at its new subfolder `name` (letters, digits, "-" and "_")."""
        if self.prefix:
            raise ValueError(f"Lab.folder({name!r}): call it on the server's Lab, not on its folder {self.prefix!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"Lab folder name {name!r}: use letters, digits, '-' and '_' only")
        (self.root / name).mkdir()
        return Lab(self.base, self.token, self.root / name, self.process, name)

    def _api(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"{self.base}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            body = reply.read()
        return json.loads(body) if body else None

    def end_test(self) -> None:
        """Leave the server as a new test expects it: every kernel shut down, the theme Lab's default.

        The kernels are stopped through the REST API in a thread, while the next test opens its
        notebook; the next `end_test` (or `wait_stopped`) waits for that and raises what it met."""
        self.wait_stopped()
        doomed = ([f"sessions/{s['id']}" for s in self._api("GET", "sessions")]
                  + [f"kernels/{k['id']}" for k in self._api("GET", "kernels")])

        def stop() -> None:
            for path in doomed:
                try:
                    self._api("DELETE", path)  # returns once the kernel has gone
                except urllib.error.HTTPError as e:
                    if e.code != 404:  # a session's DELETE also ended its kernel
                        _stopping.append(e)
                except OSError as e:
                    _stopping.append(e)

        thread = threading.Thread(target=stop, name="lab-end-test", daemon=True)
        thread.start()
        _stopping.append(thread)
        server_root = self.root if not self.prefix else self.root.parent
        theme = server_root / ".lab-settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
        theme.unlink(missing_ok=True)  # set_theme saved a choice there; without it Lab opens in its default

    def wait_stopped(self, last: bool = True) -> None:
        """Wait until the kernels earlier `end_test` calls stop have gone; raise what stopping met.

        With `last=False` the latest `end_test`'s stop (the one thread pending: each `end_test` waits
        for the one before) is not waited for: for the server's own end, which stops its kernels with
        it (one process group)."""
        errors = []
        while _stopping:
            item = _stopping.pop(0)
            if not last and isinstance(item, threading.Thread):
                continue
            if isinstance(item, threading.Thread):
                item.join(90)
                if item.is_alive():
                    errors.append(TimeoutError("a kernel of an earlier test did not stop in 90 s"))
            else:
                errors.append(item)
        if errors:
            raise RuntimeError(f"stopping the kernels of an earlier test failed: {errors}")


_stopping: list = []  # the latest end_test's thread, then any error it met


@contextlib.contextmanager
def lab_server(root: Path, start_timeout_s: float = 90) -> Iterator[Lab]:
    """Run `jupyter lab` serving `root` on 127.0.0.1 (free port, random token) until the block ends.

    The log is `root/server.log` (shown in the failure when the server dies or never answers).
    The server and its kernels share a new process group, stopped together at the end.
    """
    root = Path(root)
    settings = root / ".lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no "Jupyter news?" toast
    notebook_settings = root / ".lab-settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True, exist_ok=True)
    (notebook_settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    log_path = root / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MACHINE_NB_PROGRESS": "0"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
             "--port-retries=0", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={root / '.lab-workspaces'}",
             f"--LabApp.user_settings_dir={root / '.lab-settings'}", "--LabApp.news_url=None",
             "--LabApp.expose_app_in_browser=True"],  # window.jupyterapp: theme and save commands
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root, env=env)
        try:
            base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + start_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"jupyter lab exited {proc.returncode}:\n{log_path.read_text()}")
                try:
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"jupyter lab did not answer in {start_timeout_s} s:\n"
                                           f"{log_path.read_text()}") from None
                    time.sleep(0.2)
            yield Lab(base, token, root, proc)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # server + kernels
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


_shared: dict = {}  # this process's Playwright and Chromium, while a browser test runs


def shared_browser():
    """This test process's headless Debian Chromium (launched on first use; see stop_browser)."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)  # expect() ignores page.set_default_timeout (5 s default)
    if "browser" not in _shared:
        path = chromium_path()
        playwright = sync_playwright().start()
        try:
            _shared["browser"] = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        except BaseException:
            playwright.stop()
            raise
        _shared["playwright"] = playwright
    return _shared["browser"]


def stop_browser() -> None:
    """Close the shared Chromium and stop Playwright (which leaves no asyncio loop marked running)."""
    _shared.pop("lab_page", None)  # its context closes with the browser
    browser, playwright = _shared.pop("browser", None), _shared.pop("playwright", None)
    try:
        if browser is not None:
            browser.close()
    finally:
        if playwright is not None:
            playwright.stop()


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 900, **context_options) -> Iterator:
    """A Playwright page in a fresh context of the shared headless Chromium, with generous waits for
    `expect()` too; the context (its pages, storage and cache) closes when the block ends.
    `context_options` go to `browser.new_context` (e.g. color_scheme="dark")."""
    context = shared_browser().new_context(viewport={"width": width, "height": height}, **context_options)
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        yield page
    finally:
        context.close()


LIGHT = "JupyterLab Light"  # Lab's default theme

# Close every document of the main area unsaved (a test reads its files as it left them), then
# wait until none is left: closing a document's last tab disposes its context and widget manager.
# (Lab opens its Launcher in an emptied main area; that one stays.)
_CLOSE_DOCUMENTS_JS = """async () => {
  const app = window.jupyterapp;
  const documents = () => Array.from(app.shell.widgets("main")).filter((w) => w.context);
  for (const w of documents()) {
    if (w.context.model) w.context.model.dirty = false;  // no "Save your work?" dialog
    w.close();
  }
  for (const end = Date.now() + 60000; documents().length; ) {
    if (Date.now() > end) throw new Error("documents still open: " + documents().map((w) => w.title.label));
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}"""


@contextlib.contextmanager
def lab_page(lab: Lab, width: int = 1280, height: int = 900) -> Iterator:
    """The process's one page on JupyterLab `lab` (its server), at `width` x `height`, with Lab
    loaded and no document open; open notebooks with `open_and_run_all` (or `open_notebook`).

    When the block ends, every document is closed unsaved and the theme is Lab's default again; when
    the block raises, the page's browser context is closed and the next call loads Lab in a new one
    (nothing a failed test left, such as a dialog, reaches the next test)."""
    held = _shared.get("lab_page")
    if held is not None and (held[0] != lab.base or held[2].is_closed()):
        _shared.pop("lab_page")[1].close()
        held = None
    if held is None:
        context = shared_browser().new_context(viewport={"width": width, "height": height})
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(f"{lab.base}/lab/workspaces/browser-tests?reset&token={lab.token}")
            page.wait_for_function("() => window.jupyterapp")
            page.evaluate("() => window.jupyterapp.restored.then(() => true)")
        except BaseException:
            context.close()
            raise
        held = _shared["lab_page"] = (lab.base, context, page)
    else:
        held[2].set_viewport_size({"width": width, "height": height})
    page = held[2]
    try:
        yield page
        close_documents(page)
        if page.evaluate("document.body.dataset.jpThemeName") != LIGHT:
            set_theme(page, LIGHT)
    except BaseException:
        _shared.pop("lab_page", None)
        held[1].close()
        raise


def close_documents(page) -> None:
    """Close every document open in the Lab page unsaved, and wait until each has been disposed
    (its panel, its widget manager and its views gone); the files stay as they are."""
    page.evaluate(_CLOSE_DOCUMENTS_JS)


def open_notebook(page, lab: Lab, notebook: str) -> None:
    """Open `notebook` (under lab.root) in a new tab of the Lab page and wait until it is in front
    with its new kernel idle and the status bar saying so (so `end_test` finds the kernel)."""
    from playwright.sync_api import expect

    path = f"{lab.prefix}/{notebook}" if lab.prefix else notebook
    run_command(page, "docmanager:open", {"path": path})
    page.wait_for_function("""(path) => {
      const w = window.jupyterapp.shell.currentWidget;
      const kernel = w && w.context && w.context.path === path && w.sessionContext.session
        && w.sessionContext.session.kernel;
      return !!kernel && kernel.status === "idle";
    }""", arg=path)
    # The Run menu opened before the kernel is idle keeps its items disabled for good.
    expect(page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$"))).to_be_visible()


def open_and_run_all(page, lab: Lab, notebook: str) -> None:
    """Open a notebook in the Lab page (see `lab_page`), wait for its kernel to be idle, then
    Run > Run All Cells."""
    open_notebook(page, lab, notebook)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()


def run_command(page, command: str, args: dict | None = None) -> None:
    """Run a JupyterLab command (e.g. "apputils:change-theme", "docmanager:save") and wait for it."""
    page.evaluate("([c, a]) => window.jupyterapp.commands.execute(c, a).then(() => null)", [command, args or {}])


def set_theme(page, theme: str) -> None:
    """Switch JupyterLab's theme ("JupyterLab Light" / "JupyterLab Dark") and wait until it applies."""
    run_command(page, "apputils:change-theme", {"theme": theme})
    # Lab shows its splash, loads the theme's stylesheet, names the theme on <body>, hides the shell
    # and shows it again on the next frame, then removes the splash: the name set and the splash gone
    # mean the new colours apply and the widgets have their size again.
    page.wait_for_function("(t) => document.body.dataset.jpThemeName === t"
                           " && !document.getElementById('jupyterlab-splash')", arg=theme)


def run_in_kernel(page, code: str) -> None:
    """Run Python in the kernel of the notebook open in front (outputs go nowhere); fail on an error."""
    error = page.evaluate("""async (code) => {
      const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      const reply = await kernel.requestExecute({ code, store_history: false }).done;
      return reply.content.status === "ok" ? "" : `${reply.content.ename}: ${reply.content.evalue}`;
    }""", code)
    if error:
        raise AssertionError(f"{code!r} failed in the kernel: {error}")


def keep_screenshot(page, path: Path) -> None:
    """Screenshot the whole page to `path`, and copy it to $MACHINE_NB_TEST_ARTIFACTS when that is set."""
    page.evaluate("document.querySelectorAll('.jp-WindowedPanel-outer').forEach(e => { e.scrollTop = 0; })")
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("MACHINE_NB_TEST_ARTIFACTS"):
        out = Path(os.environ["MACHINE_NB_TEST_ARTIFACTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / Path(path).name)


@contextlib.contextmanager
def screenshot_after(page, path: Path) -> Iterator[None]:
    """Run the block, then keep a screenshot of the page at `path` (see keep_screenshot), failed or not."""
    try:
        yield
    finally:
        keep_screenshot(page, path)


# Computed colours → WCAG contrast of each matching element's text against what is behind it
# (backgrounds with alpha composited up the ancestors, over white when none is opaque).
_CONTRAST_JS = """
(selector) => {
  const parse = (c) => {
    let m = c.match(/^rgba?\\(([^)]+)\\)/);
    if (m) {
      const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
      return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    }
    m = c.match(/^color\\(srgb ([^)]+)\\)/);
    if (m) {
      const [rgb, a] = m[1].split("/");
      const p = rgb.trim().split(/\\s+/).map(Number);
      return [p[0] * 255, p[1] * 255, p[2] * 255, a === undefined ? 1 : Number(a)];
    }
    throw new Error("unparsed colour " + c);
  };
  const over = (top, bottom) => {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  };
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  };
  const out = [];
  for (const el of document.querySelectorAll(selector)) {
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height || !el.textContent.trim()) continue;
    const layers = [];
    for (let n = el; n; n = n.parentElement) {
      const bg = parse(getComputedStyle(n).backgroundColor);
      if (bg[3] > 0) layers.push(bg);
      if (bg[3] >= 1) break;
    }
    let bg = [255, 255, 255, 1];
    for (const layer of layers.reverse()) bg = over(layer, bg);
    const fg = over(parse(getComputedStyle(el).color), bg);
    const [hi, lo] = [lum(fg), lum(bg)].sort((x, y) => y - x);
    out.push({ text: el.textContent.trim().slice(0, 40), ratio: (hi + 0.05) / (lo + 0.05),
               fg: getComputedStyle(el).color, bg: bg.map(Math.round).join(",") });
    if (out.length >= 60) break;
  }
  return out;
}
"""


def contrast(page, selector: str) -> list[dict]:
    """Text contrast of the visible elements matching `selector`: text, ratio, fg, bg (at most 60)."""
    return page.evaluate(_CONTRAST_JS, selector)


def keep_widget_picture(page, cell: int, name: str) -> Path | None:
    """The output of code cell `cell` (0-based, as on screen) as a picture for the docs and the README:
    `$MACHINE_NB_TEST_ARTIFACTS/gallery/<name>.png` (`scripts/docs_images.py` copies the gallery into
    docs/images/). Taken from the live widget a browser test has just checked, so the pictures stay
    true. Returns the file, or None when MACHINE_NB_TEST_ARTIFACTS is unset."""
    if not os.environ.get("MACHINE_NB_TEST_ARTIFACTS"):
        return None
    out = Path(os.environ["MACHINE_NB_TEST_ARTIFACTS"]) / "gallery"
    out.mkdir(parents=True, exist_ok=True)
    area = page.locator(".jp-Notebook .jp-CodeCell").nth(cell).locator(".jp-Cell-outputArea")
    area.scroll_into_view_if_needed()
    path = out / f"{name}.png"
    area.screenshot(path=str(path))
    return path


def saved_outputs(path: Path, cell: int) -> list[dict]:
    """The outputs of a saved notebook's cell; [] while the file is caught mid-save (Jupyter's
    contents manager writes the notebook in place, so a poll can read it half written)."""
    try:
        nb = json.loads(path.read_text())
    except json.JSONDecodeError:
        return []
    return nb["cells"][cell].get("outputs", [])


def saved_static(path: Path, cell: int) -> str:
    """The text/html of a saved notebook cell's static fallback output ("" when it has none, or
    while the file is caught mid-save)."""
    for out in saved_outputs(path, cell):
        html = out.get("data", {}).get("text/html", "")
        html = "".join(html) if isinstance(html, list) else html
        if "mnb-static" in html:
            return html
    return ""
