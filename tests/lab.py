"""Start a real JupyterLab on localhost and drive it with headless Chromium (for browser tests).

Follows the measured recipe in shared/reference/browser-test.md: --allow-root, a token, a free
port, a settings dir without the "Jupyter news?" toast, the server in its own process group,
waiting for "| Idle" before Run > Run All. Any test module can reuse it:

    with lab_server(tmp) as lab, chromium_page() as page:
        write_notebook(tmp / "x.ipynb", ["print('ok')"])
        open_and_run_all(page, lab.url("x.ipynb"))
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
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
    """A running JupyterLab: `url(notebook)` opens a notebook under root with the token."""

    base: str
    token: str
    root: Path
    process: subprocess.Popen

    def url(self, notebook: str) -> str:
        return f"{self.base}/lab/tree/{notebook}?token={self.token}"


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    log_path = root / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MACHINE_NB_PROGRESS": "0"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}",
             "--port-retries=0", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", f"--LabApp.workspaces_dir={root / '.lab-workspaces'}",
             f"--LabApp.user_settings_dir={root / '.lab-settings'}", "--LabApp.news_url=None"],
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


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 900) -> Iterator:
    """A Playwright page in headless Debian Chromium, with generous waits for `expect()` too."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)  # expect() ignores page.set_default_timeout (5 s default)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def open_and_run_all(page, url: str) -> None:
    """Open a notebook, wait for its kernel to be idle, then Run > Run All Cells."""
    from playwright.sync_api import expect

    page.goto(url)
    # The Run menu opened before the kernel is idle keeps its items disabled for good.
    expect(page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$"))).to_be_visible()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
