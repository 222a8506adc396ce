"""Training data as the cookbook's loop reads it: a train.jsonl that `sft` writes renders, row by
row, through the renderer of the model being trained (Inkling's and Qwen3's included) exactly as
its messages were written; export's lines and token estimates take any text a run can hold; and
held-out rows given as a DataFrame are read without their empty cells."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from machine_nb.core.chat import prepare_data
from machine_nb.core.jsonl import write_jsonl
from machine_nb.data.export import estimate_tokens, training_lines, uniform_content
from machine_nb.training import loop, train

INKLING = "thinkingmachines/Inkling-Small"

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}
PLAIN = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
TOOL = {"messages": [{"role": "user", "content": "add 1 and 2"},
                     {"role": "assistant", "content": "", "tool_calls": [CALL]},
                     {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"},
                     {"role": "assistant", "content": "3"}]}


# A stand-in for Qwen3's tokenizer (its real one needs the hub): Qwen3's special tokens are one
# token each, any other text its UTF-8 bytes, so the qwen3 renderer runs its own message handling.
QWEN_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>"]
QWEN_SPLIT = re.compile("(" + "|".join(map(re.escape, QWEN_SPECIAL)) + ")")


class QwenStandIn:
    eos_token_id = 1000 + QWEN_SPECIAL.index("<|im_end|>")
    bos_token_id = None
    name_or_path = "machine-nb-test/qwen3-standin"

    def encode(self, text, add_special_tokens=False, **_):
        out = []
        for piece in QWEN_SPLIT.split(text):
            out.extend([1000 + QWEN_SPECIAL.index(piece)] if piece in QWEN_SPECIAL else piece.encode("utf-8"))
        return out

    def decode(self, tokens, **_):
        text, pending = "", bytearray()
        for t in tokens:
            if t >= 1000:
                text += pending.decode("utf-8", "replace") + QWEN_SPECIAL[t - 1000]
                pending = bytearray()
            else:
                pending.append(t)
        return text + pending.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def qwen_standin():
    from tinker_cookbook.tokenizer_utils import register_tokenizer

    register_tokenizer("machine-nb-test/qwen3-standin", QwenStandIn)
    return "machine-nb-test/qwen3-standin"


def child_batch(tmp_path, rows, model, renderer, *, seed=0):
    """The datums of one batch of every row, as the sft child's dataset gives them: rows checked by
    prepare_data, written as sft writes train.jsonl, loaded by the dataset builder of sft's config."""
    items, train_on_what = prepare_data(rows)
    path = write_jsonl(items, tmp_path / "train.jsonl")
    spec = {"data_path": str(path), "seed": seed, "model": model, "renderer": renderer, "max_length": None,
            "batch_size": len(items), "train_on_what": train_on_what, "log_dir": str(tmp_path / "log"),
            "learning_rate": 1e-4, "lr_schedule": "linear", "epochs": 1, "lora_rank": 8, "base_url": None,
            "save_every": 20, "max_steps": None, "submit_ahead": 1}
    dataset, _ = train._sft_config(spec).dataset_builder()
    return dataset.get_batch(0)


def decoded(tokenizer, datum):
    return tokenizer.decode(datum.model_input.to_ints())


# --------------------------------------------------------------------------- 1. the child's dataset


def test_a_file_with_one_tool_call_trains_every_row_on_inkling(tmp_path):
    # the real Inkling tokenizer (offline, loaded once per process): the renderer that crashed
    from machine_nb.checks.render import get_tokenizer

    batch = child_batch(tmp_path, [PLAIN, TOOL, PLAIN], INKLING, "tml_v0")
    assert len(batch) == 3
    text = "".join(decoded(get_tokenizer(INKLING), d) for d in batch)
    assert '{"name":"add","args":{"a":1,"b":2}}' in text and "hello" in text
    assert all(float(d.loss_fn_inputs["weights"].to_numpy().sum()) > 0 for d in batch)


def test_a_file_with_one_tool_call_trains_on_qwen3_with_the_call_written(tmp_path, qwen_standin):
    batch = child_batch(tmp_path, [PLAIN, TOOL], qwen_standin, "qwen3", seed=None)
    texts = sorted(decoded(QwenStandIn(), d) for d in batch)
    call = next(t for t in texts if "<tool_call>" in t)
    assert '{"name": "add", "arguments": {"a": 1, "b": 2}}' in call
    assert "<tool_response>\n3\n</tool_response>" in call


def test_a_tool_call_with_no_content_trains_on_qwen3_and_inkling(tmp_path, qwen_standin):
    """OpenAI's form of a call with no text (content None) renders as a call with empty text."""
    from machine_nb.checks.render import get_tokenizer

    def row(content):
        return {"messages": [{"role": "user", "content": "add 1 and 2"},
                             {"role": "assistant", "content": content, "tool_calls": [CALL]}]}

    for model, renderer, tok, written in (
            (qwen_standin, "qwen3", QwenStandIn(), '{"name": "add", "arguments": {"a": 1, "b": 2}}'),
            (INKLING, "tml_v0", get_tokenizer(INKLING), '{"name":"add","args":{"a":1,"b":2}}')):
        none = child_batch(tmp_path / renderer / "none", [row(None)], model, renderer)
        empty = child_batch(tmp_path / renderer / "empty", [row("")], model, renderer)
        assert decoded(tok, none[0]) == decoded(tok, empty[0])
        assert written in decoded(tok, none[0])


def test_each_row_renders_as_written_not_with_keys_from_other_rows(tmp_path):
    """A plain row in a file where another row has tool calls, a tool_call_id and a name renders
    to the same tokens as the same row trained alone."""
    from machine_nb.checks.render import get_tokenizer

    tok = get_tokenizer(INKLING)
    alone = child_batch(tmp_path / "a", [PLAIN], INKLING, "tml_v0")
    mixed = child_batch(tmp_path / "b", [PLAIN, TOOL], INKLING, "tml_v0", seed=None)
    assert decoded(tok, mixed[0]) == decoded(tok, alone[0])


def test_the_local_engine_trains_the_same_batches_as_the_cookbooks_loader(tmp_path):
    """Plain rows on the local engine: every epoch's batches hold the tokens, weights and order
    that tinker-cookbook's FromConversationFileBuilder gives for the same file and seed."""
    from machine_nb.checks.render import renderer_name
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    rows = [{"messages": [{"role": "user", "content": f"{i}+{i}"}, {"role": "assistant", "content": str(2 * i)}]}
            for i in range(6)]
    items, train_on_what = prepare_data(rows)
    path = write_jsonl(items, tmp_path / "train.jsonl")
    model = "local/arith-tiny"
    ours = train.ChatFileBuilder(file_path=str(path), model=model, renderer=renderer_name(model), max_length=64,
                                 batch_size=3, train_on_what=train_on_what, shuffle_seed=7)()[0]
    theirs = FromConversationFileBuilder(file_path=str(path), shuffle_seed=7, common_config=(
        ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=model, renderer_name=renderer_name(model),
                                       max_length=64, batch_size=3, train_on_what=train_on_what)))()[0]
    assert len(ours) == len(theirs) == 2
    for epoch in (0, 1):
        ours.set_epoch(seed=epoch)
        theirs.set_epoch(seed=epoch)
        for b in range(2):
            got, want = ours.get_batch(b), theirs.get_batch(b)
            assert [d.model_input.to_ints() for d in got] == [d.model_input.to_ints() for d in want]
            assert [d.loss_fn_inputs["weights"].tolist() for d in got] == \
                [d.loss_fn_inputs["weights"].tolist() for d in want]


# --------------------------------------------------------------------------- 2. export's lines


def test_a_token_estimate_takes_half_an_emoji():
    line = {"messages": [{"role": "user", "content": "cut \ud83d"}, {"role": "assistant", "content": "ok"}]}
    text = json.dumps(line["messages"], ensure_ascii=False, separators=(",", ":"))
    # JSON.stringify writes a lone surrogate as a 6-character escape (\ud83d)
    assert estimate_tokens([line]) == math.ceil((len(text) - 1 + 6) / 2.5)


def test_a_token_estimate_counts_an_emoji_as_two_units():
    line = {"messages": [{"role": "user", "content": "\U0001f600"}]}
    text = json.dumps(line["messages"], ensure_ascii=False, separators=(",", ":"))
    assert estimate_tokens([line]) == math.ceil((len(text) + 1) / 2.5)


def test_uniform_content_writes_an_empty_string_as_one_empty_text_part():
    lines = [{"messages": [{"role": "user", "content": ""},
                           {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                                                             {"type": "text", "text": "a"}]}]}]
    out = uniform_content(lines)
    assert out[0]["messages"][0]["content"] == [{"type": "text", "text": ""}]
    assert lines[0]["messages"][0]["content"] == ""  # the caller's lines are not changed


def test_an_exported_tool_step_without_text_keeps_an_empty_text_part():
    run = {"id": "r1", "machine": "m", "harness": "tinker", "input": "add",
           "trajectory": [{"role": "user", "content": "add 1 and 2"},
                          {"role": "assistant", "content": "", "name": "add", "toolInput": {"a": 1, "b": 2},
                           "toolCallId": "c1"},
                          {"role": "tool", "content": "3", "toolCallId": "c1", "name": "add"},
                          {"role": "assistant", "content": "3", "reasoning": "done"}]}
    lines = training_lines([run], {"name": "m"})
    step = lines[-1]["messages"][1]
    assert step["tool_calls"][0]["id"] == "c1" and step["content"] == [{"type": "text", "text": ""}]
    assert not any(m.get("content") == [] for line in lines for m in line["messages"])


# --------------------------------------------------------------------------- 3. held-out rows


def test_held_out_rows_from_a_frame_with_an_empty_format_cell_are_read():
    frame = pd.DataFrame([
        {"messages": [{"role": "user", "content": "2+2"}], "expected": "4", "format": "^\\d+$"},
        {"messages": [{"role": "user", "content": "3+3"}], "expected": "6"},
    ])
    assert pd.isna(frame.loc[1, "format"])
    settings = SimpleNamespace(model="local/arith-tiny", eval_every=None, eval_max_tokens=8, eval_temperature=0.0,
                               evals_before_last=False)
    held = loop.plan_heldout(settings, frame, None, per_epoch=2, steps=4)
    assert [r["expected"] for r in held.rows] == ["4", "6"]
    assert "format" not in held.rows[1] or held.rows[1]["format"] is None


# --------------------------------------------------------------------------- more of the same kinds


def test_tag_rows_from_a_frame_leave_empty_cells_out_of_the_lines(tmp_path):
    from machine_nb.data.export import tagged_lines

    q = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    q2 = [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    frame = pd.DataFrame([{"messages": q, "tag": "good", "id": "t1", "machine": "m", "run": "r1"},
                          {"messages": q2, "tag": "good", "id": "t2"}])  # machine and run: NaN
    lines = tagged_lines(frame)
    assert lines[1] == {"messages": q2, "tag_id": "t2"}
    write_jsonl(lines, tmp_path / "tagged.jsonl")
    json.loads((tmp_path / "tagged.jsonl").read_text().splitlines()[1])  # plain JSON, no NaN
    with pytest.warns(UserWarning, match="1 tag row"):  # a row naming no machine is counted as such
        named = tagged_lines(frame, {"name": "m"})
    assert [line["tag_id"] for line in named] == ["t1"]
    assert named.skipped[0][1] == "machine None, not 'm'"


def test_a_negative_seed_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="seed"):
        train.SFTSettings.resolve(None, model="local/arith-tiny", seed=-1)


def test_a_row_of_a_runs_frame_saved_as_csv_is_read_from_its_path(tmp_path):
    """A load_runs frame saved as CSV holds each run as text: a row of it (Series or dict) gives
    the lines its run file gives, as the whole frame does, not an empty run."""
    import io
    import warnings

    import machine_nb as mnb
    from machine_nb.data.export import run_records

    sample = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = mnb.load_runs(sample)
    saved = pd.read_csv(io.StringIO(frame.to_csv(index=False)))
    assert isinstance(saved["run"][0], str)
    want = run_records(frame.iloc[:2])
    assert run_records(saved.iloc[0]) == want[:1]
    assert run_records([saved.iloc[0], saved.iloc[1]]) == want
    assert run_records(saved.iloc[:2].to_dict("records")) == want
    with pytest.raises(ValueError, match="path"):
        run_records({"run": "{}", "id": "r1"})


@pytest.mark.parametrize("steps", [0, -1, 2.5, True])
def test_smoke_names_steps_when_they_are_not_a_whole_number_above_0(steps):
    with pytest.raises(ValueError, match=r"^steps must be"):
        train.smoke([PLAIN] * 4, steps=steps)


def test_a_tagged_frame_saved_as_parquet_gives_its_lines(tmp_path):
    """A tagged() frame read back through pyarrow holds each row's lists as numpy arrays and gives
    every message every key some message has (None): its rows still give their lines."""
    from machine_nb.data.export import tagged_lines

    q = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    q2 = [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2", "trainable": True}]
    rows = [{"messages": q, "tag": "good", "id": "t1", "machine": "m"}, {"messages": q2, "tag": "good", "id": "t2"}]
    pd.DataFrame({"id": ["t1", "t2"], "tag": ["good", "good"], "row": rows}).to_parquet(tmp_path / "tagged.parquet")
    saved = pd.read_parquet(tmp_path / "tagged.parquet")
    lines = tagged_lines(saved)
    assert not lines.skipped
    assert [line["messages"] for line in lines] == [q, q2]
    assert [line.get("machine") for line in lines] == ["m", None]


def test_held_out_rows_with_a_column_json_cannot_hold_are_copied_with_what_evals_read(tmp_path):
    """An eval frame with an extra column (a date) gives a held-out copy that can be written: the
    fields the evals read, each row's answer as checked."""
    frame = pd.DataFrame([{"messages": [{"role": "user", "content": "2+2"}], "expected": 4, "format": "^\\d+$",
                           "added": pd.Timestamp("2024-01-01")}])
    settings = SimpleNamespace(model="local/arith-tiny", eval_every=None, eval_max_tokens=8, eval_temperature=0.0,
                               evals_before_last=False)
    held = loop.plan_heldout(settings, frame, None, per_epoch=2, steps=4)
    path = write_jsonl(held.lines(), tmp_path / "heldout_data.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"messages": [{"role": "user", "content": "2+2"}], "expected": "4", "match": "exact", "format": "^\\d+$"}]


def test_a_tool_declaration_without_a_name_is_named():
    from machine_nb.data.export import tool_specs

    with pytest.raises(ValueError, match=r"tools\[1\].*name"):
        tool_specs([{"name": "a"}, {"description": "no name"}])
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        tool_specs(["read_file"])


def test_a_tool_declaration_read_back_with_none_filled_keys_keeps_its_schema():
    """A ToolSpec read back through pyarrow beside a Machine tool has `parameters: None` and its
    own `inputSchema`: the schema it has is the one kept."""
    from machine_nb.data.export import tool_specs

    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    spec = tool_specs([{"name": "read", "description": None, "parameters": None, "inputSchema": schema}])
    assert spec == [{"name": "read", "description": "", "parameters": schema}]


def test_smoke_reads_rows_given_as_a_generator_once(monkeypatch):
    """smoke reads the rows to size its batches, then hands them to sft: rows from a generator
    reach sft whole, not as an empty generator ("no training rows")."""
    seen = {}

    def fake_sft(data, model=None, engine=None, **kwargs):
        seen["rows"] = prepare_data(data)[0]
        seen["batch_size"] = kwargs["batch_size"]

    monkeypatch.setattr(train, "sft", fake_sft)
    train.smoke(dict(PLAIN) for _ in range(3))
    assert len(seen["rows"]) == 3 and seen["batch_size"] == 3


def test_validate_and_eval_prompts_render_a_tool_call_row_on_qwen3_as_training_does(qwen_standin):
    """The render check before training (validate's, through sft_view) and an eval's prompts gave
    the renderer the calls as dicts and a None text beside them, as the child's dataset no longer
    does: on Qwen3 every such row was refused as `render_failed` before training began, and an eval
    whose prompt holds a call could not be rendered."""
    from tinker_cookbook import renderers

    from machine_nb.checks.tokens import render_row
    from machine_nb.evaluation.sampling import render_prompts

    renderer = renderers.get_renderer("qwen3", QwenStandIn())
    call_row = [{"role": "user", "content": "add 1 and 2"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"},
                {"role": "assistant", "content": "3"}]
    total, trained = render_row(renderer, call_row)
    assert total > trained > 0
    (prompt,) = render_prompts(renderer, [{"messages": call_row[:3] + [{"role": "user", "content": "and 2 and 3?"}],
                                           "line": 1}], None)
    assert '{"name": "add", "arguments": {"a": 1, "b": 2}}' in QwenStandIn().decode(prompt.to_ints())


def test_the_estimate_of_a_trained_tool_call_is_made_of_the_row_as_written():
    """Machine's estimate counts a row's characters as JSON: the trained message's tool call as the
    row writes it (a dict), whatever form the renderer takes it in."""
    from machine_nb.checks import tokens

    msgs = [{"role": "user", "content": "add 1 and 2"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    assert tokens.estimate_trained(msgs) == estimate_tokens([{"messages": msgs[1:]}])


def test_the_previewer_renders_a_tool_call_line_on_qwen3(qwen_standin):
    """The previewer's token view renders a line as sft trains it: a tool call on Qwen3 included."""
    from tinker_cookbook import renderers

    from machine_nb.widgets.previewer import supervised_tokens

    renderer = renderers.get_renderer("qwen3", QwenStandIn())
    line = {"messages": [{"role": "user", "content": "add 1 and 2"},
                         {"role": "assistant", "content": None, "tool_calls": [CALL]}]}
    ids, weights = supervised_tokens(line, renderer)
    assert '{"name": "add", "arguments": {"a": 1, "b": 2}}' in QwenStandIn().decode(ids) and sum(weights) > 0



def test_dpo_pairs_whose_prompt_holds_a_tool_call_train_every_pair_on_inkling(tmp_path):
    """The cookbook's comparison loader fills every message with every key some message of the file
    has, as None: one pair's tool call gave every other pair's messages `"tool_calls": None`, which
    Inkling's renderer cannot iterate, so DPO on pairs from traces failed on every pair."""
    from machine_nb.checks.render import get_tokenizer
    from machine_nb.store.pairs import comparison_line
    from machine_nb.training import preference

    call_prompt = [{"role": "user", "content": "add 1 and 2"},
                   {"role": "assistant", "content": None, "tool_calls": [CALL]},
                   {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}]
    pairs = [{"prompt": [{"role": "user", "content": "hello"}], "chosen": [{"role": "assistant", "content": "hi"}],
              "rejected": [{"role": "assistant", "content": "go away"}]},
             {"prompt": call_prompt, "chosen": [{"role": "assistant", "content": "3"}],
              "rejected": [{"role": "assistant", "content": "4"}]}]
    path = write_jsonl([comparison_line(p) for p in pairs], tmp_path / "pairs.jsonl")
    spec = {"data_path": str(path), "model": INKLING, "renderer": "tml_v0", "max_length": None, "batch_size": 2,
            "log_dir": str(tmp_path / "log"), "load_checkpoint": None, "learning_rate": 1e-5,
            "lr_schedule": "linear", "epochs": 1, "beta": 0.1, "lora_rank": 8, "base_url": None, "save_every": 20,
            "max_steps": None}
    train_set, _ = preference._dpo_config(spec).dataset_builder()
    batch = train_set.get_batch(0)
    assert len(batch) == 4  # chosen and rejected of each pair
    text = "".join(decoded(get_tokenizer(INKLING), d) for d in batch)
    assert '{"name":"add","args":{"a":1,"b":2}}' in text and "go away" in text
