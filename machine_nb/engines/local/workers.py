"""Training processes of the local server: different runs' steps in parallel, not one at a time.

A server's training runs each execute their requests in order on a thread of their own; in one
process those threads still take turns for Python's interpreter lock, which the many small tensor
operations of a small model's step take and release thousands of times. With `train_workers=N`
(`machine-nb serve` takes one fewer than the machine's cores), a run of the engine's own models
that starts while other runs are training goes to a training process where none is (a new one
starts, importing torch, only when every place has a run training, up to N); a run alone trains
in the server's own process, as without them, so it never waits for a process to start. Each run
in a process talks to it over its own connection, so its requests stay in order, and the process
runs each of its runs on a thread of its own, with the same thread count and kernels as the
server: the losses are the ones the server would compute itself.

`RemoteTrainer` is the server's side of one run: the calls the server makes on a trainer
(`guarded_forward_backward`, `guarded_optim_step`, `meta`, `save`, `load`, `snapshot`), sent to
the process and answered there; errors come back as the same exceptions. The processes listen on a
Unix socket in a private folder and accept only clients that prove the key the server gave them
on their standard input, and they end when that input closes (the server stopped or died).

The real model (hf_compute.py) keeps its trainers in the server's process: they share one frozen
base, and its large matrix products run outside the interpreter lock already.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from ...errors import EngineError, MachineFormatError

logger = logging.getLogger(__name__)

#: The start of the name of each training process's private socket folder (under the temp dir).
SOCKET_PREFIX = "machine-nb-train-"
#: The calls a training process answers on the trainer it holds, besides creating it.
_CALLS = frozenset({"guarded_forward_backward", "guarded_optim_step", "meta", "save", "load", "snapshot"})


def default_workers() -> int:
    """Training processes `machine-nb serve` may start by default: one fewer than the cores (the
    server's own process trains too; at most 7), so none on a single core."""
    return min(max(0, (os.cpu_count() or 1) - 1), 7)


class _Process:
    """One training process: its handle, socket address and key."""

    def __init__(self, threads: int | None):
        root = Path(__file__).resolve().parents[3]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
        self.key = secrets.token_bytes(32)
        self.proc = subprocess.Popen([sys.executable, "-m", "machine_nb.engines.local.workers",
                                      "" if threads is None else str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(self.key.hex().encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it ended before reading its key: its exit code is said below
            pass
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("/"):
            self.proc.kill()
            raise EngineError(f"the local server's training process did not start (exit code {self.proc.wait()})")
        self.address = line

    def connect(self) -> Any:
        from multiprocessing.connection import Client

        return Client(self.address, family="AF_UNIX", authkey=self.key)

    def close(self, timeout: float = 30.0) -> None:
        """Close its input (it ends at once: the server lets its runs finish their steps first), then
        wait for it."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.forget()

    def forget(self) -> None:
        """Remove its socket's folder, which it removes itself unless it was killed."""
        folder = Path(self.address).parent
        if folder.name.startswith(SOCKET_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)


class TrainerPool:
    """Up to `most` training processes beside the server, started as runs need them."""

    def __init__(self, most: int, threads: int | None = None):
        self.most = max(1, int(most))
        self.threads = threads
        self._processes: list[_Process] = []
        self._lock = threading.Lock()
        self._closed = False

    def place(self, busy: dict[int | None, int]) -> "_Process | None":
        """Where a new run trains: None for the server's own process, else a training process.

        `busy`: runs training now in each place (the server's under None, a process's under its
        pid). The first free place wins, the server's own first, so a run alone never waits for a
        process to start; when every place has a run training, a new process starts (up to
        `most`), else the place with the fewest takes it, a training process before the server
        on a tie."""
        with self._lock:
            if self._closed:
                raise EngineError("the local server is stopping")
            alive = [p for p in self._processes if p.proc.poll() is None]
            for gone in set(self._processes) - set(alive):
                gone.forget()
            self._processes = alive
            places: list[_Process | None] = [None, *alive]

            def load(place: "_Process | None") -> int:
                return busy.get(None if place is None else place.proc.pid, 0)

            free = [p for p in places if load(p) == 0]
            if free:
                return free[0]
            if len(alive) < self.most:
                started = _Process(self.threads)
                self._processes.append(started)
                return started
            return min(places, key=lambda p: (load(p), p is None))  # a tie: a process (the server also serves HTTP)

    def pids(self) -> list[int]:
        """The process ids of the training processes running now."""
        with self._lock:
            return [p.proc.pid for p in self._processes if p.proc.poll() is None]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            processes, self._processes = self._processes, []
        for p in processes:
            p.close()


class RemoteTrainer:
    """A run's trainer in a training process, answering the calls the server makes on a trainer."""

    def __init__(self, process: _Process, how: str, what: str, settings: dict):
        """`new_trainer(how, what, settings)`, made in `process`."""
        self._process = process
        self._lock = threading.Lock()
        self._conn: Any = None
        try:
            try:
                self._conn = self._process.connect()
            except OSError as exc:
                raise EngineError(f"the local server's training process cannot be reached: {exc}") from None
            info = self._call(how, what, **settings)
        except BaseException:
            self.close()
            raise
        self.base_model: str = info["base_model"]
        self.rank: int = info["rank"]
        self.alpha: float | None = info["alpha"]
        self.targets: dict = info["targets"]
        self.seed: int = info["seed"]

    @property
    def pid(self) -> int:
        """The process id of the training process holding this run."""
        return self._process.proc.pid

    @property
    def address(self) -> str:
        """The socket of the training process holding this run (in a private folder of its own)."""
        return self._process.address

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._conn is None:
                raise EngineError("this training run was let go (its training process is not reachable)")
            try:
                self._conn.send_bytes(pickle.dumps((name, args, kwargs)))
                kind, *value = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                code = self._process.proc.poll()
                how = "its connection closed" if code is None else f"exit code {code}"
                raise EngineError(f"the training process of this run ended ({how}); the run's state since its last "
                                  "saved checkpoint is lost: start a new run from that checkpoint") from None
        if kind == "ok":
            return value[0]
        if kind == "EngineError":
            raise EngineError(value[0])
        if kind == "MachineFormatError":
            path, reason, line, field = value
            raise MachineFormatError(path, reason, line=line, field=field)
        if kind == "ValueError":
            raise ValueError(value[0])
        logger.error("local server: a training process failed\n%s", value[1])
        raise RuntimeError(value[0])

    def guarded_forward_backward(self, batch: Any, *, backward: bool, loss: Any = None) -> tuple[list, list, float]:
        return self._call("guarded_forward_backward", batch, backward=backward, loss=loss)

    def guarded_optim_step(self, **adam: float) -> dict[str, float]:
        return self._call("guarded_optim_step", **adam)

    def meta(self, kind: str, name: str, model_id: str, user_metadata: dict | None) -> dict:
        return self._call("meta", kind, name, model_id, user_metadata)

    def save(self, final: Path, meta: dict, *, optimizer: bool) -> None:
        self._call("save", final, meta, optimizer=optimizer)

    def load(self, directory: Path, *, optimizer: bool) -> None:
        self._call("load", directory, optimizer=optimizer)

    def snapshot(self, *, seed: int = 0) -> Any:
        """A sampler, in the server's process, of the run's weights now (a merged copy)."""
        from .compute import Sampler

        return Sampler(self._call("snapshot", seed=seed), self.base_model, seed=seed)

    def close(self) -> None:
        """Let the run go: its thread in the training process ends, and the process takes new runs."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


# ---------------------------------------------------------------------------------------------
# the training process


def new_trainer(how: str, what: str, settings: dict) -> Any:
    """A run's trainer in this process: `Trainer(what, **settings)` for `how` "create", or
    `Trainer.from_checkpoint(what, **settings)` for "from_checkpoint" (`what`: the folder)."""
    from .compute import Trainer

    if how == "create":
        return Trainer(what, **settings)
    if how == "from_checkpoint":
        return Trainer.from_checkpoint(Path(what), **settings)
    raise EngineError(f"no way to make a trainer by {how!r}")


def _answer(trainer: Any, name: str, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """(the trainer after the call, the call's value)."""
    if name in ("create", "from_checkpoint"):
        trainer = new_trainer(name, args[0], kwargs)
    elif name in _CALLS and trainer is not None:
        value = getattr(trainer, name)(*args, **kwargs)
        return trainer, value.model if name == "snapshot" else value
    else:
        raise EngineError(f"a training process does not answer {name!r} here")
    return trainer, {"base_model": trainer.base_model, "rank": trainer.rank, "alpha": trainer.alpha,
                     "targets": trainer.targets, "seed": trainer.seed}


def _serve_run(conn: Any, threads: int | None) -> None:
    """Answer one run's calls, in order, until the server closes its connection."""
    from .compute import configure_torch

    configure_torch(threads)
    trainer = None
    with conn:
        while True:
            try:
                name, args, kwargs = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return
            try:
                trainer, value = _answer(trainer, name, args, kwargs)
                reply: tuple = ("ok", value)
            except EngineError as exc:
                reply = ("EngineError", str(exc))
            except MachineFormatError as exc:
                reply = ("MachineFormatError", exc.path, exc.reason, exc.line, exc.field)
            except ValueError as exc:
                reply = ("ValueError", str(exc))
            except Exception as exc:  # a defect: the server logs the traceback and fails the request
                reply = ("error", f"internal error of the local engine: {type(exc).__name__}: {exc}",
                         traceback.format_exc())
            try:
                conn.send_bytes(pickle.dumps(reply))
            except OSError:
                return


def _main(argv: list[str]) -> int:
    import tempfile
    from multiprocessing.connection import Listener

    import signal

    from ...core.process import pause_collection, settle

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal stops the server, which ends this
    threads = int(argv[0]) if argv and argv[0] else None
    key = bytes.fromhex(sys.stdin.buffer.readline().decode().strip())
    folder = tempfile.mkdtemp(prefix=SOCKET_PREFIX)  # private (0700): only this user reaches the socket
    address = os.path.join(folder, "socket")
    listener = Listener(address, family="AF_UNIX", authkey=key)

    def end_with_input() -> None:
        sys.stdin.buffer.read()  # returns when the server closes it, or dies
        try:
            os.unlink(address)
            os.rmdir(folder)
        finally:
            os._exit(0)

    threading.Thread(target=end_with_input, daemon=True).start()
    pause_collection()  # while torch and the engine's modules are imported (core.process)

    def warm() -> None:
        try:
            __import__("machine_nb.engines.local.compute")
        finally:
            settle()

    threading.Thread(target=warm, daemon=True).start()
    print(address, flush=True)
    os.dup2(2, 1)  # anything printed later goes to stderr: nobody reads this pipe once the address is read
    while True:
        try:
            conn = listener.accept()
        except Exception:  # a client without the key, or one that went away mid-handshake
            continue
        threading.Thread(target=_serve_run, args=(conn, threads), daemon=True).start()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
