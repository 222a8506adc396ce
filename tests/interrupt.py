"""Press Ctrl-C in the middle of a training run at a known step, with no timing involved."""

import contextlib
import importlib
import threading
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def ctrl_c_at(bar: str, at: int, hold_step: int) -> Iterator[None]:
    """The training call in the block is interrupted when the `bar` progress bar reaches `at`.

    The local engine (served from this process) holds its `hold_step`-th optimizer step until the
    interrupt, so the run cannot finish first. The block must raise KeyboardInterrupt (a test
    failure otherwise); both patches are undone when it ends.
    """
    from machine_nb.engines.local import compute

    bar_class = importlib.import_module("machine_nb.core.progress").progress  # the module, not the function
    gate, calls = threading.Event(), []
    real_step, real_update = compute.Trainer.optim_step, bar_class.update

    def held_step(self, **params):
        calls.append(1)
        if len(calls) == hold_step:
            # released by the interrupt; the bound only keeps a broken test from hanging, and is
            # generous because a loaded machine can take minutes to bring the bar to `at`
            gate.wait(300)
        return real_step(self, **params)

    def interrupting_update(self, n=1, **postfix):
        real_update(self, n, **postfix)
        if self.desc == bar and self.n >= at:  # the training bar, not the token count before it
            gate.set()
            raise KeyboardInterrupt

    compute.Trainer.optim_step, bar_class.update = held_step, interrupting_update
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        compute.Trainer.optim_step, bar_class.update = real_step, real_update
