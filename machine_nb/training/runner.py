"""Run one of tinker-cookbook's training loops in a child process, exactly as a script would.

`sft` (train.py) and `dpo` (preference.py) hand this module a plain-JSON spec (loop.child_spec)
naming the module whose `child_run(spec)` builds the cookbook's own Config and runs its loop
(`run_loop`: `supervised.train.main` or `preference.train_dpo.main`, with the held-out
evaluator when asked), talking to the engine through the real tinker SDK (at the spec's base URL).
A child process, because the cookbook's loop configures the process's logging for itself (it
replaces the root logger's handlers and logs every step at INFO): in a notebook kernel that
would rewire the user's logging and flood the cell. Here its
console output goes to `<log dir>/train.log` (Machine's own habit) and nothing of the caller's
process is touched. The child exits when its parent does (it watches its stdin), so it can
never outlive the notebook or script that started it.

The cookbook writes its Config to the log dir's config.json and logs it (`ml_log.setup_logging`:
its JSON and console loggers' `log_hparams`), `base_url` included. So the Config's base_url is
None and the SDK takes the run's URL from $TINKER_BASE_URL in this process (`run`): a URL with
credentials in it (`https://user:token@gateway/…`) connects as given, and no file holds it.

The child serves one run after another (imports take seconds; the next run starts at once, and
the first one's imports are made while the parent still checks the data: PRELOAD): a
spec per line on its stdin, a status per line on its stdout (`{"event": "ready" | "done" |
"error" | "interrupted"}`, "ready" saying whether `RESTARTS`); everything else it prints goes to
the run's log. After an error or an interrupt the process that ran it exits. Where processes fork
(Linux: `RESTARTS`), the runs go to a worker forked from the child once its imports are made, and
the child forks a new worker after one that reported an error or an interrupt, so the next run
starts at once there too; elsewhere the child runs them itself, and the next run after an error or
an interrupt gets a fresh child.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
import traceback
from typing import Any, Callable, Iterator


def _status(channel: Any, **event: Any) -> None:
    channel.write(json.dumps(event) + "\n")
    channel.flush()


def run(spec: dict) -> None:
    """Run the loop `spec` names: `spec["module"]`'s `child_run(spec)` (train.py's for sft); once it
    returns, the SDK sessions it left open are finished (`_sessions_finished_after`).

    The spec's base URL goes to the SDK through $TINKER_BASE_URL, and `child_run` gets None in its
    place (the module docstring says why); every SDK client of the run resolves None to it.

    Args:
        spec: the run's spec (loop.child_spec), with its environment, cwd and log file.
    """
    if spec.get("base_url"):
        os.environ["TINKER_BASE_URL"] = spec["base_url"]
    spec = {**spec, "base_url": None}
    _no_enclosing_repository()
    if spec.get("local_models"):
        from ..engines import use_local_models

        use_local_models()
    module = importlib.import_module(spec["module"])
    with _sessions_finished_after():
        module.child_run(spec)


def _no_enclosing_repository() -> None:
    """Keep git, for this run, from finding a repository above an installed tinker-cookbook.

    The cookbook writes `code.diff` into every log dir: `git diff HEAD` of the repository its
    package sits in (`utils.code_state`). Installed under a `site-packages` folder that sits in a
    project (a `.venv` inside the checkout), git finds the project instead, and every run would
    keep a copy of the user's uncommitted changes. With the folder as a ceiling
    (GIT_CEILING_DIRECTORIES) the cookbook records that its package is in no repository; a
    cookbook run from its own clone still has that clone's state recorded.
    """
    from pathlib import Path

    spec = importlib.util.find_spec("tinker_cookbook")
    origin = Path(spec.origin).parent.parent if spec is not None and spec.origin else None
    if origin is None or origin.name not in ("site-packages", "dist-packages"):
        return
    ceilings = [p for p in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(os.pathsep) if p]
    os.environ["GIT_CEILING_DIRECTORIES"] = os.pathsep.join([*ceilings, str(origin)])


@contextlib.contextmanager
def _sessions_finished_after() -> Iterator[None]:
    """Finish, once a run's loop has returned, the SDK sessions of the clients made during it.

    tinker-cookbook's loops make their own `tinker.ServiceClient` and never close it. This process
    is kept for the next run, so an open session would go on sending heartbeats, and the engine would
    count the run as still training (`machine-nb serve` would send the next run to a training process
    beside it). While the run goes, `tinker.ServiceClient` is a subclass that records each client
    made; afterwards each is closed ("success"; a client already closed is left as it is, and a finish
    that fails leaves the session to the engine's timeout). After an error or an interrupt nothing is
    sent (the server may be gone, and the SDK retries a finish for minutes): this process exits then,
    and its sessions end with it.
    """
    import tinker

    made: list[Any] = []
    original = tinker.ServiceClient

    class RecordedServiceClient(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    tinker.ServiceClient = RecordedServiceClient
    try:
        yield
    finally:
        tinker.ServiceClient = original
    for client in made:
        with contextlib.suppress(Exception):  # the run is done either way; an unfinished session times out
            client.close("success").result(timeout=60)


def config_steps(config: Any) -> tuple[Any, int, int]:
    """How a cookbook Config's loop counts its steps (in the child, where the cookbook is loaded).

    Args:
        config: a supervised or DPO Config.

    Returns:
        (its dataset, batches an epoch, the run's steps: epochs x batches, capped by max_steps).
    """
    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    return dataset, n_batches, total


def inspect_every(inspect: dict, per_epoch: int) -> int:
    """How often the loop runs a spec's Inspect tasks while it trains.

    Args:
        inspect: the spec's `inspect` settings (loop.inspect_spec: `every` is the run's eval_every).
        per_epoch: the run's steps an epoch.

    Returns:
        `every` steps; once an epoch when it is None; 0 (eval_every=0) never, the final
        checkpoint alone being scored (the cookbook reads an infrequent_eval_every of 0 as never).
    """
    every = inspect.get("every")
    return per_epoch if every is None else int(every)


def _with_inspect(spec: dict, config: Any) -> tuple[Any, Any]:
    """A cookbook Config with the spec's Inspect tasks as its loop's infrequent evaluators (every
    `spec["inspect"]["every"]` steps: `inspect_every`), and their builder (None: no tasks)."""
    if not spec.get("inspect"):
        return config, None
    import chz

    from ..evaluation.heldout import InspectEvalBuilder

    builder = InspectEvalBuilder.from_spec(spec)
    every = inspect_every(spec["inspect"], config_steps(config)[1])
    return chz.replace(config, infrequent_evaluator_builders=[builder], infrequent_eval_every=every), builder


def run_loop(spec: dict, config: Any, main: Callable[[Any], Any], *, last: bool) -> None:
    """Run a cookbook loop, with the held-out evaluator and the Inspect tasks the spec asks for.

    The evaluator goes into the Config's `evaluator_builders` (the loop calls it every
    `spec["heldout"]["every"]` steps from the step it starts or resumes at, each score filed
    under its step: loop.eval_schedule), the Inspect tasks into its infrequent evaluators; after
    the loop, the final checkpoint is scored by both the same way (the loop evaluates before a
    step, so never the weights after the last).

    Args:
        spec: the run's spec (loop.child_spec).
        config: the cookbook's Config for it.
        main: runs the loop on a Config (the cookbook's `main`, or what stands in for it).
        last: the loop also evaluates before its last step (the cookbook's DPO loop does).
    """
    config, inspect = _with_inspect(spec, config)
    builder = None
    if spec.get("heldout"):
        import chz
        from tinker_cookbook import checkpoint_utils

        from ..evaluation.heldout import HeldOutEvalBuilder
        from .loop import eval_schedule

        _, n_batches, total = config_steps(config)
        resumed = checkpoint_utils.get_last_checkpoint(spec["log_dir"])
        start = 0 if resumed is None else (resumed.epoch or 0) * n_batches + (resumed.batch or 0)  # as the loops resume
        every = int(spec["heldout"]["every"])
        builder = HeldOutEvalBuilder.from_spec(spec, eval_schedule(start, total, every, last=last))
        config = chz.replace(config, evaluator_builders=[builder], eval_every=every)
    main(config)
    if inspect is not None:
        from ..evaluation.heldout import inspect_final

        inspect_final(inspect, spec["base_url"], config_steps(config)[2])
    if builder is not None:
        from ..evaluation.heldout import evaluate_final

        evaluate_final(builder, spec["base_url"], total)


def _redacted_json(value: Any, secrets: list[str]) -> Any:
    """A JSON-shaped copy of an SDK error's body, its text redacted (anything not JSON, as its text)."""
    from ..core.redact import scrub

    if isinstance(value, dict):
        return {scrub(str(k), secrets)[0]: _redacted_json(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted_json(v, secrets) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return scrub(value if isinstance(value, str) else str(value), secrets)[0]


def report_error(channel: Any, exc: BaseException) -> None:
    """Report a failed run: its traceback to stderr (the run's train.log), and an "error" status line
    (type, message, the SDK's body) to the parent, which raises it there.

    Both are redacted first (core.redact: the environment's secrets, a base URL's password, key-shaped
    text), as the traceback lands in a file and the message in the user's notebook; the message is
    clipped to 4,000 characters after that, so no part of a secret is left at the cut. A body that is
    not JSON (bytes, objects) goes as its text, so the status line is always sent.

    Args:
        channel: the status stream.
        exc: the run's exception.
    """
    from ..core.redact import scrub, secret_values

    secrets = secret_values()
    sys.stderr.write(scrub("".join(traceback.format_exception(exc)), secrets)[0])
    sys.stderr.flush()
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ itself fails
        message = ""
    body = getattr(exc, "body", None)
    _status(channel, event="error", type=type(exc).__name__, message=scrub(message, secrets)[0][:4000],
            body=_redacted_json(body, secrets) if isinstance(body, (dict, str)) else None)


def _redirect(path: str | None) -> None:
    """Point this process's stdout and stderr (fds 1 and 2) at a run's log file (None: /dev/null)."""
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)


#: What every training loop imports (the SDK, tinker-cookbook's renderers, datasets and SFT loop),
#: imported while the first spec is awaited (core.process.preload), so a process started ahead of its
#: first run (`loop.start_runner` starts one while the caller checks the data) spends its import time then.
PRELOAD = ("machine_nb.engines", "tinker_cookbook.renderers", "tinker_cookbook.supervised.data",
           "tinker_cookbook.supervised.train", "machine_nb.training.train")


#: Whether the runs go to workers forked from this process (`main`): where fork is safe with what
#: PRELOAD loads, and pipes can be polled (`_spec_source`): Linux (macOS's system libraries do not
#: survive a fork; Windows has no fork).
RESTARTS = sys.platform == "linux"

#: A worker's exit codes after it reported its run's outcome: an error (1), an interrupt (130).
_REPORTED = (1, 130)


def main() -> int:
    """Serve specs, one line each on stdin, one at a time, until stdin closes.

    The process stays for the next run (tinker-cookbook and the SDK take seconds to import);
    each run applies the environment and working directory its spec carries, and writes its
    console output to the spec's `log` file. Where `RESTARTS`, a worker forked from this process
    once PRELOAD is imported serves the runs, and a new one follows a worker that reported an
    error or an interrupt (`_fork_workers`).

    Returns:
        The exit code after an error (1) or an interrupt (130) without `RESTARTS`, or the exit
        code of a worker that ended without reporting an outcome; it never returns otherwise (the
        process exits when its stdin closes).
    """
    import signal

    from ..core.process import preload

    # the parent interrupts a run with SIGINT: take it even when this process was started with
    # SIGINT ignored (a parent run as a background job of a shell without job control passes that on)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", buffering=1, closefd=False)
    _redirect(None)
    _status(status, event="ready", restarts=RESTARTS)
    if RESTARTS:
        return _fork_workers(status, lambda: preload(PRELOAD))
    return _serve(status, lambda: preload(PRELOAD))


def _fork_workers(status: Any, load: Callable[[], None]) -> int:
    """Import what the runs need (`load`) in this process, which holds nothing else and starts no
    thread, then fork the worker that serves the runs (`_serve`), and a new one each time a worker
    exits after reporting an error or an interrupt: a fresh process for the next run, without
    the imports' seconds. A SIGINT here (the parent's, to stop a run) goes on to the worker, and
    ends this process while there is none yet (a run sent during the imports must not start); the
    worker is in a process group of its own, so a Ctrl-C at a terminal, which reaches this
    process's group, reaches it once. Any other end of a worker ends this process the same way: its
    stdin closed (the parent is gone), or the worker killed (its signal is this process's).

    Returns:
        The exit code of the worker that ended without a reported outcome (a signal re-raised here).
    """
    import signal

    worker = 0
    interrupted = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if not worker:  # the imports under way: a spec already sent must not run, so end here
            interrupted = True
            raise KeyboardInterrupt
        with contextlib.suppress(OSError):
            os.kill(worker, signal.SIGINT)

    signal.signal(signal.SIGINT, forward)
    load()
    if interrupted:  # a library's import caught the KeyboardInterrupt and went on
        raise KeyboardInterrupt
    parent = os.getpid()
    while True:
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                os.setpgid(0, 0)
                _end_with(parent)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                code = _serve(status, None)
            except KeyboardInterrupt:  # between runs: end as an interrupted interpreter does
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            except BaseException:
                traceback.print_exc()
            finally:
                from ..core.process import end_process

                end_process(code)
        worker = pid
        _, how = os.waitpid(pid, 0)
        worker = 0
        code = os.waitstatus_to_exitcode(how)
        if code in _REPORTED:
            continue
        if code < 0:  # killed: end as it did
            with contextlib.suppress(OSError, ValueError):  # SIGKILL's handling cannot be set, nor need be
                signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
            return 128 - code  # a signal whose default is not to end a process
        return code


def _end_with(parent: int) -> None:
    """Have the kernel kill this process (a worker) when `parent` (its forking process) ends, however
    it ends; exits at once when it has ended already."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(3)


def _read_spec() -> dict | None:
    """The next spec on stdin, read to its newline and no further: bytes past it are the next
    run's, which a worker that ends after this run must leave for the one that follows. None when
    stdin has closed (or holds a line that is not JSON)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            return None
        line += byte
    try:
        return json.loads(line)
    except ValueError:
        return None


def _exit_when_stdin_closes() -> None:
    """End this process when the parent closes its end of stdin (it ended, or was killed), also
    while a run goes; waits for the hang-up alone, so it reads nothing of stdin."""
    import select

    poller = select.poll()
    poller.register(0, 0)  # no event asked for: hang-up and errors are reported all the same
    while True:
        for _, event in poller.poll():
            if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(3)


def _spec_source() -> Callable[[], dict | None]:
    """How `_serve` takes the next spec (None: stdin closed), with the process set to end when
    stdin closes, also while a run goes (the parent ended, or was killed). Where pipes can be polled,
    each spec is read when it is taken, and no further (`_read_spec`), while a thread waits for the
    hang-up (`_exit_when_stdin_closes`); elsewhere (Windows, where the process ends after an error or
    an interrupt, so nothing read ahead is lost) a thread reads the lines as they come."""
    import select

    if hasattr(select, "poll"):
        threading.Thread(target=_exit_when_stdin_closes, name="machine-nb-parent-watch", daemon=True).start()
        return _read_spec
    import queue

    specs: "queue.Queue[dict | None]" = queue.Queue()

    def read_specs() -> None:
        try:
            for line in sys.stdin.buffer:
                specs.put(json.loads(line))
        except (OSError, ValueError):
            pass
        os._exit(3)  # the parent closed our stdin: it ended, or was killed

    threading.Thread(target=read_specs, name="machine-nb-specs", daemon=True).start()
    return specs.get


def _serve(status: Any, load: Callable[[], None] | None) -> int:
    """Serve the specs on stdin, one run at a time (`main`'s loop), after `load()` when given.

    Returns:
        1 after a run's error, 130 after its interrupt (each reported on `status` first); 3 when
        stdin closes (the process also exits then while a run goes: `_spec_source`).
    """
    next_spec = _spec_source()
    if load is not None:
        load()
    while True:
        spec = next_spec()
        if spec is None:
            return 3
        try:  # a log that cannot be opened, or a folder gone, is reported as the run's error
            os.environ.clear()
            os.environ.update(spec.get("env") or {})
            os.chdir(spec.get("cwd") or os.getcwd())
            _redirect(spec.get("log"))
            run(spec)
        except KeyboardInterrupt:
            _status(status, event="interrupted")
            return 130
        except BaseException as exc:  # reported to the parent, which raises it there
            report_error(status, exc)
            return 1
        finally:
            import logging

            root = logging.getLogger()
            for handler in list(root.handlers):  # the cookbook's, pointing at this run's files
                handler.flush()
                # gone with the run: the next run's first records (its Config among them) would
                # otherwise land in this run's logs.log
                root.removeHandler(handler)
                handler.close()
            sys.stdout.flush()
            _redirect(None)
        _status(status, event="done")


if __name__ == "__main__":
    from ..core.process import end_process

    # leave at once: the thread that watches stdin would block the interpreter's normal shutdown
    end_process(main())
