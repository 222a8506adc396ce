"""evaluate(), probe(), held-out scoring and the progress bar at their edges: a seed from numpy,
a results name that is not a file name, a results path that cannot be written, a checkpoint
trained from another base model, a long probe prompt, regex time-outs counted as failed requests,
a terminal bar writing into a log file, a notebook kernel that is a subclass of Jupyter's, and a
finished bar's time.

Samplers are stand-ins with tinker's API replying through the Inkling renderer (it tokenizes
offline), so nothing here trains or starts an engine.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from machine_nb.evaluation.evaluate import evaluate, probe

MODEL = "thinkingmachines/Inkling-Small"  # renders offline through tml_renderers


class Replies:
    """tinker's sampling-client API: every prompt gets `reply`, rendered as the model emits it."""

    def __init__(self, reply: str = "answer: 3", base_model: str | None = None) -> None:
        from machine_nb.checks.render import get_renderer

        self.renderer, self.reply, self.base_model, self.calls = get_renderer(MODEL), reply, base_model, 0
        if base_model is not None:
            self.get_base_model = lambda: self.base_model

    async def sample_async(self, prompt, num_samples, sampling_params):
        import tinker

        self.calls += 1
        await asyncio.sleep(0)
        convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": self.reply}]
        full, _ = self.renderer.build_supervised_example(convo)
        prompt_only = self.renderer.build_generation_prompt(convo[:1])
        tokens = full.to_ints()[prompt_only.length:]
        seq = tinker.SampledSequence(stop_reason="stop", sequence_id="0", tokens_np=np.array(tokens, dtype=np.int32))
        return tinker.SampleResponse(sequences=[seq])


def rows(n: int = 2) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is 2 plus {i}?"}], "expected": f"answer: {2 + i}",
             "format": r"answer: -?\d+"} for i in range(n)]


# --------------------------------------------------------------------------- evaluate's settings and results file

def test_a_numpy_seed_is_recorded_as_a_number_and_the_results_are_written(tmp_path):
    """`for seed in np.arange(3): evaluate(..., seed=seed)`: the sampler took the numpy seed, then
    the results JSON could not be written ("int64 is not JSON serializable") after every row had
    been sampled, and the paid results were lost."""
    sampler = Replies()
    res = evaluate(rows(), model=MODEL, engine="tinker", sampling_client=sampler, seed=np.int64(3),
                   out=tmp_path / "r.json", progress=False)
    written = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert written["parameters"]["seed"] == 3 and type(res.summary["parameters"]["seed"]) is int
    assert written["correct"] == 1 and sampler.calls == 2


@pytest.mark.parametrize("seed", [1.5, "3", True])
def test_a_seed_that_is_not_a_whole_number_is_refused_before_a_row_is_sent(tmp_path, seed):
    """seed=1.5 failed inside the SDK's SamplingParams with a pydantic error; "3" and True were
    sampled as 3 and 1 but recorded as "3" and true, so two evals of one seed did not compare alike."""
    sampler = Replies()
    with pytest.raises(ValueError, match=r"seed must be a whole number or None"):
        evaluate(rows(), model=MODEL, engine="tinker", sampling_client=sampler, seed=seed, out=tmp_path / "r.json",
                 progress=False)
    assert sampler.calls == 0 and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("name, file", [("runs/v2", "runs_v2.json"), ("../outside", ".._outside.json"),
                                        ("gpt: v2?", "gpt_v2_.json"), ("", "results.json")])
def test_a_results_name_that_is_not_a_file_name_stays_in_eval_results(tmp_path, monkeypatch, name, file):
    """name= went into the file name as given: "runs/v2" wrote a subfolder, "../outside" wrote
    beside eval_results, "gpt: v2?" is no file name on Windows (the write failed after the whole
    eval was sampled), "" wrote the hidden file ".json". The file name is made safe as
    write_inspect_log makes it; the results keep the name given."""
    monkeypatch.chdir(tmp_path)
    res = evaluate(rows(), model=MODEL, engine="tinker", sampling_client=Replies(), name=name, progress=False)
    assert Path(res.path) == Path("eval_results") / file
    assert [p.name for p in (tmp_path / "eval_results").iterdir()] == [file]
    assert json.loads(Path(res.path).read_text(encoding="utf-8"))["name"] == name == res.summary["name"]


def test_a_results_path_that_cannot_be_written_is_refused_before_any_request(tmp_path):
    """out= a folder, or a path under a file, was found only when the results were written, after
    every row had been sampled and paid for (IsADirectoryError, NotADirectoryError), and the
    results were lost; out= the eval file replaced the eval data with the results."""
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()), encoding="utf-8")
    before = data.read_bytes()
    (tmp_path / "results").mkdir()
    sampler = Replies()
    with pytest.raises(ValueError, match=r"out=.*results.* is a folder"):
        evaluate(data, model=MODEL, engine="tinker", sampling_client=sampler, out=tmp_path / "results", progress=False)
    with pytest.raises(ValueError, match=r"out=.*eval\.jsonl.* is the eval data"):
        evaluate(data, model=MODEL, engine="tinker", sampling_client=sampler, out=data, progress=False)
    with pytest.raises(ValueError, match=r"out=.*r\.json.*: .*eval\.jsonl is a file, not a folder"):
        evaluate(data, model=MODEL, engine="tinker", sampling_client=sampler, out=data / "r.json", progress=False)
    assert sampler.calls == 0 and data.read_bytes() == before


def test_a_checkpoint_trained_from_another_base_model_is_refused_before_any_request(tmp_path):
    """model= names the renderer; a checkpoint trained from another base model was sampled through
    it anyway: the prompts were another vocabulary's tokens, and every row failed (or scored
    nonsense) instead of a message that names both models."""
    sampler = Replies(base_model="meta-llama/Llama-3.1-8B")
    with pytest.raises(ValueError, match=r"tinker://run/sampler_weights/final was trained from "
                                         r"meta-llama/Llama-3\.1-8B, not thinkingmachines/Inkling-Small"):
        evaluate(rows(), model=MODEL, checkpoint="tinker://run/sampler_weights/final", engine="tinker",
                 sampling_client=sampler, out=tmp_path / "r.json", progress=False)
    assert sampler.calls == 0 and not (tmp_path / "r.json").exists()
    with pytest.raises(ValueError, match=r"was trained from meta-llama/Llama-3\.1-8B"):
        probe(["Name a colour."], model=MODEL, checkpoint="tinker://run/sampler_weights/final", engine="tinker",
              baseline_client=Replies(), checkpoint_client=sampler, progress=False)
    assert sampler.calls == 0
    same = Replies(base_model=MODEL)
    res = evaluate(rows(), model=MODEL, checkpoint="tinker://run/sampler_weights/final", engine="tinker",
                   sampling_client=same, save=False, progress=False)
    assert res.summary["n"] == 2 and same.calls == 2


def test_a_probe_prompt_longer_than_a_file_name_is_sampled_not_an_oserror():
    """probe("<a paragraph>") asked the file system whether the prompt was a file: a prompt over
    255 bytes raised OSError "File name too long" after the prompt had been accepted."""
    prompt = "Describe the weather today in a few sentences, please. " * 8
    res = probe(prompt, model=MODEL, checkpoint="tinker://x/sampler_weights/final", engine="tinker",
                format=r"answer: .*", baseline_client=Replies("It is sunny."), checkpoint_client=Replies("answer: sun"),
                progress=False)
    assert res.rows.loc[0, "bled"] and res.rows.loc[0, "prompt"] == prompt


# --------------------------------------------------------------------------- held-out scoring while training

def test_held_out_errors_count_failed_requests_not_regex_time_outs(tmp_path, monkeypatch):
    """heldout.jsonl's "errors" (heldout_curve: rows whose request failed) counted rows whose
    format regex ran past its time bound, so a run with a slow regex read as an engine failing;
    the time-outs are counted on their own, as evaluate() counts them."""
    from machine_nb.core import patterns
    from machine_nb.evaluation.heldout import HeldOutEvalBuilder, HeldOutEvaluator
    from machine_nb.evaluation.sampling import run_coroutine

    monkeypatch.setattr(patterns, "REGEX_TIMEOUT_S", 1e-6)
    eval_path = tmp_path / "eval.jsonl"
    slow = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}], "expected": "answer: 5",
            "format": r"(a|aa|aaa)+(b|bb)+c"}
    plain = {"messages": [{"role": "user", "content": "What is 2 plus 2?"}], "expected": "answer: 4"}  # no regex
    eval_path.write_text(json.dumps(slow) + "\n" + json.dumps(plain) + "\n", encoding="utf-8")
    builder = HeldOutEvalBuilder(eval_path=str(eval_path), model=MODEL, renderer="tml_v0", log_dir=str(tmp_path),
                                 steps=(0,))
    evaluator = HeldOutEvaluator(builder)
    run_coroutine(lambda: evaluator(Replies("a" * 25 + "b" * 25)))
    (line,) = (tmp_path / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    record = json.loads(line)
    assert record["step"] == 0 and record["n"] == 2
    assert record["rows"][0]["error"] and "timed out" in record["rows"][0]["error"]
    assert record["errors"] == 0 and record["regex_timeouts"] == 1


# --------------------------------------------------------------------------- progress bars

def test_a_terminal_bar_writing_into_a_log_file_redraws_seldom(monkeypatch):
    """In CI (stderr a file, not a terminal) tqdm redrew every 0.1 s: a 600-step run that takes a
    second a step wrote 600 bar lines into the log. There it redraws every PROGRESS_LOG_INTERVAL_S,
    and its last state is written when it closes."""
    import io

    from tqdm import std

    from machine_nb.core import progress as progress_mod

    clock = [1000.0]
    monkeypatch.setattr(std, "time", lambda: clock[0])
    monkeypatch.setattr(std.tqdm, "monitor_interval", 0)  # no monitor thread redrawing on the real clock
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    with progress_mod.progress(total=600, desc="sft", unit="steps", enabled=True) as bar:
        for _ in range(600):
            clock[0] += 1.0  # a second a step
            bar.update(1, loss=0.5)
    draws = [d for d in log.getvalue().replace("\n", "\r").split("\r") if d.strip()]
    assert len(draws) <= 600 / progress_mod.PROGRESS_LOG_INTERVAL_S + 3
    assert "600/600" in draws[-1] and "sft" in draws[-1]


def test_a_notebook_kernel_that_subclasses_jupyters_shell_gets_the_html_line(monkeypatch):
    """Colab's shell is a subclass of ZMQInteractiveShell with another name: it was not taken for a
    kernel, so its notebooks got tqdm's stderr stream instead of the one static HTML line."""
    from machine_nb.core.progress import in_kernel

    class ZMQInteractiveShell:
        pass

    class Shell(ZMQInteractiveShell):  # google.colab._shell.Shell
        pass

    class TerminalInteractiveShell:
        pass

    for shell, expected in ((Shell(), True), (ZMQInteractiveShell(), True), (TerminalInteractiveShell(), False)):
        monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda s=shell: s))
        assert in_kernel() is expected


def test_a_finished_bar_keeps_the_time_it_took(monkeypatch):
    """text() of a closed bar went on counting: "sft: 3/3 steps · 1.0 s" read a minute later said
    61.0 s, while the notebook's line (drawn at close) said 1.0 s."""
    from machine_nb.core import progress as progress_mod

    clock = [50.0]
    monkeypatch.setattr(progress_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    bar = progress_mod.progress(total=3, desc="sft", unit="steps", enabled=False)
    clock[0] += 1.0
    bar.update(3)
    bar.close()
    clock[0] += 60.0
    assert bar.text() == "sft: 3/3 steps · 1.0 s"


@pytest.mark.parametrize("value, shown", [("0", False), ("false", False), ("OFF", False), (" no ", False),
                                          ("1", True), ("true", True), ("", True)])
def test_the_environment_turns_bars_off_with_the_words_people_write(monkeypatch, value, shown):
    """MACHINE_NB_PROGRESS=false (or off, no) in a CI config left every bar on: only "0" counted."""
    from machine_nb.core.progress import resolve_progress

    monkeypatch.setenv("MACHINE_NB_PROGRESS", value)
    assert resolve_progress(None) is shown
    assert resolve_progress(True) is True and resolve_progress(False) is False


def test_results_that_cannot_be_written_after_sampling_are_returned_with_a_warning(tmp_path, monkeypatch):
    """A disk that fills up (or a folder made read-only) while the rows are sampled: the write of
    the results JSON failed and the paid results were lost with it. They are returned unsaved,
    and a warning says so and how to keep them."""
    import errno

    from machine_nb.core import jsonl

    def full(path, text, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(jsonl, "atomic_write_text", full)
    sampler = Replies()
    with pytest.warns(UserWarning, match=r"r\.json: the results could not be written \(No space left on device\)"):
        res = evaluate(rows(), model=MODEL, engine="tinker", sampling_client=sampler, out=tmp_path / "r.json",
                       progress=False)
    assert sampler.calls == 2 and res.path is None and res.accuracy == 0.5 and len(res.rows) == 2
    assert not (tmp_path / "r.json").exists()


def test_a_reply_that_calls_a_tool_keeps_its_calls_in_the_results(tmp_path):
    """A reply that is a tool call scored and showed as an empty output, its call nowhere: the rows
    carry a `tool_calls` column (OpenAI's shape) when any reply made one."""
    import asyncio as _asyncio

    import tinker
    from tinker_cookbook.renderers import ToolCall

    class Calls(Replies):
        async def sample_async(self, prompt, num_samples, sampling_params):
            self.calls += 1
            await _asyncio.sleep(0)
            call = ToolCall(id="c1", function=ToolCall.FunctionBody(name="add", arguments='{"a": 2, "b": 3}'))
            convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
            full, _ = self.renderer.build_supervised_example(convo)
            prompt_only = self.renderer.build_generation_prompt(convo[:1])
            tokens = full.to_ints()[prompt_only.length:]
            seq = tinker.SampledSequence(stop_reason="stop", sequence_id="0", tokens_np=np.array(tokens, dtype=np.int32))
            return tinker.SampleResponse(sequences=[seq])

    res = evaluate(rows(1), model=MODEL, engine="tinker", sampling_client=Calls(), out=tmp_path / "r.json",
                   progress=False)
    (calls,) = res.rows["tool_calls"]
    assert calls[0]["function"]["name"] == "add" and json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["rows"][0]["tool_calls"][0]["function"]["name"] == "add"
    plain = evaluate(rows(1), model=MODEL, engine="tinker", sampling_client=Replies(), save=False, progress=False)
    assert "tool_calls" not in plain.rows.columns  # no reply made a call: no column
