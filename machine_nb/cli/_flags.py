"""The flag groups `machine-nb` subcommands share, the spending guard, and how a finished run prints.

Each group is added with one call, so a flag reads and behaves the same in every command that
has it: which model and engine (`--model`, `--engine`), how replies are sampled (`--max-tokens`,
`--temperature`, `--seed`, `--concurrency`), what a Tinker call may spend (`--max-usd`, `--yes`,
`--json`), and for the training commands where a run writes (`--log-dir`, `--workspace`,
`--resume`), its schedule (`--epochs`, `--steps`, `--learning-rate`, `--batch-size`,
`--lora-rank`), its held-out evals (`--eval`, `--eval-every`) and Inspect tasks (`--inspect-task`).
The values land on `args` under the usual names (`args.model`, `args.max_usd`, ...); what a
command does with them stays in its module.

Spending: a command that would spend on Tinker without `--yes` prints what it would spend and
exits 4 (`refuse_to_spend`, REFUSED_SPEND); on the local engine nothing is spent and `--yes` is
not needed. A schedule the trainer refuses (fewer rows than one batch) is refused as the trainer
refuses it (exit 1), not offered for `--yes`.

Values: a number flag's range is checked while parsing (`whole`, `number`, `PORT`), so a value no
command can use (a reply budget of 0, a NaN temperature, port 70000) is argparse's one-line usage
error naming the flag (exit 2, USAGE) before anything is loaded, started or written; so is a
negative seed (`SEED`), a budget that is not a finite amount of 0 or more (`--max-usd`). A path
flag (`path`) reads a leading `~` as the home folder, as a shell would where it leaves it alone
(`--out=~/x.jsonl`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable

ENGINES = ("local", "tinker")

#: Printed instead of an estimate when a Tinker command has no model to price.
NEEDS_MODEL = "machine-nb: --engine tinker needs --model (e.g. {example})"

#: Exit status of a command line to fix: argparse's usage errors, no subcommand, `--engine tinker`
#: without the `--model` an estimate needs.
USAGE = 2

#: Exit status of a command that refused to spend (it printed the estimate; `--yes` allows it).
#: Apart from USAGE (2) and from `candidate`'s refusing gate (3), so a script can tell them apart.
REFUSED_SPEND = 4


# --------------------------------------------------------------------------- values

def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse `type`: a whole number from `low` (to `high`, inclusive), else a usage error.

    A whole number may be written as Python reads one (`1000`, `1_000`, `0x10`, spaces around it)
    or with no fraction (`1e3`, `1000.0`); `1.5`, `nan` and `1e400` are refused.

    Args:
        low: the smallest value accepted.
        high: the largest (default None: no upper bound).

    Returns:
        The parser argparse calls with the flag's text.
    """
    wanted = f"a whole number, at least {low}" if high is None else f"a whole number from {low} to {high}"

    def parse(text: str) -> int:
        value = _whole_number(text)
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def _whole_number(text: str) -> int | None:
    """The whole number `text` writes, as Python reads one (10, 1_000, 0x10) or as a number with no
    fraction (1e3, 10.0); None for anything else (1.5, nan, 1e400, words)."""
    for base in (10, 0):  # base 0 reads 0x10, 0o17, 0b101; base 10 keeps 010 as ten
        try:
            return int(text, base)
        except ValueError:
            pass
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value.is_integer() else None


def number(low: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse `type`: a finite number, `low` or more (more than `low` with `above`), else a usage error.

    Args:
        low: the bound.
        above: refuse `low` itself (default False).

    Returns:
        The parser argparse calls with the flag's text; NaN and infinities are refused.
    """
    wanted = f"a finite number {'above' if above else 'of at least'} {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def finite(text: str) -> float:
    """An argparse `type`: any finite number (NaN and infinities are a usage error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def whole_list(text: str) -> list[int]:
    """An argparse `type`: comma-separated whole numbers ("0,1,2"), else a usage error."""
    parts = text.split(",")
    values = [_whole_number(p) for p in parts]
    if any(v is None for v in values) or any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers such as 0,1,2, got {text!r}")
    return values


#: A TCP port to bind: 0 (the system picks a free one) to 65535.
PORT = whole(0, 65535)

#: A seed: a whole number from 0 (the trainers and numpy's generators refuse a negative one).
SEED = whole(0)


def path(text: str) -> str:
    """An argparse `type` for a file or folder: a leading `~` is the home folder, as a shell reads it.

    A shell leaves `~` alone after `--out=` and inside quotes; without this the command would make
    a folder named "~" in the working directory.
    """
    return os.path.expanduser(text)


# --------------------------------------------------------------------------- where it runs

def model_flag(p: argparse.ArgumentParser, *,
               help: str = "base model (default: the engine's; local/arith-tiny locally)",  # noqa: A002
               short: bool = False) -> None:
    """Add `--model` (default None).

    Args:
        p: the subcommand's parser.
        help: the flag's help line (default: a base model, the engine's by default).
        short: also accept `-m` (default False).

    Returns:
        None; `args.model` is the model name or None.
    """
    names = ("-m", "--model") if short else ("--model",)
    p.add_argument(*names, default=None, help=help)


def engine_flag(p: argparse.ArgumentParser, *,
                help: str = "local or tinker (default: the engine that serves the model or checkpoint)",  # noqa: A002
                ) -> None:
    """Add `--engine {local,tinker}` (default None).

    Args:
        p: the subcommand's parser.
        help: the flag's help line.

    Returns:
        None; `args.engine` is "local", "tinker" or None.
    """
    p.add_argument("--engine", choices=ENGINES, default=None, help=help)


def target_flags(p: argparse.ArgumentParser, *,
                 engine_default: str = "the model's engine; local when no model is given",
                 model_default: str = "the engine's; local/arith-tiny on the local engine") -> None:
    """Add where a training command runs: `--model` and `--engine`.

    Args:
        p: the command's parser.
        engine_default: what --engine defaults to, in words.
        model_default: what --model defaults to, in words.

    Returns:
        None; `args.model` and `args.engine` hold the values (None: the defaults in words).
    """
    model_flag(p, help=f"base model (default: {model_default})")
    engine_flag(p, help=f"where to train (default: {engine_default})")


def engine_of(args: argparse.Namespace, source: str | None = None) -> str:
    """The engine a command runs on: `--engine`, else the one serving `--model` or `source`, else local.

    Args:
        args: the parsed flags (reads `engine` and `model`).
        source: a checkpoint or state path to take the engine from when no model is given
            (default None: none).

    Returns:
        "local" or "tinker".
    """
    from ..engines import engine_for

    if args.engine:
        return args.engine
    given = getattr(args, "model", None) or source
    return engine_for(given) if given else "local"


# --------------------------------------------------------------------------- sampling

def sampling_flags(p: argparse.ArgumentParser, *, per: str = "row", max_tokens: int = 32,
                   concurrency: bool = True) -> None:
    """Add how replies are sampled: `--max-tokens`, `--temperature`, `--seed` and `--concurrency`.

    The defaults are evaluate()'s: 32 tokens, greedy (so reruns agree), seed 0, and the engine's
    own concurrency.

    Args:
        p: the subcommand's parser.
        per: what one reply answers, in the help text (default "row"; "case" for held-out cases).
        max_tokens: the default reply budget (default 32).
        concurrency: add `--concurrency` (default True; False for commands that do not take it).

    Returns:
        None; `args.max_tokens`, `args.temperature`, `args.seed` (and `args.concurrency`: an int or
        None) hold the values.
    """
    p.add_argument("--max-tokens", type=whole(1), default=max_tokens,
                   help=f"reply budget per {per} (default {max_tokens})")
    p.add_argument("--temperature", type=number(0), default=0.0, help="default 0: greedy, so reruns agree")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    if concurrency:
        p.add_argument("--concurrency", type=whole(1), default=None,
                       help="requests in flight (default 32 on Tinker, 8 local)")


# --------------------------------------------------------------------------- spending

def spending_flags(p: argparse.ArgumentParser, *, budget_of: str = "the run",
                   json_help: str = "print the result as one JSON object") -> None:
    """Add the spending guard and the machine-readable output: `--max-usd`, `--yes`, `--json`.

    Args:
        p: the subcommand's parser.
        budget_of: what --max-usd bounds, in words (default "the run"; e.g. "the eval").
        json_help: the `--json` help line (say what is printed).

    Returns:
        None; `args.max_usd` (float or None), `args.yes` and `args.json` (bools) hold the values.
    """
    p.add_argument("--max-usd", type=number(0), default=None,
                   help=f"Tinker budget for {budget_of}: refuse before spending when the estimate is over it "
                        "(default: no limit)")
    p.add_argument("--yes", action="store_true",
                   help=f"allow spending on Tinker (without it: print the estimate, exit {REFUSED_SPEND})")
    p.add_argument("--json", action="store_true", help=json_help)


def eval_cost_text(rows: list[dict], model: str, *, max_tokens: int, samples_per_row: int = 1) -> str:
    """What sampling these rows on Tinker could cost, in words (pricing.estimate_eval_cost).

    Args:
        rows: rows with "messages" (eval, probe or case prompts).
        model: the model whose price applies.
        max_tokens: the reply budget per sample.
        samples_per_row: samples per row (default 1; 2 for a probe's base and checkpoint, more
            for trials).

    Returns:
        "up to $X (P prompt tokens, ≤R reply tokens)", or "an unknown amount (why)" when the
        model has no known price.
    """
    from ..checks.pricing import UnknownPrice, estimate_eval_cost

    try:
        est = estimate_eval_cost(rows, model, max_tokens=max_tokens, samples_per_row=samples_per_row)
    except UnknownPrice as exc:
        return f"an unknown amount ({exc})"
    return f"up to ${est.usd:.4f} ({est.prompt_tokens} prompt tokens, ≤{est.max_output_tokens} reply tokens)"


def heldout_cost_text(evals: int, rows: int, usd: float | None) -> str:
    """A training run's held-out evals as the spending guard states them.

    Args:
        evals: how many times the eval rows are scored.
        rows: eval rows per time.
        usd: their cost at most (None: unknown, no price).

    Returns:
        "Held-out evals: N x R rows, at most $X." ("an unknown amount" without a price).
    """
    amount = "an unknown amount" if usd is None else f"at most ${usd:.4f}"
    return f"Held-out evals: {evals} x {rows} rows, {amount}."


def estimate_source(est: Any) -> str:
    """Where a cost estimate's figures come from: exact or estimated tokens, the price's source and date."""
    return f"{'exact' if est.exact else 'estimated'} tokens, {est.price.source} {est.price.date}"


def refuse_to_spend(what: str, cost: str, *, detail: str = "", file: Any = None) -> bool:
    """Say what a command would spend and that `--yes` allows it.

    Args:
        what: what the command does on Tinker ("samples", "trains local/… with DPO").
        cost: the estimate in words (e.g. eval_cost_text's, or "about $X (…)").
        detail: more sentences after the cost, e.g. the held-out evals' share (default "").
        file: where to print (default None: stderr).

    Returns:
        False (the command does not go on), so a caller can `return refuse_to_spend(...)` from a
        check that answers "go on?".
    """
    more = f" {detail.strip()}" if detail.strip() else ""
    print(f"This {what} on Tinker and costs {cost}.{more} Re-run with --yes to spend.", file=file or sys.stderr)
    return False


def needs_model(args: argparse.Namespace, example: str) -> bool:
    """Whether a Tinker estimate can be made: it needs --model (else the reason goes to stderr, and
    the command exits USAGE: `--yes` alone would not help).

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


# --------------------------------------------------------------------------- training runs

def log_dir_flags(p: argparse.ArgumentParser) -> Any:
    """Add where a run writes: `--log-dir` or `--workspace`, one of them (the run would ignore the other).

    Args:
        p: the command's parser.

    Returns:
        The group of flags that exclude each other, for `resume_flag`; `args.log_dir` and
        `args.workspace` hold the paths (or None).
    """
    where = p.add_mutually_exclusive_group()
    where.add_argument("--log-dir", type=path, default=None, help="log dir for this run (default: a fresh runs/… dir)")
    where.add_argument("--workspace", type=path, default=None, help="write the log dir under WORKSPACE/.machine/training/")
    return where


def resume_flag(p: argparse.ArgumentParser, kind: str, where: Any = None) -> None:
    """Add `--resume`.

    Args:
        p: the command's parser.
        kind: the kind of run it continues ("sft", "dpo").
        where: log_dir_flags' group (default None: none): a resumed run stays in its own log dir, so
            `--resume` with `--log-dir` or `--workspace` is a usage error instead of one ignored.

    Returns:
        None; `args.resume` is the log dir or None.
    """
    (where or p).add_argument("--resume", type=path, default=None,
                   help=f"continue the {kind} run in this log dir from its last checkpoint, with its own settings")


def schedule_flags(p: argparse.ArgumentParser, *, unit: str, learning_rate: str, lora_rank: str) -> None:
    """Add a run's schedule: `--epochs`, `--steps`, `--learning-rate` (`--lr`), `--batch-size`, `--lora-rank`.

    Args:
        p: the command's parser.
        unit: what a batch holds ("rows", "pairs").
        learning_rate: --learning-rate's default, in words.
        lora_rank: --lora-rank's default, in words.

    Returns:
        None; `args.epochs`, `args.steps`, `args.learning_rate`, `args.batch_size`, `args.lora_rank`.
        A value the trainers refuse by their own rules (epochs, steps or batch size below 1, a
        learning rate that is not a finite number above 0, a negative rank) is a usage error.
    """
    p.add_argument("--epochs", type=whole(1), default=10, help=f"passes over the {unit} (default 10)")
    p.add_argument("--steps", type=whole(1), default=None,
                   help="stop after this many steps (default: epochs x full batches)")
    p.add_argument("--learning-rate", "--lr", type=number(0, above=True), default=None,
                   help=f"peak learning rate, linear decay (default: {learning_rate})")
    p.add_argument("--batch-size", type=whole(1), default=8,
                   help=f"{unit} per step (default 8; the partial last batch is dropped)")
    p.add_argument("--lora-rank", type=whole(0), default=None, help=f"LoRA rank (default {lora_rank})")


def heldout_flags(p: argparse.ArgumentParser, *, every: str = "once an epoch",
                  example: str = "data/minimal_sft/valid.jsonl", writes: bool = True) -> None:
    """Add a run's held-out evals: `--eval` and `--eval-every`.

    Args:
        p: the command's parser.
        every: when --eval-every scores, in words (default "once an epoch").
        example: an eval file to name.
        writes: say that the evals write heldout.jsonl and join the estimate (default True).

    Returns:
        None; `args.eval_data` (a path or None) and `args.eval_every` (an int or None).
    """
    more = ". Writes heldout.jsonl; on Tinker its sampling is in the estimate" if writes else ""
    p.add_argument("--eval", dest="eval_data", type=path, default=None,
                   help=f"held-out eval JSONL to score while training (e.g. {example}; default: none){more}")
    p.add_argument("--eval-every", type=whole(0), default=None,
                   help=f"score --eval every N steps (default: {every}; 0: none while training) and the final "
                        "checkpoint")


def inspect_flags(p: argparse.ArgumentParser) -> None:
    """Add a run's Inspect AI tasks: `--inspect-task`, repeatable.

    Args:
        p: the command's parser.

    Returns:
        None; `args.inspect_tasks` (a list of task names or files, or None).
    """
    p.add_argument("--inspect-task", dest="inspect_tasks", action="append", default=None, metavar="TASK",
                   help="an Inspect AI task to run at the --eval-every steps and on the final checkpoint: a registry "
                        "name or a task file (tasks.py@name); repeat for more. Scores go into metrics.jsonl, logs "
                        "into <log dir>/inspect/. Needs machine_nb[inspect]")


def json_text(value: Any) -> str:
    """`value` as strict JSON, as `jq` and `json.loads` read it: a NaN or infinity (pandas' missing
    value, a diverged number) or pandas' NA and NaT anywhere in it is null, numpy's numbers are
    numbers, and what JSON has no other type for is its text.

    Args:
        value: dicts, lists and plain values.

    Returns:
        One line of JSON.
    """
    import json

    def plain(v: Any) -> Any:
        if type(v).__name__ in ("NAType", "NaTType"):  # pandas' missing values
            return None
        if hasattr(v, "tolist") and type(v).__module__ == "numpy":  # numpy's scalars and arrays, as plain values
            v = v.tolist()
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(value), default=str, allow_nan=False)


def print_result(result: Any, as_json: bool, *, steps: str = "steps", loss: str = "loss") -> None:
    """A finished run as the commands print it: one JSON object, or a few lines for a reader.

    Args:
        result: the run's TrainResult.
        as_json: print `result.to_dict()` as one JSON object.
        steps: what a step is called in the summary line (default "steps").
        loss: the loss's name in it (default "loss").

    Returns:
        None (prints to stdout).
    """
    if as_json:
        print(json_text(result.to_dict()))
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


__all__ = ["ENGINES", "NEEDS_MODEL", "USAGE", "REFUSED_SPEND", "PORT", "SEED", "path", "whole", "whole_list", "number", "finite",
           "model_flag", "engine_flag", "target_flags", "engine_of",
           "inspect_flags", "sampling_flags", "spending_flags", "eval_cost_text", "refuse_to_spend", "needs_model", "log_dir_flags",
           "resume_flag", "schedule_flags", "heldout_flags", "print_result", "json_text", "heldout_cost_text", "estimate_source"]
