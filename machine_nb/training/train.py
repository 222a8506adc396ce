"""Supervised fine-tuning: tinker-cookbook's own `supervised.train.main`, on the local engine or Tinker.

`sft` goes through the steps every run takes (loop.py): its settings resolved (SFTSettings), its
rows checked (`prepare_data`), then preflight (validate's checks, the held-out overlap, the cost
and the budget: pricing.py decides what a run may cost; the engine's service), one fresh log dir,
and the cookbook's loop unchanged in a child process (runner.py) against the engine's URL, with a
progress bar fed from `metrics.jsonl`. The loop reads its train.jsonl through `ChatFileBuilder`,
which gives the renderer each row as it was written (the cookbook's own file builder does not).
Both engines are the real tinker SDK; only the base URL, key and model differ. With `eval_data`,
the loop also calls the held-out evaluator (heldout.py) every `eval_every` steps. Reading a
finished (or interrupted) log dir back is runlog.py's (`read_training_log`, `training_metrics`,
`heldout_curve`, `heldout_results`; importable from here too).
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from . import loop
from ..checks import render
from ..core.chat import prepare_data
from .loop import LOCAL_LORA_RANK, TINKER_LORA_RANK, keep_runners, run_cookbook  # noqa: F401 (public here)
from .runlog import (DPO_LOSS, HELDOUT_ACCURACY, HELDOUT_DATA, HELDOUT_FILE, HELDOUT_FORMAT_RATE,  # noqa: F401
                     HELDOUT_PREFIX, LOSS_METRICS, MARKER, SFT_LOSS, TrainResult, heldout_curve, heldout_results,
                     loss_metric, new_log_dir, read_log_lines, read_training_log, training_metrics)

if TYPE_CHECKING:
    from ..checks.validate import ValidationResult

#: Defaults for local models: LoRA rank 8 (alpha 16, attention + MLP) at 3e-3, full fine-tuning
#: (rank 0) at 5e-4. benchmarks/bench_sft.py measures them; the local model's card
#: (machine_nb/engines/local/MODEL_CARD.md) reports what they reach.
LOCAL_LEARNING_RATE = 3e-3
LOCAL_FULL_LEARNING_RATE = 5e-4
#: Tinker default when the cookbook knows no learning rate for the model.
TINKER_LEARNING_RATE = 1e-4


@dataclass(frozen=True)
class SFTSettings(loop.RunSettings):
    """An sft run's settings, every default resolved (see loop.RunSettings for the shared ones).

    Args:
        submit_ahead: batches the cookbook prepares while one trains (default 1, the cookbook's).
    """

    kind: ClassVar[str] = "sft"
    loss: ClassVar[str] = SFT_LOSS
    shown: ClassVar[dict[str, str]] = {"loss": SFT_LOSS}
    resumed: ClassVar[tuple[str, ...]] = (*loop.RunSettings.resumed, "submit_ahead")

    submit_ahead: int = 1

    def default_learning_rate(self) -> float:
        """3e-3 for a local LoRA (5e-4 at rank 0); on Tinker the cookbook's `get_lr`, else 1e-4.

        Returns:
            The rate.
        """
        if render.is_local_model(self.model):
            return LOCAL_LEARNING_RATE if (self.lora_rank or 0) > 0 else LOCAL_FULL_LEARNING_RATE
        try:
            from tinker_cookbook.hyperparam_utils import get_lr

            return float(get_lr(self.model, is_lora=True))
        except Exception:  # the cookbook knows only Llama/Qwen families
            return TINKER_LEARNING_RATE

    def spec(self) -> dict[str, Any]:
        """The shared spec, with submit_ahead.

        Returns:
            A JSON-shaped dict.
        """
        return {**super().spec(), "submit_ahead": self.submit_ahead}


class SFTData(loop.RunData):
    """Chat rows as `prepare_data` checked them, and what the cookbook trains on in them.

    Args:
        items: the rows (`{"messages": [...]}`).
        train_on_what: the cookbook's TrainOnWhat value for them.
    """

    file: ClassVar[str] = "train.jsonl"
    noun: ClassVar[str] = "training rows"
    unit: ClassVar[str] = "rows"
    item: ClassVar[str] = "line"

    def __init__(self, items: list[dict], train_on_what: str):
        super().__init__(items)
        self.train_on_what = train_on_what

    def validate(self, settings: loop.RunSettings) -> "ValidationResult":
        """validate()'s checks (shape, secrets, length against the model's context, trained tokens):
        a row validate rejects is refused here too, on both engines.

        Args:
            settings: model and max_length.

        Returns:
            The ValidationResult.

        Raises:
            ValidationFailed: naming the first rows that fail.
        """
        from ..checks.validate import preflight

        return preflight(self.items, settings.model,
                         settings.max_length if settings.max_length is not None else "auto",
                         train_on_what=self.train_on_what)

    def record(self) -> dict[str, Any]:
        """train_on_what and the number of rows.

        Returns:
            Record keys.
        """
        return {"train_on_what": self.train_on_what, "rows": len(self.items)}


def sft(data: Any, model: str | None = None, engine: str | None = None, *, epochs: int = 10,
        max_steps: int | None = None, learning_rate: float | None = None, batch_size: int = 8,
        lora_rank: int | None = None, log_dir: str | os.PathLike | None = None,
        workspace: str | os.PathLike | None = None, name: str | None = None,
        resume: str | os.PathLike | None = None, seed: int = 0, max_length: int | None = None,
        lr_schedule: str = "linear", save_every: int = 20, max_usd: float | None = None,
        base_url: str | None = None, progress: bool | None = None,
        on_metrics: Callable[[list[dict]], Any] | None = None, eval_data: Any = None,
        eval_every: int | None = None, eval_max_tokens: int = 32, eval_temperature: float = 0.0,
        inspect_tasks: Any = None) -> TrainResult:
    """Supervised fine-tuning with tinker-cookbook's `supervised.train.main`, on `engine`.

    The cookbook's loop runs unchanged in a child process and reaches the engine through the real
    tinker SDK: the local engine's server (started in this process) or Tinker at `base_url`.
    With `eval_data`, the loop itself calls the held-out evaluator (heldout.py, the cookbook's
    `SamplingClientEvaluator` interface) every `eval_every` steps, and the final checkpoint is
    scored the same way: `metrics.jsonl` gains `test/accuracy` and `test/format_rate` per eval
    step, `heldout.jsonl` keeps the per-row results, and the result says which step was best.
    Everything is checked before anything is written (loop.preflight).

    Args:
        data: chat JSONL path (or a list of export lines / a DataFrame of them); a checked copy is
            written to `<log dir>/train.jsonl` and is what the cookbook reads.
        model: default None = the engine's default (`local/arith-tiny` locally; Tinker has
            none). A Tinker model on the local engine is an EngineError.
        engine: "local" or "tinker"; default None = the model's own ("local/…" → local).
            `engine="tinker"` with a local model works against a `machine-nb serve` base URL.
        epochs: passes over the data (default 10: one epoch of 48 rows at batch 8 is 6 steps,
            too few to learn a format).
        max_steps: stop after this many steps (default None: epochs x full batches).
        learning_rate: default None = LOCAL_LEARNING_RATE for a local LoRA
            (LOCAL_FULL_LEARNING_RATE at rank 0), the cookbook's `get_lr` on Tinker
            (TINKER_LEARNING_RATE when it knows none); `lr_schedule` applies.
        batch_size: rows per step (default 8; the partial last batch is dropped, as the cookbook does).
        lora_rank: default None = 8 for local models, 32 on Tinker (the cookbook's); 0 = full
            fine-tuning (local models only).
        log_dir: where the run writes; it must be new or empty (default None: a fresh
            `runs/sft-<time>-<hex>` under the cwd, or under `workspace`).
        workspace: default None; a workspace puts the log dir in `<workspace>/.machine/training/`.
        name: the log dir's name there (default None: `sft-<time>-<hex>`).
        resume: a log dir of an interrupted sft run to continue (default None); its settings are
            the ones it was started with. It continues after the last step its last checkpoint's
            state holds, as `metrics.jsonl` shows (a state holding the last step is saved as the
            final checkpoint, untrained); on the local engine it ends with the steps, tokens,
            losses and weights of an uninterrupted run (tested; on Tinker the same records are
            written, not tested). A step whose row is missing is trained again and named in
            `TrainResult.unconfirmed_steps` (see `exact_resume_point`).
        seed: data shuffling, 0 or more (default 0). On the local engine the same call twice gives
            the same losses and outputs (LoRA adapters start from the engine's fixed seed).
        max_length: tokens per example (default None = a local model's context, 128 for
            `local/arith-tiny`; no limit on Tinker).
        lr_schedule: the cookbook's schedule (default "linear": decays to 0).
        save_every: checkpoint every N steps (default 20, the cookbook's), so a Ctrl-C loses little.
        max_usd: Tinker budget; refused before spending when the estimate (training plus the
            held-out evals at `eval_max_tokens` a reply) is over it or a price is unknown (default
            None: no budget, but an unknown training price is still refused). Local runs cost 0.
        base_url: Tinker service URL (default None: $TINKER_BASE_URL, else Tinker's). Credentials in
            it (`https://user:token@host`) are connected with, never written to the log dir (its
            config.json records None); a query (`?api_key=…`) is refused (engines.check_base_url).
        progress: show a progress bar (steps, loss, last held-out accuracy); default None: in a
            notebook or terminal unless MACHINE_NB_PROGRESS=0 (machine_nb.core.progress decides).
        on_metrics: default None; a function called in the caller's thread with each list of new
            `metrics.jsonl` rows while the run writes them (e.g. a LossPlot's `update`).
        eval_data: held-out eval rows to score while training (a JSONL path, a list of row dicts,
            evaluate()'s shape, or a DataFrame of them whose empty cells are fields a row lacks);
            every row is checked before anything is written, a training row whose prompt is one of
            them is refused, and a copy of the fields the evals read goes to
            `<log dir>/heldout_data.jsonl`. Default None: no held-out evals. Choose steps and
            settings on a validation set (the corpus's valid.jsonl) and report the chosen
            checkpoint once on another (eval.jsonl): the set you choose on flatters the choice.
        eval_every: score every N steps (the eval at step s sees the weights after s steps; step
            0 is the base model). Default None = once an epoch (rows // batch_size steps).
        eval_max_tokens: the evals' reply budget, as evaluate() takes it (default 32); recorded
            with every score, since scores move with it.
        eval_temperature: the evals' sampling temperature (default 0.0: greedy); recorded too.
        inspect_tasks: Inspect AI tasks to run at the same steps (`eval_every`; default once an
            epoch) and on the final checkpoint, through tinker-cookbook's `InspectEvaluatorBuilder`
            on the loop's sampling client, at `eval_max_tokens` and `eval_temperature`, seed 0:
            registry names or task files ("tasks.py@name"), since the loop runs in a child process
            (a Task object is refused, saying so). Their scores go into `metrics.jsonl` as
            `test/inspect/<dataset>/<metric>` beside the held-out rows' `test/accuracy` (the
            held-out curve's steps; `machine_nb.evaluation.inspect_bridge.inspect_curve` reads them), Inspect's
            logs of each step into `<log dir>/inspect/` (load_results reads them). Needs
            `pip install "machine_nb[inspect]"`. Default None: none.

    Returns:
        The TrainResult read back from the log dir. A Ctrl-C stops the run and re-raises
        KeyboardInterrupt; the log dir then reads back with `read_training_log` (complete=False)
        and `sft(data, resume=log_dir)` finishes it.

    Raises:
        MachineFormatError / ValidationFailed: rows (or eval rows) that are refused, naming them.
        BudgetExceeded: on Tinker, over `max_usd` or a price unknown. EngineError: the engine
        cannot serve the model, or the run failed. FileExistsError: a log dir in use.
    """
    resumed = loop.resume_record(resume, "sft")
    settings = SFTSettings.resolve(
        resumed, model=model, engine=engine, epochs=epochs, max_steps=max_steps, learning_rate=learning_rate,
        batch_size=batch_size, lora_rank=lora_rank, seed=seed, max_length=max_length, lr_schedule=lr_schedule,
        save_every=save_every, max_usd=max_usd, base_url=base_url, eval_every=eval_every,
        eval_max_tokens=eval_max_tokens, eval_temperature=eval_temperature)
    inspect = loop.inspect_spec(inspect_tasks, settings, "sft")
    # before the runner starts: a resume whose rows are gone is refused first
    source = loop.data_source(resumed, SFTData.file, data)
    loop.refuse_if_training(resume if resume is not None else log_dir)
    loop.start_runner()
    rows = SFTData(*prepare_data(source))
    return loop.train(settings, rows, module=__name__, eval_data=eval_data, resumed=resumed, log_dir=log_dir,
                      workspace=workspace, name=name, source=data, progress=progress, on_metrics=on_metrics,
                      train_on_what=rows.train_on_what, resume=resumed is not None,
                      **({"inspect": inspect} if inspect else {}))


def smoke(data: Any, model: str | None = None, engine: str | None = None, *, steps: int = 2,
          batch_size: int | None = None, **kwargs: Any) -> TrainResult:
    """A real 2-step run through the same path as `sft`: proves data, engine and loop work.

    Args:
        data: as sft takes it (rows from an iterator are read into a list first).
        model: as sft takes it (default None: the engine's).
        engine: as sft takes it (default None: the model's).
        steps: steps to run (default 2).
        batch_size: default None = min(8, rows), so even a tiny file gives full batches.
        **kwargs: other sft arguments (e.g. `log_dir`, `max_usd`; epochs defaults to enough for `steps`).

    Returns:
        sft's TrainResult.

    Raises:
        ValueError: steps not a whole number of at least 1; and whatever sft raises.
    """
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ValueError(f"steps must be a whole number, at least 1 (got {steps!r})")
    steps = int(steps)
    if not isinstance(data, (str, os.PathLike, list)) and not hasattr(data, "columns"):
        data = list(data)  # read here and again by sft: an iterator would reach sft empty
    rows, _ = prepare_data(data)
    if batch_size is None:
        batch_size = max(1, min(8, len(rows)))
    per_epoch = max(1, len(rows) // batch_size)
    kwargs.setdefault("epochs", -(-steps // per_epoch))
    return sft(data, model, engine, max_steps=steps, batch_size=batch_size, **kwargs)


# ---------------------------------------------------------------------------------------------
# the half that runs in the child process (runner.py)


@dataclass(frozen=True)
class ChatFileBuilder:
    """The cookbook's supervised dataset of a train.jsonl, each row given to the renderer as written.

    tinker-cookbook's `FromConversationFileBuilder` loads the file with `datasets`, which gives
    every message every key some message in the file has, set to None (a row with no tool call
    reaches the renderer with `"tool_calls": None`, which Inkling's and Qwen3's renderers cannot
    iterate), and needs one type per field across the file. Here each row is kept as its JSON
    text and parsed again when its batch is built (`renderer_messages`); rows are shuffled,
    batched and turned into datums (`conversation_to_datum`) as the cookbook's builder does, with
    the same order for the same seed. Its fields land in the run's config.json, so they are plain
    values.

    Args:
        file_path: the JSONL file, one `{"messages": [...]}` a line.
        model: the model whose tokenizer renders the rows.
        renderer: the renderer's name.
        max_length: tokens per example (None: no limit).
        batch_size: rows per batch.
        train_on_what: the cookbook's TrainOnWhat value.
        shuffle_seed: the order's seed (None: the file's order).
    """

    file_path: str
    model: str
    renderer: str
    max_length: int | None
    batch_size: int
    train_on_what: str
    shuffle_seed: int | None = 0

    def __call__(self) -> tuple[Any, None]:
        """The training dataset (no test split).

        Returns:
            (the cookbook's SupervisedDatasetFromHFDataset, None).
        """
        import datasets
        from tinker_cookbook import renderers
        from tinker_cookbook.supervised.data import SupervisedDatasetFromHFDataset, conversation_to_datum
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        from ..checks.render import renderer_messages

        with open(self.file_path, encoding="utf-8") as fh:
            rows = [{"row": line} for line in (raw.strip() for raw in fh) if line]
        dataset = datasets.Dataset.from_list(rows)
        if self.shuffle_seed is not None:
            dataset = dataset.shuffle(seed=self.shuffle_seed)
        renderer = renderers.get_renderer(self.renderer, get_tokenizer(self.model))
        train_on_what = renderers.TrainOnWhat(self.train_on_what)

        def datum(row: dict) -> Any:
            messages = renderer_messages(json.loads(row["row"])["messages"])
            return conversation_to_datum(messages, renderer, self.max_length, train_on_what)

        return SupervisedDatasetFromHFDataset(dataset, batch_size=self.batch_size, map_fn=datum), None


def _sft_config(spec: dict) -> Any:
    """The cookbook's supervised Config for a spec `sft` wrote (runs in the child process)."""
    from tinker_cookbook.supervised import train as cookbook_train

    builder = ChatFileBuilder(file_path=spec["data_path"], model=spec["model"], renderer=spec["renderer"],
                              max_length=spec["max_length"], batch_size=spec["batch_size"],
                              train_on_what=spec["train_on_what"], shuffle_seed=spec["seed"])
    return cookbook_train.Config(
        log_path=spec["log_dir"], model_name=spec["model"], recipe_name="machine_nb_sft",
        renderer_name=spec["renderer"], dataset_builder=builder, learning_rate=spec["learning_rate"],
        lr_schedule=spec["lr_schedule"], num_epochs=spec["epochs"], lora_rank=spec["lora_rank"],
        base_url=spec["base_url"], save_every=spec["save_every"], eval_every=0, infrequent_eval_every=0,
        max_steps=spec["max_steps"], submit_ahead=spec["submit_ahead"], ttl_seconds=None)


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

    Args:
        log_dir: the run's log dir.
        config: its cookbook Config.

    Returns:
        The record appended to checkpoints.jsonl, or None (nothing to resume from).
    """
    from tinker_cookbook import checkpoint_utils

    from .runner import config_steps

    last = checkpoint_utils.get_last_checkpoint(log_dir)
    if last is None or last.batch is None:
        return None
    if last.extra.get("machine_nb_resume"):
        return last.to_dict()
    dataset, n_batches, total = config_steps(config)
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
    (its loop would train nothing and so save no final checkpoint). Its SDK session is finished
    when it is done."""
    import tinker
    from tinker_cookbook import checkpoint_utils
    from tinker_cookbook.utils.git_rev import recipe_user_metadata

    service = tinker.ServiceClient(base_url=config.base_url, user_metadata=recipe_user_metadata(config.recipe_name))
    status = "errored"
    try:
        metadata: dict[str, str] = {}
        checkpoint_utils.add_renderer_name_to_user_metadata(metadata, config.renderer_name)
        client = await service.create_training_client_from_state_with_optimizer_async(record["state_path"],
                                                                                       user_metadata=metadata)
        await checkpoint_utils.save_checkpoint_async(
            training_client=client, name="final", log_path=config.log_path, kind="both",
            loop_state={"epoch": config.num_epochs, "batch": 0,
                        "elapsed_tokens": int(record.get("elapsed_tokens", 0))},
            ttl_seconds=None)
        status = "success"
    finally:
        # the training process is kept for the next run: a session left open would go on heart-beating
        with contextlib.suppress(Exception):  # a server already gone has no session to finish
            service.close(status).result(timeout=30)


def child_run(spec: dict) -> None:
    """The sft half that runs in the child (runner.py): the cookbook's loop, unchanged, resumed
    exactly (`exact_resume_point`); with held-out evals or Inspect tasks, runner.run_loop puts
    them in the loop's evaluators and scores the final checkpoint.

    Args:
        spec: what `sft` wrote (loop.child_spec).
    """
    import asyncio

    from tinker_cookbook.supervised import train as cookbook_train

    from .runner import config_steps, run_loop

    config = _sft_config(spec)
    record = exact_resume_point(spec["log_dir"], config) if spec.get("resume") else None

    def main(config: Any) -> None:
        if record is not None and int(record.get("steps_in_state", -1)) >= config_steps(config)[2]:
            asyncio.run(_final_from_state(config, record))
        else:
            asyncio.run(cookbook_train.main(config))

    run_loop(spec, config, main, last=False)


__all__ = ["sft", "smoke", "SFTSettings", "SFTData", "ChatFileBuilder", "exact_resume_point",
           "child_run", "keep_runners", "run_cookbook", "TrainResult", "read_training_log", "training_metrics",
           "heldout_curve", "heldout_results", "loss_metric", "new_log_dir", "LOCAL_LORA_RANK", "TINKER_LORA_RANK",
           "LOCAL_LEARNING_RATE", "LOCAL_FULL_LEARNING_RATE", "TINKER_LEARNING_RATE", "SFT_LOSS", "DPO_LOSS",
           "LOSS_METRICS", "HELDOUT_PREFIX", "HELDOUT_ACCURACY", "HELDOUT_FORMAT_RATE", "HELDOUT_FILE", "HELDOUT_DATA",
           "MARKER"]
