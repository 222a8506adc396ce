"""The local server as a service on the user's machine: only its owner gets in (a key on every
request, checked against a real other user), a refused request never stalls the next one, bad
numbers are refused rather than trained, odd data dirs are skipped, and it stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import tinker
from tinker import types

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import server as server_mod
from machine_nb.errors import EngineError

from serving import TEST_KEY, Served, api_call, api_result, new_session, start_server, stop_server

SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by any user (the venv's interpreter may sit under /root)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("svc") / "data").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def sc(srv):
    client = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    yield client
    client.close("success").result(timeout=60)


def datum(ids, targets=None, weights=None, **inputs):
    targets = ids[1:] + [2] if targets is None else targets
    weights = [1.0] * len(ids) if weights is None else weights
    return types.Datum(model_input=types.ModelInput.from_ints(ids),
                       loss_fn_inputs={"target_tokens": targets, "weights": weights, **inputs})


IDS = [5, 17, 23, 9, 11, 40, 3]


def call(url: str, path: str, *, key: str | None, body: bytes | None = None, method: str = "GET") -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["X-API-Key"] = key
    req = urllib.request.Request(url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


# ---------------------------------------------------------------------------------------------
# 1, 2: the key


def _as_nobody(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", code], capture_output=True,
                          text=True, timeout=60, cwd="/")


@pytest.mark.skipif(os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists(),
                    reason="needs root to act as the user nobody (runuser), as CI runs")
def test_another_user_can_neither_reach_the_runs_nor_read_the_key(tmp_path, srv, sc):
    """`nobody` on the same machine gets 401 from `machine-nb serve` and from a process's own
    engine, with no key or a guessed one, and cannot read the key file."""
    os.chmod(tmp_path, 0o755)  # the folder is listable; the data dir inside is the owner's alone
    served = start_server(tmp_path, key=None)
    try:
        key_file = served.data_dir / "server.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert str(key_file) in served.output() and served.key not in served.output() + served.line
        tc = tinker.ServiceClient(base_url=served.url, api_key=served.key)
        tc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()  # the owner gets in
        probe = textwrap.dedent(f"""
            import json, urllib.request, urllib.error
            out = []
            for url in {[served.url, srv.url]!r}:
                for key in (None, "tml-a-guessed-key-0000"):
                    for path, method in (("/api/v1/training_runs", "GET"), ("/api/v1/checkpoints", "GET"),
                                         ("/api/v1/create_session", "POST")):
                        req = urllib.request.Request(url + path, method=method, data=b"{{}}" if method == "POST" else None,
                                                     headers={{"X-API-Key": key}} if key else {{}})
                        try:
                            out.append(urllib.request.urlopen(req, timeout=30).status)
                        except urllib.error.HTTPError as e:
                            out.append(e.code)
            try:
                open({str(key_file)!r}).read()
                out.append("read the key")
            except PermissionError:
                out.append("no access")
            print(json.dumps(out))
        """)
        done = _as_nobody(probe)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out[:-1] == [401] * 12 and out[-1] == "no access"
        tc.close("success").result(timeout=60)
    finally:
        assert stop_server(served) == 0


def test_a_request_without_the_key_is_refused_before_its_body_is_read(srv):
    """The 401 comes back while the client has sent only its headers (a huge body announced)."""
    host, port = urlsplit(srv.url).hostname, urlsplit(srv.url).port
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000000\r\n\r\n{")
        answer = s.recv(4096).decode("latin-1")
    assert answer.startswith("HTTP/1.1 401")


def test_every_server_has_a_key_and_the_processs_own_clients_send_it():
    from machine_nb.engines import LOCAL_API_KEY, service_client
    from machine_nb.engines.local.server import ensure_server

    a, b = server_mod.LocalServer(), server_mod.LocalServer()
    try:
        assert a.key != b.key and a.key.startswith("tml-") and len(a.key) > 30
    finally:
        a.stop()
        b.stop()
    assert ensure_server().key == LOCAL_API_KEY != "tml-local-engine"
    tc = service_client("local").create_lora_training_client(DEFAULT_MODEL, rank=2).result()  # the kept client sends it
    assert tc.get_info().model_data.model_name == DEFAULT_MODEL
    assert call(ensure_server().url, "/api/v1/training_runs", key=None)[0] == 401


def test_a_key_file_that_could_not_be_written_is_not_left_half_written(tmp_path):
    """A server that fails while writing its data dir's key file (a full disk here: no byte may be
    written) leaves no empty key file behind, so the next server makes a whole one and starts."""
    from machine_nb.engines.local import checkpoints as ck

    code = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        from machine_nb.engines.local import checkpoints as ck
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            ck.data_dir_key(Path({str(tmp_path)!r}))
        except OSError as exc:
            print("failed:", exc.strerror)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("failed:"), (done.stdout, done.stderr)
    key, path = ck.data_dir_key(tmp_path)
    assert ck.check_key(key) and path.read_text() == key + "\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ck.data_dir_key(tmp_path) == (key, path)


def test_on_a_file_system_without_hard_links_the_key_file_is_renamed_into_place(tmp_path, monkeypatch):
    from machine_nb.engines.local import checkpoints as ck

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(ck.os, "link", no_links)
    key, path = ck.data_dir_key(tmp_path)
    assert ck.check_key(key) and path.read_text() == key + "\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ck.data_dir_key(tmp_path) == (key, path) and sorted(p.name for p in tmp_path.iterdir()) == ["server.key"]


def test_serve_says_it_takes_its_key_from_a_file_or_the_environment():
    helped = subprocess.run([sys.executable, "-m", "machine_nb.cli", "serve", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert "--key-file" in helped.stdout and "MACHINE_NB_SERVER_KEY" in helped.stdout
    # the key from --key-file and from $MACHINE_NB_SERVER_KEY, never from the command line: checked
    # on the servers the signal tests below start (start_with_*), one key source each


def start_with_a_key_file(tmp_path) -> Served:
    """`machine-nb serve --key-file`: the server takes the file's key, and it is neither on the
    command line nor written to the data dir's own key file; the test key of the environment is
    refused."""
    key = "tml-from-a-key-file-0123456789"
    key_file = tmp_path / "k"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    served = start_server(tmp_path, "--key-file", str(key_file), key=None, name="filed")
    served.key = key
    try:
        assert key not in Path(f"/proc/{served.proc.pid}/cmdline").read_bytes().decode()
        assert call(served.url, "/api/v1/training_runs", key=key)[0] == 200
        assert call(served.url, "/api/v1/training_runs", key=TEST_KEY)[0] == 401
        assert not (served.data_dir / "server.key").exists()
    except BaseException:
        stop_server(served)
        raise
    return served


def start_with_the_key_from_the_environment(tmp_path) -> Served:
    """A server started with $MACHINE_NB_SERVER_KEY (serving.start_server's way) takes that key,
    and it is not on the server's command line."""
    served = start_server(tmp_path)
    try:
        assert TEST_KEY not in Path(f"/proc/{served.proc.pid}/cmdline").read_bytes().decode()
        assert call(served.url, "/api/v1/training_runs", key=TEST_KEY)[0] == 200
    except BaseException:
        stop_server(served)
        raise
    return served


# ---------------------------------------------------------------------------------------------
# 3, 4: seq_id


def test_a_seq_id_far_ahead_is_refused_and_the_run_goes_on(srv, sc):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    body = json.dumps({"model_id": tc.model_id, "seq_id": 2**31 - 1,
                       "adam_params": {"learning_rate": 1e-3}}).encode()
    status, answer = call(srv.url, "/api/v1/optim_step", key=srv.key, body=body, method="POST")
    assert status == 400 and answer["field"] == "seq_id"
    fb = tc.forward_backward([datum(IDS)], "cross_entropy").result(timeout=60)
    assert np.isfinite(fb.metrics["loss:sum"])


def test_after_a_refused_request_the_next_call_runs_at_once(srv, sc):
    """A 400 still takes the request's place in the run's order: the next call does not wait for it."""
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="vocabulary"):
        tc.forward_backward([datum([5, 10**6, 7])], "cross_entropy").result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="learning_rate"):
        tc.optim_step(types.AdamParams(learning_rate=-1.0)).result(timeout=60)
    fb = tc.forward_backward([datum(IDS)], "cross_entropy").result(timeout=30)  # would wait SEQ_GAP_TIMEOUT_S
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=30)
    assert np.isfinite(fb.metrics["loss:sum"])


def _result(srv, request_id: str) -> dict:
    """A future's result, polled as the SDK polls it (a 408 is "not ready yet")."""
    while True:
        status, answer = call(srv.url, "/api/v1/retrieve_future", key=srv.key, method="POST",
                              body=json.dumps({"request_id": request_id}).encode())
        if status != 408:
            assert status == 200, answer
            return answer


def test_after_a_request_that_never_arrived_the_next_one_runs_at_once(srv, sc, monkeypatch):
    """The requests queued behind a `seq_id` that never came fail after SEQ_GAP_TIMEOUT_S, and the
    run goes on from the last of them: the next request runs, it does not wait for a number that
    was already failed."""
    monkeypatch.setattr(server_mod, "SEQ_GAP_TIMEOUT_S", 0.0)
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    nxt = srv.runs[tc.model_id]._next_seq

    def optim_step(seq_id: int) -> str:
        body = json.dumps({"model_id": tc.model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 1e-3}})
        status, answer = call(srv.url, "/api/v1/optim_step", key=srv.key, body=body.encode(), method="POST")
        assert status == 200, answer
        return answer["request_id"]

    run, held = srv.runs[tc.model_id], threading.Event()
    run.submit(None, "hold", lambda: held.wait(60) and {})  # both are queued before the run looks at them
    queued = [optim_step(nxt + 1), optim_step(nxt + 2)]  # request nxt is lost on its way
    held.set()
    for request_id in queued:
        assert f"seq_id {nxt} of this run never arrived" in _result(srv, request_id)["error"]
    answer = _result(srv, optim_step(nxt + 3))
    assert "error" not in answer and answer["metrics"]["grad_norm"] == 0.0, answer


def test_a_session_lists_its_own_runs_and_samplers(srv):
    """`get_session` names the training runs and samplers made in that session, none of another's."""
    def post(path: str, body: dict) -> dict:
        status, answer = call(srv.url, path, key=srv.key, body=json.dumps(body).encode(), method="POST")
        assert status == 200, answer
        return answer

    made = {}
    for name in ("a", "b"):
        sid = post("/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0"})["session_id"]
        model_id = post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": DEFAULT_MODEL,
                                                 "lora_config": {"rank": 2}})["model_id"]
        sampler = post("/api/v1/create_sampling_session", {"session_id": sid, "sampling_session_seq_id": 0,
                                                           "base_model": DEFAULT_MODEL})["sampling_session_id"]
        made[name] = (sid, model_id, sampler)
    rest = tinker.RestClient(base_url=srv.url, api_key=srv.key)
    for sid, model_id, sampler in made.values():
        listed = rest.get_session(sid).result(timeout=60)
        assert listed.training_run_ids == [model_id] and listed.sampler_ids == [sampler]


# ---------------------------------------------------------------------------------------------
# 10 (numbers), 11: what is refused rather than trained


def test_a_create_model_sent_again_after_its_answer_was_lost_gets_the_same_answer(srv):
    """The SDK sends a request again when its answer was lost (a connection reset): the same
    create_model again is answered as the first was, so the run is not lost to a 409; another
    create_model under the same session and model_seq_id is still a 409."""
    create = {"session_id": new_session(srv), "model_seq_id": 0, "base_model": DEFAULT_MODEL,
              "lora_config": {"rank": 2}}
    first = api_call(srv, "/api/v1/create_model", create)
    assert first[0] == 200 and api_call(srv, "/api/v1/create_model", create) == first
    assert api_result(srv, first)["model_id"] == first[1]["model_id"]
    other = api_call(srv, "/api/v1/create_model", {**create, "lora_config": {"rank": 4}})
    assert other[0] == 409 and "exists already" in other[1]["detail"]


def test_float_or_nan_target_tokens_are_refused_with_a_400(srv, sc):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    n = len(IDS)
    for bad in (2.7, float("nan")):
        targets = types.TensorData(data=[float(t) for t in IDS[1:]] + [bad], dtype="float32", shape=[n])
        with pytest.raises(tinker.BadRequestError, match="whole token ids"):
            tc.forward_backward([datum(IDS, targets=targets)], "cross_entropy").result(timeout=60)
    whole = types.TensorData(data=[float(t) for t in IDS[1:]] + [2.0], dtype="float32", shape=[n])
    assert np.isfinite(tc.forward_backward([datum(IDS, targets=whole)], "cross_entropy").result(timeout=60)
                       .metrics["loss:sum"])


def _weights(srv, tc):
    return [p.detach().clone() for p in srv.runs[tc.model_id].trainer.params]


def test_a_step_that_makes_the_loss_or_a_parameter_non_finite_fails_and_keeps_the_state(srv, sc):
    import torch

    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    tc.forward_backward([datum(IDS)], "cross_entropy").result(timeout=60)
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
    before = _weights(srv, tc)
    with pytest.raises(tinker.RequestFailedError, match="NaN or infinite|the loss is"):
        tc.forward_backward([datum(IDS, weights=[1e38] * len(IDS))], "cross_entropy").result(timeout=60)
    assert all(p.grad is None for p in srv.runs[tc.model_id].trainer.params)  # no gradient kept from it
    tc.forward_backward([datum(IDS)], "cross_entropy").result(timeout=60)
    with pytest.raises(tinker.RequestFailedError, match="NaN or infinite"):
        tc.optim_step(types.AdamParams(learning_rate=1e30)).result(timeout=60)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(srv, tc)))
    # beta2 = 1 would turn weights whose gradient was always 0 NaN: refused before the step is queued
    with pytest.raises(tinker.BadRequestError, match="adam_params.beta2"):
        tc.optim_step(types.AdamParams(learning_rate=1e-2, beta2=1.0)).result(timeout=60)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(srv, tc)))
    srv.runs[tc.model_id].trainer.optimizer.zero_grad()
    path = tc.save_weights_for_sampler("after-refusals").result(timeout=60).path
    out = sc.create_sampling_client(model_path=path).sample(
        types.ModelInput.from_ints(IDS), 1, types.SamplingParams(max_tokens=3)).result(timeout=60)
    assert all(np.isfinite(out.sequences[0].logprobs))


# ---------------------------------------------------------------------------------------------
# 9: odd data dirs


def test_stray_folders_and_unreadable_run_records_are_skipped(srv, sc, caplog):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    tc.save_weights_for_sampler("listed").result(timeout=60)
    runs = srv.data_dir / "runs"
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    (runs / "not-a-run").mkdir()
    (runs / "stray.txt").write_text("x")
    broken = runs / "local-0123456789abcdef:train:0"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    rest = tinker.RestClient(base_url=srv.url, api_key=srv.key)
    listed = rest.list_training_runs(limit=100).result(timeout=60)
    ids = [r.training_run_id for r in listed.training_runs]
    assert tc.model_id in ids and broken.name not in ids
    cps = rest.list_user_checkpoints().result(timeout=60)
    assert any(c.checkpoint_id == "sampler_weights/listed" for c in cps.checkpoints)
    assert "not a training run" in caplog.text and "unreadable run record" in caplog.text


# ---------------------------------------------------------------------------------------------
# 10: framing


def _raw(srv, data: bytes) -> bytes:
    host, port = urlsplit(srv.url).hostname, urlsplit(srv.url).port
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_chunked_bodies_are_framed_and_a_smuggled_request_is_never_run(srv):
    key = srv.key.encode()
    ok = _raw(srv, b"POST /api/v1/client/config HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key +
              b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
              b"2\r\n{}\r\n0\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200") and b"pjwt_auth_enabled" in ok
    hidden = b"GET /api/v1/training_runs HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + b"\r\n\r\n"
    smuggled = _raw(srv, b"POST /api/v1/telemetry HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key +
                    b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    + f"{len(hidden):x}".encode() + b"\r\n" + hidden + b"\r\n0\r\n\r\n")
    assert smuggled.count(b"HTTP/1.1 ") == 1 and b"training_runs" not in smuggled


def test_a_negative_content_length_gets_an_answer(srv):
    out = _raw(srv, b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\nX-API-Key: " + srv.key.encode() +
               b"\r\nContent-Length: -5\r\n\r\n{}")
    assert out.startswith(b"HTTP/1.1 400")


# ---------------------------------------------------------------------------------------------
# 7: stopping


@pytest.mark.parametrize("sig, start", [(signal.SIGTERM, start_with_a_key_file),
                                        (signal.SIGINT, start_with_the_key_from_the_environment)])
def test_a_signal_stops_the_server_cleanly_and_answers_the_request_in_progress(tmp_path, sig, start):
    """A poll held open on a request that cannot finish yet (an earlier seq_id never came) is
    answered as a failed request saying the server stopped; the process prints "stopped", exit 0.
    (Each server takes its key from one of the sources `serve` reads, checked as it starts.)"""
    import threading

    served = start(tmp_path)
    try:
        post = lambda path, body: call(served.url, path, key=served.key, body=json.dumps(body).encode(),
                                       method="POST")
        sid = post("/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0"})[1]["session_id"]
        created = post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": DEFAULT_MODEL,
                                                "lora_config": {"rank": 2}})[1]
        assert post("/api/v1/retrieve_future", {"request_id": created["request_id"]})[0] == 200
        waiting = post("/api/v1/optim_step", {"model_id": created["model_id"], "seq_id": 5,
                                              "adam_params": {"learning_rate": 1e-3}})[1]
        answer: list = []
        poll = threading.Thread(target=lambda: answer.append(post("/api/v1/retrieve_future",
                                                                  {"request_id": waiting["request_id"]})))
        poll.start()
        poll.join(1.0)
        assert poll.is_alive()  # held open: the request cannot run before seq_ids 1-4
        served.proc.send_signal(sig)
        poll.join(60)
        assert answer and answer[0][0] == 200 and "server stopped" in answer[0][1]["error"]
    finally:
        code = stop_server(served, sig)
    assert code == 0 and "stopped" in served.output()


def test_a_request_whose_body_never_finishes_arriving_does_not_hold_the_stop(tmp_path, caplog):
    """A client that sent a request's head and part of its body, then nothing (a cancelled call
    whose connection stays open): stop() answers it 503, saying the server stopped, and goes on;
    it does not wait out the shutdown's grace for the rest of the body."""
    s = server_mod.LocalServer(data_dir=tmp_path / "data").start()
    host, port = urlsplit(s.url).hostname, urlsplit(s.url).port
    with socket.create_connection((host, port), timeout=60) as c:
        c.sendall(b"POST /api/v1/session_heartbeat HTTP/1.1\r\nHost: x\r\nX-API-Key: " + s.key.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"session")
        assert s.busy() is False  # the head is in, the body is not: nothing is dispatched yet
        stopping = threading.Thread(target=s.stop)
        stopping.start()
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    stopping.join(60)
    assert not stopping.is_alive()
    assert out.startswith(b"HTTP/1.1 503") and b"the server stopped" in out, out
    assert b"connection: close" in out.lower()
    assert not [r for r in caplog.records if "ASGI" in r.getMessage()], caplog.records


def test_a_body_begun_after_the_stop_gets_a_second_then_a_503(srv):
    """A request that begins on a kept-alive connection in the instant after stop() cut the
    bodies in progress: its body has a second to arrive."""
    import asyncio

    app = server_mod._App(srv)
    app._cut = True

    async def never() -> dict:
        await asyncio.Event().wait()

    async def at_once() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    with pytest.raises(server_mod.ApiError) as err:
        asyncio.run(app._body(never, "POST", "/api/v1/create_session"))
    assert err.value.status == 503 and "stopped before the request's body" in err.value.message
    assert asyncio.run(app._body(at_once, "POST", "/api/v1/create_session")) == b"{}"


# ---------------------------------------------------------------------------------------------
# 8: train_unembed


def test_train_unembed_is_honoured_and_reported(srv, sc):
    """The SDK's default train_unembed=True trains an adapter on the output projection (saved,
    reported by weights_info, and served by a sampler of the checkpoint); False trains none."""
    rest = tinker.RestClient(base_url=srv.url, api_key=srv.key)
    data = [datum(IDS)]
    for unembed in (True, False):
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2, train_unembed=unembed).result()
        for _ in range(3):
            tc.forward_backward(data, "cross_entropy").result(timeout=60)
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=60)
        model = srv.runs[tc.model_id].trainer.model
        assert hasattr(model, "unembed_lora") is unembed
        if unembed:
            assert float(model.unembed_lora.lora_b.abs().max()) > 0
        path = tc.save_weights_for_sampler(f"unembed-{unembed}").result(timeout=60).path
        assert rest.get_weights_info_by_tinker_path(path).result(timeout=60).train_unembed is unembed
        trained = tc.forward(data, "cross_entropy").result(timeout=60).loss_fn_outputs[0]["logprobs"].tolist()
        served = sc.create_sampling_client(model_path=path).compute_logprobs(
            types.ModelInput.from_ints(IDS + [2])).result(timeout=60)[1:]
        assert np.allclose(served, trained, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# 12: runs side by side


def test_two_runs_at_once_give_the_same_losses_as_each_alone(srv, sc):
    """Each run's steps run on its own thread; runs side by side stay bit-identical to runs alone
    (benchmarks/bench_concurrent_runs.py times them)."""
    import threading

    def losses(seed: int) -> list[float]:
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=seed).result()
        data = [datum([(7 * i + 3 * j + seed) % 90 + 5 for j in range(24)]) for i in range(4)]
        out = []
        for _ in range(4):
            fb = tc.forward_backward(data, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
            out.append(fb.result(timeout=60).metrics["loss:sum"])
            opt.result(timeout=60)
        return out

    alone = {seed: losses(seed) for seed in (1, 2)}
    together: dict = {}
    threads = [threading.Thread(target=lambda s=s: together.__setitem__(s, losses(s))) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert together == alone


def test_two_runs_steps_run_at_the_same_time(srv, sc, monkeypatch):
    """Each run's forward/backward waits inside the step until the other run's is inside too: were
    the runs' steps served one at a time, the first would wait for a second that cannot start."""
    import threading

    from machine_nb.engines.local import compute

    both_inside = threading.Barrier(2, timeout=60)
    step = compute.Trainer.forward_backward

    def meeting(self, *args, **kwargs):
        both_inside.wait()
        return step(self, *args, **kwargs)

    clients = [sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=s).result() for s in (1, 2)]
    monkeypatch.setattr(compute.Trainer, "forward_backward", meeting)
    futures = [tc.forward_backward([datum([5, 6, 7, 8])], "cross_entropy") for tc in clients]
    assert all(f.result(timeout=120).metrics["loss:sum"] > 0 for f in futures)
    assert not both_inside.broken


STOP_SIGNALS = textwrap.dedent("""
    import os, signal, threading
    from machine_nb.engines.local.server import _StopSignals

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
        before = signal.getsignal(sig)
        stop = _StopSignals()
        assert not stop.wait(0.01)
        threading.Timer(0.05, os.kill, (os.getpid(), sig)).start()
        assert stop.wait(60), sig  # the signal, caught while the main thread waits
        stop._handle(sig, None)  # a second stop request, before the first is read, neither blocks nor fails
        stop.close()
        assert signal.getsignal(sig) is before
    print("ok")
""")


def test_serve_takes_ctrl_c_and_sigterm_through_handlers_that_take_no_lock():
    # a handler that set a threading.Event could find the Event's lock held by the main thread's
    # own wait on it, and `machine-nb serve` then hung on Ctrl-C for good
    done = subprocess.run([sys.executable, "-c", STOP_SIGNALS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_run_whose_creation_failed_says_so_to_every_later_call(srv, monkeypatch):
    """A run whose trainer could not be made (its create_model failed): optimizer steps, saves and
    samplers of it say the run was not created, as a forward pass does, not "internal error"."""
    def post(path: str, body: dict) -> dict:
        status, answer = call(srv.url, path, key=srv.key, body=json.dumps(body).encode(), method="POST")
        assert status == 200, answer
        return answer

    def fails(*args, **kwargs):
        raise EngineError("the base model could not be loaded")

    monkeypatch.setattr(srv, "_new_trainer", fails)
    sid = post("/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0"})["session_id"]
    made = post("/api/v1/create_model", {"session_id": sid, "model_seq_id": 0, "base_model": DEFAULT_MODEL,
                                         "lora_config": {"rank": 2}})
    assert "could not be loaded" in _result(srv, made["request_id"])["error"]
    model_id, nxt = made["model_id"], srv.runs[made["model_id"]]._next_seq
    asked = [post("/api/v1/optim_step", {"model_id": model_id, "seq_id": nxt, "adam_params": {"learning_rate": 1e-3}}),
             post("/api/v1/save_weights", {"model_id": model_id, "seq_id": nxt + 1, "path": "s"}),
             post("/api/v1/save_weights_for_sampler", {"model_id": model_id, "seq_id": nxt + 2, "path": "w"}),
             post("/api/v1/save_weights_for_sampler", {"model_id": model_id, "seq_id": nxt + 3})]
    for answer in asked:
        result = _result(srv, answer["request_id"])
        assert "the training run was not created" in result["error"] and result["category"] == "user", result
