"""machine_nb: Machine's tag → export → validate → SFT → evaluate loop, in Jupyter.

Every public name is importable from here and loads lazily: `import machine_nb` stays fast
(no pandas, torch, tinker or tinker-cookbook until a call needs them). The map below is the
public API; each name lives in the module a reader would look for (`select_runs` in
`select.py`, `LossPlot` in `widgets/loss_plot.py`, what a training log dir reads back as in
`runlog.py`).

One result class, TrainResult, serves sft and dpo runs. `close_clients` is here because a
notebook that uses a `machine-nb serve` server through engine="tinker" calls it before stopping
that server.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

# public name -> module (relative to this package) that defines it
_API: dict[str, str] = {
    # errors
    "MachineFormatError": "errors",
    "BudgetExceeded": "errors",
    "EngineError": "errors",
    # files
    "read_jsonl": "jsonl",
    "write_jsonl": "jsonl",
    "append_jsonl": "jsonl",
    # Machine's workspace: runs, messages, sessions, events, machine definitions
    "load_runs": "frames",
    "messages": "frames",
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
    "select_runs": "select",
    "training_lines": "export",
    "conversation": "export",
    "estimate_tokens": "export",
    "step_failed": "export",
    # corpus, validation, tokens, prices
    "make_corpus": "corpus",
    "validate": "validate",
    "count_tokens": "tokens",
    "PRICES": "pricing",
    "price_for": "pricing",
    "estimate_cost": "pricing",
    "estimate_eval_cost": "pricing",
    "check_budget": "pricing",
    "UnknownPrice": "pricing",
    "set_price": "pricing",
    "ValidationResult": "validate",
    "model_context": "validate",
    # training
    "sft": "train",
    "smoke": "train",
    # a training log dir read back
    "TrainResult": "runlog",
    "read_training_log": "runlog",
    "training_metrics": "runlog",
    # evaluation
    "load_eval_rows": "chat",
    "score_output": "scoring",
    "evaluate": "evaluate",
    "probe": "evaluate",
    "load_results": "results",
    "EvalResult": "results",
    # Inspect AI tasks on a model or checkpoint (pip install "machine_nb[inspect]")
    "inspect_eval": "inspect_bridge",
    # comparing results: statistics that hold at small n
    "compare": "compare",
    "compare_many": "compare",
    "CompareResult": "compare",
    "CompareManyResult": "compare",
    # widgets
    "RunPicker": "widgets.run_picker",
    "Dashboard": "widgets.dashboard",
    "ExamplePreviewer": "widgets.previewer",
    "CostMeter": "widgets.cost_meter",
    "LossPlot": "widgets.loss_plot",
    "Tagger": "widgets.tagger",
    "CompareView": "widgets.compare_view",
    "Progress": "progress",  # the class; `machine_nb.progress` is the module
    # reports
    "run_report": "report",
    "report_summary": "report",
    "ReportSummary": "report",
    # a notebook that cannot go on: its stated reason, and the cells below skipped
    "stop_notebook": "stop",
    "NotebookStopped": "stop",
    # the local engine (a Tinker-compatible server)
    "use_local_models": "engines",
    "engine_for": "engines",
    "close_clients": "engines",
    # the checks sft runs first, and what they raise
    "preflight": "validate",
    "ValidationFailed": "errors",
    # a machine's cases, held-out eval and promotion gate
    "load_cases": "cases",
    "evaluate_cases": "cases",
    "read_versions": "cases",
    "live_version": "cases",
    "case_key": "export",
    "held_out_keys": "export",
    "tagged_lines": "export",
    "TaggedLines": "export",
    "HeldOutExcluded": "export",
    "candidate": "candidate",
    "Candidate": "candidate",
    "CandidateReport": "candidate",
    "Gate": "candidate",
    "CommitRefused": "candidate",
    "CommitConflict": "candidate",
    "revert": "candidate",
    "CandidateView": "widgets.candidate_view",
    # runs at scale: records on demand, the run index
    "load_records": "frames",
    "run_index_path": "store.index",
    # held-out accuracy while training, sweeps
    "heldout_curve": "runlog",
    "heldout_results": "runlog",
    "sweep": "sweeps",
    "read_sweep": "sweeps",
    "sweep_summary": "sweeps",
    "SweepView": "widgets.sweep_view",
    # preference pairs from tags, and DPO on them
    "preference_pairs": "pairs",
    "pairs_from_results": "pairs",
    "write_pairs": "pairs",
    "read_pairs": "pairs",
    "PreferencePairs": "pairs",
    "PairsSkipped": "pairs",
    "dpo": "preference",
    "score_pairs": "preference",
    "read_dpo_log": "preference",
    "estimate_dpo_cost": "pricing",
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


class _Package(types.ModuleType):
    """This package's module type: a public function keeps its name when its namesake submodule loads.

    `evaluate`, `validate`, `compare` and `candidate` are functions defined in modules of the same
    name. When Python first loads such a submodule it binds it to the package's attribute of that
    name, which would leave `machine_nb.evaluate` the module (not callable) for the rest of the
    process. Here the function is bound instead; the module stays in `sys.modules`.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _API.get(name) == name and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
