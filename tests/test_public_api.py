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
