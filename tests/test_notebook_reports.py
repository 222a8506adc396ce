"""The shipped explore notebook as a report: it executes headless, shows static tables instead of live
widgets, and never carries a secret, even with TINKER_API_KEY set in the environment it ran in.
"""

import importlib.util
import json
from pathlib import Path

import pytest

from machine_nb.reports.notebook import WIDGET_VIEW, run_report

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "02_explore_runs.ipynb"
CANARY = "tml-canary-F7-0123456789abcdef-DO-NOT-LEAK"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Notebook 02 executed once through run_report with a canary key set; scratch paths under tmp."""
    tmp = tmp_path_factory.mktemp("explore")
    mp = pytest.MonkeyPatch()
    mp.setenv("TINKER_API_KEY", CANARY)  # the kernel inherits the environment
    try:
        yield run_report(NOTEBOOK, {"store": str(tmp / "store"), "export_path": str(tmp / "export" / "train.jsonl")},
                         tmp / "explore.html", progress=False, timeout=600), tmp
    finally:
        mp.undo()


@pytest.mark.slow
def test_report_never_contains_the_key(report):
    rep, _ = report
    for path in (rep.html, rep.executed):
        assert CANARY not in path.read_text(encoding="utf-8"), f"the canary key leaked into {path}"
    # stronger than "scrubbed afterwards": the notebook itself never printed it
    assert rep.redactions == 0, f"{rep.redactions} redaction(s) were needed: a cell printed the key"


@pytest.mark.slow
def test_report_has_no_widget_state_and_shows_static_tables(report):
    rep, _ = report
    nb = json.loads(rep.executed.read_text(encoding="utf-8"))
    assert "widgets" not in nb["metadata"]
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if WIDGET_VIEW in o.get("data", {})], "a live widget view is left in the report"
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"a cell failed: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    html = rep.html.read_text(encoding="utf-8")
    # the run picker's static table shows the picked runs, the plots are embedded images
    picker = next(o for c in nb["cells"] if c.get("id") == "picker" for o in c["outputs"] if "data" in o)
    static = "".join(picker["data"]["text/html"])
    assert "<table" in static and "3 selected" in static
    top, body = html[:html.index("</header>")], html[html.index("</header>"):]  # the report's top, the notebook
    assert body.count("<table") >= 4, "expected the runs, per-machine, picked and tag tables"
    assert body.count("data:image/png;base64") >= 3, "expected the three plots embedded in the HTML"
    # a notebook without a headline still reads as a report: its title, settings, section links, hidden code
    assert "<title>Explore runs: from a Machine workspace to training JSONL</title>" in html
    assert '<code>export_path</code></th><td><code>"' in top and "(set for this report)" in top
    assert top.count("<li><a href=") >= 5 and 'id="mnb-code-toggle"' in top


@pytest.mark.slow
def test_report_shows_the_committed_per_machine_table(report):
    """The cell marked NBVAL_CHECK_OUTPUT shows what the committed copy shows, both as text and as
    the HTML table: the sample workspace is deterministic, so its numbers must not drift. (This run
    is the suite's run of notebook 02: every cell ran without an error, checked above.)"""
    rep, _ = report

    def shown(nb: dict) -> list[dict[str, str]]:
        cell = next(c for c in nb["cells"] if c.get("id") == "by-machine")
        assert "# NBVAL_CHECK_OUTPUT" in "".join(cell["source"])
        return [{mime: "".join(value) for mime, value in out.get("data", {}).items()
                 if mime in ("text/plain", "text/html")} for out in cell["outputs"]]

    ran, committed = (shown(json.loads(p.read_text(encoding="utf-8"))) for p in (rep.executed, NOTEBOOK))
    assert committed and all(out.get("text/plain") and out.get("text/html") for out in committed)
    assert ran == committed


@pytest.mark.slow
def test_report_exports_valid_training_jsonl_to_the_given_path(report):
    rep, tmp = report
    lines = [json.loads(line) for line in (tmp / "export" / "train.jsonl").read_text().splitlines() if line.strip()]
    assert lines, "the export cell wrote no training lines"
    for line in lines:
        assert line["messages"] and {"machine", "run"} <= set(line)
        assert line["messages"][-1]["role"] == "assistant"
    # the scratch store got the tags; the committed sample store was not touched
    assert any((tmp / "store").rglob("*.jsonl")), "no tag rows in the scratch store"


@pytest.mark.slow
def test_minimal_sft_runs_unchanged_on_tinker_until_the_network_and_never_leaks_the_key(tmp_path, monkeypatch):
    """engine="tinker": the same cells validate and price for a Tinker model offline (Inkling's
    tokenizer ships), then stop at the first call that needs the service with a clear error,
    and the key, set and used this time, appears nowhere in the report."""
    from papermill.exceptions import PapermillExecutionError

    monkeypatch.setenv("TINKER_API_KEY", CANARY)
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")  # nothing listens: refused at once, never the internet
    with pytest.raises(PapermillExecutionError) as failure:
        run_report(ROOT / "notebooks" / "01_minimal_sft.ipynb",
                   {"engine": "tinker", "model": "thinkingmachines/Inkling", "log_root": str(tmp_path / "runs")},
                   tmp_path / "tinker.html", progress=False, timeout=600)
    assert failure.value.ename == "EngineError"
    nb = json.loads((tmp_path / "tinker.ipynb").read_text(encoding="utf-8"))
    by_id = {c.get("id"): c for c in nb["cells"]}
    text = lambda cell: json.dumps(by_id[cell].get("outputs", []))
    assert "TINKER_API_KEY: set" in text("setup")
    assert "thinkingmachines/Inkling" in text("validate") and "ready" in text("validate")
    assert "$" in text("cost") and "cannot be bounded" not in text("cost")
    assert "EngineError" in text("baseline"), "the first service call should fail with a clear EngineError"
    for path in (tmp_path / "tinker.html", tmp_path / "tinker.ipynb"):
        assert CANARY not in path.read_text(encoding="utf-8"), f"the key leaked into {path}"


def _refresh_module():
    spec = importlib.util.spec_from_file_location("refresh_notebooks", ROOT / "scripts" / "refresh_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_refresh_strips_per_run_metadata():
    nb = {"metadata": {"papermill": {"duration": 3.2}, "kernelspec": {"name": "python3"}},
          "cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"], "execution": {"iopub.status.idle": "t"},
                                                       "papermill": {"duration": 1.0}}}]}
    out = _refresh_module().strip_run_metadata(nb)
    assert out["metadata"] == {"kernelspec": {"name": "python3"}}
    assert out["cells"][0]["metadata"] == {"tags": ["parameters"]}


def test_refresh_writes_checkout_paths_relative_to_notebooks_with_the_reports_rule(monkeypatch):
    """The committed notebooks and a report name local paths by one rule (report.scrub_notebook)."""
    monkeypatch.setenv("MACHINE_NB_TEST_TOKEN", "s3cret-token-value")
    text = ("local:///srv/repo/notebooks/../runs/a/final /srv/repo/data/x /srv/repo/notebooks/y.json /srv/other "
            "/home/me/.cache/m s3cret-token-value")
    nb = {"metadata": {"papermill": {"input_path": "/srv/repo/notebooks/a.ipynb"}},
          "cells": [{"cell_type": "code", "metadata": {}, "outputs": [
              {"output_type": "stream", "name": "stdout", "text": [text]},
              {"output_type": "display_data", "data": {"text/html": f"<pre>{text}</pre>", "text/plain": text}}]}]}
    nb, redactions = _refresh_module().clean(nb, Path("/srv/repo/notebooks"), home="/home/me")
    want = "local://../runs/a/final ../data/x y.json /srv/other ~/.cache/m [redacted]"
    stream, shown = nb["cells"][0]["outputs"]
    assert stream["text"] == [want] and shown["data"] == {"text/html": f"<pre>{want}</pre>", "text/plain": want}
    assert redactions == 3 and nb["metadata"] == {}


# Text no committed output may hold: a warning or traceback printed into the report, an absolute path of
# the machine that ran it, a loss plot's stale placeholder, a path into Machine's source tree.
UNCLEAN_OUTPUT = ("DeprecationWarning", "FutureWarning", "Traceback", "/work/", "/tmp/", "/home/",
                  "no metrics yet", "Machine src/")


def unclean_outputs(nb: dict) -> list[str]:
    """What makes a notebook's saved outputs unfit to commit: one line per offending output."""
    problems = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            text = json.dumps(out, ensure_ascii=False)
            problems += [f"cell {cell.get('id')}: {bad!r} in an output" for bad in UNCLEAN_OUTPUT if bad in text]
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                problems.append(f"cell {cell.get('id')}: stderr output {''.join(out.get('text', ''))[:200]!r}")
    return problems


def test_unclean_outputs_names_each_kind_of_noise():
    said = {"DeprecationWarning": "x.py:3: DeprecationWarning: the old name ...",
            "FutureWarning": "../machine_nb/evaluate.py:232: FutureWarning: Using the future ...",
            "Traceback": "Traceback (most recent call last):", "/work/": "logs: /work/repo/runs/a",
            "/tmp/": "wrote /tmp/x.json", "/home/": "/home/me/.cache", "no metrics yet": "LossPlot: no metrics yet",
            "Machine src/": "source=Machine src/pricing.ts"}
    for bad, text in said.items():
        nb = {"cells": [{"id": "c1", "outputs": [{"output_type": "display_data", "data": {"text/plain": [text]}}]}]}
        assert [p for p in unclean_outputs(nb) if repr(bad) in p], bad
    warned = {"cells": [{"id": "c2", "outputs": [{"output_type": "stream", "name": "stderr", "text": ["UserWarning: x"]}]}]}
    assert unclean_outputs(warned) == ["cell c2: stderr output 'UserWarning: x'"]
    fine = {"cells": [{"id": "c3", "outputs": [{"output_type": "stream", "name": "stdout",
                                                 "text": ["scratch workspace: ../runs/a/workspace\n"]}]}]}
    assert unclean_outputs(fine) == []


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_committed_notebooks_are_clean_and_parameterised(name):
    nb = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] >= 5
    assert "widgets" not in nb["metadata"], "GitHub refuses notebooks with widget state"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", []), "first code cell must be tagged parameters"
    assert all(c.get("id") for c in nb["cells"])
    assert all(c.get("execution_count") for c in code), "committed notebooks carry executed outputs (refresh them)"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"a committed output is an error: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    text = json.dumps(nb)
    assert WIDGET_VIEW not in text and "papermill" not in json.dumps(nb["metadata"])
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, "absolute local paths in outputs"
    problems = unclean_outputs(nb)
    assert not problems, f"{name} carries output it should not (re-run scripts/refresh_notebooks.py): " + "; ".join(problems)


# The committed notebooks that compare checkpoints state a headline: (notebook, its title, what the headline
# must say besides its interval and n, the accuracy chart's labels, top to bottom).
HEADLINED = {
    "03_tag_train_promote.ipynb": ("Tag → train → held-out cases → promote: a machine learns from its own runs",
                                   ("The candidate scores 80.0% (95% CI", "against the live version v1's 0.0%",
                                    "The promotion gate passed it: committed as v2."),
                                   ["the live version v1", "the candidate"]),
    "05_preference.ipynb": ("Preference training from tags: SFT vs DPO vs SFT→DPO on held-out cases",
                            ("SFT 85.0% (95% CI", "DPO 0.0% (95% CI", "SFT→DPO 80.0% (95% CI",
                             "against the live version v1's 0.0%", "pair accuracy on 20 held-out pairs"),
                            ["live v1", "SFT", "DPO", "SFT→DPO"]),
}


@pytest.mark.parametrize("name", sorted(HEADLINED))
def test_report_of_a_comparing_notebook_opens_with_its_headline_cost_accuracy_chart_and_loss(name):
    """The report's top, built from the committed executed notebook (what `machine-nb report` writes): the
    title, the headline with its interval and n, the cost observed against its estimate, the accuracy
    chart with every compared checkpoint beside the loss curve, and the summary shown after the comparison."""
    import html as html_lib
    import re

    from machine_nb.reports.notebook import SUMMARY_MIME, ReportSummary, to_html

    title, says, labels = HEADLINED[name]
    nb = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
    page = to_html(json.dumps(nb))
    top = page[page.index("<main>"):page.index("</header>")]
    assert f"<title>{html_lib.escape(title)}</title>" in page
    headline = html_lib.unescape(re.search(r'<p class="mnb-headline">(.*?)</p>', top, re.S).group(1))
    assert "n = 20 held-out cases" in headline, headline
    for text in says:
        assert text in headline, (text, headline)
    assert re.search(r"<b>Cost</b>: \$0\.0000 observed \(estimated \$0\.0000; [^)]+\)", top), "no cost line"
    assert re.search(r'class="mnb-chart mnb-accuracy-chart"><img alt="accuracy with 95% intervals" '
                     r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"', top), "no accuracy chart"
    assert 'class="mnb-chart mnb-loss-chart"' in top, "no loss curve beside the accuracy chart"
    # the chart's points: every compared checkpoint, each with its interval
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    at = [i for i, c in enumerate(cells) for o in c.get("outputs", []) if SUMMARY_MIME in o.get("data", {})]
    assert len(at) == 1, "one report summary, shown once"
    summary = ReportSummary.from_dict(next(o["data"][SUMMARY_MIME] for o in cells[at[0]]["outputs"]
                                           if SUMMARY_MIME in o.get("data", {})))
    assert [p["label"] for p in summary.points] == labels
    assert all(p["low"] is not None and p["low"] <= p["accuracy"] <= p["high"] for p in summary.points)
    # shown where the comparison exists: after every cell that may stop the notebook
    stops = [i for i, c in enumerate(cells) if "mnb.stop_notebook(" in "".join(c["source"])]
    assert stops and at[0] > max(stops)
