"""The toolkit's own processes: their start-up without the garbage collector's repeated walks, and
ending one at once, its output written."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence


def end_process(code: int) -> None:
    """Flush logging, stdout and stderr, then end the process with `code` at once (`os._exit`): no
    atexit handlers, no interpreter teardown of the modules it loaded. For a program whose work is
    done and written when it calls this; never returns."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def freeze_at_exit() -> None:
    """Have the interpreter's exit skip its final walks over what the process still holds: registers
    `gc.freeze` to run at exit after every exit handler registered later (atexit runs the last
    registered first), so those still run, and the full collections of the interpreter's own
    teardown then pass over the objects that lived to the end, whose memory the operating system
    takes back at once anyway. For a toolkit program (`machine-nb` commands): with torch, the SDK
    and the cookbook loaded those walks take about 0.4 CPU-s, a fifth of a short command. An
    object kept alive to the end in a reference cycle is not finalized then (CPython does not
    promise it either); the toolkit's programs close what they write before they return.
    """
    import atexit

    atexit.register(gc.freeze)


def pause_collection() -> None:
    """Pause the cyclic garbage collector for the start-up of one of the toolkit's own long-lived
    processes (the training runner, a server's training process, `machine-nb serve`); `settle`
    resumes it once the process is ready.

    Importing torch, the tinker SDK and tinker-cookbook, and loading a model, make some hundreds of
    thousands of objects that live as long as the process. A collector running while they are made
    walks the growing heap again and again, and every full collection afterwards walks them all
    once more. Never for a user's interpreter: `settle` freezes every object that exists.
    """
    gc.disable()


def settle() -> None:
    """The process is ready: move every object it has made so far, which lives as long as it does, to
    the collector's permanent generation (`gc.freeze`), then resume the collector for what the
    process makes from now on. Nothing happens while the collector runs (the process has settled
    already), so a `finally` may call it again."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()


def preload(modules: Sequence[str]) -> None:
    """Import `modules` with the collector paused, then `settle`: what a fresh process about to use
    them saves in collections (the training runner while it awaits its first run, a report's
    kernel before its first cell: reports.notebook). A module that fails to import is left out
    (what needs it fails there, and says why).
    Only at the start of a process, before it holds anything of a user's: `settle` freezes every
    object that exists. Returns None (an IPython exec line shows no value).

    Args:
        modules: module names, imported in order.
    """
    pause_collection()
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    finally:
        settle()
