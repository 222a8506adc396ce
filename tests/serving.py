"""`machine-nb serve` started as a user starts it: a real subprocess on a free port, its log in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class Served:
    """A running `machine-nb serve`: its process, URL, data dir and log file."""

    def __init__(self, proc: subprocess.Popen, url: str, data_dir: Path, log):
        self.proc, self.url, self.data_dir, self.log = proc, url, data_dir, log

    def output(self) -> str:
        self.log.flush()
        return open(self.log.name, encoding="utf-8", errors="replace").read()


def ctrl_c_reaches_it() -> None:
    """For Popen's preexec_fn: SIGINT as a terminal delivers it, even when the test run itself was
    started with SIGINT ignored (a background job of a shell without job control), so a test that
    presses Ctrl-C on the process tests what a user sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_server(tmp_path: Path, *args: str, name: str = "server") -> Served:
    """Start `machine-nb serve --port 0` with its data under tmp_path; returns once it says it is ready."""
    data_dir = tmp_path / f"{name}-data"
    log = open(tmp_path / f"{name}.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                             str(data_dir), *args], stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    line = proc.stdout.readline()  # the ready line; a dead server gives "" at once
    assert line.startswith("serving the Tinker API on http://"), (line, open(log.name).read())
    served = Served(proc, line.split(" on ", 1)[1].split()[0], data_dir, log)
    served.first_line = line
    return served


def stop_server(served: Served) -> int:
    """Ctrl-C the server (SIGKILL after 20 s) and return its exit status."""
    if served.proc.poll() is None:
        served.proc.send_signal(signal.SIGINT)
        try:
            served.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(served.proc.pid, signal.SIGKILL)
            served.proc.wait()
    served.log.close()
    return served.proc.returncode
