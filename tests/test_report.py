"""Reports: a notebook executed with parameters becomes HTML + executed .ipynb, with no secret."""

import json
import re
from pathlib import Path

import pytest

from machine_nb.reports.notebook import WIDGET_VIEW, clean_notebook, run_report, scrub, secret_values

CANARY = "tml-canary-0123456789abcdefDEADBEEF"


def _notebook(path: Path, cells: list[tuple[str, str, list[str]]]) -> Path:
    """Write a notebook as plain JSON: (cell_type, source, tags) triples."""
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}, "cells": []}
    for i, (kind, source, tags) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"c{i}", "metadata": {"tags": tags}, "source": source}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        nb["cells"].append(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    return path


def test_report_injects_parameters_and_writes_html_and_ipynb(tmp_path):
    nb = _notebook(tmp_path / "demo.ipynb", [
        ("markdown", "# Demo report", []),
        ("code", "steps = 1\nlabel = 'default'", ["parameters"]),
        ("code", "print(f'steps={steps} label={label}')", []),
    ])
    out = tmp_path / "out" / "demo.html"
    report = run_report(nb, {"steps": 7, "label": "seven"}, out, progress=False)
    assert report.html == out.resolve() and out.exists()
    executed = json.loads(report.executed.read_text())
    stdout = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "steps=7 label=seven" in stdout
    html = out.read_text()
    assert "steps=7 label=seven" in html and "Demo report" in html
    # no report_summary: still a report's top (title, settings, section links, hidden code), no headline
    assert "<title>Demo report</title>" in html and 'class="mnb-headline"' not in html
    assert re.search(r'<code>steps</code></th><td><code>7</code> <span class="mnb-set">\(set for this report\)', html)
    assert 'id="mnb-code-toggle"' in html and 'class="mnb-toc"' in html


def test_report_redacts_secret_env_values_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", CANARY)
    nb = _notebook(tmp_path / "leak.ipynb", [
        ("code", "note = ''", ["parameters"]),
        ("code", "import os\nprint(os.environ['TINKER_API_KEY'])\nos.environ['TINKER_API_KEY']", []),
        ("code", "from IPython.display import HTML\nHTML('<b>' + os.environ['TINKER_API_KEY'] + '</b>')", []),
    ])
    report = run_report(nb, {"note": CANARY[:4]}, tmp_path / "out" / "leak.html", progress=False)
    for path in (report.html, report.executed):
        text = path.read_text()
        assert CANARY not in text, f"secret leaked into {path}"
        assert "[redacted]" in text
    assert report.redactions >= 3


def test_failed_cell_still_writes_partial_report_then_raises(tmp_path):
    from papermill.exceptions import PapermillExecutionError

    nb = _notebook(tmp_path / "bad.ipynb", [
        ("code", "x = 1", ["parameters"]),
        ("code", "print('before')", []),
        ("code", "raise ValueError('boom in cell')", []),
    ])
    with pytest.raises(PapermillExecutionError):
        run_report(nb, {}, tmp_path / "out" / "bad.html", progress=False)
    html = (tmp_path / "out" / "bad.html").read_text()
    assert "before" in html and "boom in cell" in html


def test_clean_notebook_drops_widget_views_with_fallback_and_widget_metadata():
    view = {"version_major": 2, "version_minor": 0, "model_id": "abc"}
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"version_major": 2}}},
          "cells": [{"cell_type": "code", "outputs": [
              {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": view,
                                                       "text/html": "<table></table>", "text/plain": "Picker"}},
              {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": view}},
          ]}]}
    out = clean_notebook(nb)
    assert "widgets" not in out["metadata"]
    first, second = out["cells"][0]["outputs"]
    assert set(first["data"]) == {"text/html", "text/plain"}
    assert "interactive widget" in second["data"]["text/plain"]


def test_secret_values_and_scrub_cover_json_escaped_forms():
    env = {"TINKER_API_KEY": 'ab"cd\\efgh1234', "HOME": "/root", "SHORT_TOKEN": "1"}
    assert secret_values(env) == ['ab"cd\\efgh1234']
    text, n = scrub(json.dumps({"v": env["TINKER_API_KEY"]}), secret_values(env))
    assert n == 1 and "efgh1234" not in text


def test_cli_report_parses_parameters(tmp_path, capsys):
    """`machine-nb report -p lr 3e-3 -p name hello`: the number reaches the notebook as a float, the word
    as a string. The command runs in this process (`main`, the parsing and the report it writes are the
    program's); tests/test_hardening_report.py runs it as the program, `python -m machine_nb.cli report`."""
    from machine_nb.cli import main

    nb = _notebook(tmp_path / "cli.ipynb", [
        ("code", "lr = 0.1\nname = 'x'", ["parameters"]),
        ("code", "print(type(lr).__name__, lr, name)", []),
    ])
    out = tmp_path / "out" / "cli.html"
    code = main(["report", str(nb), "-p", "lr", "3e-3", "-p", "name", "hello", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "float 0.003 hello" in out.read_text()


def test_report_writes_local_paths_relative_to_the_notebook_and_home_as_tilde(tmp_path, monkeypatch):
    """A report made on a user's machine names no absolute path of it: what the notebook prints under
    its own folder (or the project folder above it) reads relative to the notebook, what it prints
    under the home folder reads `~/…`, in every output type, the metadata and the HTML."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the kernel inherits it
    nb = _notebook(tmp_path / "proj" / "notebooks" / "paths.ipynb", [
        ("code", "log_root = '../runs'", ["parameters"]),
        ("code", "import os\nfrom pathlib import Path\nfrom IPython.display import HTML, JSON, display\n"
                 "log_dir = Path(log_root).absolute() / 'x' / 'sft'\n"
                 "here = Path.cwd() / 'cache' / 'a.json'\n"
                 "ckpt = Path(os.environ['HOME']) / 'models' / 'ckpt'\n"
                 "print(log_dir, here, ckpt, '/elsewhere/x')", []),
        ("code", "class Result:\n"
                 "    def __repr__(self): return f'Result(log_dir={str(log_dir.resolve())!r}, ckpt={str(ckpt)!r})'\n"
                 "    def _repr_html_(self): return f'<code>{log_dir}</code> <code>{ckpt}</code>'\n"
                 "display(JSON({'log_dir': str(log_dir), 'here': str(here)}))\nResult()", []),
        ("code", "raise ValueError(f'no checkpoint at {ckpt}')", []),
    ])
    out = tmp_path / "proj" / "reports" / "paths.html"
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError):
        run_report(nb, {}, out, progress=False)
    for path in (out, out.with_suffix(".ipynb")):
        text = path.read_text(encoding="utf-8")
        assert str(tmp_path) not in text, f"an absolute path of this machine in {path.name}"
        assert str(home) not in text and str(tmp_path / "proj") not in text
        for shown in ("../runs/x/sft", "cache/a.json", "~/models/ckpt", "/elsewhere/x", "no checkpoint at ~/models/ckpt"):
            assert shown in text, f"{shown!r} not in {path.name}"
    executed = json.loads(out.with_suffix(".ipynb").read_text(encoding="utf-8"))
    shown, result = next(c for c in executed["cells"] if c["id"] == "c2")["outputs"]
    assert shown["data"]["application/json"] == {"log_dir": "../runs/x/sft", "here": "cache/a.json"}
    assert "".join(result["data"]["text/plain"]) == "Result(log_dir='../runs/x/sft', ckpt='~/models/ckpt')"
    assert "".join(result["data"]["text/html"]) == "<code>../runs/x/sft</code> <code>~/models/ckpt</code>"
    assert executed["metadata"]["papermill"]["output_path"] == "../reports/paths.ipynb"


def test_path_rewriter_changes_only_the_notebook_project_and_home_folders(tmp_path):
    from machine_nb.reports.notebook import path_rewriter

    rewrite = path_rewriter("/srv/proj/notebooks", home="/home/me")
    cases = {
        "/srv/proj/notebooks/cache/a.json": "cache/a.json",
        "/srv/proj/notebooks/../runs/x/sft": "../runs/x/sft",
        "local:///srv/proj/notebooks/../runs/a/final": "local://../runs/a/final",
        "/srv/proj/runs/x": "../runs/x",
        "cwd=/srv/proj/notebooks, root=/srv/proj.": "cwd=., root=...",
        "/srv/proj/notebooks/": "./",
        "/home/me/.cache/machine_nb/i.parquet": "~/.cache/machine_nb/i.parquet",
        "'/home/me'": "'~'",
        # not under those folders, only alike: left as they are
        "/srv/proj2/x /srv/project /home/me2/x /home/me.bak /data/home/me/x /srv/other /tmp/x":
            "/srv/proj2/x /srv/project /home/me2/x /home/me.bak /data/home/me/x /srv/other /tmp/x",
        "see /home/meaning and srv/proj/notebooks/x": "see /home/meaning and srv/proj/notebooks/x",
    }
    for text, want in cases.items():
        assert rewrite(text) == want, text
    # escaped as JSON inside a string, or as HTML
    odd = path_rewriter('/srv/a "b"/nb', home="/home/me")
    assert odd(json.dumps({"p": '/srv/a "b"/nb/x'})) == json.dumps({"p": "x"})
    assert odd("<code>/srv/a &quot;b&quot;/nb/x</code>") == "<code>x</code>"
    # a folder above that holds the home folder (or is /) is not claimed: home paths read ~/…
    assert path_rewriter("/home/me/nb", home="/home/me")("/home/me/data /home/you") == "~/data /home/you"
    assert path_rewriter("/nb", home="/home/me")("/nb/x /etc/hosts /home/me/y") == "x /etc/hosts ~/y"
    # a symlinked folder is matched by its given and its real path
    (tmp_path / "real" / "nb").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    linked = path_rewriter(tmp_path / "link" / "nb", home="/nowhere")
    assert linked(f"{tmp_path}/link/nb/x {tmp_path}/real/nb/y {tmp_path}/real/z") == "x y ../z"


def test_secrets_are_redacted_before_paths_are_rewritten():
    """A secret value that is a path under home is found whole, never left behind as `~/…`."""
    from machine_nb.reports.notebook import scrub_notebook

    key_file = "/home/me/.config/gcloud/service-key.json"
    nb = {"cells": [{"outputs": [{"text": f"key at {key_file}, runs at /home/me/proj/runs"}]}]}
    nb, n = scrub_notebook(nb, secret_values({"GCP_CREDENTIALS": key_file}), "/home/me/proj/notebooks", "/home/me")
    assert n == 1 and nb["cells"][0]["outputs"][0]["text"] == "key at [redacted], runs at ../runs"


def test_clean_notebook_drops_the_live_twin_of_a_widget_whose_static_output_is_kept():
    """A machine_nb widget shows as its static output (kept up to date) then its live view, whose
    text/plain is the state when it was first shown: with the view gone that copy is stale
    ("LossPlot: no metrics yet" beside the final curve), so the whole live output goes."""
    static = {"output_type": "display_data", "metadata": {}, "data": {
        "text/html": '<div class="mnb-static" data-mnb-static="m1"><img/></div>', "image/png": "iVBOR",
        "text/plain": "LossPlot: sft: 60 steps, last loss 0.01"}}
    live = {"output_type": "display_data", "metadata": {}, "data": {
        WIDGET_VIEW: {"version_major": 2, "model_id": "m1"},
        "text/html": "", "text/plain": "LossPlot: no metrics yet"}}
    other = {"output_type": "display_data", "data": {WIDGET_VIEW: {"model_id": "m2"}, "text/html": "<b>slider</b>",
                                                      "text/plain": "IntSlider(value=3)"}}
    bare = {"output_type": "display_data", "data": {WIDGET_VIEW: {"model_id": "m3"}}}
    nb = {"metadata": {}, "cells": [{"cell_type": "code", "outputs": [static, live]},
                                    {"cell_type": "code", "outputs": [other, bare]}]}
    first, second = (c["outputs"] for c in clean_notebook(nb)["cells"])
    assert first == [static], "the live twin (and its stale text) is left"
    assert second[0]["data"] == {"text/html": "<b>slider</b>", "text/plain": "IntSlider(value=3)"}
    assert "interactive widget" in second[1]["data"]["text/plain"]


def test_the_progress_flag_is_called_progress(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_report(tmp_path / "missing.ipynb", progress=False)
    with pytest.raises(TypeError, match="progress_bar"):
        run_report(tmp_path / "missing.ipynb", progress_bar=False)


SUMMARY_CELL = """import pandas as pd
import machine_nb as mnb
from machine_nb.evaluation.results import EvalResult

def results(name, correct):
    n = len(correct)
    rows = pd.DataFrame({"row": range(n), "prompt": ["q"] * n, "expected": ["a"] * n, "output": ["a"] * n,
                         "correct": correct})
    return EvalResult(rows=rows, summary={"name": name})

comparison = mnb.compare(results("base", [False] * 12), results("tuned", [True] * 12))
mnb.report_summary(comparison, baseline="the base model", checkpoint="the checkpoint", cost_usd=0.0,
                   estimated_usd=0.5, cost_note="training")"""


def _header(page: str) -> str:
    return page[page.index("<main>"):page.index("</header>")]


def test_report_page_opens_with_title_headline_cost_charts_settings_and_links_and_hides_code(tmp_path):
    """What a colleague reads first: the notebook's title (the page's too), the result in one sentence with
    its interval and n, the cost, an accuracy chart, the settings with what the run set, links to every
    section; the code one click away; nothing fetched from the network."""
    token = "tok-0123456789abcdefSECRET"
    nb = _notebook(tmp_path / "demo.ipynb", [
        ("markdown", "# Demo *report*: a title\n\nWhat this notebook is for.", []),
        ("code", "steps = 1  # optimizer steps\nlabel = 'default'  # a name\napi_token = None  # the service's key",
         ["parameters"]),
        ("markdown", "## 1. Results", []),
        ("code", SUMMARY_CELL, []),
        ("markdown", "## Limitations, in plain words\n\n- Twelve rows.", []),
    ])
    page = run_report(nb, {"steps": 7, "api_token": token}, tmp_path / "out" / "demo.html", progress=False).html
    page = page.read_text()
    top = _header(page)
    assert "<title>Demo report: a title</title>" in page
    assert '<h1 class="mnb-title">Demo report: a title</h1>' in top
    headline = re.search(r'<p class="mnb-headline">(.*?)</p>', top).group(1)
    assert ("The checkpoint scores 100.0% (95% CI" in headline and "against the base model's 0.0%" in headline
            and "on n = 12 held-out rows" in headline and "McNemar, p = " in headline), headline
    assert "<b>Cost</b>: $0.0000 observed (estimated $0.5000; training)" in top  # the page runs no math typesetter
    assert re.search(r'class="mnb-chart mnb-accuracy-chart"><img alt="accuracy with 95% intervals" '
                     r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"', top)
    assert re.search(r'<code>steps</code></th><td><code>7</code> <span class="mnb-set">\(set for this report\)'
                     r"</span></td><td>optimizer steps</td>", top)
    assert "<code>api_token</code></th><td><code>[redacted]</code>" in top and token not in page
    links = re.findall(r"<li><a href='#([^']+)'>([^<]+)</a></li>", top)
    assert [text for _, text in links] == ["1. Results", "Limitations, in plain words"], links
    for anchor, _ in links:
        assert f'<h2 id="{anchor}">' in page, anchor
    # the code is in the page (one click shows it), hidden until then
    # (the parameters, the values the run injected, the summary's cell)
    assert page.count('<div class="cm-editor cm-s-jupyter">') == 3, "the code cells' sources are not in the page"
    assert "body:not(.mnb-show-code) .jp-CodeCell .jp-Cell-inputWrapper { display: none; }" in page
    assert '<button aria-pressed="false" id="mnb-code-toggle" type="button">Show code</button>' in top
    # nothing fetched: no script or stylesheet from anywhere, no MathJax, require.js or widget manager
    assert not re.search(r"<script[^>]*\ssrc=|<link[^>]*\shref=[\"']?https?:", page)
    for fetched in ("cdnjs", "unpkg", "jsdelivr", "require.js", "MathJax.Hub", "html-manager"):
        assert fetched not in page, fetched


def test_report_summary_reads_compare_many_and_a_sweep_summary():
    import pandas as pd

    import machine_nb as mnb
    from machine_nb.reports.notebook import SUMMARY_MIME
    from machine_nb.evaluation.results import EvalResult

    def results(name, correct):
        n = len(correct)
        rows = pd.DataFrame({"row": range(n), "prompt": ["q"] * n, "expected": ["a"] * n, "output": ["a"] * n,
                             "correct": correct})
        return EvalResult(rows=rows, summary={"name": name})

    base = results("base", [False] * 10)
    many = mnb.compare_many(base, {"a": results("a", [True] * 5 + [False] * 5), "b": results("b", [True] * 9 + [False])})
    sweep = pd.DataFrame([{"learning_rate": 0.003, "epochs": 10, "seeds": 3, "metric": "heldout_accuracy",
                           "mean": 0.9, "ci_low": 0.7, "ci_high": 0.97, "effective_n": 24.0}])
    summary = mnb.report_summary(many, sweep=sweep, cost_usd=None)
    labels = [p["label"] for p in summary.points]
    assert labels == ["base", "a", "b", "learning_rate=0.003, epochs=10 (3 seeds)"], labels
    assert [p["group"] for p in summary.points] == ["compared"] * 3 + ["sweep"]
    assert summary.headline.startswith("B (best of 2) scores 90.0%")
    assert summary.cost_text() is None
    bundle = summary._repr_mimebundle_()
    assert bundle[SUMMARY_MIME] == summary.to_dict() and json.loads(json.dumps(bundle[SUMMARY_MIME]))
    assert "$" not in bundle["text/html"] and "data:image/png;base64," in bundle["text/html"]


def test_a_malformed_report_summary_output_is_named_with_its_cell_and_what_to_do():
    from machine_nb.reports.notebook import SUMMARY_MIME, to_html

    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": "result", "metadata": {}, "execution_count": 1, "source": "", "outputs": [
            {"output_type": "display_data", "metadata": {},
             "data": {SUMMARY_MIME: {"headline": "h", "points": [{"label": "a", "accuracy": "high"}]},
                      "text/plain": "ReportSummary"}}]}]}
    with pytest.raises(ValueError, match=r"cell result: .*points\[0\]\.accuracy: not a number.*report_summary"):
        to_html(json.dumps(nb))
