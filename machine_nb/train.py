"""Supervised fine-tuning: tinker-cookbook's own `supervised.train.main`, on the local engine or Tinker.

`sft` prepares one fresh log dir, checks the engine can serve the model (and, on Tinker, the key,
the service and the price: pricing.py decides what a run may cost), then runs the cookbook's loop
unchanged in a child process (runner.py) against the engine's URL, with a progress bar fed from
`metrics.jsonl`. Both engines are the real tinker SDK; only the base URL, key and model differ.
With `eval_data`, the loop also calls the held-out evaluator (heldout.py) every `eval_every`
steps. Reading a finished (or interrupted) log dir back is `read_training_log` /
`training_metrics`, and its held-out scores `heldout_curve` / `heldout_results`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from . import render
from .errors import EngineError, MachineFormatError
from .jsonl import write_jsonl
from .runlog import (DPO_LOSS, HELDOUT_ACCURACY, HELDOUT_DATA, HELDOUT_FILE, HELDOUT_FORMAT_RATE,  # noqa: F401
                     HELDOUT_PREFIX, LOSS_METRICS, MARKER, RUN_FILES, SFT_LOSS, MetricsTail, TrainResult,
                     claim_log_dir, heldout_curve, heldout_results, load_marker, log_entries, loss_metric,
                     new_log_dir, prepare_data, private_files, read_log_lines, read_training_log, training_metrics)

#: Defaults for local models, calibrated on the minimal-SFT corpus (48 rows, batch 8, 10 epochs
#: = 60 steps; the measured figures are in benchmarks/bench_sft.py's output and the model card):
#: LoRA rank 8 (alpha 16, attention + MLP) at 3e-3; full fine-tuning (rank 0) at 5e-4.
LOCAL_LORA_RANK = 8
LOCAL_LEARNING_RATE = 3e-3
LOCAL_FULL_LEARNING_RATE = 5e-4
#: Tinker defaults: the cookbook's LoRA rank, and its learning rate when it knows none for the model.
TINKER_LORA_RANK = 32
TINKER_LEARNING_RATE = 1e-4


# ---------------------------------------------------------------------------------------------
# running the cookbook (in a child process: runner.py says why)



def _child_env(engine: str) -> dict[str, str]:
    """The run's environment: the caller's, unchanged, except that on the local engine the
    training loop sends a placeholder key (the user's own TINKER_API_KEY never goes to the local server)."""
    from .engines import LOCAL_API_KEY

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if engine == "local":
        env["TINKER_API_KEY"] = LOCAL_API_KEY
    return env


class _Runner:
    """A child process (runner.py) that runs training loops one after another.

    Kept for the next run, since importing tinker-cookbook and the SDK takes seconds; replaced
    after an error or an interrupt, and ended with this process (it exits when its stdin closes).
    """

    _idle: "list[_Runner]" = []
    _keep = 1  # idle processes kept for the next run (keep_runners raises it while runs go in parallel)
    _lock = threading.Lock()

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-m", "machine_nb.runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_child_env("local"))
        self.events: "list[dict]" = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name="machine-nb-runner-status", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        with self._cond:
            self.events.append({"event": "exit"})
            self._cond.notify_all()

    @classmethod
    def take(cls) -> "_Runner":
        while True:
            with cls._lock:
                runner = cls._idle.pop() if cls._idle else None
            if runner is None:
                return cls()
            if runner.proc.poll() is None:
                return runner

    def give_back(self) -> None:
        with type(self)._lock:
            if len(type(self)._idle) < type(self)._keep and self.proc.poll() is None:
                type(self)._idle.append(self)
                return
        self.close()

    @classmethod
    def trim(cls) -> None:
        """Close idle processes beyond the number kept."""
        with cls._lock:
            extra, cls._idle = cls._idle[cls._keep:], cls._idle[:cls._keep]
        for runner in extra:
            runner.close()

    def send(self, spec: dict) -> int:
        """Start a run; returns the index of the first event that belongs to it."""
        with self._cond:
            start = len(self.events)
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(spec) + "\n").encode("utf-8"))
        self.proc.stdin.flush()
        return start

    def outcome(self, start: int) -> dict | None:
        with self._cond:
            for event in self.events[start:]:
                if event.get("event") in ("done", "error", "interrupted", "exit"):
                    return event
        return None

    def stop(self) -> None:
        """Ctrl-C for the run in progress (SIGINT, then harder), then the process ends."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(Exception):
            self.proc.wait(5)


@contextlib.contextmanager
def keep_runners(n: int) -> Iterator[None]:
    """While the block runs, keep up to `n` training processes for the next runs (one each for
    runs going in parallel: a fresh one takes seconds to import the cookbook); one afterwards."""
    with _Runner._lock:
        before, _Runner._keep = _Runner._keep, max(_Runner._keep, int(n))
    try:
        yield
    finally:
        with _Runner._lock:
            _Runner._keep = before
        _Runner.trim()


def run_cookbook(spec: dict, log_dir: Path, *, engine: str, on_poll: Any = None, poll_s: float = 0.2,
                 watchdog: Any = None) -> None:
    """Run `runner.run(spec)` in the runner process, calling `on_poll()` in this thread meanwhile.

    Its console output goes to `<log dir>/train.log`. A KeyboardInterrupt here (or an error from
    `on_poll`, or a watchdog that saw the service die) stops the run (SIGINT, then harder) before
    re-raising; files it wrote stay whole. An error in the run is raised here as EngineError (or
    MachineFormatError when the server named a corrupt file).
    """
    spec = {**spec, "env": _child_env(engine), "cwd": os.getcwd(), "log": str(log_dir / "train.log")}
    runner = _Runner.take()
    start = runner.send(spec)
    try:
        while True:
            outcome = runner.outcome(start)
            if outcome is not None:
                break
            with runner._cond:
                runner._cond.wait(poll_s)
            if on_poll is not None:
                on_poll()
            if watchdog is not None:
                watchdog.check()
    except BaseException:
        runner.stop()
        raise
    if on_poll is not None:
        on_poll()
    if outcome["event"] == "done":
        runner.give_back()
        return
    runner.close()
    if outcome["event"] == "interrupted":
        raise KeyboardInterrupt("training was interrupted")
    if outcome["event"] == "exit":
        raise EngineError(f"the training process ended unexpectedly (exit code {runner.proc.returncode}); "
                          f"see {log_dir / 'train.log'}")
    from .engines import explain

    if isinstance(outcome.get("body"), dict):
        class _Sdk(Exception):
            body = outcome["body"]
        raise explain(_Sdk(outcome["message"])) from None
    from .redact import redacted

    raise EngineError(redacted(f"training failed: {outcome['type']}: {outcome['message']} "
                               f"(log: {log_dir / 'train.log'})"))


def _sft_config(spec: dict) -> Any:
    """The cookbook's supervised Config for a spec `sft` wrote (runs in the child process)."""
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised import train as cookbook_train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    builder = FromConversationFileBuilder(
        file_path=spec["data_path"], test_size=0, shuffle_seed=spec["seed"],
        common_config=ChatDatasetBuilderCommonConfig(
            model_name_for_tokenizer=spec["model"], renderer_name=spec["renderer"],
            max_length=spec["max_length"], batch_size=spec["batch_size"],
            train_on_what=TrainOnWhat(spec["train_on_what"])))
    return cookbook_train.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_sft",
        renderer_name=spec["renderer"], dataset_builder=builder, learning_rate=spec["learning_rate"],
        lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"], lora_rank=spec["lora_rank"],
        base_url=spec["base_url"], save_every=spec["save_every"], eval_every=0, infrequent_eval_every=0,
        max_steps=spec["max_steps"], submit_ahead=spec["submit_ahead"], ttl_seconds=None)


def _total_steps(config: Any) -> tuple[Any, int, int]:
    """(dataset, batches an epoch, the run's steps) for a cookbook supervised Config."""
    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    return dataset, n_batches, total


def exact_resume_point(log_dir: str, config: Any) -> dict | None:
    """Append the record from which the cookbook resumes a run exactly; returns it (None if none).

    The cookbook saves checkpoint N while finishing step N, after it has already submitted steps
    N+1 … N+submit_ahead, yet the record says to resume at batch N: a plain resume would train
    the steps the state already holds twice. Which of N … N+submit_ahead the state holds is told
    by `metrics.jsonl`: a step's row is written once its optimizer step has finished, and the
    engine ran it before the save that was queued after it. The appended record points past the
    steps with rows (epoch, batch, elapsed_tokens) and says how many steps the state holds
    (`steps_in_state`), so the resumed run continues from the exact state and ends with the
    losses and weights of an uninterrupted one; when the state holds every step, `child_run`
    saves the final checkpoint from it. A step without a row is trained again and listed in
    `unconfirmed`: the engine may have failed it (the state lacks it: training it again is
    exact), or an interrupt came between the checkpoint and its row (the state holds it: it is
    trained twice); the log cannot tell which. A record this function wrote is returned as it is.
    """
    from tinker_cookbook import checkpoint_utils

    last = checkpoint_utils.get_last_checkpoint(log_dir)
    if last is None or last.batch is None:
        return None
    if last.extra.get("machine_nb_resume"):
        return last.to_dict()
    dataset, n_batches, total = _total_steps(config)
    if n_batches == 0:
        return None
    epoch = last.epoch or 0
    if epoch >= config.num_epochs:  # the final record: nothing left to run
        return None
    saved_step = epoch * n_batches + last.batch
    submitted = min(saved_step + config.submit_ahead, total - 1)
    if submitted < saved_step:
        return None
    logged = {m.get("step") for m in read_log_lines(Path(log_dir) / "metrics.jsonl")
              if isinstance(m.get(SFT_LOSS), (int, float))}
    done_through = saved_step - 1
    while done_through < submitted and done_through + 1 in logged:
        done_through += 1

    def batch_tokens(step: int) -> int:
        e, b = divmod(step, n_batches)
        dataset.set_epoch(seed=e)
        return sum(d.model_input.length for d in dataset.get_batch(b))

    tokens = int(last.extra.get("elapsed_tokens", 0))  # through step N
    tokens += sum(batch_tokens(step) for step in range(saved_step + 1, done_through + 1))
    if done_through < saved_step:
        tokens -= batch_tokens(saved_step)
    e, b = divmod(done_through + 1, n_batches)
    record = {"name": last.name, "epoch": e, "batch": b, "state_path": last.state_path,
              "sampler_path": last.sampler_path, "elapsed_tokens": tokens, "machine_nb_resume": True,
              "steps_in_state": done_through + 1, "unconfirmed": list(range(done_through + 1, submitted + 1))}
    with open(os.path.join(log_dir, checkpoint_utils.CHECKPOINTS_BASE_NAME), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


async def _final_from_state(config: Any, record: dict) -> None:
    """The final checkpoint of a run whose saved state already holds every step: the state
    loaded (weights and optimizer) and saved again as "final", as the cookbook's loop ends a run
    (its loop would train nothing and so save no final checkpoint)."""
    import tinker
    from tinker_cookbook import checkpoint_utils
    from tinker_cookbook.utils.git_rev import recipe_user_metadata

    service = tinker.ServiceClient(base_url=config.base_url, user_metadata=recipe_user_metadata(config.recipe_name))
    metadata: dict[str, str] = {}
    checkpoint_utils.add_renderer_name_to_user_metadata(metadata, config.renderer_name)
    client = await service.create_training_client_from_state_with_optimizer_async(record["state_path"],
                                                                                   user_metadata=metadata)
    await checkpoint_utils.save_checkpoint_async(
        training_client=client, name="final", log_path=config.log_path, kind="both",
        loop_state={"epoch": config.num_epochs, "batch": 0, "elapsed_tokens": int(record.get("elapsed_tokens", 0))},
        ttl_seconds=None)


def _with_heldout(spec: dict, config: Any) -> tuple[Any, Any, int]:
    """The Config with the held-out evaluator in its `evaluator_builders` (when the spec asks for
    one), the builder, and the run's total steps."""
    import chz
    from tinker_cookbook import checkpoint_utils

    from .heldout import HeldOutEvalBuilder, eval_schedule

    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    last = checkpoint_utils.get_last_checkpoint(spec["log_dir"])
    start = 0 if last is None or last.batch is None else (last.epoch or 0) * n_batches + last.batch
    every = int(spec["heldout"]["every"])
    builder = HeldOutEvalBuilder.from_spec(spec, eval_schedule(start, total, every))
    return chz.replace(config, evaluator_builders=[builder], eval_every=every), builder, total


def child_run(spec: dict) -> None:
    """The sft half that runs in the child (runner.py): the cookbook's loop, unchanged; with
    held-out evals, its evaluator in the loop's `evaluator_builders`, then the final checkpoint
    scored the same way (the loop evaluates before a step, so never the weights after the last)."""
    import asyncio

    from tinker_cookbook.supervised import train as cookbook_train

    config = _sft_config(spec)
    record = exact_resume_point(spec["log_dir"], config) if spec.get("resume") else None
    builder = None
    if spec.get("heldout"):
        config, builder, total = _with_heldout(spec, config)
    if record is not None and "steps_in_state" in record and int(record["steps_in_state"]) >= _total_steps(config)[2]:
        asyncio.run(_final_from_state(config, record))
    else:
        asyncio.run(cookbook_train.main(config))
    if builder is not None:
        from .heldout import evaluate_final

        evaluate_final(builder, spec["base_url"], total)


def _default_lr(engine: str, model: str, lora_rank: int) -> float:
    if render.is_local_model(model):
        return LOCAL_LEARNING_RATE if lora_rank > 0 else LOCAL_FULL_LEARNING_RATE
    try:
        from tinker_cookbook.hyperparam_utils import get_lr

        return float(get_lr(model, is_lora=True))
    except Exception:  # the cookbook knows only Llama/Qwen families
        return TINKER_LEARNING_RATE


def _heldout_settings(eval_data: Any, model: str, eval_every: int | None, per_epoch: int, max_tokens: int,
                      temperature: float, steps_total: int) -> dict:
    """The held-out eval of a run, checked before anything is written: its rows (every one
    checked as evaluate() checks it, and rendered by the model's renderer), how often, how sampled."""
    from .chat import eval_rows
    from .results import file_sha256
    from .sampling import render_prompts, renderer_for

    if hasattr(eval_data, "to_dict") and hasattr(eval_data, "columns"):
        eval_data = eval_data.to_dict("records")
    rows, source = eval_rows(eval_data)
    every = per_epoch if eval_every is None else eval_every
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"eval_every must be a whole number of steps, at least 1 (got {eval_every!r})")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"eval_max_tokens must be at least 1, got {max_tokens!r}")
    renderer, name = renderer_for(model, None)
    render_prompts(renderer, rows, source)  # a row the renderer cannot format fails now, not mid-run
    return {"rows": [{k: v for k, v in r.items() if k != "line"} for r in rows], "source": source,
            "source_sha256": file_sha256(source), "n": len(rows), "every": every,
            "evals": -(-steps_total // every) + 1,  # steps 0, N, 2N, … before the last, and the final checkpoint
            "max_tokens": int(max_tokens), "temperature": float(temperature), "seed": 0, "renderer": name}


def run_estimate(rows: Any, model: str, engine: str, *, epochs: int, batch_size: int, max_steps: int | None,
                 eval_rows: Any = None, evals: int = 0, eval_max_tokens: int = 32) -> dict:
    """What a training run is estimated to cost before it starts: training plus its held-out evals.

    Args:
        rows: the training rows as sft trains them. model / engine: what and where.
        epochs / batch_size / max_steps: as sft takes them.
        eval_rows: the held-out rows (default None: no evals). evals: how many times they are
            scored (eval steps plus the final checkpoint). eval_max_tokens: output tokens a reply.

    Returns:
        {"usd" (None when a price is unknown), "train_usd", "eval_usd", "tokens" (tokens the
        training is priced on), "evals", "exact", "price_source", "price_date"}: 0 on the local engine.
    """
    from .pricing import UnknownPrice, estimate_cost, estimate_eval_cost

    try:
        train = estimate_cost(rows, model, epochs=epochs, batch_size=batch_size, max_steps=max_steps)
    except UnknownPrice:
        return {"usd": None, "train_usd": None, "eval_usd": None, "tokens": None, "evals": evals, "exact": None,
                "price_source": None, "price_date": None}
    full = (train.rows // batch_size) * epochs
    tokens = round(train.tokens * epochs * (train.steps / full if full else 1.0))
    eval_usd = 0.0
    if eval_rows is not None and evals:
        try:
            eval_usd = estimate_eval_cost(eval_rows, model, max_tokens=eval_max_tokens).usd * evals
        except UnknownPrice:
            eval_usd = None
    if engine == "local":
        train_usd, eval_usd = 0.0, 0.0
    else:
        train_usd = train.usd
    usd = None if eval_usd is None else train_usd + eval_usd
    return {"usd": usd, "train_usd": train_usd, "eval_usd": eval_usd, "tokens": tokens, "evals": evals,
            "exact": train.exact, "price_source": train.price.source, "price_date": train.price.date}


#: Settings a resumed run takes from the run it continues (so the resumed run is the same run).
_RESUMED = ("epochs", "batch_size", "max_steps", "learning_rate", "lora_rank", "seed", "max_length",
            "lr_schedule", "save_every", "submit_ahead", "model", "engine")


def sft(data: Any, model: str | None = None, engine: str | None = None, *, epochs: int = 10,
        max_steps: int | None = None, learning_rate: float | None = None, batch_size: int = 8,
        lora_rank: int | None = None, log_dir: str | os.PathLike | None = None,
        workspace: str | os.PathLike | None = None, name: str | None = None,
        resume: str | os.PathLike | None = None, seed: int = 0, max_length: int | None = None,
        lr_schedule: str = "linear", save_every: int = 20, max_usd: float | None = None,
        base_url: str | None = None, progress: bool = True, on_metrics: Any = None,
        eval_data: Any = None, eval_every: int | None = None, eval_max_tokens: int = 32,
        eval_temperature: float = 0.0) -> TrainResult:
    """Supervised fine-tuning with tinker-cookbook's `supervised.train.main`, on `engine`.

    The cookbook's loop runs unchanged in a child process and reaches the engine through the real
    tinker SDK: the local engine's server (started in this process) or Tinker at `base_url`.
    With `eval_data`, the loop itself calls the held-out evaluator (heldout.py, the cookbook's
    `SamplingClientEvaluator` interface) every `eval_every` steps, and the final checkpoint is
    scored the same way: `metrics.jsonl` gains `test/accuracy` and `test/format_rate` per eval
    step, `heldout.jsonl` keeps the per-row results, and the result says which step was best.

    Args:
        data: chat JSONL path (or a list of export lines / a DataFrame of them); a checked copy is
            written to `<log dir>/train.jsonl` and is what the cookbook reads.
        model: default None = the engine's default (`machine_nb.engines.local.DEFAULT_MODEL`
            locally; Tinker has none). A Tinker model on the local engine is an EngineError.
        engine: "local" or "tinker"; default None = the model's own ("local/…" → local).
            `engine="tinker"` with a local model works against a `machine-nb serve` base URL.
        epochs: passes over the data (default 10: one epoch of 48 rows at batch 8 is 6 steps,
            too few to learn a format).
        max_steps: stop after this many steps (default None: epochs x full batches).
        learning_rate: default None = 3e-3 for a local LoRA (5e-4 at rank 0), the cookbook's
            `get_lr` on Tinker (1e-4 when it knows none); linear decay to 0 (`lr_schedule`).
        batch_size: rows per step (default 8; the partial last batch is dropped, as the cookbook does).
        lora_rank: default None = 8 for local models, 32 on Tinker (the cookbook's); 0 = full
            fine-tuning (local models only).
        log_dir / workspace / name: where the run writes (default: a fresh `runs/sft-<time>-<hex>`
            under the cwd, or `<workspace>/.machine/training/<name>`). It must be new or empty.
        resume: a log dir of an interrupted sft run to continue; its settings are the ones it was
            started with. It continues after the last step its last checkpoint's state holds, as
            `metrics.jsonl` shows (a state holding the last step is saved as the final checkpoint,
            untrained); on the local engine it ends with the steps, tokens, losses and weights of
            an uninterrupted run (tested; on Tinker the same records are written, not tested). A
            step whose row is missing is trained again and named in
            `TrainResult.unconfirmed_steps` (see `exact_resume_point`).
        seed: data shuffling (default 0). On the local engine the same call twice gives the same
            losses and outputs (LoRA adapters start from the engine's fixed seed).
        max_length: tokens per example (default None = the local model's context, 128; no limit on Tinker).
        save_every: checkpoint every N steps (default 20, the cookbook's), so a Ctrl-C loses little.
        max_usd: Tinker budget; refused before spending when the estimate (training plus the
            held-out evals at `eval_max_tokens` a reply) is over it or a price is unknown (default
            None: no budget, but an unknown training price is still refused). Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's).
        progress: show a progress bar (steps, loss, last held-out accuracy).
        on_metrics: default None; a function called in the caller's thread with each list of new
            `metrics.jsonl` rows while the run writes them (e.g. to refresh a LossPlot live).
        eval_data: held-out eval rows to score while training (a JSONL path or a list of row dicts,
            evaluate()'s shape); every row is checked before anything is written, and a copy goes
            to `<log dir>/heldout_data.jsonl`. Default None: no held-out evals. Choose steps and
            settings on a validation set (the corpus's valid.jsonl) and report the chosen
            checkpoint once on another (eval.jsonl): the set you choose on flatters the choice.
        eval_every: score every N steps (the eval at step s sees the weights after s steps; step
            0 is the base model). Default None = once an epoch (rows // batch_size steps).
        eval_max_tokens / eval_temperature: the evals' sampling, as evaluate() takes it (default
            32 tokens, greedy); recorded with every score, since scores move with them.
    Returns:
        The TrainResult read back from the log dir. A Ctrl-C stops the run and re-raises
        KeyboardInterrupt; the log dir then reads back with `read_training_log` (complete=False)
        and `sft(data, resume=log_dir)` finishes it.
    """
    from . import engines

    submit_ahead = 1  # the cookbook's default: the next batch is prepared while one trains
    if resume is not None:
        path = Path(resume).absolute()
        claim_log_dir(path, resume=True)
        saved = load_marker(path)
        if saved.get("kind", "sft") != "sft":
            raise ValueError(f"resume={str(path)!r} is a {saved['kind']} run: continue it with "
                             f"machine_nb.{saved['kind']}(…, resume=…), not sft()")
        epochs, batch_size, max_steps = saved["epochs"], saved["batch_size"], saved.get("max_steps")
        learning_rate, lora_rank, seed = saved["learning_rate"], saved["lora_rank"], saved["seed"]
        max_length, lr_schedule = saved.get("max_length"), saved.get("lr_schedule", lr_schedule)
        save_every, submit_ahead = saved.get("save_every", save_every), saved.get("submit_ahead", submit_ahead)
        model, engine = saved["model"], saved["engine"]
        held = saved.get("heldout")
        eval_data = path / HELDOUT_DATA if held else None
        if held:
            eval_every, eval_max_tokens = held["every"], held["max_tokens"]
            eval_temperature = held["temperature"]
    if engine is None:
        engine = engines.engine_for(model) if model else "local"
    if engine not in engines.ENGINES:
        raise EngineError(f"Unknown engine {engine!r}: use 'local' or 'tinker'.")
    if model is None:
        model = engines.default_model(engine)
    engines.check_model(engine, model)
    local_model = render.is_local_model(model)
    if engine == "tinker":  # refuse an unbounded cost first, before anything else is looked up
        from .pricing import UnknownPrice, price_for

        if price_for(model).train is None:
            raise UnknownPrice(f"No training price is known for {model!r}: cannot bound the cost of training it. "
                               f"Call machine_nb.pricing.set_price({model!r}, train=…) with Tinker's price.")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be at least 1 (got epochs={epochs}, batch_size={batch_size})")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be at least 1 or None, got {max_steps}")
    if lora_rank is None:
        lora_rank = LOCAL_LORA_RANK if local_model else TINKER_LORA_RANK
    if lora_rank < 0 or (lora_rank == 0 and not local_model):
        raise ValueError(f"lora_rank must be at least 1 (0 = full fine-tuning, local models only), got {lora_rank}")

    source = data
    if resume is not None and (Path(resume) / "train.jsonl").exists():
        source = Path(resume).absolute() / "train.jsonl"  # the very rows the run started with
    rows, train_on = prepare_data(source)
    if len(rows) < batch_size:
        raise ValueError(f"{len(rows)} training rows make no full batch of {batch_size}; the cookbook would "
                         "train 0 steps. Lower batch_size or add rows.")
    steps_total = (len(rows) // batch_size) * epochs
    if max_steps is not None:
        steps_total = min(steps_total, max_steps)
    heldout = held_rows = None
    if eval_data is not None:
        heldout = _heldout_settings(eval_data, model, eval_every, len(rows) // batch_size, eval_max_tokens,
                                    eval_temperature, steps_total)
        held_rows = heldout.pop("rows")
        if resume is not None and saved.get("heldout"):  # the file the run was started with, not its copy
            heldout.update(source=saved["heldout"].get("source"), source_sha256=saved["heldout"].get("source_sha256"))

    renderer = render.renderer_name(model)
    if local_model and max_length is None:
        max_length = engines.model_context(render.base_model(model))
    # the very checks validate() runs (shape, secrets, length against the model's context, trained
    # tokens): a row validate rejects is refused here too, on both engines, before anything is written
    from .validate import preflight

    overlap = heldout["source"] if heldout and heldout["source"] and Path(heldout["source"]).is_file() else None
    preflight(rows, model, max_length if max_length is not None else "auto", train_on_what=train_on,
              eval_path=overlap)

    # refuse before spending (and before writing anything): over budget, no key, not Tinker
    estimate = run_estimate(rows, model, engine, epochs=epochs, batch_size=batch_size, max_steps=max_steps,
                            eval_rows=held_rows, evals=heldout["evals"] if heldout else 0,
                            eval_max_tokens=eval_max_tokens)
    if engine == "tinker":
        from .pricing import check_budget

        check_budget(estimate["usd"], max_usd, f"training {model} for {epochs} epoch(s)"
                     + (f" with {estimate['evals']} held-out evals" if heldout else ""))
    url = engines.check_service(engine, base_url, (model,))

    if resume is None:
        path = Path(log_dir).absolute() if log_dir is not None else new_log_dir(workspace=workspace, name=name)
        claim_log_dir(path, resume=False)
        write_jsonl(rows, path / "train.jsonl")
        if held_rows is not None:
            write_jsonl(held_rows, path / HELDOUT_DATA)
        if learning_rate is None:
            learning_rate = _default_lr(engine, model, lora_rank)
        marker = {"engine": engine, "model": model, "renderer": renderer, "train_on_what": train_on,
                  "rows": len(rows), "epochs": epochs, "batch_size": batch_size, "max_steps": max_steps,
                  "learning_rate": learning_rate, "lora_rank": lora_rank, "seed": seed, "max_length": max_length,
                  "lr_schedule": lr_schedule, "save_every": save_every, "submit_ahead": submit_ahead,
                  "source": str(data) if isinstance(data, (str, os.PathLike)) else "<in-memory rows>",
                  "heldout": heldout, "estimate": estimate}
        from .jsonl import atomic_write_text

        atomic_write_text(path / MARKER, json.dumps(marker, indent=1))

    spec = {"module": __name__, "data_path": str(path / "train.jsonl"), "log_dir": str(path),
            "model": render.base_model(model), "renderer": renderer, "train_on_what": train_on,
            "max_length": max_length, "batch_size": batch_size, "seed": seed, "learning_rate": learning_rate,
            "lr_schedule": lr_schedule, "epochs": epochs, "lora_rank": lora_rank, "base_url": url,
            "save_every": save_every, "max_steps": max_steps, "submit_ahead": submit_ahead,
            "resume": resume is not None, "local_models": local_model,
            "heldout": None if heldout is None else {**heldout, "path": str(path / HELDOUT_DATA)}}

    from .progress import progress as progress_bar

    before = log_entries(path) if resume is not None else set()
    tail = MetricsTail(path / "metrics.jsonl")
    seen_steps: set[int] = set()
    watchdog = engines.watchdog(engine, url)
    with progress_bar(total=steps_total, desc="sft", unit="steps", enabled=None if progress else False) as bar, \
            watchdog as dog:

        def poll() -> None:
            new = tail.new_rows()
            steps = [m for m in new if SFT_LOSS in m and m.get("step") not in seen_steps]
            seen_steps.update(m.get("step") for m in steps)
            scored = [m[HELDOUT_ACCURACY] for m in new if isinstance(m.get(HELDOUT_ACCURACY), (int, float))]
            if scored:
                bar.set_postfix(heldout=float(scored[-1]))
            if steps:
                bar.update(len(steps), loss=float(steps[-1][SFT_LOSS]))
            if new and on_metrics is not None:
                on_metrics(new)

        try:
            run_cookbook(spec, path, engine=engine, on_poll=poll, watchdog=dog)
        finally:
            private_files(path, before)
    result = read_training_log(path)
    result.model, result.engine = model, engine
    return result


def smoke(data: Any, model: str | None = None, engine: str | None = None, *, steps: int = 2,
          batch_size: int | None = None, **kwargs: Any) -> TrainResult:
    """A real 2-step run (`steps`) through the same path as `sft`: proves data, engine and loop work.

    batch_size: default None = min(8, rows) so even a tiny file gives full batches. Other keyword
    arguments go to `sft` (e.g. `log_dir`, `max_usd`; epochs defaults to enough for `steps`).
    """
    rows, _ = prepare_data(data)
    if batch_size is None:
        batch_size = max(1, min(8, len(rows)))
    per_epoch = max(1, len(rows) // batch_size)
    kwargs.setdefault("epochs", -(-steps // per_epoch))
    return sft(data, model, engine, max_steps=steps, batch_size=batch_size, **kwargs)
