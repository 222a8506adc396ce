"""Ending a program's process at once, its output written."""

from __future__ import annotations

import os
import sys


def end_process(code: int) -> None:
    """Flush logging, stdout and stderr, then end the process with `code` at once (`os._exit`): no
    atexit handlers, no interpreter teardown of the modules it loaded. For a program whose work is
    done and written when it calls this; never returns."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
