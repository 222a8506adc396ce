"""Inspect AI on both sides: our results as Inspect logs, Inspect tasks on the local engine through
tinker-cookbook's Inspect model API, any Inspect log read back and compared, and no network reached.

Everything runs offline against the real local server: the rows are notebook 01's held-out rows
(make_corpus), sampled by the shipped model.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import sys
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.evaluation.inspect_bridge import eval_task, inspect_eval, offline_inspect

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample_workspace"


# --------------------------------------------------------------------------- no network

class NetworkGuard:
    """Refuses, and records, every connection and name lookup that is not to this machine."""

    def __init__(self):
        self.attempts: list[str] = []

    @staticmethod
    def local(host) -> bool:
        if host in ("localhost", "", None):
            return True
        try:
            return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
        except ValueError:
            return False

    def install(self, monkeypatch):
        real_connect, real_connect_ex, real_lookup = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
        guard = self

        def check(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not guard.local(address[0]):
                guard.attempts.append(f"connect {address}")
                raise ConnectionRefusedError(f"network refused in tests: {address}")

        def connect(sock, address):
            check(sock, address)
            return real_connect(sock, address)

        def connect_ex(sock, address):
            check(sock, address)
            return real_connect_ex(sock, address)

        def getaddrinfo(host, *args, **kwargs):
            if not guard.local(host):
                guard.attempts.append(f"lookup {host}")
                raise socket.gaierror(f"name lookup refused in tests: {host}")
            return real_lookup(host, *args, **kwargs)

        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return self


@pytest.fixture(scope="module")
def guard():
    mp = pytest.MonkeyPatch()
    g = NetworkGuard().install(mp)
    # Inspect's opt-in telemetry hook would import and call user code that may reach a server;
    # inspect_eval switches it off (set to a module that is not there, Inspect would refuse to run)
    mp.setenv("INSPECT_TELEMETRY", "no_such_module.send")
    yield g
    mp.undo()


@pytest.fixture(scope="module")
def runs(tmp_path_factory, guard):
    """evaluate() and inspect_eval() on the 24 held-out rows, base model, same seed."""
    root = tmp_path_factory.mktemp("inspect")
    corpus = mnb.make_corpus(root / "corpus", seed=0)
    base = mnb.evaluate(corpus.eval, out=root / "eval_results" / "baseline.json", progress=False)
    run = inspect_eval(eval_task(corpus.eval), log_dir=root / "logs")
    return {"root": root, "corpus": corpus, "base": base, "run": run}


# --------------------------------------------------------------------------- Inspect tasks on the local engine

def test_an_inspect_task_runs_on_the_local_server_with_evaluates_replies_and_scores(runs, guard):
    base, run = runs["base"], runs["run"]
    assert len(run) == 1 and len(run.logs) == 1 and run.logs[0].status == "success"
    res = run[0]
    assert res.path.endswith(".eval") and res.path.startswith(str(runs["root"] / "logs"))
    assert len(res.rows) == 24
    assert res.rows["prompt"].tolist() == base.rows["prompt"].tolist()
    assert res.rows["output"].tolist() == base.rows["output"].tolist()  # same replies
    assert res.rows["correct"].tolist() == base.rows["correct"].tolist()  # same scores
    assert res.accuracy == base.accuracy
    assert res.rows["prompt_tokens"].tolist() == base.rows["prompt_tokens"].tolist()  # the cookbook's usage
    assert res.rows["output_tokens"].tolist() == base.rows["output_tokens"].tolist()
    s = res.summary
    assert (s["model"], s["checkpoint"], s["engine"]) == ("local/arith-tiny", None, "local")
    assert s["parameters"]["temperature"] == 0.0 and s["parameters"]["seed"] == 0
    assert s["inspect"]["model"] == "tinker-sampling/local/arith-tiny"
    # the log on disk reads back the same, run settings included
    back = mnb.load_results(res.path)
    assert back.rows["output"].tolist() == res.rows["output"].tolist()
    assert (back.summary["engine"], back.summary["renderer"]) == ("local", s["renderer"])
    # compare takes a run of one task, an Inspect result and our own alike
    cmp = mnb.compare(base, run)
    assert (cmp.n, cmp.delta, cmp.wins, cmp.losses) == (24, 0.0, 0, 0)
    assert guard.attempts == []


def test_no_network_is_reached(runs, guard):
    runs["base"].write_inspect_log(runs["root"] / "again.eval")
    mnb.load_results(runs["root"] / "again.eval")
    assert guard.attempts == [], guard.attempts


# --------------------------------------------------------------------------- our results as Inspect logs

def test_our_log_reads_back_in_inspect_with_every_field(runs):
    from inspect_ai.log import read_eval_log

    base = runs["base"]
    path = base.write_inspect_log()  # default: beside the results JSON
    assert path == str(runs["root"] / "eval_results" / "baseline.eval")
    log = read_eval_log(path)
    assert log.status == "success" and log.eval.task == "baseline"
    assert log.eval.model == "tinker-sampling/local/arith-tiny"
    assert log.eval.model_args == {"engine": "local", "renderer": base.summary["renderer"]}
    cfg = log.eval.model_generate_config
    assert (cfg.max_tokens, cfg.temperature, cfg.seed) == (32, 0.0, 0)
    assert log.eval.metadata["machine_nb"]["parameters"] == base.summary["parameters"]
    assert log.eval.dataset.location == str(runs["corpus"].eval) and log.eval.dataset.samples == 24
    assert log.results.scores[0].metrics["accuracy"].value == base.accuracy
    assert log.stats.model_usage["tinker-sampling/local/arith-tiny"].output_tokens == base.summary["output_tokens"]
    assert len(log.samples) == 24
    for sample, row in zip(log.samples, base.rows.to_dict("records")):
        assert sample.id == row["row"] + 1 and sample.epoch == 1
        assert sample.input[-1].text == row["prompt"]
        assert sample.target == row["expected"]
        assert sample.output.completion == row["output"]
        assert sample.messages[-1].role == "assistant" and sample.messages[-1].text == row["output"]
        score = sample.scores["match"]
        assert score.value == ("C" if row["correct"] else "I")
        assert score.metadata["match"] == row["match"] == "exact"
        assert score.metadata["format_ok"] == row["format_ok"]
        usage = sample.model_usage["tinker-sampling/local/arith-tiny"]
        assert (usage.input_tokens, usage.output_tokens) == (row["prompt_tokens"], row["output_tokens"])
        assert sample.metadata["stop_reason"] == row["stop_reason"]
        assert sample.metadata["latency_s"] == row["latency_s"]
    back = mnb.load_results(path)
    cols = ["row", "prompt", "expected", "match", "output", "correct", "format_ok", "prompt_tokens", "output_tokens"]
    assert back.rows[cols].to_dict("records") == base.rows[cols].to_dict("records")
    assert back.summary["checkpoint"] is None and back.summary["data"] == base.summary["data"]
    # Inspect's JSON log format reads back the same
    as_json = mnb.load_results(base.write_inspect_log(runs["root"] / "baseline-log.json"))
    assert as_json.rows[cols].to_dict("records") == base.rows[cols].to_dict("records")


def test_a_file_that_is_not_an_inspect_log_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.eval"
    bad.write_bytes(b"not a zip")
    with pytest.raises(mnb.MachineFormatError, match=r"broken\.eval.*not an Inspect eval log"):
        mnb.load_results(bad)
    with pytest.raises(mnb.MachineFormatError, match="file not found"):
        mnb.load_results(tmp_path / "missing.eval")
    assert bad.read_bytes() == b"not a zip"  # left as it was


def test_cases_and_probe_results_write_inspect_logs(runs, tmp_path):
    from inspect_ai.log import read_eval_log

    from machine_nb.engines import default_model
    from machine_nb.evaluation.sampling import SamplerTarget, open_sampler

    cases = mnb.evaluate_cases(SAMPLE, "tutor", cases=["What is 47 plus 15?", "Who wrote Hamlet?"],
                               grader=lambda c, r: "62" in r, trials=2, out=tmp_path / "cases.json", progress=False)
    log = read_eval_log(cases.write_inspect_log(tmp_path / "cases.eval"))
    assert sorted((s.id, s.epoch) for s in log.samples) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # trials are epochs
    assert log.eval.config.epochs == 2
    back = mnb.load_results(tmp_path / "cases.eval")
    assert back.rows[["case", "trial"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert back.rows["correct"].tolist() == cases.rows["correct"].tolist()

    model = default_model("local")
    same = open_sampler(SamplerTarget(model, None, "local"))
    bled = mnb.probe(["Name a colour.", "What is 2 plus 2?"], model=model, checkpoint_client=same,
                     format=r"\d+ \+ \d+ = \d+\.?", progress=False)
    log = read_eval_log(bled.write_inspect_log(tmp_path / "probe.eval"))
    assert [s.output.completion for s in log.samples] == bled.rows["checkpoint_output"].tolist()
    assert [s.metadata["baseline_output"] for s in log.samples] == bled.rows["baseline_output"].tolist()
    assert [s.scores["bled"].value for s in log.samples] == [0, 0]  # the same model on both sides never bleeds
    assert log.results.scores[0].name == "bled"
    back = mnb.load_results(tmp_path / "probe.eval")
    assert back.rows[["prompt", "baseline_output", "checkpoint_output", "bled"]].to_dict("records") == \
        bled.rows[["prompt", "baseline_output", "checkpoint_output", "bled"]].to_dict("records")
    assert back.accuracy is None and back.summary["bled"] == 0


# --------------------------------------------------------------------------- any Inspect log, compared

@functools.cache
def canned_api():
    """A model API of this test's own, registered with Inspect as "canned" (once, on first use): fixed
    replies, with usage."""
    from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi

    class Canned(ModelAPI):
        def __init__(self, model_name, base_url=None, api_key=None, config=GenerateConfig(), replies=None):
            super().__init__(model_name=model_name, base_url=base_url, api_key=api_key, config=config)
            self.replies = dict(replies or {})

        async def generate(self, input, tools, tool_choice, config):
            out = ModelOutput.from_content(self.model_name, self.replies[input[-1].text])
            out.usage = ModelUsage(input_tokens=7, output_tokens=3, total_tokens=10)
            return out

    @modelapi(name="canned")
    def canned():
        return Canned

    return canned


def foreign_log(log_dir, replies: dict[str, str], *, ids=("q-b", "q-a", "q-c"), epochs: int = 1):
    """A log made by Inspect itself: a task with Inspect's match() scorer, on a model API of this
    test's own that reports its usage (Inspect's mockllm would fetch a tiktoken encoding)."""
    from inspect_ai import Task, eval as inspect_run
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    canned_api()
    questions = {"q-a": ("What is 1 plus 1?", "2"), "q-b": ("What is 2 plus 2?", "4"), "q-c": ("What is 3 plus 3?", "6")}
    task = Task(dataset=MemoryDataset([Sample(id=i, input=questions[i][0], target=questions[i][1]) for i in ids],
                                      name="sums"), solver=generate(), scorer=match(), name="sums")
    with offline_inspect():
        [log] = inspect_run(task, model=get_model("canned/sums", replies=replies), log_dir=str(log_dir),
                            display="none", epochs=epochs)
    return log.location


def test_a_foreign_inspect_log_reads_back(tmp_path, guard):
    path = foreign_log(tmp_path, {"What is 1 plus 1?": "It is 2", "What is 2 plus 2?": "5",
                                  "What is 3 plus 3?": "6"}, epochs=2)
    res = mnb.load_results(path)
    assert res.rows[["sample_id", "epoch"]].values.tolist() == [["q-b", 1], ["q-b", 2], ["q-a", 1], ["q-a", 2],
                                                                ["q-c", 1], ["q-c", 2]]  # dataset order
    assert res.rows["correct"].tolist() == [False, False, True, True, True, True]
    assert res.rows["scorer"].unique().tolist() == ["match"]
    assert res.rows["prompt_tokens"].tolist() == [7] * 6 and res.rows["output_tokens"].tolist() == [3] * 6
    assert res.summary["name"] == "sums" and res.accuracy == pytest.approx(4 / 6)
    assert guard.attempts == []


def test_compare_pairs_two_inspect_logs_by_sample_id(tmp_path):
    a = foreign_log(tmp_path / "a", {"What is 1 plus 1?": "2", "What is 2 plus 2?": "5", "What is 3 plus 3?": "6"})
    b = foreign_log(tmp_path / "b", {"What is 1 plus 1?": "3", "What is 2 plus 2?": "4", "What is 3 plus 3?": "6"},
                    ids=("q-c", "q-a", "q-b"))  # another order: paired by id, not by position
    cmp = mnb.compare(mnb.load_results(a), mnb.load_results(b))
    assert (cmp.n, cmp.wins, cmp.ties, cmp.losses) == (3, 1, 1, 1)
    assert sorted(cmp.flips["prompt"]) == ["What is 1 plus 1?", "What is 2 plus 2?"]
    assert cmp.delta_ci_low < 0 < cmp.delta_ci_high
    assert "What is 2 plus 2?" in mnb.CompareView(a, b).static_html()
    fewer = foreign_log(tmp_path / "c", {"What is 1 plus 1?": "2", "What is 2 plus 2?": "4"}, ids=("q-a", "q-b"))
    with pytest.raises(ValueError, match=r"not over the same samples: only .* has sample\(s\) q-c"):
        mnb.compare(mnb.load_results(a), mnb.load_results(fewer))


# --------------------------------------------------------------------------- without inspect_ai

def test_without_inspect_ai_each_function_says_how_to_install_it(runs, monkeypatch, tmp_path):
    for name in [n for n in sys.modules if n == "inspect_ai" or n.startswith("inspect_ai.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # `import inspect_ai` raises ImportError
    hint = r'pip install "machine_nb\[inspect\]"'
    with pytest.raises(ImportError, match=hint):
        runs["base"].write_inspect_log(tmp_path / "x.eval")
    with pytest.raises(ImportError, match=hint):
        mnb.inspect_eval("tasks.py")
    with pytest.raises(ImportError, match=hint):
        mnb.load_results(runs["run"].paths[0])
    with pytest.raises(ImportError, match=hint):
        eval_task(runs["corpus"].eval)
    with pytest.raises(ImportError, match=hint):
        mnb.sft(runs["corpus"].train, max_steps=1, inspect_tasks=["tasks.py@x"], log_dir=tmp_path / "run")
    with pytest.raises(ImportError, match=hint):
        mnb.dpo([], max_steps=1, inspect_tasks=["tasks.py@x"], log_dir=tmp_path / "dpo")
    assert not (tmp_path / "x.eval").exists() and not (tmp_path / "run").exists() and not (tmp_path / "dpo").exists()


# --------------------------------------------------------------------------- Inspect tasks while training

TASK_FILE = '''
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import match
from inspect_ai.solver import generate

ROWS = {rows!r}


@task
def held_out_sums():
    return Task(dataset=MemoryDataset([Sample(id=i + 1, input=q, target=a) for i, (q, a) in enumerate(ROWS)],
                                      name="held_out_sums"),
                solver=generate(), scorer=match(location="exact"), name="held_out_sums")
'''


def test_sft_runs_inspect_tasks_at_its_eval_steps_and_on_the_final_checkpoint(runs, tmp_path, guard):
    rows = mnb.read_jsonl(runs["corpus"].eval)[:4]
    task_file = tmp_path / "sums_task.py"
    task_file.write_text(TASK_FILE.format(rows=[(r["messages"][-1]["content"], r["expected"]) for r in rows]))
    result = mnb.sft(runs["corpus"].train, max_steps=2, batch_size=8, eval_every=1, eval_data=rows[:2],
                     inspect_tasks=[f"{task_file}@held_out_sums"], log_dir=tmp_path / "run", progress=False)
    from machine_nb.evaluation.inspect_bridge import inspect_curve

    curve = inspect_curve(result.log_dir)
    acc = curve[curve["metric"] == "accuracy"]
    assert acc["step"].tolist() == [0, 1, 2] and set(acc["task"]) == {"held_out_sums"}  # steps 0, 1 and the final
    held = mnb.heldout_curve(result.log_dir)
    assert held["step"].tolist() == [0, 1, 2]  # the same steps as the held-out rows
    # the Inspect task's accuracy joins the held-out curve, step by step
    assert held["inspect:held_out_sums"].tolist() == acc["value"].tolist()
    logs = sorted((tmp_path / "run" / "inspect").glob("*.eval"))
    assert len(logs) == 3
    first = mnb.load_results(logs[0])
    assert len(first.rows) == 4 and first.accuracy == acc["value"].iloc[0]
    assert first.summary["inspect"]["model"] == "tinker-sampling/local/arith-tiny"
    with pytest.raises(TypeError, match="registry name"):
        mnb.sft(runs["corpus"].train, max_steps=1, inspect_tasks=[eval_task(rows)], log_dir=tmp_path / "no")
    assert not (tmp_path / "no").exists()


def test_the_cli_runs_inspect_tasks_with_sft_and_dpo(runs, tmp_path, guard, capsys):
    """`machine-nb sft|dpo … --inspect-task FILE@task`: the task's scores at step 0 and on the final checkpoint."""
    from machine_nb.cli import main
    from machine_nb.evaluation.inspect_bridge import inspect_curve

    rows = mnb.read_jsonl(runs["corpus"].eval)[:2]
    task_file = tmp_path / "sums_task.py"
    task_file.write_text(TASK_FILE.format(rows=[(r["messages"][-1]["content"], r["expected"]) for r in rows]))
    pairs = tmp_path / "pairs.jsonl"
    mnb.write_jsonl([{"prompt": r["messages"][:-1], "chosen": [r["messages"][-1]],
                      "rejected": [{**r["messages"][-1], "content": r["messages"][-1]["content"] + "0"}]}
                     for r in mnb.read_jsonl(runs["corpus"].train)[:8]], pairs)
    for command, data in (("sft", runs["corpus"].train), ("dpo", pairs)):
        log_dir = tmp_path / command
        assert main([command, str(data), "--log-dir", str(log_dir), "--steps", "1", "--batch-size", "8",
                     "--inspect-task", f"{task_file}@held_out_sums"]) == 0, capsys.readouterr().err
        curve = inspect_curve(log_dir)
        assert curve[curve["metric"] == "accuracy"]["step"].tolist() == [0, 1], command


def test_dpo_runs_inspect_tasks_at_its_eval_steps_and_on_the_final_checkpoint(runs, tmp_path, guard):
    """As sft: the Inspect task before each of the 2 steps and on the final checkpoint, its scores in
    the run's metrics and its logs in the log dir; a Task object is refused before anything runs."""
    from machine_nb.evaluation.inspect_bridge import inspect_curve
    from machine_nb.data.export import HeldOutExcluded

    sample = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
    with pytest.warns(HeldOutExcluded):
        pairs = mnb.preference_pairs(sample / ".machine-store", workspace=sample, machine="tutor")
    rows = mnb.read_jsonl(runs["corpus"].eval)[:4]
    task_file = tmp_path / "sums_task.py"
    task_file.write_text(TASK_FILE.format(rows=[(r["messages"][-1]["content"], r["expected"]) for r in rows]))
    result = mnb.dpo(pairs, max_steps=2, batch_size=8, eval_every=1, inspect_tasks=f"{task_file}@held_out_sums",
                     log_dir=tmp_path / "dpo", progress=False)
    acc = inspect_curve(result.log_dir)
    acc = acc[acc["metric"] == "accuracy"]
    assert acc["step"].tolist() == [0, 1, 2] and set(acc["task"]) == {"held_out_sums"}
    assert len(sorted((tmp_path / "dpo" / "inspect").glob("*.eval"))) == 3
    with pytest.raises(TypeError, match=r"dpo\(inspect_tasks=…\).*registry name"):
        mnb.dpo(pairs, max_steps=1, inspect_tasks=[eval_task(rows)], log_dir=tmp_path / "no")
    assert not (tmp_path / "no").exists()
