"""Every name the README and notebooks use is importable from the top-level package, lazily."""

import subprocess
import sys

import machine_nb


def test_every_public_name_resolves():
    missing = [name for name in machine_nb.__all__ if getattr(machine_nb, name, None) is None]
    assert missing == []


def test_import_stays_light():
    code = ("import sys, machine_nb; heavy = [m for m in ('torch', 'pandas', 'tinker', 'tinker_cookbook', "
            "'transformers', 'ipywidgets') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    try:
        machine_nb.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_a_function_keeps_its_name_when_its_namesake_module_loads_first():
    """`evaluate`, `validate`, `compare` and `candidate` are functions defined in modules of the same
    name (in the stage subpackages); importing such a module first (as internal code does) must
    not change what the package's name is."""
    import subprocess
    import sys

    import machine_nb

    namesakes = sorted(name for name, module in machine_nb._API.items() if module.rpartition(".")[2] == name)
    assert {"evaluate", "validate", "compare", "candidate"} <= set(namesakes)
    code = ("import importlib, machine_nb as mnb\n"
            f"api = {dict((n, machine_nb._API[n]) for n in namesakes)!r}\n"
            "for module in api.values(): importlib.import_module('machine_nb.' + module)\n"
            "print(all(callable(getattr(mnb, n)) and getattr(mnb, n).__name__ == n for n in api))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_eval_results_have_a_public_type():
    from machine_nb.evaluation.results import EvalResult

    assert machine_nb.EvalResult is EvalResult and "EvalResult" in machine_nb.__all__


def test_a_run_read_back_comes_from_runlog_and_the_kept_clients_can_be_closed():
    from machine_nb import engines
    from machine_nb.training import runlog

    for name in ("TrainResult", "read_training_log", "training_metrics", "heldout_curve", "heldout_results"):
        assert machine_nb._API[name] == "training.runlog" and getattr(machine_nb, name) is getattr(runlog, name)
    assert machine_nb.close_clients is engines.close_clients
    from machine_nb.training import preference

    assert "DPOResult" not in machine_nb.__all__ and not hasattr(preference, "DPOResult")  # one result class
