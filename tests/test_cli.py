"""The CLI mirrors Machine's `/train` commands: every subcommand is listed and its help says what
it does, what it reads and writes, and what it may cost (the headless user's only documentation).
"""

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from machine_nb.cli import build_parser

# Machine's /train, /tagged and data commands, plus the report runner
COMMANDS = ["corpus", "validate", "sft", "smoke", "eval", "tagged", "runs", "export", "report", "serve", "cases",
            "candidate", "commit", "revert", "sweep"]
EVAL_COMMANDS = ["baseline", "checkpoint", "compare", "probe"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(name: str) -> str:
    parser = build_parser()
    subs = _subparsers(parser)
    assert name in subs, f"`machine-nb {name}` is missing; have {sorted(subs)}"
    return subs[name].format_help()


def test_top_level_help_lists_every_command():
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    listed = set(re.findall(r"^\s{4}(\w[\w-]*)\s", proc.stdout, flags=re.M))
    missing = [c for c in COMMANDS if c not in listed]
    assert not missing, f"machine-nb --help does not list {missing}:\n{proc.stdout}"


def _says_reads_writes_costs(name: str, text: str) -> None:
    flat = " ".join(text.split()).lower()
    assert re.search(r"\bread", flat), f"`{name} --help` does not say what it reads:\n{text}"
    assert re.search(r"\bwrit", flat), f"`{name} --help` does not say what it writes:\n{text}"
    assert re.search(r"\bcost|\bfree\b|\busd\b|\$", flat), f"`{name} --help` does not say what it costs:\n{text}"


@pytest.mark.parametrize("name", [c for c in COMMANDS if c != "eval"])
def test_each_command_help_says_reads_writes_costs(name):
    _says_reads_writes_costs(name, _help(name))


@pytest.mark.parametrize("name", EVAL_COMMANDS)
def test_eval_subcommands_help_says_reads_writes_costs(name):
    parser = build_parser()
    subs = _subparsers(parser)
    assert "eval" in subs, f"`machine-nb eval` is missing; have {sorted(subs)}"
    inner = _subparsers(subs["eval"])
    assert name in inner, f"`machine-nb eval {name}` is missing; have {sorted(inner)}"
    _says_reads_writes_costs(f"eval {name}", inner[name].format_help())


@pytest.mark.parametrize("sub", [["baseline"], ["checkpoint", "tinker://x/sampler_weights/final"],
                                 ["probe", "tinker://x/sampler_weights/final"]])
def test_eval_subcommands_share_the_model_sampling_and_spending_flags(sub):
    parser = build_parser()
    given = parser.parse_args(["eval", *sub, "-m", "M", "--engine", "tinker", "--max-tokens", "8", "--temperature",
                               "0.5", "--seed", "3", "--concurrency", "4", "--max-usd", "0.25", "--yes", "--json"])
    default = parser.parse_args(["eval", *sub])
    names = ("model", "engine", "max_tokens", "temperature", "seed", "concurrency", "max_usd", "yes", "json")
    assert [getattr(given, n) for n in names] == ["M", "tinker", 8, 0.5, 3, 4, 0.25, True, True]
    assert [getattr(default, n) for n in names] == [None, None, 32, 0.0, 0, None, None, False, False]
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", *sub, "--engine", "cloud"])


def test_the_spending_guard_says_what_sampling_could_cost(capsys):
    from machine_nb.cli._flags import eval_cost_text, refuse_to_spend

    rows = [{"messages": [{"role": "user", "content": "What is 1 plus 1?"}]}]
    one = eval_cost_text(rows, "thinkingmachines/Inkling-Small", max_tokens=8)
    two = eval_cost_text(rows, "thinkingmachines/Inkling-Small", max_tokens=8, samples_per_row=2)
    assert re.fullmatch(r"up to \$\d+\.\d{4} \(\d+ prompt tokens, ≤8 reply tokens\)", one)
    assert "≤16 reply tokens" in two  # a probe samples every prompt twice
    assert eval_cost_text(rows, "acme/unknown-7b", max_tokens=8).startswith("an unknown amount (No price is known")
    assert refuse_to_spend("samples", one) is False
    assert capsys.readouterr().err == f"This samples on Tinker and costs {one}. Re-run with --yes to spend.\n"


@pytest.fixture(scope="module")
def spend_inputs(tmp_path_factory):
    """A corpus, a pairs file and the sample workspace: what the spending commands read."""
    from machine_nb import make_corpus, write_pairs

    root = tmp_path_factory.mktemp("spend")
    corpus = make_corpus(root / "corpus", n_train=16, n_eval=4, n_valid=4)
    pairs = write_pairs([{"prompt": [{"role": "user", "content": f"What is {i} plus 1?"}],
                          "chosen": [{"role": "assistant", "content": f"answer: {i + 1}"}],
                          "rejected": [{"role": "assistant", "content": f"{i} + 1 = {i + 1}"}]} for i in range(8)],
                        root / "pairs.jsonl")
    workspace = Path(__file__).resolve().parent.parent / "data" / "sample_workspace"
    return {"train": str(corpus.train), "eval": str(corpus.eval), "valid": str(corpus.valid), "pairs": str(pairs),
            "workspace": str(workspace), "runs": str(root / "runs")}


SPENDING = {  # every command that spends on Tinker, as a user would start it without --yes
    "sft": ["sft", "{train}", "--engine", "tinker", "--model", "thinkingmachines/Inkling", "--eval", "{valid}",
            "--log-dir", "{runs}/sft"],
    "smoke": ["smoke", "{train}", "--engine", "tinker", "--model", "thinkingmachines/Inkling", "--log-dir",
              "{runs}/smoke"],
    "sweep": ["sweep", "{train}", "--grid", "epochs=1,2", "--model", "thinkingmachines/Inkling", "--sweep-dir",
              "{runs}/sweep"],
    "dpo": ["dpo", "{pairs}", "--engine", "tinker", "--model", "thinkingmachines/Inkling", "--eval", "{valid}",
            "--log-dir", "{runs}/dpo"],
    "eval baseline": ["eval", "baseline", "--data", "{eval}", "-m", "thinkingmachines/Inkling-Small", "--engine",
                      "tinker", "--out", "{runs}/baseline.json"],
    "eval probe": ["eval", "probe", "tinker://x/sampler_weights/final", "--data", "{eval}", "-m",
                   "thinkingmachines/Inkling-Small"],
    "candidate": ["candidate", "{workspace}", "--machine", "tutor", "--checkpoint", "tinker://x/sampler_weights/final",
                  "--engine", "tinker"],
}


@pytest.mark.parametrize("name", sorted(SPENDING))
def test_every_spending_command_refuses_in_the_same_words_without_yes(name, spend_inputs, capsys, monkeypatch):
    """One guard for every command: the estimate on one line, exit 4, nothing run or written."""
    from machine_nb.cli import main

    monkeypatch.setenv("TINKER_API_KEY", "tml-not-a-real-key")  # never used: nothing may start without --yes
    code = main([a.format(**spend_inputs) for a in SPENDING[name]])
    err = capsys.readouterr().err
    assert code == 4, err
    assert re.fullmatch(r"This .+ on Tinker and costs (about|up to) \$\d+\.\d{4}.*\. Re-run with --yes to spend\.\n",
                        err, flags=re.S), err
    assert "tml-not-a-real-key" not in err and not Path(spend_inputs["runs"]).exists()


def test_console_script_help_runs_without_heavy_imports():
    # `machine-nb --help` must stay light: no torch or tinker_cookbook just to print help
    code = ("import sys; from machine_nb.cli import build_parser; build_parser().format_help(); "
            "print(','.join(m for m in ('torch', 'tinker_cookbook', 'pandas') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"--help imported heavy modules: {proc.stdout.strip()}"


def test_unknown_command_fails_cleanly():
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "no-such-command"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr


def _cli(*args: str, cwd) -> str:
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", *args], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, f"machine-nb {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    return proc.stdout


def _main(capfd, *args: str) -> str:
    """`machine-nb ARGS` run through the CLI's own `main` in this process: what the console script
    runs, with its exit code, stdout and stderr (file descriptors, so anything a child process or
    C code writes there is seen as a terminal would see it)."""
    from machine_nb.cli import main

    code = main(list(args))
    out, err = capfd.readouterr()
    assert code == 0, f"machine-nb {' '.join(args)} failed ({code}):\n{err[-2000:]}"
    return out


@pytest.mark.slow
def test_headless_minimal_sft_loop_like_machines_train_commands(tmp_path, capfd, monkeypatch):
    """Machine's minimal SFT loop with `machine-nb` in place of `pi -p "/train …"`, on the local engine.

    The corpus and the final checkpoint's eval run as separate `machine-nb` processes, as a later
    terminal command would: the checkpoint sft printed is found by a fresh process through the
    data dir alone. The steps between run through the CLI's `main` in this process (one set of
    imports for all of them rather than one a command)."""
    _cli("corpus", "-o", "data", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    assert "0 error(s)" in _main(capfd, "validate", "data/train.jsonl", "-m", "local/arith-tiny", "--eval",
                                 "data/eval.jsonl")
    smoke = json.loads(_main(capfd, "smoke", "data/train.jsonl", "--log-dir", "logs/smoke", "--json"))
    assert smoke["steps"] == 2 and smoke["checkpoint"]
    base = json.loads(_main(capfd, "eval", "baseline", "--data", "data/eval.jsonl", "--out", "ev/baseline.json",
                            "--json"))
    sft = json.loads(_main(capfd, "sft", "data/train.jsonl", "--epochs", "10", "--steps", "30", "--log-dir",
                           "logs/sft", "--json"))
    assert sft["steps"] == 30 and sft["last_loss"] < sft["first_loss"]
    _cli("eval", "checkpoint", sft["checkpoint"], "--data", "data/eval.jsonl", "--out", "ev/final.json", "--json",
         cwd=tmp_path)
    result = json.loads(_main(capfd, "eval", "compare", "ev/baseline.json", "ev/final.json", "--json"))
    assert result["n"] == 24 and result["baseline_accuracy"] == base["accuracy"]
    assert result["checkpoint_accuracy"] > result["baseline_accuracy"]


def test_headless_explore_commands_read_the_sample_without_writing_it(tmp_path, capfd, monkeypatch):
    root = Path(__file__).resolve().parent.parent
    workspace = root / "data" / "sample_workspace"
    store = workspace / ".machine-store"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.rglob("*") if p.is_file()}
    monkeypatch.chdir(tmp_path)
    assert "coder" in _main(capfd, "runs", str(workspace), "--limit", "5")
    assert "train.jsonl" in _main(capfd, "tagged", "--store", str(store))
    _main(capfd, "export", str(workspace), "--machine", "coder", "--out", "export.jsonl")
    lines = (tmp_path / "export.jsonl").read_text().splitlines()
    assert lines and all('"messages"' in line for line in lines)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in store.rglob("*") if p.is_file()}
    assert after == before, "listing and exporting must not write into the tag store"
