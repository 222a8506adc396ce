"""Shared test set-up: offline, single-threaded torch, small fixtures."""

import atexit
import gc
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
# one compute thread per process (torch, BLAS), for this process and every process it starts: the
# engine pins one itself, and two test workers each computing on every core slow each other down
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _session_dir(var: str, prefix: str) -> None:
    """Point `var` at a new temporary folder, removed when this test process exits.

    atexit runs last-registered first, so the local server (whose own exit handler is registered
    later, when it starts) has stopped writing here before the folder goes; a forked child that
    exits through atexit leaves its parent's folder alone."""
    if var in os.environ:
        return
    path, owner = tempfile.mkdtemp(prefix=prefix), os.getpid()
    os.environ[var] = path
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))


# the local Tinker server writes runs and checkpoints here, not into the user's cache
_session_dir("MACHINE_NB_DATA_DIR", "machine-nb-server-")
# and run indexes go here, never into the user's cache
_session_dir("MACHINE_NB_CACHE_DIR", "machine-nb-cache-")
# local models' tokenizers are written to the Hugging Face hub cache under their names: not the user's
_session_dir("HF_HUB_CACHE", "machine-nb-hub-")
# real models converted from their GGUF files persist across test sessions (only the first converts)
os.environ.setdefault("MACHINE_NB_MODELS_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                            ".machine_nb_cache", "models"))

# browser tests: one JupyterLab and one Chromium per test process (tests/lab_fixtures.py)
from lab_fixtures import lab, shared_lab, stop_browser_unless_next  # noqa: E402,F401
import pytest  # noqa: E402
from sdk_sessions import check_no_heartbeat_left  # noqa: E402

from machine_nb.core.process import pause_collection, settle  # noqa: E402


# Collection imports torch, the tinker SDK, tinker-cookbook, pandas and the package: hundreds of
# thousands of objects that live as long as the test process. The collector is paused while they
# are made, and they are frozen out of its walks once collected (pytest_collection_finish), as the
# toolkit's own processes do at start-up (machine_nb.core.process.pause_collection). After each
# file, what outlived it (modules its tests imported, caches) is frozen too, once a collection has
# freed its garbage (pytest_runtest_teardown): each later collection walks only what is new.
pause_collection()


def pytest_collection_finish(session):
    settle()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test's teardown (the fixtures of its module too, when the next test is in
    another): the shared Chromium stops before a test that is not a browser test, no tinker
    SDK session is left sending heartbeats to a server that is gone, and after a file's last test
    what outlived the file is frozen out of the collector's walks."""
    yield
    stop_browser_unless_next(nextitem)
    check_no_heartbeat_left()
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


#: Browser tests (marker `browser`) are in files named test_browser*.py, and no other test is: under
#: `make test` those files are one unit of work that one pytest-xdist worker runs back to back, first,
#: so one JupyterLab, one Chromium and one Lab page serve them all (see pytest_xdist_make_scheduler).
BROWSER_FILES = "test_browser"

#: The other files that take longest, longest first. With `--dist loadfile --no-loadscope-reorder` (the
#: Makefile) a worker takes the next file in this order when it is free; handing out the long files
#: first lets the workers end together rather than one running a long file picked last while the
#: others wait.
LONG_FIRST = ("test_real_model_server", "test_preference_dpo", "test_notebook_tinker_path",
              "test_server", "test_preference_notebook", "test_sweeps",
              "test_notebook_real_model", "test_train", "test_server_tokenizer", "test_heldout",
              "test_notebook_sweep", "test_notebook_promote_run", "test_notebook_inspect",
              "test_notebooks_any_workspace", "test_notebook_reports", "test_server_lifecycle",
              "test_hardening_report", "test_server_service", "test_dpo_heldout", "test_candidate",
              "test_tinker_engine", "test_docs", "test_inspect", "test_report")


def _is_browser_file(path: str) -> bool:
    return os.path.basename(path).startswith(BROWSER_FILES)


def pytest_collection_modifyitems(config, items):
    """Run the browser files first, then the long files (in LONG_FIRST's order); every file's own
    tests keep their order. A browser test outside a test_browser*.py file, or a test in one that
    is not marked `browser`, is refused: the scheduling above relies on the names."""
    misplaced = sorted({item.nodeid.split("::")[0] for item in items
                        if (item.get_closest_marker("browser") is not None) != _is_browser_file(str(item.path))})
    if misplaced:
        raise pytest.UsageError(f"the `browser` marker and the file name {BROWSER_FILES}*.py go together; "
                                f"these files have one without the other: {', '.join(misplaced)}")
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: -1 if _is_browser_file(str(item.path)) else rank.get(item.path.stem, len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with all the browser files as one unit: the worker that takes it runs every
    browser test, one after another, on one JupyterLab and one Chromium (started once, not once
    for each file that follows a file of other tests)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BrowserFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return f"{BROWSER_FILES}*.py" if _is_browser_file(path) else path

    return BrowserFilesTogether(config, log)


@pytest.fixture
def isolated_run_index(tmp_path, monkeypatch):
    """The run index's cache folder under this test's tmp_path (MACHINE_NB_CACHE_DIR); returns it."""
    monkeypatch.setenv("MACHINE_NB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def stand_in_gguf(tmp_path, monkeypatch):
    """A stand-in GGUF file, an empty models folder and a stand-in `convert` that copies the file's
    bytes into a small complete folder (the real conversion is the first use in a fresh checkout).

    Returns:
        A namespace: gguf (the file), models (the folder), calls (the folders `convert` filled).
    """
    from types import SimpleNamespace

    from machine_nb.engines.local import hf

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setattr(hf, "gguf_path", lambda: gguf)
    monkeypatch.setenv("MACHINE_NB_MODELS_DIR", str(tmp_path / "models"))
    calls: list = []

    def convert(source, dest):
        calls.append(dest)
        (dest / "model.safetensors").write_bytes(source.read_bytes())
        (dest / "done.json").write_text("{}")

    monkeypatch.setattr(hf, "convert", convert)
    return SimpleNamespace(gguf=gguf, models=tmp_path / "models", calls=calls)
