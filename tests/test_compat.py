"""Renamed keywords keep working for a release, with a warning that names the new one."""

import warnings

import pytest

from machine_nb.core.compat import renamed


@renamed(eval_path="data", show_progress="progress")
def run(data, *, progress=None):
    return data, progress


def test_an_old_keyword_is_passed_on_under_its_new_name_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"run\(eval_path=…\) is now run\(data=…\)"):
        assert run(eval_path="rows.jsonl") == ("rows.jsonl", None)
    with pytest.warns(DeprecationWarning, match="progress"):
        assert run("x", show_progress=False) == ("x", False)


def test_new_names_and_positional_calls_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run("x", progress=True) == ("x", True)
        assert run(data="y") == ("y", None)


def test_both_names_at_once_is_an_error():
    with pytest.raises(TypeError, match="both 'eval_path' and 'data'"):
        run(data="a", eval_path="b")


def test_the_wrapper_keeps_the_functions_name_and_docs():
    assert run.__name__ == "run" and run.__renamed__ == {"eval_path": "data", "show_progress": "progress"}


def test_warnings_name_the_users_line_however_deep_in_the_package_they_are_raised(tmp_path):
    """A warning raised inside machine_nb (below a `renamed` wrapper, or helpers that warn for
    their caller) points at the line that called the package: here, this file."""
    import json

    import machine_nb as mnb
    from machine_nb.checks.tokens import TokenEstimateWarning

    rows = [{"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}]
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    calls = {
        "count_tokens (renamed wrapper, hub-only tokenizer offline)":
            (TokenEstimateWarning, lambda: mnb.count_tokens(rows, "Qwen/Qwen3-8B")),
        "read_jsonl (a skipped line)": (UserWarning, lambda: mnb.read_jsonl(bad, on_error="warn")),
        "tagged (no store there)": (UserWarning, lambda: mnb.tagged(tmp_path / "no-store")),
        "an old keyword": (DeprecationWarning, lambda: mnb.count_tokens(path_or_rows=rows, model="Qwen/Qwen3-8B")),
    }
    for what, (category, call) in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        ours = [w for w in caught if issubclass(w.category, category)]
        assert ours, what
        assert all(w.filename == __file__ for w in ours), (what, [(w.filename, w.lineno) for w in ours])
