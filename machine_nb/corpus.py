"""The minimal-SFT arithmetic corpus: bare questions whose target is exactly `answer: <integer>`.

The phrasings below are shared with the local engine's pretraining corpus
(machine_nb/engines/local/build.py), so the shipped base model answers these very questions
naturally ("47 + 15 = 62") before SFT teaches it the house style.
"""

from __future__ import annotations

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
