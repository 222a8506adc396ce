"""The local engine through the real tinker SDK: training steps lower the loss, checkpoints
round-trip, async forms, sampling parameters (stop, max_tokens, seed), LoRA rank and AdamParams
honoured, clear errors. The server runs in this process, so tests can look at its weights."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch

from machine_nb.engines import check_checkpoint, check_model, engine_for, service_client
from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import checkpoints as ck
from machine_nb.engines.local import lora as lora_mod
from machine_nb.engines.local.server import ensure_server
from machine_nb.errors import EngineError
from machine_nb.checks.render import get_renderer

PAIRS = [(12, 30), (45, 11), (23, 67), (50, 19), (81, 17), (66, 24), (38, 29), (90, 14)]


@pytest.fixture(scope="module")
def renderer():
    return get_renderer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def batch(renderer):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum

    convs = [[{"role": "user", "content": f"What is {a} plus {b}?"},
              {"role": "assistant", "content": f"answer: {a + b}"}] for a, b in PAIRS]
    return [conversation_to_datum(c, renderer, 128, TrainOnWhat.LAST_ASSISTANT_MESSAGE) for c in convs]


@pytest.fixture(scope="module")
def sc():
    """The real SDK's ServiceClient, pointed at this process's local server."""
    return service_client("local")


def trainer(tc):
    """The server-side trainer behind an SDK training client (its model and parameters)."""
    return ensure_server().runs[tc.model_id].trainer


def directory(path: str):
    return ck.checkpoint_dir(ensure_server().data_dir, path)


def prompt(renderer, text="What is 12 plus 30?"):
    return renderer.build_generation_prompt([{"role": "user", "content": text}])


def train_steps(tc, batch, n, lr=3e-3, **adam):
    losses = []
    for _ in range(n):
        fb = tc.forward_backward(batch, "cross_entropy")
        opt = tc.optim_step(tinker.AdamParams(learning_rate=lr, **adam))
        losses.append(fb.result().metrics["loss:sum"])
        opt.result()
    return losses


def test_forward_backward_optim_step_lowers_the_loss_and_returns_tinker_types(sc, batch):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=8).result()
    out = tc.forward_backward(batch, "cross_entropy").result()
    assert isinstance(out, tinker.ForwardBackwardOutput)
    assert len(out.loss_fn_outputs) == len(batch)
    # the loss is sum(-w * logprob) over the batch, from the very logprobs returned
    total = 0.0
    for datum, o in zip(batch, out.loss_fn_outputs):
        lp = o["logprobs"].to_numpy()
        w = datum.loss_fn_inputs["weights"].to_numpy()
        assert lp.shape == w.shape == (datum.model_input.length,)
        total += float(-(w * lp).sum())
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)
    resp = tc.optim_step(tinker.AdamParams(learning_rate=3e-3)).result()
    assert isinstance(resp, tinker.OptimStepResponse)
    losses = train_steps(tc, batch, 8)
    assert losses[-1] < 0.8 * out.metrics["loss:sum"]


def test_forward_alone_computes_no_gradients(sc, batch):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4).result()
    a = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()  # nothing accumulated: no change
    b = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert a == b


def test_lora_rank_and_alpha_are_honoured(sc):
    for rank in (2, 8):
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=rank).result()
        info = tc.get_info()
        assert info.is_lora and info.lora_rank == rank and info.model_name == DEFAULT_MODEL
        mods = lora_mod.lora_modules(trainer(tc).model)
        cfg = trainer(tc).model.config
        # q, k, v, o and both MLP projections in every layer
        assert len(mods) == 6 * cfg.n_layer
        assert all(m.rank == rank and m.alpha == 2 * rank for m in mods.values())
        expected = sum(rank * (m.base.in_features + m.base.out_features) for m in mods.values())
        expected += rank * (cfg.n_embd + cfg.vocab_size)  # the unembedding's adapter (train_unembed=True)
        assert trainer(tc).num_trainable() == expected
    attn_only = sc.create_lora_training_client(DEFAULT_MODEL, rank=2, train_mlp=False).result()
    assert all("attn." in name for name in lora_mod.lora_modules(trainer(attn_only).model))
    # a rank past the model's width adds nothing (every adapted layer maps to or from it) and only
    # costs memory: refused with a 400 naming the field before any run is made, as a negative one is
    runs = len(list(Path(ensure_server().data_dir, "runs").iterdir()))
    for bad, said in ((cfg.n_embd + 1, f"at most {cfg.n_embd}"), (-1, "0 (full fine-tuning) or more")):
        with pytest.raises(tinker.BadRequestError, match="lora_config.rank") as refused:
            sc.create_lora_training_client(DEFAULT_MODEL, rank=bad).result(timeout=60)
        assert said in str(refused.value), str(refused.value)
    assert len(list(Path(ensure_server().data_dir, "runs").iterdir())) == runs
    widest = sc.create_lora_training_client(DEFAULT_MODEL, rank=cfg.n_embd).result()
    assert widest.get_info().lora_rank == cfg.n_embd


def test_adam_params_learning_rate_weight_decay_and_clip_are_honoured(sc, batch):
    def a_after(**adam):
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=1).result()
        before = {k: v.clone() for k, v in lora_mod.adapter_state(trainer(tc).model).items()}
        tc.forward_backward(batch, "cross_entropy")
        tc.optim_step(tinker.AdamParams(**adam)).result()
        return before, lora_mod.adapter_state(trainer(tc).model)

    before, zero_lr = a_after(learning_rate=0.0)
    assert all(torch.equal(before[k], zero_lr[k]) for k in before)
    # decoupled weight decay: the only difference is -lr * wd * A_old
    _, plain = a_after(learning_rate=1e-2)
    _, decayed = a_after(learning_rate=1e-2, weight_decay=0.5)
    key = next(k for k in before if k.endswith("lora_a"))
    torch.testing.assert_close(decayed[key] - plain[key], -1e-2 * 0.5 * before[key], rtol=1e-4, atol=1e-7)
    # clipping: with a large eps Adam's step scales with the gradient, so a tiny clip moves B far less
    _, unclipped = a_after(learning_rate=1e-2, eps=1.0)
    _, clipped = a_after(learning_rate=1e-2, eps=1.0, grad_clip_norm=1e-3)
    bkey = next(k for k in before if k.endswith("lora_b"))
    assert clipped[bkey].abs().sum() < 0.01 * unclipped[bkey].abs().sum()


def test_full_fine_tuning_with_rank_zero(sc, batch, renderer):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=0).result()
    assert not tc.get_info().is_lora
    losses = train_steps(tc, batch, 4, lr=5e-4)
    assert losses[-1] < losses[0]
    path = tc.save_weights_for_sampler("full").result().path
    assert (directory(path) / "model.safetensors").exists()
    res = sc.create_sampling_client(model_path=path).result().sample(
        prompt(renderer), 1, tinker.SamplingParams(max_tokens=8, temperature=0.0)).result()
    assert len(res.sequences[0].tokens) >= 1


def test_save_then_sample_round_trip(sc, batch, renderer):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=8).result()
    train_steps(tc, batch, 6)
    saved = tc.save_weights_for_sampler("000006").result()
    assert isinstance(saved, tinker.types.SaveWeightsForSamplerResponse)
    assert saved.path == f"tinker://{tc.model_id}/sampler_weights/000006"
    assert engine_for(saved.path) == "local"
    folder = directory(saved.path)
    assert folder.is_relative_to(ensure_server().data_dir)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in folder.iterdir())
    run_dir = folder.parent.parent  # <data dir>/runs/<run id>: run.json, written whole and private
    record = json.loads((run_dir / "run.json").read_text())
    assert record["training_run_id"] == tc.model_id and record["lora_rank"] == 8
    assert stat.S_IMODE(os.stat(run_dir / "run.json").st_mode) == 0o600
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json", "sampler_weights"]  # no temporary file left
    state = tc.save_state("000006").result()
    assert state.path.endswith("/weights/000006") and (directory(state.path) / "optimizer.pt").exists()

    params = tinker.SamplingParams(max_tokens=12, temperature=0.0, stop=renderer.get_stop_sequences())
    loaded = sc.create_sampling_client(model_path=saved.path).result()
    snapshot = tc.save_weights_and_get_sampling_client().result()
    base = sc.create_sampling_client(base_model=DEFAULT_MODEL).result()
    for text in ("What is 12 plus 30?", "What is 81 minus 17?"):
        a = loaded.sample(prompt(renderer, text), 1, params).result().sequences[0]
        b = snapshot.sample(prompt(renderer, text), 1, params).result().sequences[0]
        assert a.tokens == b.tokens
        assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
    # the trained adapter is what the checkpoint serves: the trained replies became likelier than on the base
    for datum in batch[:3]:
        full = datum.model_input.append_int(int(datum.loss_fn_inputs["target_tokens"].to_numpy()[-1]))
        w = datum.loss_fn_inputs["weights"].to_numpy()
        ckpt_lp = np.array(loaded.compute_logprobs(full).result()[1:], dtype=float)
        base_lp = np.array(base.compute_logprobs(full).result()[1:], dtype=float)
        assert (w * ckpt_lp).sum() > (w * base_lp).sum() + 1.0


def test_resume_from_state_with_optimizer_continues_identically(sc, batch):
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=3).result()
    train_steps(tc, batch, 3)
    path = tc.save_state("000003").result().path
    original = train_steps(tc, batch, 2)
    resumed_client = sc.create_training_client_from_state_with_optimizer(path).result()
    assert train_steps(resumed_client, batch, 2) == original
    fresh_opt = sc.create_training_client_from_state(path).result()
    assert train_steps(fresh_opt, batch, 2) != original  # a fresh optimizer takes other steps
    rest = sc.create_rest_client()
    run = rest.get_training_run_by_tinker_path(path).result()
    assert run.base_model == DEFAULT_MODEL and run.lora_rank == 4
    names = [c.checkpoint_id for c in rest.list_checkpoints(tc.model_id).result().checkpoints]
    assert names == ["weights/000003"]
    info = rest.get_weights_info_by_tinker_path(path).result()
    assert info.base_model == DEFAULT_MODEL and info.lora_rank == 4


def test_same_seed_gives_identical_losses(sc, batch):
    runs = []
    for i in range(2):
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=8, seed=7).result()
        runs.append(train_steps(tc, batch, 4))
    assert runs[0] == runs[1]
    other = sc.create_lora_training_client(DEFAULT_MODEL, rank=8, seed=8).result()
    assert train_steps(other, batch, 4) != runs[0]
    unseeded = [train_steps(sc.create_lora_training_client(DEFAULT_MODEL, rank=8).result(), batch, 2) for _ in range(2)]
    assert unseeded[0] == unseeded[1]  # no seed: the engine's fixed default, not a random draw


def test_async_forms_as_the_cookbook_calls_them(batch, renderer):
    async def main():
        sc = service_client("local")
        tc = await sc.create_lora_training_client_async(base_model=DEFAULT_MODEL, rank=4)
        fb_future = await tc.forward_backward_async(batch, loss_fn="cross_entropy")
        opt_future = await tc.optim_step_async(tinker.AdamParams(learning_rate=1e-3))
        fb = await fb_future.result_async()
        await opt_future  # SDK futures are awaitable too
        saved = await (await tc.save_weights_for_sampler_async("a")).result_async()
        sampler = await sc.create_sampling_client_async(model_path=saved.path)
        params = tinker.SamplingParams(max_tokens=6, temperature=0.0)
        # the evaluator gathers many rows at once
        many = await asyncio.gather(*[sampler.sample_async(prompt(renderer), 1, params) for _ in range(4)])
        lps = await sampler.compute_logprobs_async(prompt(renderer))
        return fb, many, lps

    fb, many, lps = asyncio.run(main())
    assert isinstance(fb, tinker.ForwardBackwardOutput)
    assert all(isinstance(r, tinker.SampleResponse) for r in many)
    assert len({tuple(r.sequences[0].tokens) for r in many}) == 1
    assert lps[0] is None and len(lps) == prompt(renderer).length


def test_sampling_stop_max_tokens_and_seed(sc, renderer):
    sampler = sc.create_sampling_client(base_model=DEFAULT_MODEL).result()
    p = prompt(renderer)
    free = sampler.sample(p, 1, tinker.SamplingParams(max_tokens=5, temperature=0.0, stop=[])).result().sequences[0]
    assert len(free.tokens) == len(free.logprobs) == 5 and free.stop_reason == "length"
    # a token-id stop: generation ends on it and keeps it
    stop_tok = free.tokens[2]
    first = free.tokens.index(stop_tok)
    hit = sampler.sample(p, 1, tinker.SamplingParams(max_tokens=5, temperature=0.0, stop=[stop_tok])).result().sequences[0]
    assert hit.stop_reason == "stop" and hit.tokens == free.tokens[:first + 1]
    # a string stop
    from machine_nb.engines.local import get_tokenizer

    tok = get_tokenizer(DEFAULT_MODEL)
    text = tok.decode(free.tokens)
    piece = text.strip()[:1]
    assert piece
    s = sampler.sample(p, 1, tinker.SamplingParams(max_tokens=5, temperature=0.0, stop=[piece])).result().sequences[0]
    assert s.stop_reason == "stop" and piece in tok.decode(s.tokens)
    assert piece not in tok.decode(s.tokens[:-1])
    # the renderer's stop sequence ends a chat reply
    chat = sampler.sample(p, 1, tinker.SamplingParams(max_tokens=40, temperature=0.0,
                                                      stop=renderer.get_stop_sequences())).result().sequences[0]
    if chat.stop_reason == "stop":
        assert renderer.parse_response(chat.tokens)[1].value == "stop_sequence"
    # temperature sampling repeats with a seed, and samples i use seed + i
    hot = tinker.SamplingParams(max_tokens=8, temperature=1.5, seed=11)
    a = sampler.sample(p, 3, hot).result()
    b = sampler.sample(p, 3, hot).result()
    assert [x.tokens for x in a.sequences] == [x.tokens for x in b.sequences]
    assert len(a.sequences) == 3 and len({tuple(x.tokens) for x in a.sequences}) > 1


def test_concurrent_samples_from_threads_match_sequential(sc, renderer):
    sampler = sc.create_sampling_client(base_model=DEFAULT_MODEL).result()
    params = tinker.SamplingParams(max_tokens=6, temperature=0.0)
    prompts = [prompt(renderer, f"What is {a} minus {b}?") for a, b in PAIRS]
    sequential = [sampler.sample(p, 1, params).result().sequences[0].tokens for p in prompts]
    results: dict[int, list[int]] = {}

    def worker(i):
        results[i] = sampler.sample(prompts[i], 1, params).result().sequences[0].tokens

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(prompts))] == sequential


def test_engine_routing_and_clear_errors(sc, batch):
    assert engine_for("local/arith-tiny") == "local"
    with pytest.raises(EngineError, match=r"'local:///x/sampler_weights/final' is not a checkpoint path tinker://<run>/"):
        check_checkpoint("local:///x/sampler_weights/final")
    assert engine_for("tinker://local-0123abcd:train:0/sampler_weights/final") == "local"
    assert engine_for("thinkingmachines/Inkling-Small") == "tinker"
    assert engine_for("tinker://run/sampler_weights/final") == "tinker"
    check_model("local", DEFAULT_MODEL)
    check_model("tinker", DEFAULT_MODEL)  # allowed: a `machine-nb serve` URL serves it (checked there)
    with pytest.raises(EngineError, match="engine='tinker'"):
        check_model("local", "Qwen/Qwen3-8B")
    with pytest.raises(tinker.BadRequestError, match="does not serve 'thinkingmachines/Inkling-Small'"):
        sc.create_lora_training_client("thinkingmachines/Inkling-Small").result()
    with pytest.raises(tinker.BadRequestError, match="engine='tinker'"):
        sc.create_sampling_client(model_path="tinker://abc/sampler_weights/final").result()
    missing = "tinker://local-0123abcd:train:0/sampler_weights/missing"
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        sc.create_sampling_client(model_path=missing).result()
    with pytest.raises(tinker.BadRequestError, match="does not serve"):
        sc.create_lora_training_client("local/no-such-model").result()
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    with pytest.raises(tinker.BadRequestError, match="importance_sampling needs loss_fn_inputs 'logprobs'"):
        tc.forward_backward(batch, "importance_sampling").result()
    with pytest.raises(tinker.BadRequestError, match="does not serve loss_fn 'stable_reinforce'"):
        tc.forward_backward(batch, "stable_reinforce").result()
    with pytest.raises(tinker.BadRequestError, match="letters, digits"):
        tc.save_state("../escape").result()
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    too_long = tinker.Datum(model_input=tinker.ModelInput.from_ints([5] * 300),
                            loss_fn_inputs={"target_tokens": [5] * 300, "weights": [1.0] * 300})
    with pytest.raises(tinker.BadRequestError, match="context"):
        tc.forward_backward([too_long], "cross_entropy").result()


def test_a_session_that_stopped_its_heartbeats_is_let_go(monkeypatch):
    """Runs and samplers of a session gone quiet are released (a long notebook session would keep
    every model it trained); their checkpoints stay on disk."""
    from machine_nb.engines.local import server as server_mod

    srv = server_mod.LocalServer().start()
    try:
        sc = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
        tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
        path = tc.save_weights_for_sampler("kept").result().path
        sc.create_sampling_client(model_path=path).result()
        assert tc.model_id in srv.runs and srv.samplers
        monkeypatch.setattr(server_mod, "SESSION_TTL_S", -1.0)  # every session counts as quiet now
        srv._reap()
        assert tc.model_id not in srv.runs and not srv.samplers
        assert (ck.checkpoint_dir(srv.data_dir, path) / "checkpoint.json").is_file()
        sc.close("success").result(timeout=60)
    finally:
        srv.stop()


@pytest.mark.filterwarnings("ignore:.*load_state.*is deprecated:FutureWarning")  # the SDK's; the server serves it
def test_load_state_into_an_existing_training_client(sc, batch):
    """TrainingClient.load_state / load_state_with_optimizer on a client that has trained already:
    its weights (and with the optimizer, Adam's moments) become the checkpoint's."""
    tc = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=3).result()
    train_steps(tc, batch, 3)
    path = tc.save_state("three").result().path
    original = train_steps(tc, batch, 2)

    other = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=5).result()
    train_steps(other, batch, 1)  # weights and optimizer state of its own, to be replaced
    other.load_state_with_optimizer(path).result()
    assert train_steps(other, batch, 2) == original

    weights_only = sc.create_lora_training_client(DEFAULT_MODEL, rank=4, seed=5).result()
    train_steps(weights_only, batch, 1)
    weights_only.load_state(path).result()
    fresh = train_steps(weights_only, batch, 2)
    assert fresh[0] == original[0]  # the same weights give the same loss …
    assert fresh[1] != original[1]  # … and a fresh optimizer takes another step

    wrong_rank = sc.create_lora_training_client(DEFAULT_MODEL, rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match="rank 4"):
        wrong_rank.load_state(path).result()


def test_a_poll_that_is_not_ready_is_held_open(monkeypatch, caplog):
    """retrieve_future long-polls: while a sample waits behind a busy sampler, the SDK's one poll
    is held open and answered when the result is ready; without the hold (LONG_POLL_S = 0) the SDK
    polls again at once, over and over. Counted by the server, per request. A poll that ends not
    ready is answered the way the SDK retries silently (no "Retrying request …" warning per poll)."""
    from machine_nb.engines.local import server as server_mod

    renderer = get_renderer(DEFAULT_MODEL)
    srv = server_mod.LocalServer().start()
    client = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    try:
        sampler = client.create_sampling_client(base_model=DEFAULT_MODEL).result()
        (worker,) = srv.samplers.values()
        params = tinker.SamplingParams(max_tokens=4, temperature=0.0)

        def polls_while_held(until_polls: int, wait: float) -> tuple[int, int]:
            """(polls while the sample was held back, polls in all) for one sample request, held back
            until `until_polls` polls came and then `wait` seconds more."""
            gate = threading.Event()
            worker.worker.submit(gate.wait)  # the sampler's one worker is busy until the gate opens
            pending = sampler.sample(prompt(renderer), 1, params)
            for _ in range(3000):  # the SDK's first poll (and, without a hold, more) arrives
                futs = [f for f in srv.futures.of_call("asample") if not f.done.is_set()]
                if futs and futs[0].polls >= until_polls:
                    break
                gate.wait(0.01)
            (fut,) = futs
            gate.wait(wait)
            held = fut.polls
            gate.set()
            assert pending.result().sequences
            return held, fut.polls

        # a second of waiting: a client that polls at once polls many times in it
        held, total = polls_while_held(until_polls=1, wait=1.0)
        assert held == 1 and total == 1
        monkeypatch.setattr(server_mod, "LONG_POLL_S", 0.0)
        held, total = polls_while_held(until_polls=5, wait=0.0)  # the polls came without a hold
        assert held >= 5 and total >= held
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("tinker")]
    finally:
        client.close("success").result(timeout=60)
        srv.stop()


def test_telemetry_is_accepted_and_dropped(tmp_path):
    """The SDK's telemetry gets {"status": "accepted"} (a 5xx would delay every SDK error) and is
    neither written anywhere nor kept."""
    import json
    import urllib.request

    from machine_nb.engines.local import server as server_mod

    srv = server_mod.LocalServer(data_dir=tmp_path / "data").start()
    try:
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        canary = "telemetry-canary-0123456789"
        body = json.dumps({"events": [{"event": "GENERIC_EVENT", "event_name": canary}],
                           "platform": "x", "sdk_version": "0", "session_id": "local-0"}).encode()
        req = urllib.request.Request(srv.url + "/api/v1/telemetry", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-API-Key": srv.key})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200 and json.loads(r.read()) == {"status": "accepted"}
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        assert not srv.futures.of_call("telemetry") and not srv.sessions
        for p in tmp_path.rglob("*"):
            assert not p.is_file() or canary.encode() not in p.read_bytes()
    finally:
        srv.stop()


def test_the_base_model_of_a_local_checkpoint_is_read_without_loading_torch(tmp_path):
    """Reading a checkpoint's description (evaluate, a candidate's commit, dpo from a checkpoint)
    loads no tensor library: a fresh process answers from checkpoint.json alone."""
    code = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from machine_nb import engines
        from machine_nb.engines.local.checkpoints import checkpoint_dir
        path = "tinker://local-0123456789abcdef:train:0/weights/000010"
        folder = checkpoint_dir(Path(sys.argv[1]), path)
        folder.mkdir(parents=True)
        (folder / "checkpoint.json").write_text(json.dumps({"base_model": "local/arith-tiny", "lora_rank": 8}))
        print(engines.checkpoint_base_model(path), "torch" in sys.modules)
    """)
    env = {**os.environ, "MACHINE_NB_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["local/arith-tiny", "False"]


def test_checkpoint_names_and_run_ids_are_whole_matches():
    """A name or run id with a trailing newline is refused like any other character outside the rule."""
    assert ck.check_name("final") == "final"
    for bad in ("final\n", "a/b", "..", "", "x" * 129):
        with pytest.raises(EngineError, match="checkpoint name"):
            ck.check_name(bad)
    good = "local-0123456789abcdef:train:0"
    assert ck.run_dir(Path("/d"), good) == Path("/d/runs") / good
    with pytest.raises(EngineError, match="not a local run id"):
        ck.run_dir(Path("/d"), good + "\n")
