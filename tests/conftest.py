"""Shared test set-up: offline, single-threaded torch, small fixtures."""

import atexit
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test's teardown (the fixtures of its module too, when the next test is in
    another): the shared Chromium stops before a test that is not a browser test, and no tinker
    SDK session is left sending heartbeats to a server that is gone."""
    yield
    stop_browser_unless_next(nextitem)
    check_no_heartbeat_left()


#: The files that take longest (8 to 35 s each, run alone), longest first. With `-n 2 --dist loadfile
#: --no-loadscope-reorder` (the Makefile) a worker takes the next file in this order when it is free;
#: handing out the long files first lets the two workers end together rather than one waiting while
#: the other runs a long file picked last.
LONG_FIRST = ("test_real_model_server", "test_browser", "test_preference_dpo", "test_notebook_tinker_path",
              "test_server", "test_browser_review", "test_preference_notebook", "test_sweeps",
              "test_notebook_real_model", "test_train", "test_server_tokenizer", "test_heldout",
              "test_notebook_sweep", "test_notebook_promote_run", "test_notebook_inspect",
              "test_notebooks_any_workspace", "test_notebook_reports", "test_browser_sweep", "test_server_lifecycle",
              "test_hardening_report", "test_server_service", "test_dpo_heldout", "test_candidate",
              "test_tinker_engine", "test_docs", "test_inspect", "test_report")


def pytest_collection_modifyitems(config, items):
    """Run the long files first (in LONG_FIRST's order); every file's own tests keep their order."""
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
