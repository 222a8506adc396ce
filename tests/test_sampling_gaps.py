"""What a user meets when sampling goes beyond the happy path: an Inspect task that sets generate
options or sends messages the sampler cannot take, a reply cut at its budget, one request the
engine refuses, one reply that cannot be parsed, and Ctrl-C in a notebook while rows are sampled.

Inspect tasks run on the local engine's shipped model (`local/arith-tiny`, in-process server);
sample_rows and run_coroutine run against stand-in samplers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from machine_nb.errors import EngineError
from machine_nb.evaluation.sampling import run_coroutine, sample_rows

from interrupt import ctrl_c_as_the_pool_starts, interrupted_in_a_kernel

QUESTION = "What is 2 plus 3?"


# --------------------------------------------------------------------------- Inspect tasks on the local engine

def task(inputs, config=None, name="sums"):
    """An Inspect task of one sample per input, generate() and Inspect's match() scorer."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import GenerateConfig
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    samples = [Sample(id=i + 1, input=inp, target="5") for i, inp in enumerate(inputs)]
    return Task(dataset=MemoryDataset(samples, name=name), solver=generate(), scorer=match(),
                config=config or GenerateConfig(), name=name)


def run(tmp_path, inputs, **config):
    from inspect_ai.model import GenerateConfig

    from machine_nb.evaluation.inspect_bridge import inspect_eval

    return inspect_eval(task(inputs, GenerateConfig(**config)), log_dir=tmp_path / "logs")


@pytest.fixture(scope="module")
def uncut(tmp_path_factory):
    """The shipped model's greedy reply to QUESTION, with no options set."""
    pytest.importorskip("inspect_ai")
    res = run(tmp_path_factory.mktemp("uncut"), [QUESTION])
    sample = res.logs[0].samples[0]
    assert sample.output.stop_reason == "stop" and len(sample.output.completion) > 4
    return sample.output.completion


def test_a_reply_cut_at_max_tokens_says_max_tokens_not_stop(tmp_path, uncut):
    """Every reply was marked "stop", so a reply cut at its budget read as one the model ended."""
    res = run(tmp_path, [QUESTION], max_tokens=2)
    sample = res.logs[0].samples[0]
    assert uncut.startswith(sample.output.completion) and sample.output.completion != uncut
    assert sample.output.stop_reason == "max_tokens"
    assert res[0].rows["stop_reason"].tolist() == ["length"]  # evaluate()'s word for it


def test_a_tasks_stop_sequences_end_the_reply(tmp_path, uncut):
    """GenerateConfig(stop_seqs=…) was dropped: the reply ran on past the stop sequence."""
    cut_at = uncut[2:4]
    res = run(tmp_path, [QUESTION], stop_seqs=[cut_at, "never in a reply"])
    sample = res.logs[0].samples[0]
    assert sample.output.completion == uncut[:uncut.index(cut_at)]  # the stop sequence is not kept
    assert sample.output.stop_reason == "stop"


def test_settings_the_sampler_cannot_apply_are_named_in_a_warning(tmp_path, uncut):
    """top_logprobs and frequency_penalty were dropped without a word (logprobs are honoured:
    test_inspect_review)."""
    with pytest.warns(UserWarning, match=r"frequency_penalty=1\.0, top_logprobs=2"):
        res = run(tmp_path, [QUESTION], top_logprobs=2, frequency_penalty=1.0)
    assert res.logs[0].samples[0].output.completion == uncut


def test_an_image_is_refused_on_its_sample_not_dropped(tmp_path, uncut):
    """An image in a prompt was skipped with a log line, and the model answered without it."""
    from inspect_ai.model import ChatMessageUser, ContentImage, ContentText

    with_image = [ChatMessageUser(content=[ContentText(text=QUESTION),
                                           ContentImage(image="data:image/png;base64,iVBORw0KGgo=")])]
    with pytest.warns(UserWarning):  # the errored sample counts as wrong, said by the log reader
        res = run(tmp_path, [with_image, QUESTION])
    rows = res[0].rows
    assert "ContentImage" in rows["error"][0] and "cannot take" in rows["error"][0]
    assert rows["output"].tolist() == ["", uncut]


def test_an_assistant_prefill_is_refused_not_rendered_as_a_finished_turn(tmp_path):
    """A last assistant message was rendered as a whole turn and a new reply sampled after it."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser

    with pytest.warns(UserWarning):
        res = run(tmp_path, [[ChatMessageUser(content=QUESTION), ChatMessageAssistant(content="answer:")]])
    error = res[0].rows["error"][0]
    assert "assistant" in error and "prefill" in error


# --------------------------------------------------------------------------- sample_rows with stand-ins

def seq(tokens, stop_reason="stop"):
    return SimpleNamespace(sequences=[SimpleNamespace(tokens=tokens, stop_reason=stop_reason)])


class TextRenderer:
    """Tokens are character codes; a reply holding token 0 cannot be parsed."""

    def parse_response(self, tokens):
        if 0 in tokens:
            raise ValueError("token 0 is not text")
        return {"role": "assistant", "content": "".join(map(chr, tokens))}, True


def prompts(n):
    return [SimpleNamespace(length=3, name=f"p{i}") for i in range(n)]


def test_a_reply_that_cannot_be_parsed_is_an_error_on_its_row_not_the_whole_eval():
    class Sampler:
        async def sample_async(self, prompt, num_samples, sampling_params):
            return seq([0, 1] if prompt.name == "p1" else [104, 105])

    out = asyncio.run(sample_rows(Sampler(), TextRenderer(), prompts(3), None, 2))
    assert [r["output"] for r in out] == ["hi", "", "hi"]
    assert out[1]["error"] == "ValueError: token 0 is not text" and out[0]["error"] is None
    assert out[1]["output_tokens"] == 2  # the tokens were sampled (and paid for)


def test_an_engine_refusal_cancels_the_requests_still_in_flight():
    """The other rows' requests went on after the EngineError that ended the eval."""
    ended = {}

    class Sampler:
        async def sample_async(self, prompt, num_samples, sampling_params):
            if prompt.name == "p0":
                await asyncio.sleep(0)
                raise EngineError("no key")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                ended[prompt.name] = "cancelled"
                raise

    async def main():
        with pytest.raises(EngineError, match="no key"):
            await sample_rows(Sampler(), TextRenderer(), prompts(4), None, 8)
        return dict(ended)

    assert asyncio.run(main()) == {"p1": "cancelled", "p2": "cancelled", "p3": "cancelled"}


def sampling_work(started: threading.Event, seen: list, ending_s: float = 0.0):
    """A coroutine function standing in for sampling: it sets `started`, then waits; cancelled, it
    takes `ending_s` to end and notes "cancelled" in `seen` ("finished" if it ran out)."""
    async def work():
        started.set()
        try:
            await asyncio.sleep(30)
            seen.append("finished")
        except asyncio.CancelledError:
            time.sleep(ending_s)
            seen.append("cancelled")
            raise

    return work


def test_ctrl_c_in_a_notebook_cancels_the_sampling_and_returns_at_once():
    """In a kernel (an event loop running) Ctrl-C waited for every row to be sampled first."""
    started, seen = threading.Event(), []
    work = sampling_work(started, seen)
    interrupted_in_a_kernel(lambda: run_coroutine(work), ctrl_c_once=started)
    assert seen == ["cancelled"]


def test_a_samples_own_error_is_its_reason_not_the_event_loop_check(tmp_path):
    """Every sample error without a cause of its own read "RuntimeError('no running event loop')":
    Inspect ran inside the handler of inspect_eval's event-loop check and took that as the cause."""
    from inspect_ai import Task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import solver

    from machine_nb.evaluation.inspect_bridge import inspect_eval

    @solver
    def broken():
        async def solve(state, generate):
            raise ValueError("the solver's own reason")
        return solve

    failing = Task(dataset=MemoryDataset([Sample(id=1, input=QUESTION, target="5")], name="broken"),
                   solver=broken(), scorer=match(), name="broken")
    with pytest.warns(UserWarning):
        res = inspect_eval(failing, log_dir=tmp_path / "logs")
    assert "the solver's own reason" in res[0].rows["error"][0]


def test_ctrl_c_as_the_worker_thread_starts_still_waits_for_the_work_to_end(monkeypatch):
    """A Ctrl-C can land while the pool is still starting its thread (in `submit`, after the work
    began): the pool has not listed that thread yet, so its shutdown does not wait for it. The work
    is cancelled and run_coroutine returns only once it has ended, as for a Ctrl-C a moment later."""
    from machine_nb.evaluation import sampling

    started, seen = threading.Event(), []
    work = sampling_work(started, seen, ending_s=0.2)  # the work takes a moment to end

    ctrl_c_as_the_pool_starts(monkeypatch, started)
    interrupted_in_a_kernel(lambda: sampling.run_coroutine(work))
    assert seen == ["cancelled"]
