"""Worker processes that share a long parse with this one: the run index's first load of a large
workspace reads and checks its files in several processes at once (run parsing is Python code,
which one process runs on one CPU at a time).

A worker is `python -m machine_nb.store.parse_pool`, started with the interpreter of this process,
fed calls over its stdin and answering on its stdout (length-prefixed pickles). Plain processes,
not `multiprocessing`: a worker never re-imports the caller's main script (a script without an
`if __name__ == "__main__"` guard would run again in every worker) and never forks a process that
has threads (as a Jupyter kernel has). A worker that cannot start leaves its calls to this
process; a call whose worker dies is tried once more in a fresh worker, then made here (or handed
to the caller's `crashed`: see ParsePool.run); a worker that takes no call or gives no answer
within ANSWER_TIMEOUT_S (stopped with SIGSTOP, or stuck) is killed and replaced, its call made
here. Ctrl-C (or any error here) kills the workers; a worker ignores Ctrl-C itself, and ends when
its stdin closes, so it never outlives this process's pipe.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_HEAD = 8  # bytes of the little-endian length before each pickle
#: Seconds a worker may take to answer one call (a batch of run files) before it is taken for
#: stopped or stuck: it is killed, its call made in this process, and a new worker started.
ANSWER_TIMEOUT_S = 120.0


def _send(fh: Any, obj: Any, timeout: float | None = None) -> None:
    """One message; TimeoutError when the pipe takes none of it for `timeout` seconds (None: wait)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if timeout is None or os.name == "nt":
        fh.write(len(data).to_bytes(_HEAD, "little"))
        fh.write(data)
        fh.flush()
        return
    import select

    view = memoryview(len(data).to_bytes(_HEAD, "little") + data)
    while view:  # a non-blocking pipe (see ParsePool._start), written as it drains: a stopped worker never drains it
        if not select.select([], [fh], [], timeout)[1]:
            raise TimeoutError("the worker takes no input")
        view = view[fh.write(view[:1 << 16]) or 0:]


def _recv(fh: Any, timeout: float | None = None) -> Any:
    """One message; TimeoutError when none has come whole within `timeout` seconds (None: wait)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    head = _read(fh, _HEAD, deadline)
    if len(head) < _HEAD:
        raise EOFError("the pipe closed")
    n = int.from_bytes(head, "little")
    data = _read(fh, n, deadline)
    if len(data) < n:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)


def _read(fh: Any, n: int, deadline: float | None) -> bytes:
    """n bytes (fewer when the pipe closes). With a deadline, `fh` is an unbuffered pipe read as
    it becomes readable (select), so a worker that stops answering is noticed."""
    if deadline is None or os.name == "nt":  # no select on Windows pipes: wait
        return fh.read(n)
    import select

    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fh], [], [], left)[0]:
            raise TimeoutError("no answer in time")
        chunk = fh.read(n - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class ParsePool:
    """Up to `size` worker processes, started on entering a `with` block and ended on leaving it.

    `run(fn, calls)` computes `fn(*args)` for every args tuple of `calls`, in the workers and in
    this process at once, and yields the results in the order they finish. `fn` and its arguments
    must pickle (a module-level function; objects whose classes are importable); a call that does
    not is made here. `made_here` and `made_there` count the calls made here and by the workers.
    """

    def __init__(self, size: int, answer_timeout: float = ANSWER_TIMEOUT_S):
        self.size = max(0, int(size))
        self.answer_timeout = float(answer_timeout)  # seconds a worker may take over one call
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self.made_here = 0   # calls this process made (run counts them)
        self.made_there = 0  # calls the workers made
        self.replaced = 0    # workers killed for giving no answer in time (and started again)

    def _start(self) -> subprocess.Popen | None:
        # a worker imports what this process imports: its module search path goes with it (a
        # notebook that put a source checkout on sys.path has its workers find it too)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:  # unbuffered: replies are read as the pipe becomes readable (see _read)
            proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, close_fds=True, env=env, bufsize=0)
        except OSError:
            return None  # no more processes: this one does the rest
        if os.name != "nt":
            # a write to a blocking pipe waits until all of it fits, however long select waited
            # first: a worker that stopped reading (or a pipe smaller than one write) would hold
            # this process forever. Non-blocking, each write takes what fits (see _send).
            os.set_blocking(proc.stdin.fileno(), False)
        with self._lock:
            self._procs.append(proc)
        return proc

    def __enter__(self) -> "ParsePool":
        for _ in range(self.size):
            if self._start() is None:
                break
        return self

    @property
    def started(self) -> int:
        """Worker processes running (0 before entering and after leaving the `with` block)."""
        return len(self._procs)

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.close(kill=kind is not None)

    @property
    def pids(self) -> list[int]:
        """The process ids of the workers running."""
        return [p.pid for p in self._procs]

    def close(self, *, kill: bool = False) -> None:
        """End the workers: close their input (they exit after their call), or kill them."""
        for proc in self._procs:
            if kill:
                proc.kill()
            for fh in (proc.stdin, proc.stdout):
                try:
                    fh.close()
                except OSError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []

    def run(self, fn: Callable, calls: Iterable[tuple], *, crashed: Callable | None = None) -> Iterator[Any]:
        """Yield `fn(*args)` for each args of `calls`, as they finish (workers' and this process's).

        A call whose worker dies while making it (killed, out of memory) is tried once more in a
        fresh worker, which first answers a call of its own, so a worker that cannot run at all is
        told from a call that ends every worker. When the call ends that worker too, it is made
        here, or, with `crashed`, `crashed(*args)` is yielded in its place: a call that exhausts a
        worker's memory would exhaust this process's too.

        Args:
            fn: the function (it must pickle to run in a worker).
            calls: its argument tuples.
            crashed: what a call that ended two workers yields instead of being made here
                (default None: it is made here).

        Raises:
            The first exception a call raised (in a worker or here); the other calls stop.
        """
        it = iter(calls)
        lock = threading.Lock()
        stop = threading.Event()
        done: queue.SimpleQueue = queue.SimpleQueue()
        orphans: list[tuple] = []  # calls whose worker died: made here at the end
        lost: list[tuple] = []     # calls that ended a fresh worker too: handed to `crashed`

        def take() -> tuple | None:
            with lock:
                return None if stop.is_set() else next(it, None)

        def fresh() -> subprocess.Popen | None:
            """A new worker that has answered a call, else None."""
            new = None if stop.is_set() else self._start()
            if new is None:
                return None
            try:
                _send(new.stdin, (os.getpid, ()), self.answer_timeout)
                if _recv(new.stdout, self.answer_timeout)[0] == "ok":
                    return new
            except (OSError, EOFError, TimeoutError, pickle.PickleError, ValueError, TypeError, AttributeError):
                pass
            new.kill()
            return None

        def serve(proc: subprocess.Popen) -> None:
            again: tuple | None = None  # a call whose worker died, tried once more in a fresh one
            try:
                while (args := again if again is not None else take()) is not None:
                    try:
                        _send(proc.stdin, (fn, args), self.answer_timeout)
                        status, value = _recv(proc.stdout, self.answer_timeout)
                    except TimeoutError:
                        # stopped (SIGSTOP), or stuck: its call is made here, and a new worker
                        # takes its place (once per worker the pool started)
                        orphans.append(args)
                        again = None
                        proc.kill()
                        if self.replaced >= self.size or stop.is_set() or (new := self._start()) is None:
                            return
                        self.replaced += 1
                        proc = new
                        continue
                    except (OSError, EOFError):  # the worker ended while making the call
                        proc.kill()
                        if again is not None:  # a fresh worker died of it too
                            again = None
                            (lost if crashed is not None else orphans).append(args)
                            if (new := fresh()) is None:
                                return
                            proc = new
                            continue
                        if (new := fresh()) is None:  # no worker runs here: the call is made here
                            orphans.append(args)
                            return
                        proc, again = new, args
                        continue
                    except (pickle.PickleError, ValueError, TypeError, AttributeError):
                        orphans.append(args)  # the call does not pickle (or the pipe is closed): made here
                        return
                    again = None
                    done.put((status, value))
                    if status != "ok":
                        return
            finally:
                done.put(("end", None))

        threads = [threading.Thread(target=serve, args=(p,), name="machine-nb-parse", daemon=True)
                   for p in self._procs]
        for t in threads:
            t.start()
        ended = 0
        mine = True  # this process still takes calls
        try:
            while mine or ended < len(threads):
                try:  # a result a worker finished; once no call is left, wait for them (with a
                    # timeout, so Ctrl-C is seen here too)
                    status, value = done.get_nowait() if mine else done.get(timeout=0.2)
                except queue.Empty:
                    if mine:
                        args = take()
                        if args is None:
                            mine = False
                        else:
                            self.made_here += 1
                            yield fn(*args)
                    continue
                if status == "end":
                    ended += 1
                elif status == "ok":
                    self.made_there += 1
                    yield value
                else:
                    raise value
            for args in orphans:
                self.made_here += 1
                yield fn(*args)
            for args in lost:
                yield crashed(*args)  # type: ignore[misc]
        finally:
            stop.set()


def _worker() -> None:
    """A worker's loop: read a call, make it, answer; end when stdin closes."""
    import gc
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it kills the worker on Ctrl-C
    gc.disable()  # parsed runs hold no cycles (see frames.load_runs)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed while parsing must not land in the replies
    while True:
        try:
            fn, args = _recv(inp)
        except EOFError:
            return
        try:
            reply = ("ok", fn(*args))
        except Exception as exc:  # noqa: BLE001  handed to the parent, which raises it
            reply = ("error", exc)
        try:
            _send(out, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            _send(out, ("error", RuntimeError(f"a parse worker could not send its result: {exc}")))
        except OSError:
            return


if __name__ == "__main__":
    _worker()
