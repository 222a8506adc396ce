"""The local server's life as a user's script sees it: machine_nb's SDK sessions end before the
server they talk to goes away (at exit, when it is stopped, or when a `machine-nb serve` it used
dies), so no script or notebook prints the SDK's "Session heartbeat failed … Tinker is down"; and
the training child process never outlives the process that started it. Each story runs as a
real script in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from serving import child_pids

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("heartbeat failed", "Tinker is down", "Traceback")

# The SDK warns once a session's heartbeats have failed for 2 minutes, checking every 10 s. This
# preamble runs the SDK's sleeps 100x fast and its clock 500x, so a heartbeat goes every 0.1 s and
# each one that fails adds 50 s of failures: past 2 minutes by the third, which warns, as a
# long-lived notebook would print.
FAST_SDK_CLOCK = textwrap.dedent("""
    import time, types
    import tinker.lib.internal_client_holder as _holder
    _real, _sleep = time.monotonic, _holder.asyncio.sleep
    _clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
    _clock.monotonic = lambda: _real() * 500
    _holder.time = _clock
    _aio = types.SimpleNamespace(**{k: getattr(_holder.asyncio, k) for k in dir(_holder.asyncio) if not k.startswith("__")})
    _aio.sleep = lambda delay, *a, **kw: _sleep(delay / 100, *a, **kw)
    _holder.asyncio = _aio
""")

ROWS = textwrap.dedent("""
    ROWS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}], "expected": f"answer: {a + b}"}
            for a, b in [(12, 30), (45, 11)]]
""")


def run_script(tmp_path: Path, body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "MACHINE_NB_DATA_DIR": str(tmp_path / "data")}
    env.pop("TINKER_API_KEY", None)
    env.pop("TINKER_BASE_URL", None)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_quiet(done: subprocess.CompletedProcess) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for word in NOISE:
        assert word not in out, out[-3000:]


def test_a_script_on_the_local_engine_exits_promptly_with_its_sessions_finished(tmp_path):
    """At exit the process's own server stops; machine_nb's SDK sessions on it are finished first
    (the server recorded each one as finished), and nothing is printed. On the way, a forked child
    (multiprocessing's fork, data-loader workers) shares nothing of the parent's server but its
    memory: it exits without trying to stop a server whose threads it never had, and the parent's
    server keeps serving."""
    body = textwrap.dedent("""
        import atexit, json
        seen = {}
        # registered first, so it runs last: after the local server has stopped
        atexit.register(lambda: print("SESSIONS", json.dumps(seen.get("server") and
                        {sid: s.finished for sid, s in seen["server"].sessions.items()}), flush=True))
        import multiprocessing as mp
        import machine_nb as mnb
        from machine_nb import engines
        from machine_nb.engines import service_client
        from machine_nb.engines.local.server import ensure_server
    """) + ROWS + textwrap.dedent("""
        res = mnb.evaluate(ROWS, save=False, progress=False)
        assert len(res.rows) == 2
        service_client("local").create_sampling_client(base_model="local/arith-tiny").result()
        seen["server"] = ensure_server()
        print("evaluated", flush=True)
        url = engines.local_base_url()

        def work(q):
            q.put(sum(range(10)))

        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        p.start()
        p.join(60)
        if p.exitcode is None:
            p.kill()
        print("child", p.exitcode, q.get(timeout=5) if p.exitcode == 0 else None)
        assert engines.local_base_url() == url  # the same server, still running
        print("accuracy", mnb.evaluate(ROWS, model="local/arith-tiny", progress=False).rows["correct"].mean() >= 0)
    """)
    start = time.monotonic()
    done = run_script(tmp_path, body, timeout=180)
    assert_quiet(done)
    assert "evaluated" in done.stdout
    assert "child 0 45" in done.stdout, done.stdout + done.stderr
    assert "accuracy True" in done.stdout
    sessions = json.loads(done.stdout.split("SESSIONS", 1)[1])
    assert sessions and all(sessions.values()), sessions  # every session was finished before the server stopped
    assert time.monotonic() - start < 180  # (the bound is the requirement: "exits promptly", not a benchmark)


def test_no_heartbeat_warning_after_a_server_stops_or_dies_and_work_at_exit_finishes(tmp_path):
    """A stopped local server and a killed `machine-nb serve` (engine="tinker"): machine_nb keeps no
    SDK client for either, so no heartbeat keeps failing and nothing is printed; the next call on
    the local engine starts a fresh server and works.

    Then the main thread ends while a (non-daemon) thread still evaluates: Python waits for that
    thread, and the local server keeps serving it until it is done. The thread's calls all start
    once the main thread has ended (it joins it first), so every one of them comes at exit."""
    body = FAST_SDK_CLOCK + ROWS + textwrap.dedent("""
        import os, signal, subprocess, sys, time
        import machine_nb as mnb
        from machine_nb.engines.local import server as server_mod
        from machine_nb.errors import EngineError

        old = server_mod.ensure_server()
        assert len(mnb.evaluate(ROWS, save=False, progress=False).rows) == 2
        server_mod._stop_default()           # as a test (or a user) may stop it
        assert all(s.finished for s in old.sessions.values())
        assert len(mnb.evaluate(ROWS, save=False, progress=False).rows) == 2   # a fresh server
        assert server_mod.ensure_server() is not old

        proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                                 "served"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True,
                                env={**os.environ, "MACHINE_NB_SERVER_KEY": "tml-placeholder-key-0000"})
        url = proc.stdout.readline().split(" on ", 1)[1].strip()
        os.environ.update(TINKER_BASE_URL=url, TINKER_API_KEY="tml-placeholder-key-0000")
        assert len(mnb.evaluate(ROWS, model="local/arith-tiny", engine="tinker", save=False, progress=False).rows) == 2
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        try:
            mnb.evaluate(ROWS, model="local/arith-tiny", engine="tinker", save=False, progress=False)
        except EngineError as exc:
            print("refused:", str(exc)[:60], flush=True)
        time.sleep(0.5)                      # five SDK heartbeats, 250 s by its fast clock
        print("done", flush=True)

        import threading
        many = ROWS * 4
        main = threading.main_thread()

        def work():
            main.join()  # returns once the main thread has ended: the interpreter is exiting
            for _ in range(3):
                assert len(mnb.evaluate(many, save=False, progress=False).rows) == len(many)
            print("thread done", flush=True)

        threading.Thread(target=work).start()
        print("main done", flush=True)
    """)
    done = run_script(tmp_path, body)
    assert_quiet(done)
    assert "refused: Tinker at http://127.0.0.1" in done.stdout and "done" in done.stdout
    assert "main done" in done.stdout and "thread done" in done.stdout


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's reaping is left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads child processes from /proc (Linux)")
def test_the_training_child_ends_when_its_parent_is_killed(tmp_path):
    """kill -9 a script while sft's child process (runner.py) trains: the child, and the worker it
    forked to train (runner.RESTARTS), exit by themselves."""
    from machine_nb.data.corpus import make_corpus

    corpus = make_corpus(tmp_path / "corpus", seed=0)
    body = textwrap.dedent(f"""
        import machine_nb as mnb
        mnb.sft({str(corpus.train)!r}, log_dir="run", epochs=50, progress=False)
    """)
    script = tmp_path / "script.py"
    script.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "MACHINE_NB_DATA_DIR": str(tmp_path / "data")}
    parent = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):  # the child is training
            assert parent.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.2)
        children = child_pids(parent.pid)
        assert children, "no child process"
        children += [worker for child in children for worker in child_pids(child)]  # a runner's forked worker
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [c for c in children if _alive(c)]
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    for c in left:  # do not leave it running if the assertion fails
        os.kill(c, signal.SIGKILL)
    assert not left, f"child processes {left} outlived their killed parent"


def _ignored_signals(pid: int) -> int:
    """The process's ignored-signal mask (bit n-1 for signal n), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn line for process {pid}")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal masks from /proc (Linux)")
def test_the_training_child_takes_ctrl_c_when_its_parent_ignores_it():
    """A process started where SIGINT is ignored (a background job of a shell without job control)
    hands "ignore" on to the processes it starts. sft's training child must still stop on the SIGINT
    its parent sends to interrupt a run, or an interrupted run goes on to its end."""
    from machine_nb.training.loop import _Runner

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        runner = _Runner()  # started while this process ignores SIGINT, as such a parent would
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        with runner._cond:
            assert runner._cond.wait_for(lambda: runner.events, timeout=120), "the training child never started"
        assert runner.events[0]["event"] == "ready"
        assert not _ignored_signals(runner.proc.pid) & (1 << (signal.SIGINT - 1)), "the child ignores SIGINT"
    finally:
        runner.close()
