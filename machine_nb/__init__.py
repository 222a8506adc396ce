"""machine_nb: Machine's tag → export → validate → SFT → evaluate loop, in Jupyter.

Every public name is importable from here and loads lazily: `import machine_nb` stays fast
(no pandas, torch, tinker or tinker-cookbook until a call needs them). The map below is the
public API; each name lives in the module a reader would look for (`select_runs` in
`data/select.py`, `LossPlot` in `widgets/loss_plot.py`, what a training log dir reads back as in
`training/runlog.py`).

The subpackages follow the loop's stages: `store` (Machine's files on disk), `data` (runs as
DataFrames, selection, export), `checks` (validation, tokens, prices), `training`, `evaluation`,
`engines` (the local Tinker-compatible server and the Tinker glue), `widgets`, `reports`, `cli`;
`core` holds the small pieces all of them use, `tools` what is no part of the API (the sample
workspace's generator).

One result class, TrainResult, serves sft and dpo runs. `close_clients` is here because a
notebook that uses a `machine-nb serve` server through engine="tinker" calls it before stopping
that server.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module (relative to this package) that defines it
_API: dict[str, str] = {
    # errors
    "MachineFormatError": "errors",
    "BudgetExceeded": "errors",
    "EngineError": "errors",
    # files
    "read_jsonl": "core.jsonl",
    "write_jsonl": "core.jsonl",
    "append_jsonl": "core.jsonl",
    # Machine's workspace: runs, messages, sessions, events, machine definitions
    "load_runs": "data.frames",
    "messages": "data.frames",
    "load_sessions": "store.workspace",
    "load_events": "store.workspace",
    "load_machine": "store.workspace",
    "list_machines": "store.workspace",
    # the per-project tag store
    "tag": "store.tags",
    "tagged": "store.tags",
    "untag": "store.tags",
    "store_dir": "store.tags",
    # selection and export
    "select_runs": "data.select",
    "training_lines": "data.export",
    "conversation": "data.export",
    "estimate_tokens": "data.export",
    "step_failed": "data.export",
    # corpus, validation, tokens, prices
    "make_corpus": "data.corpus",
    "validate": "checks.validate",
    "count_tokens": "checks.tokens",
    "PRICES": "checks.pricing",
    "price_for": "checks.pricing",
    "estimate_cost": "checks.pricing",
    "estimate_eval_cost": "checks.pricing",
    "check_budget": "checks.pricing",
    "UnknownPrice": "checks.pricing",
    "set_price": "checks.pricing",
    "ValidationResult": "checks.validate",
    "model_context": "checks.validate",
    # training
    "sft": "training.train",
    "smoke": "training.train",
    # a training log dir read back
    "TrainResult": "training.runlog",
    "read_training_log": "training.runlog",
    "training_metrics": "training.runlog",
    # evaluation
    "load_eval_rows": "core.chat",
    "score_output": "evaluation.scoring",
    "evaluate": "evaluation.evaluate",
    "probe": "evaluation.evaluate",
    "load_results": "evaluation.results",
    "EvalResult": "evaluation.results",
    # Inspect AI tasks on a model or checkpoint (pip install "machine_nb[inspect]")
    "inspect_eval": "evaluation.inspect_bridge",
    # comparing results: statistics that hold at small n
    "compare": "evaluation.compare",
    "compare_many": "evaluation.compare",
    "NotMeasuredAlike": "evaluation.compare",
    "CompareResult": "evaluation.compare",
    "CompareManyResult": "evaluation.compare",
    # widgets
    "RunPicker": "widgets.run_picker",
    "Dashboard": "widgets.dashboard",
    "ExamplePreviewer": "widgets.previewer",
    "CostMeter": "widgets.cost_meter",
    "LossPlot": "widgets.loss_plot",
    "Tagger": "widgets.tagger",
    "CompareView": "widgets.compare_view",
    "Progress": "core.progress",  # the class; `machine_nb.core.progress` is the module
    # reports
    "run_report": "reports.notebook",
    "report_summary": "reports.notebook",
    "ReportSummary": "reports.notebook",
    "no_math": "core.theme",
    # a notebook that cannot go on: its stated reason, and the cells below skipped
    "stop_notebook": "core.stop",
    "NotebookStopped": "core.stop",
    # the local engine (a Tinker-compatible server)
    "use_local_models": "engines",
    "engine_for": "engines",
    "close_clients": "engines",
    # the checks sft runs first, and what they raise
    "preflight": "checks.validate",
    "ValidationFailed": "errors",
    # a machine's cases, held-out eval and promotion gate
    "load_cases": "evaluation.cases",
    "evaluate_cases": "evaluation.cases",
    "read_versions": "evaluation.cases",
    "live_version": "evaluation.cases",
    "case_key": "data.export",
    "held_out_keys": "data.export",
    "tagged_lines": "data.export",
    "TaggedLines": "data.export",
    "HeldOutExcluded": "data.export",
    "candidate": "evaluation.candidate",
    "Candidate": "evaluation.candidate",
    "CandidateReport": "evaluation.candidate",
    "Gate": "evaluation.candidate",
    "CommitRefused": "evaluation.candidate",
    "CommitConflict": "evaluation.candidate",
    "revert": "evaluation.candidate",
    "CandidateView": "widgets.candidate_view",
    # runs at scale: records on demand, the run index
    "load_records": "data.frames",
    "run_index_path": "store.index",
    # held-out accuracy while training, sweeps
    "heldout_curve": "training.runlog",
    "heldout_results": "training.runlog",
    "sweep": "training.sweeps",
    "read_sweep": "training.sweeps",
    "sweep_summary": "training.sweeps",
    "SweepView": "widgets.sweep_view",
    # preference pairs from tags, and DPO on them
    "preference_pairs": "training.pairs",
    "pairs_from_results": "training.pairs",
    "write_pairs": "training.pairs",
    "read_pairs": "training.pairs",
    "PreferencePairs": "training.pairs",
    "PairsSkipped": "training.pairs",
    "dpo": "training.preference",
    "score_pairs": "training.preference",
    "read_dpo_log": "training.preference",
    "estimate_dpo_cost": "checks.pricing",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'machine_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
