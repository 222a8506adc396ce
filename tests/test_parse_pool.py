"""The run index's parse pool: worker processes that share a long parse with this one, through
the real `python -m machine_nb.store.parse_pool` processes. The workers import the helper
functions of tests/workers.py because a pool hands them this process's module search path."""

from __future__ import annotations

import os
import time

import pytest

import workers
from machine_nb.store.parse_pool import ParsePool


@pytest.fixture
def marks(tmp_path):
    return str(tmp_path)


def test_every_call_is_made_once_by_the_workers_and_this_process(marks):
    me = os.getpid()
    with ParsePool(2) as pool:
        assert pool.started == 2
        pids = list(pool.run(workers.worker_pid, [(me, marks, x) for x in range(40)]))
    assert len(pids) == 40 and pool.made_here + pool.made_there == 40
    assert len(set(pids) - {me}) == 2  # both workers took calls …
    assert pool.made_here == pids.count(me) and pool.started == 0


def test_a_worker_that_dies_leaves_its_call_to_this_process(marks):
    me = os.getpid()
    with ParsePool(1) as pool:
        procs = list(pool._procs)
        got = sorted(pool.run(workers.twice_or_die, [(me, marks, x) for x in range(8)]))
    assert got == [2 * x for x in range(8)]  # nothing lost: the dead worker's call was made here
    assert procs[0].returncode == 7


def test_an_error_in_a_worker_is_raised_here_and_the_workers_end(marks):
    me = os.getpid()
    with pytest.raises(ValueError, match="three is not allowed"):
        with ParsePool(1) as pool:
            procs = list(pool._procs)
            list(pool.run(workers.twice_or_fail, [(me, marks, x) for x in range(200)]))
    assert all(p.poll() is not None for p in procs)


def test_ctrl_c_here_kills_the_workers_at_once(marks):
    me = os.getpid()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with ParsePool(2) as pool:
            procs = list(pool._procs)
            list(pool.run(workers.slow_or_interrupt, [(me, marks, x) for x in range(10)]))
    assert time.monotonic() - start < 30  # not the minute a worker's call sleeps
    assert all(p.poll() is not None for p in procs)


def test_a_pool_whose_workers_cannot_start_runs_everything_here(monkeypatch):
    import subprocess

    def refuse(*a, **k):
        raise OSError("no more processes")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    with ParsePool(3) as pool:
        assert pool.started == 0
        assert sorted(pool.run(pow, [(x, 2) for x in range(5)])) == [0, 1, 4, 9, 16]


def test_a_stopped_worker_is_replaced_and_its_call_made_here(marks):
    """A worker stopped with SIGSTOP never answers: past the answer bound it is killed, its call
    made here and a new worker takes its place. The pool runs in a thread with a deadline, so a
    pool that waits forever fails this test instead of hanging it."""
    import signal
    import threading

    me = os.getpid()
    out: list = []
    pool = ParsePool(1, answer_timeout=2.0)
    first: list = []

    def go() -> None:
        with pool:
            first.extend(pool.pids)
            out.extend(sorted(pool.run(workers.twice_or_stop, [(me, marks, x) for x in range(8)])))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(90)
    try:
        assert not t.is_alive(), "the pool waited on a stopped worker"
        assert out == [2 * x for x in range(8)]  # nothing lost
        assert pool.replaced == 1 and pool.made_here >= 1
    finally:
        for pid in first:  # a stopped worker left behind by a failing pool
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
