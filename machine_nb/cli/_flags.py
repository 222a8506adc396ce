"""Flag groups that several `machine-nb` subcommands share, so each reads and behaves the same:
which model and engine, how replies are sampled, and the spending guard (a budget, `--yes`
before spending on Tinker, `--json`).

Each helper adds its flags to one argparse parser; the values land on `args` under the usual
names (`args.model`, `args.max_usd`, ...). What a command does with them stays in its module.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

ENGINES = ("local", "tinker")


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
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"reply budget per {per} (default {max_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy, so reruns agree")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    if concurrency:
        p.add_argument("--concurrency", type=int, default=None,
                       help="requests in flight (default 32 on Tinker, 8 local)")


def spending_flags(p: argparse.ArgumentParser, *,
                   max_usd_help: str = "refuse before spending if it could cost more (default: no limit)",
                   json_help: str = "print the result as one JSON object") -> None:
    """Add the spending guard and the machine-readable output: `--max-usd`, `--yes`, `--json`.

    Without `--yes` a command that would spend on Tinker prints its estimate and exits 2
    (Machine's habit; see refuse_to_spend); on the local engine nothing is spent and `--yes` is
    not needed.

    Args:
        p: the subcommand's parser.
        max_usd_help: the `--max-usd` help line (say what the budget covers).
        json_help: the `--json` help line (say what is printed).

    Returns:
        None; `args.max_usd` (float or None), `args.yes` and `args.json` (bools) hold the values.
    """
    p.add_argument("--max-usd", type=float, default=None, help=max_usd_help)
    p.add_argument("--yes", action="store_true",
                   help="allow spending on Tinker (without it: print the estimate, exit 2)")
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
    from ..pricing import UnknownPrice, estimate_eval_cost

    try:
        est = estimate_eval_cost(rows, model, max_tokens=max_tokens, samples_per_row=samples_per_row)
    except UnknownPrice as exc:
        return f"an unknown amount ({exc})"
    return f"up to ${est.usd:.4f} ({est.prompt_tokens} prompt tokens, ≤{est.max_output_tokens} reply tokens)"


def refuse_to_spend(what: str, cost: str, *, file: Any = None) -> bool:
    """Say what a command would spend and that `--yes` allows it.

    Args:
        what: what the command does on Tinker ("samples", "trains local/… with DPO").
        cost: the estimate in words (e.g. eval_cost_text's).
        file: where to print (default None: stderr).

    Returns:
        False (the command does not go on), so a caller can `return refuse_to_spend(...)` from a
        check that answers "go on?".
    """
    print(f"This {what} on Tinker and costs {cost}. Re-run with --yes to spend.", file=file or sys.stderr)
    return False


__all__ = ["ENGINES", "model_flag", "engine_flag", "sampling_flags", "spending_flags", "eval_cost_text",
           "refuse_to_spend"]
