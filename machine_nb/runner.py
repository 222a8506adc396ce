"""Run one of tinker-cookbook's training loops in a child process, exactly as a script would.

`sft` (train.py) hands this module a plain-JSON spec; the child builds the cookbook's own Config
and runs `supervised.train.main` with `asyncio.run`, talking to the engine through the real
tinker SDK (`Config.base_url`). A child process, because the cookbook's loop configures the
process's logging for itself (it replaces the root logger's handlers and logs every step at
INFO): in a notebook kernel that would rewire the user's logging and flood the cell. Here its
console output goes to `<log dir>/train.log` (Machine's own habit) and nothing of the caller's
process is touched. The child exits when its parent does (it watches its stdin), so it can
never outlive the notebook or script that started it.

The child serves one run after another (imports take seconds; the next run starts at once): a
spec per line on its stdin, a status per line on its stdout (`{"event": "ready" | "done" |
"error" | "interrupted"}`); everything else it prints goes to the run's log. After an error or
an interrupt it exits, and the next run gets a fresh child.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import traceback
from typing import Any


def _status(channel: Any, **event: Any) -> None:
    channel.write(json.dumps(event) + "\n")
    channel.flush()


def _sft_config(spec: dict) -> Any:
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


def exact_resume_point(log_dir: str, config: Any) -> dict | None:
    """Append the record from which the cookbook resumes a run exactly; returns it (None if none).

    The cookbook saves checkpoint N while finishing step N, after it has already submitted steps
    N+1 … N+submit_ahead, so the saved state holds min(N + submit_ahead, last) + 1 optimizer
    steps, yet the record says to resume at batch N: a plain resume would train those steps
    twice. The appended record points past them (epoch, batch, elapsed_tokens), so the resumed
    run continues from the exact state and ends with the losses and weights of an uninterrupted
    one. A record this function wrote already is left as it is.
    """
    from tinker_cookbook import checkpoint_utils

    last = checkpoint_utils.get_last_checkpoint(log_dir)
    if last is None or last.extra.get("machine_nb_resume") or last.batch is None:
        return None
    dataset, _ = config.dataset_builder()
    n_batches = len(dataset)
    if n_batches == 0:
        return None
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    epoch = last.epoch or 0
    if epoch >= config.num_epochs:  # the final record: nothing left to run
        return None
    saved_step = epoch * n_batches + last.batch
    # the state can already hold the last step; the cookbook then saves no final checkpoint for a
    # resume past the end, so that one step is run again (the only case that is not exact)
    done_through = min(saved_step + config.submit_ahead, total - 2)
    if done_through < saved_step:
        return None
    tokens = int(last.extra.get("elapsed_tokens", 0))
    for step in range(saved_step + 1, done_through + 1):
        e, b = divmod(step, n_batches)
        dataset.set_epoch(seed=e)
        tokens += sum(d.model_input.length for d in dataset.get_batch(b))
    e, b = divmod(done_through + 1, n_batches)
    record = {"name": last.name, "epoch": e, "batch": b, "state_path": last.state_path,
              "sampler_path": last.sampler_path, "elapsed_tokens": tokens, "machine_nb_resume": True,
              "steps_in_state": done_through + 1}
    with open(os.path.join(log_dir, checkpoint_utils.CHECKPOINTS_BASE_NAME), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def run(spec: dict) -> None:
    """Build the loop `spec` names and run it to the end (raises what it raises)."""
    if spec.get("local_models"):
        from .engines.local import use_local_models

        use_local_models()
    if spec["kind"] != "sft":
        raise ValueError(f"unknown training loop {spec['kind']!r}")
    from tinker_cookbook.supervised import train as cookbook_train

    config = _sft_config(spec)
    if spec.get("resume"):
        exact_resume_point(spec["log_dir"], config)
    asyncio.run(cookbook_train.main(config))


def _redirect(path: str | None) -> None:
    """Point this process's stdout and stderr (fds 1 and 2) at a run's log file (None: /dev/null)."""
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)


def main() -> int:
    """Serve specs, one line each on stdin, one at a time, until stdin closes.

    The process stays for the next run (tinker-cookbook and the SDK take seconds to import);
    each run applies the environment and working directory its spec carries, and writes its
    console output to the spec's `log` file.
    """
    import queue

    status = os.fdopen(os.dup(1), "w", encoding="utf-8")
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", buffering=1, closefd=False)
    _redirect(None)
    specs: "queue.Queue[dict | None]" = queue.Queue()

    def read_specs() -> None:
        try:
            for line in sys.stdin.buffer:
                specs.put(json.loads(line))
        except (OSError, ValueError):
            pass
        os._exit(3)  # the parent closed our stdin: it ended, or was killed

    threading.Thread(target=read_specs, name="machine-nb-specs", daemon=True).start()
    _status(status, event="ready")
    while True:
        spec = specs.get()
        os.environ.clear()
        os.environ.update(spec.get("env") or {})
        os.chdir(spec.get("cwd") or os.getcwd())
        _redirect(spec.get("log"))
        try:
            run(spec)
        except KeyboardInterrupt:
            _status(status, event="interrupted")
            return 130
        except BaseException as exc:  # reported to the parent, which raises it there
            traceback.print_exc()
            body = getattr(exc, "body", None)
            _status(status, event="error", type=type(exc).__name__, message=str(exc)[:4000],
                    body=body if isinstance(body, (dict, str)) else None)
            return 1
        finally:
            import logging

            for handler in logging.getLogger().handlers:  # the cookbook's, pointing at this run's files
                handler.flush()
            sys.stdout.flush()
            _redirect(None)
        _status(status, event="done")


if __name__ == "__main__":
    code = main()
    # leave at once: the spec reader thread would block the interpreter's normal shutdown
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
