"""`machine-nb serve` started as a user starts it: a real subprocess on a free port, its log in a file;
a stand-in for the Hugging Face hub that counts the connections a call makes to it; and raw
requests to a server's HTTP API (`api_call`, `api_result`, `new_session`), as a client other than
the SDK sends them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

#: The key test servers require unless a test gives another (a fake one: no real service sees it).
TEST_KEY = "tml-placeholder-key-for-a-local-server-0000"


class Served:
    """A running `machine-nb serve`: its process, URL, key, data dir and log file."""

    def __init__(self, proc: subprocess.Popen, url: str, data_dir: Path, log, key: str | None, line: str):
        self.proc, self.url, self.data_dir, self.log, self.key, self.line = proc, url, data_dir, log, key, line

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return open(self.log.name, encoding="utf-8", errors="replace").read()

    def children(self) -> list[str]:
        """The command lines of the server's child processes (its training processes, say)."""
        lines = []
        for pid in child_pids(self.proc.pid):
            with contextlib.suppress(OSError):  # one that ended meanwhile
                lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        return lines


def child_pids(pid: int) -> list[int]:
    """The process ids whose parent is `pid`, read from /proc (Linux)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def ctrl_c_reaches_it() -> None:
    """For Popen's preexec_fn: SIGINT as a terminal delivers it, even when the test run itself was
    started with SIGINT ignored (a background job of a shell without job control), so a test that
    presses Ctrl-C on the process tests what a user sees."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_server(tmp_path: Path, *args: str, name: str = "server", key: str | None = TEST_KEY) -> Served:
    """Start `machine-nb serve --port 0` with its data under tmp_path; returns once it says it is ready.

    key: given to the server through $MACHINE_NB_SERVER_KEY; None gives it none (it then makes
    its data dir's key file, which `Served.key` reads)."""
    data_dir = tmp_path / f"{name}-data"
    log = open(tmp_path / f"{name}.log", "w+")
    env = {k: v for k, v in os.environ.items() if k != "MACHINE_NB_SERVER_KEY"}
    if key is not None:
        env["MACHINE_NB_SERVER_KEY"] = key
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                             str(data_dir), *args], stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                            start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    line = proc.stdout.readline()  # the ready line; a dead server gives "" at once
    assert line.startswith("serving the Tinker API on http://"), (line, open(log.name).read())
    if key is None and "--key" not in " ".join(args):
        key = (data_dir / "server.key").read_text().strip()
    return Served(proc, line.split(" on ", 1)[1].split()[0], data_dir, log, key, line)


def stop_server(served: Served, sig: int = signal.SIGINT) -> int:
    """Stop the server with `sig` (Ctrl-C by default; SIGKILL after 20 s) and return its exit status."""
    if served.proc.poll() is None:
        served.proc.send_signal(sig)
        try:
            served.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(served.proc.pid, signal.SIGKILL)
            served.proc.wait()
    served.log.close()
    return served.proc.returncode


def cookbook_sft_script(model: str, renderer: str, *, max_length: int, batch_size: int, learning_rate: float,
                        save_every: int, recipe: str = "my_recipe") -> str:
    """A user's tinker-cookbook SFT script for a served local model, as a Tinker user writes it
    (`machine_nb.use_local_models()` is its only machine_nb line). Run it with the chat JSONL, the
    log dir and the server's URL as its arguments, and TINKER_API_KEY set to the server's key.

    Returns:
        The script's source.
    """
    return textwrap.dedent(f"""
        import asyncio, sys
        import machine_nb
        from tinker_cookbook.supervised import train
        from tinker_cookbook.supervised.data import FromConversationFileBuilder
        from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
        from tinker_cookbook.renderers import TrainOnWhat

        machine_nb.use_local_models()  # the only line a Tinker script needs for a local model
        data, log_path, base_url = sys.argv[1:4]
        builder = FromConversationFileBuilder(
            file_path=data, test_size=0, shuffle_seed=0,
            common_config=ChatDatasetBuilderCommonConfig(
                model_name_for_tokenizer={model!r}, renderer_name={renderer!r},
                max_length={max_length}, batch_size={batch_size}, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE))
        config = train.Config(log_path=log_path, model_name={model!r}, recipe_name={recipe!r},
                              renderer_name={renderer!r},
                              dataset_builder=builder, learning_rate={learning_rate!r}, num_epochs=1, lora_rank=8,
                              base_url=base_url, save_every={save_every}, eval_every=0)
        asyncio.run(train.main(config))
    """)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool]) -> list[float]:
    """SIGKILL a server process (its process group) once `ready()` holds, checked from a daemon
    thread, as a crash mid-run would stop it.

    Returns:
        A list that gets the monotonic time of the kill.
    """
    killed_at: list[float] = []

    def kill() -> None:
        while not ready():
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    threading.Thread(target=kill, daemon=True).start()
    return killed_at


def watch_closely(monkeypatch) -> None:
    """Make the Tinker engine's watchdog (engines.tinker.Watchdog, which every `engine="tinker"`
    call builds with its defaults) give up on a service after seconds rather than its default
    ten, through its own constructor arguments: a health check every 0.5 s, a service that has not
    answered for 4 s, or whose work calls answered 5xx at least 4 times over 2 s. The checks, the
    counting and the messages are the product's; only the waits are shorter (the default's seconds
    to a half-dead service's EngineError: benchmarks/bench_hardening.py). A live server, even on a
    loaded machine, answers its health check well within 4 s."""
    from machine_nb.engines import tinker as tinker_engine

    real = tinker_engine.Watchdog

    class CloseWatchdog(real):
        def __init__(self, url: str, **kwargs):
            super().__init__(url, **{"every": 0.5, "grace": 4.0, "grace_5xx": 2.0, **kwargs})

    monkeypatch.setattr(tinker_engine, "Watchdog", CloseWatchdog)


class FakeHub:
    """A stand-in for the Hugging Face hub's address (`HF_ENDPOINT`) that counts the connections made to
    it and drops each at once, so a call that asks the network shows without waiting."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def api_call(srv, path: str, body=None, *, method: str = "POST", raw: bytes | None = None,
             content_type: str = "application/json", timeout: float = 30) -> tuple[int, dict]:
    """(status, JSON body) of one request to `srv` (anything with `url` and `key`) with its key; a
    protobuf answer (a sampling result) as {"protobuf": bytes}. `raw` sends those bytes as the body."""
    import json
    import urllib.error
    import urllib.request

    data = raw if raw is not None else (None if body is None else json.dumps(body).encode("utf-8"))
    req = urllib.request.Request(srv.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type, "X-API-Key": srv.key})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, out, kind = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, out, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, ({"protobuf": out} if "protobuf" in kind else json.loads(out or b"{}"))


def api_result(srv, answer: tuple[int, dict]) -> dict:
    """The result of the future a 200 answer names, polled until it is ready."""
    status, body = answer
    assert status == 200, body
    while True:
        status, out = api_call(srv, "/api/v1/retrieve_future", {"request_id": body["request_id"]})
        if status != 408:
            assert status == 200, out
            return out


def new_sampler(srv, session: str, base_model: str = "local/arith-tiny") -> str:
    """A new sampling session of `base_model` in `session` on `srv`; returns its id."""
    status, body = api_call(srv, "/api/v1/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 0,
                                                                     "base_model": base_model})
    assert status == 200, body
    return body["sampling_session_id"]


def new_session(srv) -> str:
    """A new SDK session on `srv`, as the SDK creates one; returns its id."""
    status, body = api_call(srv, "/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.0",
                                                           "type": "create_session"})
    assert status == 200, body
    return body["session_id"]
