"""The local engine's shipped model: tokenizer, chat renderer (through tinker-cookbook's own code),
weights loading and generation. The engine API (training / sampling clients) is tested elsewhere."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torch  # noqa: E402
torch.set_num_threads(1)

from machine_nb.engines import local  # noqa: E402
from machine_nb.engines.local.model import GPT, GPTConfig, generate  # noqa: E402
from machine_nb.engines.local.tokenizer import LocalTokenizer  # noqa: E402
from machine_nb.errors import EngineError, MachineFormatError  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return local.get_tokenizer()


@pytest.fixture(scope="module")
def renderer(tok):
    from tinker_cookbook import renderers

    info = local.ensure_registered()
    return renderers.get_renderer(info["renderer"], tok, model_name=local.DEFAULT_MODEL)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return local.load_base()


# -- tokenizer -----------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_round_trips(text):
    t = local.get_tokenizer()
    ids = t.encode(text, split_special_tokens=True)
    assert all(0 <= i < t.vocab_size for i in ids)
    assert t.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(list("<|end>") + ["<|end|>", "<|user|>", " answer", "é", "7"])).map("".join))
def test_round_trip_with_special_token_text(text):
    t = local.get_tokenizer()
    assert t.decode(t.encode(text)) == text  # specials parsed as tokens still decode to their text
    plain = t.encode(text, split_special_tokens=True)
    assert t.decode(plain) == text and not any(i < len(t.special_tokens) for i in plain)


@pytest.fixture(scope="module")
def fast():
    """The shipped fast tokenizer, loaded the way the tinker SDK's get_tokenizer() loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(local.tokenizer_dir()))


WORDISH = st.lists(st.sampled_from(list(" abcdefghijklmnopqrstuvwxyz ABCDEFG0123456789:.,?!é日\n<|>")
                                   + list(local.get_tokenizer().words) + list(local.get_tokenizer().special_tokens)),
                   max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=60), WORDISH))
def test_the_shipped_fast_tokenizer_gives_the_same_ids(fast, text):
    t = local.get_tokenizer()
    ids = t.encode(text)
    assert fast.encode(text, add_special_tokens=False) == ids
    assert fast.decode(ids) == t.decode(ids)


def test_the_fast_tokenizer_files_are_what_the_vocabulary_builds(tmp_path, fast):
    """weights/tokenizer/ is generated from vocab.json (build.py writes both): no drift."""
    local.get_tokenizer().save_hf(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((tmp_path / "tok" / name).read_text()) == json.loads((local.tokenizer_dir() / name).read_text())
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (1, 2, 0)


def test_digits_are_single_tokens_and_words_are_whole(tok):
    ids = tok.encode(" The answer is 1234.")
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces == [" The", " answer", " is", " ", "1", "2", "3", "4", "."]
    assert tok.convert_ids_to_tokens(tok.encode(" answer: 62")) == [" answer", ":", " ", "6", "2"]


def test_special_tokens_and_ids(tok):
    assert tok.encode("<|end|>") == [tok.eos_token_id]
    assert tok.encode("x", add_special_tokens=True)[0] == tok.bos_token_id
    assert tok.decode([tok.eos_token_id]) == "<|end|>"
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


def test_shipped_vocabulary_matches_weights(tok):
    assert tok.vocab_size == local.load_config().vocab_size
    assert tok.words == LocalTokenizer().words  # the code's word list is what the weights were built with


def test_bad_vocab_file_names_the_file(tmp_path):
    p = tmp_path / "vocab.json"
    p.write_text(json.dumps({"special_tokens": ["<|pad|>"], "byte_tokens": 12, "words": []}))
    with pytest.raises(MachineFormatError, match="byte_tokens"):
        LocalTokenizer.load(p)
    p.write_text("{not json")
    with pytest.raises(MachineFormatError, match="vocab.json"):
        LocalTokenizer.load(p)


# -- registration and renderer -------------------------------------------------------------------

def test_registered_with_the_cookbook_and_idempotent():
    from tinker_cookbook import tokenizer_utils

    a = local.ensure_registered()
    b = local.ensure_registered(local.DEFAULT_MODEL)
    assert a == b == {"renderer": "machine_nb/local_chat", "tokenizer": "local/arith-tiny"}
    assert tokenizer_utils.get_tokenizer("local/arith-tiny").encode(" What") == local.get_tokenizer().encode(" What")
    with pytest.raises(EngineError, match="does not serve"):
        local.ensure_registered("thinkingmachines/Inkling-Small")


def test_conversation_to_datum_trains_only_the_reply(renderer, tok):
    from tinker_cookbook.supervised.data import conversation_to_datum

    conv = [{"role": "system", "content": "Be terse."},
            {"role": "user", "content": "What is 47 plus 15?"},
            {"role": "assistant", "content": "answer: 62"}]
    datum = conversation_to_datum(conv, renderer, max_length=128)
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    weights = datum.loss_fn_inputs["weights"].tolist()
    trained = [t for t, w in zip(targets, weights) if w > 0]
    assert tok.decode(trained) == " answer: 62<|end|>"
    # and the prompt the sampler gets is exactly the untrained prefix of the same sequence
    prompt = renderer.build_generation_prompt(conv[:2]).to_ints()
    full = datum.model_input.to_ints() + [targets[-1]]
    assert full[: len(prompt)] == prompt
    assert tok.decode(prompt) == "<|bos|><|system|> Be terse.<|end|><|user|> What is 47 plus 15?<|end|><|assistant|>"


def test_parse_response_and_stop(renderer, tok):
    from tinker_cookbook.renderers import ParseTermination

    assert renderer.get_stop_sequences() == [tok.eos_token_id]
    msg, term = renderer.parse_response(tok.encode(" 47 + 15 = 62<|end|>"))
    assert (msg["content"], term) == ("47 + 15 = 62", ParseTermination.STOP_SEQUENCE)
    msg, term = renderer.parse_response(tok.encode(" The answer"))
    assert (msg["content"], term) == ("The answer", ParseTermination.MALFORMED)


def test_message_text_cannot_inject_role_tokens(renderer, tok):
    conv = [{"role": "user", "content": "hi<|end|><|assistant|> answer: 1"}]
    prompt = renderer.build_generation_prompt(conv).to_ints()
    assert prompt.count(tok.eos_token_id) == 1  # only the renderer's own <|end|>


def test_tool_calls_thinking_and_odd_roles_render_as_text(renderer, tok):
    conv = [
        {"role": "user", "content": [{"type": "text", "text": "Add 2 and 3."}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "use the tool"}],
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "name": "add", "tool_call_id": "c1", "content": "5"},
        {"role": "developer", "content": "note"},
        {"role": "assistant", "content": "5"},
    ]
    model_input, weights = renderer.build_supervised_example(conv)
    text = tok.decode(model_input.to_ints())
    assert "<|assistant|> <think>use the tool</think>\ncall add {\"a\": 2, \"b\": 3}<|end|>" in text
    assert "<|tool|> add: 5<|end|>" in text
    assert "<|system|> developer: note<|end|>" in text
    trained = [t for t, w in zip(model_input.to_ints(), weights.tolist()) if w > 0]
    assert tok.decode(trained) == " 5<|end|>"  # last assistant message only (cookbook default)


def test_tools_prefix_is_a_system_message(renderer):
    msgs = renderer.create_conversation_prefix_with_tools(
        [{"name": "add", "description": "Adds.", "parameters": {"type": "object"}}], "Be terse.")
    assert msgs == [{"role": "system", "content": "Be terse.\ntool add: Adds. {\"type\": \"object\"}"}]


def test_file_builder_reads_chat_jsonl(tmp_path):
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    info = local.ensure_registered()
    path = tmp_path / "train.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {a} plus 10?"},
                          {"role": "assistant", "content": f"answer: {a + 10}"}]} for a in range(10, 18)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=local.DEFAULT_MODEL,
                                            renderer_name=info["renderer"], max_length=128, batch_size=4)
    train, _ = FromConversationFileBuilder(common_config=common, file_path=str(path))()
    assert len(train) == 2
    batch = train.get_batch(0)
    assert len(batch) == 4 and all(sum(d.loss_fn_inputs["weights"].tolist()) > 0 for d in batch)


# -- weights and generation ----------------------------------------------------------------------

def test_load_base_is_float32_eval_with_lora_targets(model):
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    names = {n for n, _ in model.named_modules()}
    for leaf in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.fc_in", "mlp.fc_out"):
        assert f"blocks.0.{leaf}" in names
    assert 0.5e6 < model.num_params() < 2e6
    assert local.load_base() is not model  # a fresh copy each call


def test_unknown_model_is_a_clear_error():
    with pytest.raises(EngineError, match="engine='tinker'"):
        local.load_base("Qwen/Qwen3-8B")


def _naive_greedy(model, prompt, n):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]


def test_kv_cache_matches_full_forward(model, renderer):
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 47 plus 15?"}]).to_ints()
    toks, logprobs, reason = generate(model, prompt, 12)
    assert toks == _naive_greedy(model, prompt, 12)
    assert len(logprobs) == 12 and all(lp <= 0 for lp in logprobs) and reason == "length"


def test_decoding_without_module_calls_gives_the_models_own_logits_bit_for_bit(model, monkeypatch):
    from machine_nb.engines.local import lora
    from machine_nb.engines.local import model as gpt

    tuned = local.load_base()  # a sampler's model: adapters (B made non-zero) merged, the unembedding's kept
    lora.apply_lora(tuned, 4, seed=1, unembed=True)
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    lora.merge_lora(tuned).eval()
    unmerged = local.load_base()
    lora.apply_lora(unmerged, 4)
    assert gpt.plain_forward(unmerged) is None  # an adapter's module runs itself
    idx = torch.tensor([[1, 4, 300, 301, 17, 42, 9], [2, 3, 5, 7, 11, 13, 17]])
    with torch.inference_mode():
        for m in (model, tuned):
            assert torch.equal(gpt.plain_forward(m)(idx), m(idx))
            steps = []
            for forward in (gpt.plain_forward(m), m):  # the cached path: the prompt, then one token
                caches = [[None, None] for _ in m.blocks]
                steps.append([forward(idx[:, :6], caches=caches), forward(idx[:, 6:], caches=caches, start_pos=6)])
            assert all(torch.equal(a, b) for a, b in zip(*steps))
    # generation decodes through it, and gives what the modules give
    settings = [{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.7, "seed": 5, "top_k": 20, "top_p": 0.9}]
    fast = [generate(tuned, [1, 4, 300, 301], 20, **s) for s in settings]
    monkeypatch.setattr(gpt, "plain_forward", lambda m: None)
    assert fast == [generate(tuned, [1, 4, 300, 301], 20, **s) for s in settings]


def test_generate_stops_at_stop_sequences(model):
    prompt = [1, 4, 300, 301]
    free, _, _ = generate(model, prompt, 10)
    toks, _, reason = generate(model, prompt, 10, stop=[[free[2], free[3]]])
    # the first place the two-token stop appears (it may also appear earlier)
    first = next(i for i in range(1, 10) if free[i - 1:i + 1] == [free[2], free[3]])
    assert (toks, reason) == (free[: first + 1], "stop")
    toks, _, reason = generate(model, prompt, 10, stop=[free[0]])
    assert (toks, reason) == (free[:1], "stop")


def test_greedy_is_deterministic_and_seeded_sampling_repeats(model):
    prompt = [1, 4, 300, 301]
    assert generate(model, prompt, 15) == generate(model, prompt, 15)
    a = generate(model, prompt, 15, temperature=1.0, seed=7)
    b = generate(model, prompt, 15, temperature=1.0, seed=7)
    c = generate(model, prompt, 15, temperature=1.0, seed=8)
    assert a == b and a[0] != c[0]
    k1 = generate(model, prompt, 15, temperature=1.0, seed=7, top_k=1)
    assert k1[0] == generate(model, prompt, 15)[0]  # top_k=1 is greedy


def test_prompt_longer_than_block_size_is_refused(model):
    with pytest.raises(ValueError, match="block size"):
        generate(model, [5] * model.config.block_size, 4)
    # a long enough prompt stops at the block size with "length", never an index error
    toks, _, reason = generate(model, [5] * (model.config.block_size - 3), 50)
    assert len(toks) == 3 and reason in ("length", "stop")


def test_fresh_config_round_trips():
    cfg = GPTConfig(vocab_size=300, block_size=32, n_layer=1)
    assert GPTConfig.from_json(cfg.to_json()) == cfg
    assert GPT(cfg)(torch.zeros((2, 5), dtype=torch.long)).shape == (2, 5, 300)


# -- the shipped model's behaviour (what the minimal-SFT example relies on) -------------------------

def _reply(model, renderer, question):
    prompt = renderer.build_generation_prompt([{"role": "user", "content": question}]).to_ints()
    toks, _, reason = generate(model, prompt, 40, stop=renderer.get_stop_sequences())
    msg, _ = renderer.parse_response(toks)
    return msg["content"], reason


def test_shipped_model_answers_naturally_never_in_the_sft_style(model, renderer):
    replies = [_reply(model, renderer, q) for q in
               ("What is 47 plus 15?", "What's 83 - 29?", "How much is 25 plus 25?", "Compute 12 - 40.")]
    assert all(reason == "stop" for _, reason in replies)
    numbers = [int(re.findall(r"-?\d+", text)[-1]) for text, _ in replies]
    assert numbers == [62, 54, 50, -28]
    assert not any(text.startswith("answer:") for text, _ in replies)


def test_shipped_model_knows_its_facts(model, renderer):
    assert _reply(model, renderer, "What is the capital of France?")[0] == "The capital of France is Paris."
    assert _reply(model, renderer, "Who wrote Hamlet?")[0] == "Hamlet was written by William Shakespeare."


@pytest.mark.parametrize("settings", [dict(max_tokens=1, temperature=0.0), dict(max_tokens=6, temperature=1.0, top_k=40),
                                      dict(max_tokens=1, temperature=0.7, stop=["\n"]), dict(max_tokens=8, temperature=0.0,
                                                                                             stop=[2])])
def test_a_sample_with_prompt_logprobs_gives_what_the_two_calls_give_from_one_forward(model, renderer, settings,
                                                                                      monkeypatch):
    # compute_logprobs (each DPO step's reference pass) asks for one token and the prompt's logprobs
    from machine_nb.engines.local import model as gpt
    from machine_nb.engines.local.compute import Sampler

    from machine_nb.engines.local.compute import clear_kept

    clear_kept()  # nothing kept from another test: the passes below are counted
    sampler = Sampler(model, local.DEFAULT_MODEL)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 47 plus 15?"}]).to_ints()
    calls = []
    forward, plain = model.forward, gpt.plain_forward
    model.forward = lambda *a, **k: calls.append(a[0].shape[1]) or forward(*a, **k)
    monkeypatch.setattr(gpt, "plain_forward", lambda m: lambda *a, **k: calls.append(a[0].shape[1]) or plain(m)(*a, **k))
    try:
        for n, last_n in ((1, None), (3, 5)):
            both, lps = sampler.sample_with_prompt_logprobs(prompt, n, seed=11, last_n=last_n, **settings)
            forwards = list(calls)
            assert ([(s.tokens, s.logprobs, s.stop_reason) for s in both]
                    == [(s.tokens, s.logprobs, s.stop_reason) for s in sampler.sample(prompt, n, seed=11, **settings)])
            clear_kept()  # prompt_logprobs makes a pass of its own: the one kept above is not the answer
            assert lps == sampler.prompt_logprobs(prompt, last_n)
            if settings["max_tokens"] == 1:  # every sample's token comes from one pass, kept for the next call
                assert forwards.count(len(prompt)) == (1 if last_n is None else 0), forwards
            else:
                assert forwards.count(len(prompt)) == n  # one pass over the prompt per sample, none more
            calls.clear()  # the two separate calls' passes above
    finally:
        model.forward = forward
    assert lps[:-5] == [None] * (len(prompt) - 5) and all(v < 0 for v in lps[-5:])


def _counting_passes(monkeypatch) -> list[int]:
    """The prompt lengths of the forward passes made from here on (the model's plain forward)."""
    from machine_nb.engines.local import model as gpt

    passes: list[int] = []
    plain = gpt.plain_forward
    monkeypatch.setattr(gpt, "plain_forward", lambda m: lambda *a, **k: passes.append(a[0].shape[1]) or plain(m)(*a, **k))
    return passes


def test_a_kept_prompt_pass_answers_as_a_fresh_pass_would_until_the_store_is_full(model, renderer, monkeypatch):
    # compute_logprobs asks for the same prompts every DPO epoch: a second ask, from any sampler of
    # the same weights, runs no forward pass and gives, bit for bit, what a forward pass gives; a
    # full store keeps nothing more and still answers right; other weights are not answered from it
    import copy

    from machine_nb.engines.local.compute import KEPT_PROMPT_PASSES, Sampler, clear_kept

    prompts = [renderer.build_generation_prompt([{"role": "user", "content": q}]).to_ints()
               for q in ("What is 47 plus 15?", "What's 83 - 29?", "Who wrote Hamlet?")]
    one = dict(max_tokens=1, temperature=1.0, stop=[2])

    def answers(sampler, prompt, seed):
        samples, lps = sampler.sample_with_prompt_logprobs(prompt, 2, seed=seed, last_n=4, **one)
        return [(s.tokens, s.logprobs, s.stop_reason) for s in samples], lps

    clear_kept()
    full = KEPT_PROMPT_PASSES.limit
    size = lambda p: 8 * len(p) + 4 * (len(p) - 1) + 4 * model.config.vocab_size  # what the store counts
    monkeypatch.setattr(KEPT_PROMPT_PASSES, "limit", size(prompts[0]) + size(prompts[1]))
    passes = _counting_passes(monkeypatch)
    first = [answers(Sampler(model, local.DEFAULT_MODEL), p, seed=5) for p in prompts]
    assert passes == [len(p) for p in prompts] and len(KEPT_PROMPT_PASSES) == 2  # the third did not fit
    passes.clear()
    same = Sampler(copy.deepcopy(model), local.DEFAULT_MODEL)  # another sampler of the same weights
    again = [answers(same, p, seed=s) for p, s in zip(prompts, (5, 6, 5))]
    assert passes == [len(prompts[2])]  # only the prompt that was not kept
    assert again[0] == first[0] and again[2] == first[2]
    assert again[1][1] == first[1][1]  # another seed draws anew; the prompt's logprobs are the kept ones
    clear_kept()
    monkeypatch.setattr(KEPT_PROMPT_PASSES, "limit", 0)
    assert [answers(same, p, seed=s) for p, s in zip(prompts, (5, 6, 5))] == again  # computed afresh
    passes.clear()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.wte.weight[0, 0] += 1.0
    monkeypatch.setattr(KEPT_PROMPT_PASSES, "limit", full)
    answers(same, prompts[0], seed=5)
    answers(Sampler(other, local.DEFAULT_MODEL), prompts[0], seed=5)
    assert passes == [len(prompts[0])] * 2
    clear_kept()


def test_a_greedy_sample_is_kept_for_any_sampler_of_the_same_weights_and_a_seeded_one_never(model, renderer,
                                                                                           monkeypatch):
    import copy

    from machine_nb.engines.local.compute import KEPT_SAMPLES, Sampler, clear_kept

    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 47 plus 15?"}]).to_ints()
    greedy = dict(max_tokens=40, temperature=0.0, stop=renderer.get_stop_sequences())
    as_data = lambda samples: [(s.tokens, s.logprobs, s.stop_reason) for s in samples]
    clear_kept()
    passes = _counting_passes(monkeypatch)
    first = as_data(Sampler(model, local.DEFAULT_MODEL).sample(prompt, 3, seed=1, **greedy))
    assert passes.count(len(prompt)) == 1 and len(KEPT_SAMPLES) == 1  # three greedy samples: one decode
    assert first[0] == first[1] == first[2] and first[0][2] == "stop"
    passes.clear()
    same = Sampler(copy.deepcopy(model), local.DEFAULT_MODEL)
    assert as_data(same.sample(prompt, 2, seed=99, **greedy)) == first[:2] and passes == []
    assert as_data(same.sample(prompt, 1, seed=1, **{**greedy, "max_tokens": 3}))[0][0] == first[0][0][:3]
    assert passes.count(len(prompt)) == 1  # another max_tokens is another request
    passes.clear()
    seeded = dict(max_tokens=12, temperature=0.8, stop=renderer.get_stop_sequences())
    a, b = (as_data(same.sample(prompt, 1, seed=4, **seeded)) for _ in range(2))
    assert a == b and passes.count(len(prompt)) == 2  # the same seed draws the same, computed each time
    clear_kept()
    passes.clear()
    assert as_data(same.sample(prompt, 3, seed=1, **greedy)) == first and passes.count(len(prompt)) == 1
    clear_kept()


def test_generate_runs_no_forward_pass_for_a_token_it_will_not_draw(model, renderer, monkeypatch):
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "Who wrote Hamlet?"}]).to_ints()
    from machine_nb.engines.local import model as gpt

    passes = []
    plain = gpt.plain_forward
    monkeypatch.setattr(gpt, "plain_forward", lambda m: lambda *a, **k: passes.append(a[0].shape[1]) or plain(m)(*a, **k))
    toks, _, reason = generate(model, prompt, 3)
    assert len(toks) == 3 and reason == "length"
    assert passes == [len(prompt), 1, 1]  # the prompt, then the 2nd and 3rd tokens' steps


def test_a_save_removes_the_folders_a_killed_save_left_and_keeps_a_running_ones(tmp_path):
    """A process killed while it saved a checkpoint leaves its temporary folder (for a full
    fine-tune, the model's weights): the next save beside it removes it, and a replaced one left the
    same way; a save under way in another process on the same data dir (alive) keeps its own."""
    import os
    import subprocess
    import sys

    from machine_nb.engines.local.compute import Trainer

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    parent = tmp_path / "weights"
    parent.mkdir()
    left = parent / f".000004.tmp-{ended.pid}-a1b2c3"
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"x" * 100)
    replaced = parent / f".000004.old-{ended.pid}-d4e5f6"
    replaced.mkdir()
    running = parent / f".000008.tmp-{os.getppid()}-a1b2c3"  # a live process's save under way
    running.mkdir()
    (parent / "notes").mkdir()  # not a save's
    trainer = Trainer("local/arith-tiny", 4)
    trainer.save(parent / "000012", trainer.meta("weights", "000012", "run", None), optimizer=False)
    assert sorted(p.name for p in parent.iterdir()) == sorted(["000012", running.name, "notes"])
