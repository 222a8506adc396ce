"""The package's warnings point at the user's line (errors.user_stacklevel), however deep inside
machine_nb they are raised."""

import json
import warnings

import machine_nb as mnb
from machine_nb.checks.tokens import TokenEstimateWarning


def test_warnings_name_the_users_line_however_deep_in_the_package_they_are_raised(tmp_path):
    """A warning raised inside machine_nb (in helpers that warn for their caller) points at the
    line that called the package: here, this file."""
    rows = [{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}]
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    calls = {
        "count_tokens (hub-only tokenizer offline)":
            (TokenEstimateWarning, lambda: mnb.count_tokens(rows, "Qwen/Qwen3-8B")),
        "read_jsonl (a skipped line)": (UserWarning, lambda: mnb.read_jsonl(bad, on_error="warn")),
        "tagged (no store there)": (UserWarning, lambda: mnb.tagged(tmp_path / "no-store")),
    }
    for what, (category, call) in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        ours = [w for w in caught if issubclass(w.category, category)]
        assert ours, what
        assert all(w.filename == __file__ for w in ours), (what, [(w.filename, w.lineno) for w in ours])
