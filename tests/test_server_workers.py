"""Training processes (engines/local/workers.py): a server with `train_workers` trains a run of the
engine's own model that starts while others train in a process of its own, so different runs'
steps run in parallel, with the losses, checkpoints, samplers and errors of a server that trains
them itself."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import server as server_mod


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """A server with two training processes, and one run of its own that counts as training
    whenever `elsewhere` places a run, so that run goes to a training process."""
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("pooled") / "data", train_workers=2).start()
    sc = tinker.ServiceClient(base_url=s.url, api_key=s.key)
    anchor = sc.create_lora_training_client(DEFAULT_MODEL, rank=2, seed=99).result()
    assert s.runs[anchor.model_id].place is None
    yield s, sc
    sc.close("success").result(timeout=60)
    s.stop()


def elsewhere(srv, sc, monkeypatch, create=None, **settings):
    """A training client whose run trains in a training process: made while every run counts as
    training (the fixture's anchor run holds the server's own place)."""
    monkeypatch.setattr(server_mod, "ACTIVE_S", 1e9)
    try:
        tc = (create or (lambda: sc.create_lora_training_client(DEFAULT_MODEL, **settings).result()))()
    finally:
        monkeypatch.undo()
    assert srv.runs[tc.model_id].place in srv.train_pool.pids()
    return tc


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("here") / "data").start()
    sc = tinker.ServiceClient(base_url=s.url, api_key=s.key)
    yield s, sc
    sc.close("success").result(timeout=60)
    s.stop()


def rows(seed: int, n: int = 4, length: int = 24) -> list[types.Datum]:
    out = []
    for i in range(n):
        ids = [(7 * i + 3 * j + seed) % 90 + 5 for j in range(length)]
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids),
                               loss_fn_inputs={"target_tokens": ids[1:] + [2], "weights": [1.0] * length}))
    return out


def train(tc, data, steps: int, lr: float = 1e-2) -> list[float]:
    out = []
    for _ in range(steps):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=lr))
        out.append(fb.result(timeout=60).metrics["loss:sum"])
        opt.result(timeout=60)
    return out


def test_a_run_alone_trains_in_the_server_and_one_started_beside_it_in_a_training_process(tmp_path, here,
                                                                                          monkeypatch):
    """Run 1 alone trains in the server itself; run 2, started while run 1 trains, in a training
    process; the two train at once with the losses of a server that trains both itself; once both
    are idle, run 3 trains in the server again (a free place, no new process). Stopping the server
    ends its training process and removes its private socket folder."""
    srv = server_mod.LocalServer(data_dir=tmp_path / "data", train_workers=1).start()
    sc = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    try:
        monkeypatch.setattr(server_mod, "ACTIVE_S", 30.0)
        clients = [sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=s).result() for s in (1, 2)]
        places = [srv.runs[tc.model_id].place for tc in clients]
        assert places[0] is None and places[1] == srv.train_pool.pids()[0] != os.getpid()
        pids = srv.train_pool.pids()
        folder = Path(srv.runs[clients[1].model_id].trainer.address).parent
        assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
        together: dict = {}
        threads = [threading.Thread(target=lambda s=s, tc=tc: together.__setitem__(s, train(tc, rows(s), 4)))
                   for s, tc in zip((1, 2), clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        monkeypatch.setattr(server_mod, "ACTIVE_S", 0.0)
        third = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=3).result()
        assert srv.runs[third.model_id].place is None and len(srv.train_pool.pids()) == 1
    finally:
        sc.close("success").result(timeout=60)
        srv.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pids[0]}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pids[0]}")  # stopping the server ended its training process
    assert not folder.exists()
    own_srv, own_sc = here
    for s in (1, 2):
        tc = own_sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=s).result()
        assert own_srv.runs[tc.model_id].place is None and own_srv.train_pool is None
        assert train(tc, rows(s), 4) == together[s]
    assert together[1][-1] < together[1][0]


def test_checkpoints_samplers_and_rl_losses_of_a_run_in_a_training_process(pooled, here, monkeypatch):
    """Save state, resume it in a new run (in a training process): the next loss is the
    uninterrupted run's; a sampler of the run's weights samples what the server's own would; a
    PPO forward/backward gives the same loss."""
    srv, sc = pooled
    own_srv, own_sc = here
    data = rows(3)
    tc = elsewhere(srv, sc, monkeypatch, rank=4, seed=3, train_unembed=True)
    train(tc, data, 3)
    path = tc.save_state("mid").result(timeout=60).path
    uninterrupted = train(tc, data, 2)
    resumed = elsewhere(srv, sc, monkeypatch, lambda: sc.create_training_client_from_state_with_optimizer(path).result())
    assert train(resumed, data, 2) == uninterrupted

    theirs = own_sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=3, train_unembed=True).result()
    train(theirs, data, 5)
    prompt = types.ModelInput.from_ints([5, 17, 23, 9])
    params = types.SamplingParams(max_tokens=8, temperature=0.0)
    samples = [c.save_weights_and_get_sampling_client().sample(prompt, 1, params).result(timeout=60)
               for c in (resumed, theirs)]
    assert samples[0].sequences[0].tokens == samples[1].sequences[0].tokens

    ppo = [types.Datum(model_input=d.model_input, loss_fn_inputs={
        "target_tokens": d.loss_fn_inputs["target_tokens"], "logprobs": [-1.0] * 24, "advantages": [0.5] * 24})
        for d in data]
    losses = [c.forward_backward(ppo, "ppo").result(timeout=60).metrics["loss:sum"] for c in (resumed, theirs)]
    assert losses[0] == losses[1] and np.isfinite(losses[0])


def test_a_step_gone_non_finite_in_a_training_process_fails_and_keeps_the_run(pooled, monkeypatch):
    srv, sc = pooled
    data = rows(4)
    tc = elsewhere(srv, sc, monkeypatch, rank=4, seed=4)
    train(tc, data, 2)
    before = tc.forward(data, "cross_entropy").result(timeout=60).metrics["loss:sum"]
    tc.forward_backward(data, "cross_entropy").result(timeout=60)
    with pytest.raises(Exception, match="NaN or infinite.*kept as it was"):
        tc.optim_step(types.AdamParams(learning_rate=1e30)).result(timeout=60)
    assert tc.forward(data, "cross_entropy").result(timeout=60).metrics["loss:sum"] == before


def test_a_training_process_that_dies_fails_its_runs_clearly_and_the_server_goes_on(pooled, monkeypatch):
    srv, sc = pooled
    tc = elsewhere(srv, sc, monkeypatch, rank=4, seed=5)
    train(tc, rows(5), 1)
    pid = srv.runs[tc.model_id].trainer.pid
    folder = Path(srv.runs[tc.model_id].trainer.address).parent
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception, match="training process of this run ended.*last saved checkpoint"):
        tc.forward_backward(rows(5), "cross_entropy").result(timeout=60)
    fresh = elsewhere(srv, sc, monkeypatch, rank=4, seed=5)
    assert srv.runs[fresh.model_id].trainer.pid != pid
    assert not folder.exists()  # the killed process's socket folder, removed by the server
    assert len(train(fresh, rows(5), 1)) == 1


def test_the_real_model_and_a_server_without_workers_keep_runs_in_the_server(pooled, tmp_path):
    """Only the engine's own models go to training processes (the real model's runs share one
    frozen base in the server); `train_workers=0`, the default of an in-process server, starts none."""
    from machine_nb.engines.local import MODELS

    srv, _ = pooled
    real = [name for name, entry in MODELS.items() if entry.backend is not None]
    assert real and all(srv._pool_for(name) is None for name in real)
    assert srv._pool_for(DEFAULT_MODEL) is srv.train_pool
    assert server_mod.LocalServer(data_dir=tmp_path / "d").train_pool is None


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to act as the user nobody (runuser), as CI runs")
def test_another_user_cannot_reach_a_training_process(pooled, monkeypatch):
    """A training process's socket lies in a folder only its owner may enter, and it answers only
    a client that proves the key the server gave it."""
    import json
    import subprocess
    import textwrap
    from multiprocessing.connection import Client

    srv, sc = pooled
    tc = elsewhere(srv, sc, monkeypatch, rank=2, seed=7)
    address = srv.runs[tc.model_id].trainer.address
    probe = textwrap.dedent(f"""
        import json, socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({address!r})
            print(json.dumps("connected"))
        except PermissionError:
            print(json.dumps("no access"))
    """)
    done = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", probe], capture_output=True,
                          text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "no access"
    with pytest.raises(Exception, match="digest|authenticat"):  # the owner, without the key
        Client(address, family="AF_UNIX", authkey=b"not-the-key")
    assert len(train(tc, rows(7, n=1), 1)) == 1  # and the run goes on


def test_a_run_whose_session_was_finished_takes_no_place_from_the_next_run(tmp_path, monkeypatch):
    """Runs one after another, each client finishing its session at its end (`close()`, as a
    script should): the next run trains in the server, even right after the last one's final
    request, and no training process starts."""
    srv = server_mod.LocalServer(data_dir=tmp_path / "data", train_workers=1).start()
    monkeypatch.setattr(server_mod, "ACTIVE_S", 1e9)  # every run not finished counts as training
    try:
        first = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
        tc = first.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=1).result()
        train(tc, rows(1), 1)
        assert srv.runs[tc.model_id].place is None
        first.close("success").result(timeout=60)
        second = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
        try:
            tc2 = second.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=2).result()
            assert srv.runs[tc2.model_id].place is None and srv.train_pool.pids() == []
            # while that run's session is open it still counts: a third goes to a training process
            third = second.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=3).result()
            assert srv.runs[third.model_id].place in srv.train_pool.pids() != []
        finally:
            second.close("success").result(timeout=60)
    finally:
        srv.stop()


def test_a_run_whose_creation_failed_takes_no_place_from_the_next_run(tmp_path, monkeypatch):
    """A run whose trainer could not be made (as the real model's without its package) never
    trains: the run created next trains in the server itself, starting no training process."""
    from machine_nb.errors import EngineError

    srv = server_mod.LocalServer(data_dir=tmp_path / "data", train_workers=1).start()
    sc = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    make = srv._new_trainer

    def new_trainer(run, how, base_model, settings):
        if settings.get("seed") == 13:
            raise EngineError("no weights for this model here")
        return make(run, how, base_model, settings)

    monkeypatch.setattr(srv, "_new_trainer", new_trainer)
    monkeypatch.setattr(server_mod, "ACTIVE_S", 30.0)
    try:
        with pytest.raises(Exception, match="no weights for this model here"):
            sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=13).result()
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=1).result()
        assert srv.runs[tc.model_id].place is None and srv.train_pool.pids() == []
    finally:
        sc.close("success").result(timeout=60)
        srv.stop()


def test_a_training_process_that_ends_before_it_reads_its_key_is_an_error_naming_its_exit_code(monkeypatch):
    """The process ended before the key was written to it (a broken interpreter, a failed import):
    the server's error says it did not start and how it ended, not a bare BrokenPipeError."""
    import subprocess
    import types as pytypes

    from machine_nb.engines.local import workers
    from machine_nb.errors import EngineError

    popen = subprocess.Popen

    def ended_at_once(args, **kwargs):
        proc = popen(["/bin/sh", "-c", "exit 3"], **kwargs)
        proc.wait()  # gone, its end of stdin closed, before the key is written
        return proc

    monkeypatch.setattr(workers, "subprocess", pytypes.SimpleNamespace(  # this module's Popen only
        Popen=ended_at_once, PIPE=subprocess.PIPE, TimeoutExpired=subprocess.TimeoutExpired))
    with pytest.raises(EngineError, match=r"did not start \(exit code 3\)"):
        workers._Process(None)
