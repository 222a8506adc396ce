"""`machine-nb corpus`: write the minimal-SFT arithmetic corpus (train, held-out eval, probe, manifest)."""

from __future__ import annotations

import argparse

from ._flags import path, whole


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the `machine-nb` parser.

    Args:
        sub: the parser's subparsers.
    """
    p = sub.add_parser(
        "corpus",
        help="write the minimal-SFT corpus: 48 train rows, 24 held-out eval rows, 24 valid rows, a probe set, a manifest",
        description=(
            "Generate the deterministic minimal-SFT corpus: bare arithmetic questions whose target is exactly "
            "'answer: <integer>'. Reads: nothing. Writes: OUT/train.jsonl, OUT/eval.jsonl, OUT/valid.jsonl, "
            "OUT/probe.jsonl and OUT/manifest.json (seed, counts, sha256 per file). The same seed writes "
            "byte-identical files. Choose steps and settings on valid.jsonl, report on eval.jsonl. Refuses, "
            "unless --force, to replace an eval.jsonl or valid.jsonl with different rows or any file it did not "
            "write (not listed with its sha256 in its own manifest.json), and refuses row counts the corpus "
            "cannot hold (train or eval below 1, or over 4,095 train + eval + valid: the distinct operand pairs). "
            "Cost: free (no model calls)."),
    )
    p.add_argument("-o", "--out", type=path, default="data/minimal_sft", help="output directory (default data/minimal_sft, git-ignored)")
    p.add_argument("--seed", type=whole(0), default=0,
                   help="the draw, a whole number from 0 (default 0); another seed gives new questions")
    p.add_argument("--force", action="store_true", help="overwrite existing files that differ: held-out rows, and files make_corpus did not write")
    p.add_argument("--train-rows", type=int, default=48,
                   help="training rows (default 48; at least 1, and train + eval + valid at most 4,095)")
    p.add_argument("--eval-rows", type=int, default=24,
                   help="held-out eval rows, to report on (default 24; at least 1)")
    p.add_argument("--valid-rows", type=int, default=24,
                   help="held-out selection rows, to choose steps and settings on (default 24; 0 = none)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..data.corpus import make_corpus

    corpus = make_corpus(args.out, seed=args.seed, force=args.force, n_train=args.train_rows, n_eval=args.eval_rows,
                         n_valid=args.valid_rows)
    for name, info in corpus.manifest["files"].items():
        print(f"{corpus.out_dir / name}: {info['rows']} rows, sha256 {info['sha256']}")
    print(f"{corpus.out_dir / 'manifest.json'}: seed {args.seed}")
    return 0
