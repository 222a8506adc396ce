"""Training runs more than one test file compares against, trained once per test process.

`minimal_sft` is the minimal-SFT run of the corpus (seed 0): 48 rows at batch 8 for 10 epochs =
60 steps, local defaults, no held-out evals. test_train.py checks what it learned and resumes
against it; test_heldout.py checks that evals leave its steps untouched. Its checkpoints live on
this process's local server, so the run is kept for the process (files in one worker share it);
nothing may write into its log dir.
"""

from __future__ import annotations

from machine_nb.data.corpus import make_corpus
from machine_nb.training.train import sft

_RUNS: dict = {}


def minimal_sft(tmp_path_factory):
    """The minimal-SFT run (a TrainResult), trained on the first call in this process.

    Args:
        tmp_path_factory: pytest's, for a folder that lasts the session.

    Returns:
        The TrainResult.
    """
    if "sft" not in _RUNS:
        root = tmp_path_factory.mktemp("minimal-sft")
        corpus = make_corpus(root / "corpus", seed=0)
        _RUNS["sft"] = sft(corpus.train, log_dir=root / "sft", epochs=10, batch_size=8, progress=False)
    return _RUNS["sft"]
