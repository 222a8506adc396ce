"""The pairs file `dpo` trains on, as the cookbook's DPO loop reads it, each pair given to the
renderer as it was written.

tinker-cookbook's `ComparisonBuilderFromJsonl` loads the file with `datasets`, which gives every
message every key some message in the file has, set to None: one pair whose prompt holds a tool
call gives every other pair's messages `"tool_calls": None`, which Inkling's and Qwen3's renderers
cannot iterate. `ComparisonFileBuilder` keeps each line as its JSON text and parses it when the
pair is used; the tool calls go to the renderer as training gives them (checks.render.
renderer_messages). Imported in the training process only: chz and the cookbook load with it.
"""

from __future__ import annotations

import json
from typing import Any

import chz
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.preference.types import Comparison, LabeledComparison

from ..checks.render import renderer_messages


@chz.chz
class ComparisonFileBuilder(ComparisonBuilderFromJsonl):
    """The cookbook's comparison JSONL (`{"comparison": {...}, "label": "A"}` a line, as
    store.pairs.comparison_line writes it), one dataset row per line held as its text; the same
    rows in the same order as the cookbook's builder gives, so a seed shuffles them alike."""

    def get_train_and_test_datasets(self) -> tuple[Any, None]:
        """The file's lines as a dataset of one text column (no test split).

        Returns:
            (the datasets.Dataset, None).
        """
        import datasets

        with open(self.train_path, encoding="utf-8") as fh:
            rows = [{"line": line} for line in (raw.strip() for raw in fh) if line]
        return datasets.Dataset.from_list(rows), None

    def example_to_labeled_comparison(self, example: dict) -> LabeledComparison | None:
        """One line as the cookbook's LabeledComparison, its messages as written.

        Args:
            example: a dataset row (`line`: the JSON text).

        Returns:
            The comparison; None for a line without "comparison" and "label" (the cookbook skips it).
        """
        data = json.loads(example["line"])
        if not isinstance(data, dict) or "comparison" not in data or "label" not in data:
            return None
        c = data["comparison"]
        return LabeledComparison(comparison=Comparison(prompt_conversation=renderer_messages(c["prompt_conversation"]),
                                                       completion_A=renderer_messages(c["completion_A"]),
                                                       completion_B=renderer_messages(c["completion_B"])),
                                 label=data["label"])


__all__ = ["ComparisonFileBuilder"]
