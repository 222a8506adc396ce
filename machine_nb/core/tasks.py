"""Ending an asyncio task that may absorb a cancel."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: "asyncio.Task") -> None:
    """Cancel `task` again every 50 ms until it has ended; awaited on the task's own loop.

    One cancel is not always enough: a layer under the task can turn its CancelledError into another
    error, or catch it, and the task then runs on (the tinker SDK's session heartbeat was seen to)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
