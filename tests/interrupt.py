"""Stop a training run at a known step, with no timing involved: Ctrl-C (`ctrl_c_at`) or an engine
fault (`engine_fault_at`)."""

import contextlib
import importlib
import threading
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def ctrl_c_at(bar: str, at: int, hold_step: int) -> Iterator[None]:
    """The training call in the block is interrupted when the `bar` progress bar reaches `at`.

    The local engine (served from this process) holds its `hold_step`-th optimizer step until the
    interrupted training process has been stopped (loop._Runner.stop returned: the run has
    ended), so the run cannot finish first, however slowly the interrupt travels. The block must
    raise KeyboardInterrupt (a test failure otherwise); every patch is undone when it ends.
    """
    from machine_nb.engines.local import compute
    from machine_nb.training import loop

    bar_class = importlib.import_module("machine_nb.core.progress").progress  # the module, not the function
    gate, calls = threading.Event(), []
    real_step, real_update, real_stop = compute.Trainer.optim_step, bar_class.update, loop._Runner.stop

    def held_step(self, **params):
        calls.append(1)
        if len(calls) == hold_step:
            # released once the training process has stopped; the bound only keeps a broken test
            # from hanging, and is generous because a loaded machine can take minutes to bring the
            # bar to `at`
            gate.wait(300)
        return real_step(self, **params)

    def interrupting_update(self, n=1, **postfix):
        real_update(self, n, **postfix)
        if self.desc == bar and self.n >= at:  # the training bar, not the token count before it
            raise KeyboardInterrupt

    def stop_then_release(self):
        try:
            real_stop(self)
        finally:
            gate.set()

    compute.Trainer.optim_step, bar_class.update, loop._Runner.stop = held_step, interrupting_update, stop_then_release
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        gate.set()
        compute.Trainer.optim_step, bar_class.update, loop._Runner.stop = real_step, real_update, real_stop


@contextlib.contextmanager
def engine_fault_at(step: int) -> Iterator[None]:
    """The local engine's `step`-th optimizer step in the block (counted across runs) raises
    RuntimeError("engine fault for the test"), once; the real step is back when the block ends."""
    from machine_nb.engines.local import compute

    real_step, calls = compute.Trainer.optim_step, []

    def failing_step(self, **params):
        calls.append(1)
        if len(calls) == step:
            raise RuntimeError("engine fault for the test")
        return real_step(self, **params)

    compute.Trainer.optim_step = failing_step
    try:
        yield
    finally:
        compute.Trainer.optim_step = real_step


def ctrl_c_as_the_pool_starts(monkeypatch: pytest.MonkeyPatch, started: threading.Event) -> None:
    """Make every `concurrent.futures.ThreadPoolExecutor` of the test behave as when a Ctrl-C lands
    while the pool starts its thread: `submit` hands the work to the thread, waits until the work
    has begun (`started` set), then raises KeyboardInterrupt with the thread not yet in the pool's
    records, so the pool's own shutdown does not wait for it."""
    import concurrent.futures

    class StartingPool(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            super().submit(fn, *args, **kwargs)
            started.wait(timeout=60)
            self._threads.clear()
            raise KeyboardInterrupt

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", StartingPool)


def interrupted_in_a_kernel(call, ctrl_c_once: threading.Event | None = None) -> None:
    """`call()` from inside a running event loop, as a notebook cell runs; it must raise
    KeyboardInterrupt (a test failure otherwise). With `ctrl_c_once`, a real SIGINT goes to this
    thread once that event is set, and raises KeyboardInterrupt where it lands, as ipykernel's
    Ctrl-C does (SIGINT's default handler is in place meanwhile: a test process may have been
    started with SIGINT ignored)."""
    import asyncio
    import signal

    def interrupt():
        ctrl_c_once.wait()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    async def cell():
        if ctrl_c_once is not None:
            threading.Thread(target=interrupt, daemon=True).start()
        call()

    kernel = asyncio.new_event_loop()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            kernel.run_until_complete(cell())
    finally:
        signal.signal(signal.SIGINT, before)
        kernel.close()
