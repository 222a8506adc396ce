"""Functions for the parse pool's tests: importable by a worker process (a pool hands its workers
the test process's module search path, which holds this folder), and each behaves differently in a worker than in the test's process.
No timing decides an outcome: the test's process waits for a worker's mark (a file in `marks`)
before making a call, so the workers are sure to have taken the calls a test is about."""

import os
import time
from pathlib import Path


def _mark(marks: str) -> None:
    Path(marks, f"worker-{os.getpid()}").touch()


def _wait(marks: str, n: int) -> None:
    end = time.monotonic() + 60
    while len(list(Path(marks).glob("worker-*"))) < n:
        if time.monotonic() > end:
            raise TimeoutError(f"fewer than {n} worker(s) made a call within 60 s (did they start?)")
        time.sleep(0.01)


def twice_or_die(parent: int, marks: str, x: int) -> int:
    """2x. A worker asked for 3 marks, then dies without answering (as a killed worker would);
    the test's process waits for that mark."""
    if os.getpid() == parent:
        _wait(marks, 1)
    elif x == 3:
        _mark(marks)
        os._exit(7)
    return 2 * x


def twice_or_fail(parent: int, marks: str, x: int) -> int:
    """2x. A worker asked for 3 marks, then raises; the test's process waits for that mark."""
    if os.getpid() == parent:
        _wait(marks, 1)
    elif x == 3:
        _mark(marks)
        raise ValueError("three is not allowed in a worker")
    return 2 * x


def slow_or_interrupt(parent: int, marks: str, x: int) -> int:
    """A worker marks and sleeps for a minute; the test's process waits for every worker's mark,
    then raises KeyboardInterrupt (Ctrl-C)."""
    if os.getpid() == parent:
        _wait(marks, 2)
        raise KeyboardInterrupt
    _mark(marks)
    time.sleep(60)
    return x


def worker_pid(parent: int, marks: str, x: int) -> int:
    """The pid of the process that made the call. No call returns before two workers have each
    taken one: a worker marks and then waits for the other's mark, and the test's process waits
    too. So the first worker cannot make every call while the second is still starting."""
    if os.getpid() != parent:
        _mark(marks)
    _wait(marks, 2)
    return os.getpid()


def twice_or_stop(parent: int, marks: str, x: int) -> int:
    """2x. The first worker to take a call stops itself (SIGSTOP) without answering, as a stopped
    worker would; its replacement answers. The test's process waits for that mark."""
    import signal

    if os.getpid() == parent:
        _wait(marks, 1)
    elif not list(Path(marks).glob("worker-*")):
        _mark(marks)
        os.kill(os.getpid(), signal.SIGSTOP)
    return 2 * x
