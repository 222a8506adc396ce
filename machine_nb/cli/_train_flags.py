"""The flag groups the training commands share (`sft`, `smoke`, `sweep`, `dpo`), and how they print a run.

Each group is added with one call, so a flag reads the same in every command that has it: where
to train (`--model`, `--engine`), what a Tinker run may spend (`--max-usd`, `--yes`, `--json`),
where the run writes (`--log-dir`, `--workspace`, `--resume`), its schedule (`--epochs`,
`--steps`, `--learning-rate`, `--batch-size`, `--lora-rank`) and its held-out evals (`--eval`,
`--eval-every`); `print_result` prints a finished run the same way for each.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

#: What the commands print instead of spending when a Tinker run has no model to price.
NEEDS_MODEL = "machine-nb: --engine tinker needs --model (e.g. {example})"


def add_target(p: argparse.ArgumentParser, *, engine_default: str = "the model's engine; local when no model is given",
               model_default: str = "the engine's; local/arith-tiny on the local engine") -> None:
    """--model and --engine.

    Args:
        p: the command's parser.
        engine_default: what --engine defaults to, in words.
        model_default: what --model defaults to, in words.
    """
    p.add_argument("--model", default=None, help=f"base model (default: {model_default})")
    p.add_argument("--engine", choices=["local", "tinker"], default=None,
                   help=f"where to train (default: {engine_default})")


def add_spend(p: argparse.ArgumentParser, *, budget_of: str = "the run",
              json_help: str = "print the result as one JSON object") -> None:
    """--max-usd, --yes and --json.

    Args:
        p: the command's parser.
        budget_of: what --max-usd bounds, in words (default "the run").
        json_help: what --json prints.
    """
    p.add_argument("--max-usd", type=float, default=None,
                   help=f"Tinker budget for {budget_of}: refuse when the estimate is over it")
    p.add_argument("--yes", action="store_true", help="allow spending on Tinker (without it: print the estimate, exit 2)")
    p.add_argument("--json", action="store_true", help=json_help)


def add_log_dir(p: argparse.ArgumentParser) -> None:
    """--log-dir and --workspace.

    Args:
        p: the command's parser.
    """
    p.add_argument("--log-dir", default=None, help="log dir for this run (default: a fresh runs/… dir)")
    p.add_argument("--workspace", default=None, help="write the log dir under WORKSPACE/.machine/training/")


def add_resume(p: argparse.ArgumentParser, kind: str) -> None:
    """--resume.

    Args:
        p: the command's parser.
        kind: the kind of run it continues ("sft", "dpo").
    """
    p.add_argument("--resume", default=None,
                   help=f"continue the {kind} run in this log dir from its last checkpoint, with its own settings")


def add_schedule(p: argparse.ArgumentParser, *, unit: str, learning_rate: str, lora_rank: str) -> None:
    """--epochs, --steps, --learning-rate (--lr), --batch-size and --lora-rank.

    Args:
        p: the command's parser.
        unit: what a batch holds ("rows", "pairs").
        learning_rate: --learning-rate's default, in words.
        lora_rank: --lora-rank's default, in words.
    """
    p.add_argument("--epochs", type=int, default=10, help=f"passes over the {unit} (default 10)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: epochs x full batches)")
    p.add_argument("--learning-rate", "--lr", type=float, default=None,
                   help=f"peak learning rate, linear decay (default: {learning_rate})")
    p.add_argument("--batch-size", type=int, default=8,
                   help=f"{unit} per step (default 8; the partial last batch is dropped)")
    p.add_argument("--lora-rank", type=int, default=None, help=f"LoRA rank (default {lora_rank})")


def add_eval(p: argparse.ArgumentParser, *, every: str = "once an epoch", example: str = "data/minimal_sft/valid.jsonl",
             writes: bool = True) -> None:
    """--eval and --eval-every.

    Args:
        p: the command's parser.
        every: when --eval-every scores, in words (default "once an epoch").
        example: an eval file to name.
        writes: say that the evals write heldout.jsonl and join the estimate (default True).
    """
    more = ". Writes heldout.jsonl; on Tinker its sampling is in the estimate" if writes else ""
    p.add_argument("--eval", dest="eval_data", default=None,
                   help=f"held-out eval JSONL to score while training (e.g. {example}; default: none){more}")
    p.add_argument("--eval-every", type=int, default=None,
                   help=f"score --eval every N steps (default: {every}) and the final checkpoint")


def needs_model(args: argparse.Namespace, example: str) -> bool:
    """Whether a Tinker estimate can be made: it needs --model (else the reason goes to stderr).

    Args:
        args: the parsed flags.
        example: a model to suggest.

    Returns:
        True when --model is given.
    """
    if args.model:
        return True
    print(NEEDS_MODEL.format(example=example), file=sys.stderr)
    return False


def print_result(result: Any, as_json: bool, *, steps: str = "steps", loss: str = "loss") -> None:
    """A finished run as the commands print it: one JSON object, or a few lines for a reader.

    Args:
        result: the run's TrainResult.
        as_json: print `result.to_dict()` as one JSON object.
        steps: what a step is called in the summary line (default "steps").
        loss: the loss's name in it (default "loss").
    """
    if as_json:
        import json

        print(json.dumps(result.to_dict()))
        return

    def usd(v: float | None) -> str:
        return "unknown" if v is None else f"${v:.4f}"

    span = "–" if result.first_loss is None else f"{result.first_loss:.4f} → {result.last_loss:.4f}"
    cost = usd(result.cost_usd) + ("" if result.estimated_usd is None else f" (estimated {usd(result.estimated_usd)})")
    print(f"{result.model} on {result.engine}: {result.steps} {steps}, {result.tokens:,} tokens, {loss} {span}, "
          f"cost {cost}")
    if result.evals:
        final = "–" if result.heldout_accuracy is None else f"{result.heldout_accuracy:.1%}"
        print(f"held-out:   {final} at the final checkpoint; best {result.best_accuracy:.1%} at step "
              f"{result.best_step} ({result.evals} evals, heldout.jsonl)")
    if result.note:
        print(f"note:       {result.note}")
    print(f"checkpoint: {result.checkpoint}")
    print(f"log dir:    {result.log_dir}")
