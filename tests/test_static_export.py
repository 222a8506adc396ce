"""Static fallback end to end: execute a notebook with the widgets in a real kernel (nbclient),
export it with nbconvert's HTMLExporter, and read the HTML as a person without a kernel would.

The exported page must show the previewer's current example, the cost numbers and the loss plot
as an <img>; the saved notebook must not carry `metadata.widgets` without "state" (GitHub refuses it).
nbclient stores the widget state (JupyterLab does not by default); with it nbconvert picks the live
view, which needs the widget manager from a CDN, so the page is read both as JupyterLab saves it
(no widget state) and as `machine_nb.report.clean_notebook` leaves it.
"""

import copy

import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
nbconvert = pytest.importorskip("nbconvert")

REPO = Path(__file__).resolve().parents[1]

SETUP = """
import json, os, sys
sys.path.insert(0, {repo!r})
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MACHINE_NB_PROGRESS"] = "0"
from pathlib import Path
work = Path({work!r})
"""

CELLS = [
    "from machine_nb import ExamplePreviewer\n"
    "ExamplePreviewer(work / 'train.jsonl', model='thinkingmachines/Inkling', index=1)",
    "from machine_nb import CostMeter\n"
    "CostMeter(work / 'train.jsonl', model='thinkingmachines/Inkling', epochs=2, batch_size=2, budget=1e-6)",
    "from machine_nb import LossPlot\n"
    "LossPlot(work / 'log', live=False)",
    # a live plot: the next cell runs while it polls (the kernel is not blocked), and when the run
    # writes its final checkpoint the saved output is the final state, not the first
    "live = LossPlot(work / 'live', refresh_s=0.05)\nlive",
    "import time\n"
    "with open(work / 'live' / 'metrics.jsonl', 'a') as fh:\n"
    "    for s in range(2, 6):\n"
    "        fh.write(json.dumps({'step': s, 'learning_rate': 1e-4, 'train_mean_nll': 1.0 / (1 + s)}) + '\\n')\n"
    "(work / 'live' / 'checkpoints.jsonl').write_text(json.dumps({'name': 'final'}) + '\\n')\n"
    "deadline = time.monotonic() + 60\n"
    "while live.live and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
    "print('live plot rows:', len(live.frame), 'still polling:', live.live)",
    "import pandas as pd\nfrom machine_nb import CompareView\n"
    "def res(correct, outputs):\n"
    "    return pd.DataFrame({'row': range(3), 'prompt': ['1+1', '2+2', '3+3'], 'expected': ['2', '4', '6'],\n"
    "                         'match': ['number'] * 3, 'output': outputs, 'correct': correct})\n"
    "CompareView(res([True, False, True], ['answer: 2', 'four?', 'answer: 6']),\n"
    "            res([True, True, False], ['answer: 2', 'answer: 4', 'answer: 7']))",
]


def lines():
    out = []
    for i in range(4):
        out.append({"machine": "calc", "run": f"run-{i}", "score": 1.0, "messages": [
            {"role": "user", "content": f"What is {i} + 17?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": f"adding {i} and 17"},
                                              {"type": "text", "text": f"answer: {i + 17}"}]}]})
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    work = tmp_path_factory.mktemp("static")
    (work / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines()))
    log = work / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "learning_rate": 1e-4, "train_mean_nll": 2.0 / (1 + s)}) + "\n" for s in range(8)))
    (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 8}) + "\n")
    (work / "live").mkdir()
    (work / "live" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "learning_rate": 1e-4, "train_mean_nll": 1.0 / (1 + s)}) + "\n" for s in range(2)))

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP.format(repo=str(REPO), work=str(work)))]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(work)}})
    client.execute()
    saved = work / "executed.ipynb"
    nbformat.write(nb, saved)
    from nbconvert import HTMLExporter

    from machine_nb.report import clean_notebook

    as_lab_saves = copy.deepcopy(nb)
    as_lab_saves.metadata.pop("widgets", None)
    cleaned = nbformat.from_dict(clean_notebook(copy.deepcopy(nb)))
    pages = {name: HTMLExporter(embed_images=True).from_notebook_node(x)[0]
             for name, x in (("lab", as_lab_saves), ("report", cleaned))}
    return nb, json.loads(saved.read_text()), pages


def test_cells_ran_without_errors(exported):
    nb, _, _ = exported
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", out


@pytest.mark.parametrize("page", ["lab", "report"])
def test_html_export_shows_the_widgets_without_a_kernel(exported, page):
    html = exported[2][page]
    assert "application/vnd.jupyter.widget-view+json" not in html  # nothing waits on a widget manager
    # the previewer's current example (index 1): its run, its question and the trained badge
    assert "example 2/4 · run run-1" in html
    assert "What is 1 + 17?" in html and "answer: 18" in html
    assert 'class="mnb-trained"' in html and "mnb-tok-trained" in html
    # the cost numbers and the budget verdict
    assert re.search(r"trained tokens</td><td>\d", html)
    assert "over budget by $" in html and "steps</td><td>4 (2 epoch(s) at batch 2)" in html
    # the compare view: numbers, and the flipped rows with both outputs
    assert "wins / ties / losses" in html
    assert 'class="mnb-win"' in html and "four?" in html and 'class="mnb-loss"' in html and "answer: 7" in html
    # the loss plot as an embedded PNG
    assert re.search(r'<img alt="training loss" src="data:image/png;base64,iVBOR', html)


def test_saved_notebook_widget_metadata_is_renderable_on_github(exported):
    _, saved, _ = exported
    widgets_meta = saved.get("metadata", {}).get("widgets")
    if widgets_meta is not None:  # allowed only with its "state" (GitHub's renderer requires it)
        state = widgets_meta.get("application/vnd.jupyter.widget-state+json")
        assert isinstance(state, dict) and "state" in state, widgets_meta
    # each widget output also carries the static fallback and a stable text/plain
    outs = [o for c in saved["cells"] for o in c.get("outputs", []) if "data" in o]
    assert len(outs) == 5
    for out in outs:
        assert "text/html" in out["data"]
        plain = out["data"]["text/plain"]
        plain = "".join(plain) if isinstance(plain, list) else plain  # the file stores multiline text as a list
        assert not re.search(r"0x[0-9a-f]{6,}", plain)  # no object ids: nbval compares text/plain
    assert "image/png" in outs[2]["data"]


def test_live_plot_did_not_block_and_saved_its_final_state(exported):
    nb, saved, _ = exported
    printed = "".join(o.get("text", "") for o in nb.cells[5].outputs if o.get("output_type") == "stream")
    assert "live plot rows: 6 still polling: False" in printed
    live_out = [o for o in saved["cells"][4]["outputs"] if "data" in o][0]
    plain = live_out["data"]["text/plain"]
    plain = "".join(plain) if isinstance(plain, list) else plain
    assert plain == "LossPlot: live: 6 steps, last loss 0.1667"  # the final state, updated in place
    assert "image/png" in live_out["data"]
