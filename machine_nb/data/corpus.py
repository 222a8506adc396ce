"""The minimal-SFT arithmetic corpus: bare questions whose target is exactly `answer: <integer>`.

Three disjoint splits: `train` (what SFT trains on), `valid` (what a step, an epoch count or a
learning rate is chosen on: `sft(eval_data=…)`, `sweep(eval_data=…)`) and `eval` (what the chosen
checkpoint is reported on, once). Choosing on the set you report on would bias the report upward.

The phrasings below are shared with the local engine's pretraining corpus
(machine_nb/engines/local/build.py), so the shipped base model answers these very questions
naturally ("47 + 15 = 62") before SFT teaches it the house style.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from ..core.jsonl import atomic_write_text, dumps_line, held_folder, parse_json, remove_stale_temporaries

# {a} and {b} are two-digit operands; results may be negative for "-".
QUESTION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": (
        "What is {a} plus {b}?",
        "What's {a} + {b}?",
        "How much is {a} plus {b}?",
        "Compute {a} + {b}.",
    ),
    "-": (
        "What is {a} minus {b}?",
        "What's {a} - {b}?",
        "How much is {a} minus {b}?",
        "Compute {a} - {b}.",
    ),
}

GENERATOR_VERSION = 1  # bump when the same seed would draw different rows
ANSWER_FORMAT = r"^answer: -?\d+$"  # the style, checked apart from correctness
DEFAULT_OUT_DIR = "data/minimal_sft"  # git-ignored
OPERANDS = range(10, 100)  # two-digit operands
MAX_ROWS = len(OPERANDS) * (len(OPERANDS) + 1) // 2
"""Train + eval + valid rows one corpus can hold: 4,095 distinct unordered operand pairs ({47, 15} == {15, 47})."""

# Off-distribution questions: a learned `answer: …` style that bleeds shows up here.
PROBE_QUESTIONS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"),
    ("Who wrote Hamlet?", "William Shakespeare"),
    ("What color is the sky on a clear day?", "blue"),
    ("How many legs does a spider have?", "eight"),
    ("What is the largest planet in our solar system?", "Jupiter"),
    ("Which animal is known as the king of the jungle?", "the lion"),
    ("What do bees make?", "honey"),
    ("In which season do leaves fall from the trees?", "autumn"),
)


def answer(a: int, op: str, b: int) -> int:
    """The integer result of `a op b` for the two operators the corpus uses.

    Args:
        a: the first operand.
        op: "+" or "-".
        b: the second operand.

    Returns:
        a + b or a - b.
    """
    return a + b if op == "+" else a - b


def draw_questions(n: int, rng: random.Random, exclude: set[frozenset[int]] = frozenset()) -> list[tuple[int, str, int, str]]:
    """Questions with distinct two-digit operand pairs.

    Pairs are compared unordered ({47, 15} == {15, 47}) so a held-out question is never the same
    sum with its operands swapped.

    Args:
        n: how many.
        rng: the random generator (seeded by the caller: the same seed draws the same questions).
        exclude: operand pairs already used (default none).

    Returns:
        n tuples (a, op, b, question text).

    Raises:
        ValueError: fewer than n distinct pairs are left.
    """
    seen = set(exclude)
    if n > MAX_ROWS - len(seen):  # the draw below would never finish
        raise ValueError(f"cannot draw {n:,} questions: only {MAX_ROWS - len(seen):,} distinct operand pairs are left "
                         f"(of {MAX_ROWS:,})")
    out = []
    while len(out) < n:
        a, b = rng.randint(OPERANDS[0], OPERANDS[-1]), rng.randint(OPERANDS[0], OPERANDS[-1])
        pair = frozenset((a, b))
        if pair in seen:
            continue
        seen.add(pair)
        op = rng.choice(("+", "-"))
        out.append((a, op, b, rng.choice(QUESTION_TEMPLATES[op]).format(a=a, b=b)))
    return out


def _whole(name: str, n: Any, least: int) -> int:
    """`n` as an int (numpy integers included), or TypeError / ValueError naming `name`."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {n!r}")
    if n < least:
        raise ValueError(f"{name} must be at least {least}, got {n}")
    return int(n)


def check_seed(seed: Any) -> int:
    """The seed as an int, or refused: random.Random draws the same rows for -3 as for 3, and new
    rows on every call for None, so neither would be the seed the manifest records.

    Args:
        seed: the draw.

    Returns:
        int(seed).

    Raises:
        TypeError: not an integer (bools, floats, strings and None included).
        ValueError: below 0.
    """
    return _whole("seed", seed, 0)


def check_counts(n_train: int, n_eval: int, n_valid: int = 0) -> None:
    """Refuse row counts the corpus cannot hold: train and eval at least 1, valid at least 0, all
    together at most MAX_ROWS (every distinct two-digit operand pair once).

    Args:
        n_train: training rows.
        n_eval: eval rows.
        n_valid: selection rows (default 0).

    Raises:
        TypeError: a count that is not an integer (numpy integers are integers).
        ValueError: a count below its least, or too many together (saying the limit).
    """
    n_train, n_eval, n_valid = (_whole(name, n, least) for name, n, least in
                                (("n_train", n_train, 1), ("n_eval", n_eval, 1), ("n_valid", n_valid, 0)))
    total = n_train + n_eval + n_valid
    if total > MAX_ROWS:
        parts = f"{n_train:,} train + {n_eval:,} eval" + (f" + {n_valid:,} valid" if n_valid else "")
        raise ValueError(f"{parts} rows = {total:,}, but the corpus holds at most "
                         f"{MAX_ROWS:,} rows in all: that many distinct two-digit operand pairs exist, and no pair "
                         "is used twice (no two splits share one)")


def corpus_rows(seed: int = 0, n_train: int = 48, n_eval: int = 24,
                n_valid: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The corpus as rows (no I/O); the same seed gives the same rows.

    The valid rows are drawn after the others, so train and eval are the same rows whatever
    n_valid is.

    Args:
        seed: the random seed (default 0; an integer, at least 0: see check_seed).
        n_train: training rows (default 48; at least 1).
        n_eval: eval rows (default 24; at least 1).
        n_valid: selection rows (default 0 here; make_corpus writes 24). At most MAX_ROWS together
            (see check_counts).

    Returns:
        {"train", "eval", "probe", "valid"}: lists of rows.
    """
    check_counts(n_train, n_eval, n_valid)
    n_train, n_eval, n_valid = int(n_train), int(n_eval), int(n_valid)
    rng = random.Random(check_seed(seed))
    train_q = draw_questions(n_train, rng)
    used = {frozenset((a, b)) for a, _, b, _ in train_q}
    eval_q = draw_questions(n_eval, rng, exclude=used)
    used |= {frozenset((a, b)) for a, _, b, _ in eval_q}
    valid_q = draw_questions(n_valid, rng, exclude=used)
    train = [{"messages": [{"role": "user", "content": q},
                           {"role": "assistant", "content": f"answer: {answer(a, op, b)}"}]}
             for a, op, b, q in train_q]

    def held_out(questions: list[tuple[int, str, int, str]]) -> list[dict[str, Any]]:
        return [{"messages": [{"role": "user", "content": q}], "expected": f"answer: {answer(a, op, b)}",
                 "match": "exact", "format": ANSWER_FORMAT} for a, op, b, q in questions]

    probe = [{"messages": [{"role": "user", "content": q}], "expected_natural": hint} for q, hint in PROBE_QUESTIONS]
    return {"train": train, "eval": held_out(eval_q), "probe": probe, "valid": held_out(valid_q)}


@dataclass
class Corpus:
    """What make_corpus wrote: the directory, its files and the manifest's content.

    valid: the selection split (None when made with n_valid=0).
    """

    out_dir: Path
    train: Path
    eval: Path
    probe: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    valid: Path | None = None

    def _repr_html_(self) -> str:
        from ..core.theme import escape, no_math

        files = "".join(f"<li><code>{escape(name)}</code>: {f['rows']} rows, sha256 {f['sha256'][:12]}…</li>"
                        for name, f in self.manifest["files"].items())
        return no_math(f"<div><b>minimal-SFT corpus</b> (seed {self.manifest['seed']}) in "
                       f"<code>{escape(self.out_dir)}</code><ul>{files}</ul></div>")


def _body(rows: list[dict[str, Any]]) -> str:
    return "".join(dumps_line(r) + "\n" for r in rows)


GENERATOR = "machine_nb.corpus.make_corpus"  # the manifest's "generator": how make_corpus knows its own files (a name files carry, not an import path)
HELD_OUT = ("eval.jsonl", "valid.jsonl")


def _own_checksums(out: Path) -> dict[str, str]:
    """{file name: sha256} from the manifest make_corpus wrote in `out` ({} when there is none or
    it is someone else's file)."""
    path = out / "manifest.json"
    if path.is_symlink() or not path.is_file():
        return {}
    try:
        manifest = parse_json(path.read_bytes(), path)
    except ValueError:
        return {}
    if not isinstance(manifest, dict) or manifest.get("generator") != GENERATOR \
            or not isinstance(manifest.get("files"), dict):
        return {}
    own = {name: info.get("sha256") for name, info in manifest["files"].items() if isinstance(info, dict)}
    own["manifest.json"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return own


def _files_to_write(out: Path, bodies: dict[str, str], seed: int, force: bool,
                    absent: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The names among `bodies` whose file in `out` is missing or holds other bytes, and the names
    among `absent` (splits this corpus has none of) whose file is to go.

    Without `force`, a differing held-out file (eval, valid) is refused, and so is any file that
    make_corpus did not write: not listed with its sha256 in make_corpus's own manifest (a user's
    file, one edited since, a symlink). A held-out file in `absent` is left where train and eval
    stay the bytes they are (the same draw made it) and refused otherwise: rows of another draw may
    share operand pairs with the new train.jsonl. All are checked before anything is written.

    Raises:
        FileExistsError: naming the file, unless force.
    """
    own = _own_checksums(out)
    changed = []
    for name, body in bodies.items():
        path = out / name
        if not os.path.lexists(path):
            changed.append(name)
            continue
        data = body.encode("utf-8")
        if not path.is_symlink() and path.is_file() and path.read_bytes() == data:
            continue  # the same bytes: left as they are
        changed.append(name)
        if force:
            continue
        if name in HELD_OUT and path.is_file() and not path.is_symlink():
            raise FileExistsError(
                f"{path} exists with different held-out rows (seed {seed} draws others); refusing to replace a "
                "held-out set. Use another out_dir, or pass force=True (CLI: --force) to overwrite it.")
        if path.is_symlink() or not path.is_file() \
                or own.get(name) != hashlib.sha256(path.read_bytes()).hexdigest():
            raise FileExistsError(
                f"{path} was not written by make_corpus (or was changed since: its manifest.json does not list "
                "it with this content); refusing to replace it. Use another out_dir, or pass force=True "
                "(CLI: --force) to overwrite it.")
    same_draw = not {"train.jsonl", "eval.jsonl"} & set(changed)
    gone = []
    for name in absent:
        path = out / name
        if same_draw or not os.path.lexists(path):
            continue
        if not force:
            raise FileExistsError(
                f"{path} holds held-out rows of another draw (another seed or size): beside the new train.jsonl "
                "they may share operand pairs with it; refusing to leave it there or to remove it. Pass n_valid "
                "(CLI: --valid-rows) to draw a valid split with this corpus, use another out_dir, or pass "
                "force=True (CLI: --force) to remove it.")
        gone.append(name)
    return changed, gone


@contextlib.contextmanager
def _holding(out: Path) -> Iterator[None]:
    """Hold `out` while one make_corpus checks and writes it: a second one (another thread or
    process) waits, then checks what the first wrote, so neither replaces the other's held-out rows
    unseen. The hold is an flock on the folder itself (no lock file); a file system without flock
    leaves it unheld."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file, not a folder: make_corpus writes its files into a folder. "
                                 "Pass another out_dir.")
    out.mkdir(parents=True, exist_ok=True)
    with held_folder(out):
        yield


def make_corpus(out_dir: str | os.PathLike = DEFAULT_OUT_DIR, seed: int = 0, force: bool = False, *,
                n_train: int = 48, n_eval: int = 24, n_valid: int = 24) -> Corpus:
    """Write the minimal-SFT corpus: train.jsonl, eval.jsonl, probe.jsonl, valid.jsonl and manifest.json.

    Args:
        out_dir: default "data/minimal_sft" (git-ignored).
        seed: the draw (default 0; an integer, at least 0); the same seed writes byte-identical
            files, and train, eval and probe are the same bytes whatever n_valid is (valid rows
            are drawn last).
        force: replace existing files whose content differs even when make_corpus did not write
            them (default False: nothing is written when an eval.jsonl or valid.jsonl holds other
            rows, or when any of the five files is not one this function wrote, i.e. listed with
            its sha256 in its own manifest.json; FileExistsError names the file). Files that
            already hold the same bytes are left as they are.
        n_train / n_eval: rows (default 48 / 24, the documented run's), each at least 1.
        n_valid: selection rows (default 24; 0 writes no valid.jsonl, and a valid.jsonl already
            there stays only when train and eval are unchanged: one of another draw is refused,
            and removed with force).
            All three together at most MAX_ROWS (4,095), else ValueError before anything is written.

    A second make_corpus into the same folder (another thread or process) waits until this one
    has written, then checks what it finds as above. Each file is written atomically, the old
    manifest removed first and the new one written last: a process killed in between leaves no
    manifest, so the files of two draws it may leave are refused until forced.

    Returns:
        The Corpus. Operand pairs never repeat across train, eval and valid; eval and valid rows
        carry expected, match "exact" and the answer format regex. Choose steps and settings on
        valid.jsonl; report the chosen checkpoint on eval.jsonl.
    """
    out = Path(out_dir)
    seed = check_seed(seed)
    rows = corpus_rows(seed, n_train, n_eval, n_valid)
    if not n_valid:
        del rows["valid"]
    bodies = {f"{name}.jsonl": _body(r) for name, r in rows.items()}
    manifest = {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "counts": {name: len(r) for name, r in rows.items()},
        "format": ANSWER_FORMAT,
        "files": {name: {"rows": len(rows[name.removesuffix(".jsonl")]),
                         "sha256": hashlib.sha256(body.encode("utf-8")).hexdigest()}
                  for name, body in bodies.items()},
    }
    bodies["manifest.json"] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    with _holding(out):
        changed, gone = _files_to_write(out, bodies, seed, force, absent=() if n_valid else ("valid.jsonl",))
        for name in (*bodies, *gone):  # what a process killed inside a write left (a link's are beside its target)
            if not (out / name).is_symlink():
                remove_stale_temporaries(out / name)
        if "manifest.json" in changed and os.path.lexists(out / "manifest.json"):
            # first: a process killed among the writes below leaves no manifest vouching for a mix of
            # two draws, so the next make_corpus refuses those files until forced
            os.unlink(out / "manifest.json")
        for name in gone:  # never beside the new train rows
            os.unlink(out / name)
        for name in sorted(changed, key=lambda n: n == "manifest.json"):  # the manifest last: it vouches for the rest
            atomic_write_text(out / name, bodies[name], mode=0o644)
    return Corpus(out, out / "train.jsonl", out / "eval.jsonl", out / "probe.jsonl", manifest,
                  out / "valid.jsonl" if n_valid else None)
