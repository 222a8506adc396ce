"""Renamed keywords keep working for a release, with a warning that names the new one."""

import warnings

import pytest

from machine_nb.compat import renamed


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
