"""Fixtures for the browser tests (tests/conftest.py imports them): one JupyterLab per test process.

`lab` is that server seen from a new folder of its own for each test (its notebooks and files);
when the test ends its kernels are shut down (in the background, while the next test opens its
notebook) and the theme saved in the settings is Lab's default again.
`shared_lab` is the server itself, for a module that keeps one folder for all its tests. The shared
Chromium, with the Lab page `lab.lab_page` lends, stops after a browser test whose next test is not
one (marker `browser`), so no Playwright is left running under other tests.
"""

from __future__ import annotations

import itertools
import re
import sys

import pytest

_folders = itertools.count()


@pytest.fixture(scope="session")
def shared_lab(tmp_path_factory):
    """This test process's JupyterLab, rooted at a session temp folder."""
    from lab import chromium_path, lab_server

    chromium_path()  # fails at once, saying to run `make setup`, when Chromium is missing
    with lab_server(tmp_path_factory.mktemp("lab")) as server:
        yield server
        server.wait_stopped(last=False)  # the last test's kernels stop with the server


@pytest.fixture
def lab(shared_lab, request):
    """The shared JupyterLab rooted at a new folder for this test; its kernels stop after it."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:60]
    folder = shared_lab.folder(f"{next(_folders):03d}-{name}")
    try:
        yield folder
    finally:
        folder.end_test()


def stop_browser_unless_next(nextitem) -> None:
    """Stop the shared Chromium unless the next test is a browser test (tests/conftest.py calls it
    after each test's teardown)."""
    lab = sys.modules.get("lab")
    if lab is not None and (nextitem is None or nextitem.get_closest_marker("browser") is None):
        lab.stop_browser()
