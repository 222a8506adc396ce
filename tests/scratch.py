"""Scratch copies of the sample workspace on disk, a stand-in local checkpoint, and the check of a
CLI usage error, shared by the test files that need them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


def copy_tutor(root: Path) -> Path:
    """A copy of the sample's tutor machine (its definition only) in workspace `root`; returns `root`."""
    shutil.copytree(SAMPLE / "machines" / "tutor", root / "machines" / "tutor")
    return root


def copy_runs(root: Path) -> Path:
    """A copy of the sample's runs and machines in workspace `root`, its run files and folders dated an
    hour back (not written lately: the next load trusts the folders' times); returns `root`."""
    shutil.copytree(SAMPLE / ".machine" / "runs", root / ".machine" / "runs")
    shutil.copytree(SAMPLE / "machines", root / "machines")
    t = time.time() - 3600
    for dirpath, _, files in os.walk(root / ".machine" / "runs"):
        for f in files:
            os.utime(os.path.join(dirpath, f), (t, t))
        os.utime(dirpath, (t, t))
    return root


def local_checkpoint(root: Path, name: str) -> str:
    """A local checkpoint as commit and revert check it: its description in the server's data dir,
    under a run named after `root` (no weights: nothing samples it)."""
    from machine_nb.engines.local.checkpoints import checkpoint_dir, default_data_dir

    run = "local-" + hashlib.sha256(str(root).encode()).hexdigest()[:16] + ":train:0"
    path = f"tinker://{run}/sampler_weights/{name}"
    d = checkpoint_dir(default_data_dir(), path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "checkpoint.json").write_text(json.dumps({"format": "machine-nb-local/1", "base_model": "local/arith-tiny",
                                                   "lora_rank": 0}))
    return path


def usage_error(capsys, argv: list[str]) -> str:
    """Run `machine-nb ARGV`, expect argparse's usage error (exit 2), return its stderr."""
    from machine_nb.cli import main

    with pytest.raises(SystemExit) as exited:
        assert main(argv) != 0, f"machine-nb {' '.join(argv)} was accepted"
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "Traceback" not in err
    return err
