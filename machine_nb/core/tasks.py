"""Ending an asyncio task that may absorb a cancel, and work in a worker thread that a Ctrl-C
stops and waits for."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable


async def cancel_and_wait(task: "asyncio.Task") -> None:
    """Cancel `task` again every 50 ms until it has ended; awaited on the task's own loop.

    One cancel is not always enough: a layer under the task can turn its CancelledError into another
    error, or catch it, and the task then runs on (the tinker SDK's session heartbeat was seen to)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)


def call_in_worker_thread(fn: Callable[[], Any], on_interrupt: Callable[[], None]) -> Any:
    """fn() in a worker thread, waited for here (where an event loop already runs, in a notebook
    kernel, work with a loop of its own cannot run in this thread).

    When the wait is interrupted (Ctrl-C: KeyboardInterrupt) or fails, `on_interrupt()` tells the
    work to stop, and, if the work has begun, this waits until it has ended (a second Ctrl-C stops
    waiting) before the exception goes up. The work's own end is waited for, not the pool's: a
    Ctrl-C that lands while the pool starts its thread leaves the pool unaware of that thread.

    Returns:
        What fn() returns.
    """
    began, ended = threading.Event(), threading.Event()

    def in_thread() -> Any:
        began.set()
        try:
            return fn()
        finally:
            ended.set()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(in_thread).result()
    except BaseException:
        on_interrupt()
        pool.shutdown(wait=False, cancel_futures=True)  # work not started yet never starts
        if began.is_set():
            ended.wait()
        raise
    finally:
        pool.shutdown(wait=False)
