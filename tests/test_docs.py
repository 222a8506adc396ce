"""The documentation site: it builds offline in strict mode, its API reference names every public
name, and the README's library example runs as written."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

import machine_nb

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_strict(tmp_path, monkeypatch, caplog):
    """`make docs`'s build, through mkdocs' own build function in this process (the interpreter and
    the notebook libraries it has loaded serve it): broken links, missing anchors and references,
    and griffe's docstring warnings all fail a strict build."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    site = tmp_path / "site"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    monkeypatch.chdir(ROOT)  # snippets' base_path is the working directory, as under `make docs`
    config = load_config(str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(site))
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build(config)
    except Abort as exc:
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        pytest.fail(f"{exc}\n" + "\n".join(said)[-4000:])
    finally:
        config.plugins.on_shutdown()
    api = (site / "api.html").read_text(encoding="utf-8")
    cli = (site / "cli.html").read_text(encoding="utf-8")
    # the API page carries rendered docstrings, not just the names
    assert "All runs of a workspace as a DataFrame" in api
    # the CLI page is written from --help: every command's usage line is there
    for command in ("runs", "sft", "serve", "report", "dpo"):
        assert f"usage: machine-nb {command}" in cli, command
    assert "usage: machine-nb eval baseline" in cli
    # every tutorial notebook became a page
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert (site / "tutorials" / f"{nb.stem}.html").is_file(), nb.name


def test_api_reference_names_every_public_name():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^::: machine_nb\.[\w.]+\.(\w+)$", text, flags=re.M))
    missing = sorted(set(machine_nb.__all__) - listed)
    assert not missing, f"public names missing from docs/api.md: {missing}"
    for line in re.findall(r"^::: (machine_nb\.[\w.]+)$", text, flags=re.M):
        module, name = line.rsplit(".", 1)
        assert machine_nb._API[name] == module.removeprefix("machine_nb."), line


def test_every_public_name_has_a_docstring():
    undocumented = [name for name in machine_nb.__all__
                    if not isinstance(getattr(machine_nb, name), (dict, list, tuple))
                    and not (getattr(machine_nb, name).__doc__ or "").strip()]
    assert not undocumented, f"public names without a docstring: {undocumented}"


def _readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_code_runs_as_written(tmp_path, monkeypatch):
    """The README's Python block, run as written from a folder laid out like the repository
    (the sample workspace beside it), offline, on the local engine."""
    blocks = _readme_python_blocks()
    assert blocks, "README.md has no python block"
    shutil.copytree(ROOT / "data" / "sample_workspace", tmp_path / "data" / "sample_workspace")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}  # one namespace: a reader runs the blocks in order
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 (the README's own example)


def test_every_picture_the_readme_and_docs_show_is_there():
    """The README's widget pictures (light and dark), as scripts/docs_images.py copies them from the
    browser tests' gallery, are committed under docs/images/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_images", ROOT / "scripts" / "docs_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shown = module.shown()
    assert {f"{w}-{t}.png" for w in ("run_picker", "previewer", "loss_plot", "candidate_view", "sweep_view")
            for t in ("light", "dark")} <= shown
    missing = sorted(n for n in shown if not (ROOT / "docs" / "images" / n).is_file())
    assert not missing, f"pictures shown but not in docs/images/: {missing}"
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150
