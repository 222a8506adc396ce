"""Static fallback end to end: execute a notebook with the widgets in a real kernel (nbclient),
export it with nbconvert's HTMLExporter, and read the HTML as a person without a kernel would.

The exported page must show the previewer's current example, the cost numbers and the loss plot
as an <img>; the saved notebook must not carry `metadata.widgets` without "state" (GitHub refuses it).
What a later cell does to a widget (another example, a tag, another model) must show in the page
too, and a loss plot shown while training is one output with the final curve.
nbclient stores the widget state (JupyterLab does not by default); with it nbconvert picks the live
view, which needs the widget manager from a CDN, so the page is read both as JupyterLab saves it
(no widget state) and as `machine_nb.reports.notebook.clean_notebook` leaves it.
"""

import copy

import json
import re
from pathlib import Path

import pytest

import nbclient  # noqa: E402  - project dependencies: a broken install fails, never skips
import nbconvert  # noqa: E402
import nbformat  # noqa: E402

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
    "CostMeter(work / 'train.jsonl', model='thinkingmachines/Inkling', epochs=2, batch_size=2, max_usd=1e-6)",
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
    # 7-8: a later cell moves the previewer; the page shows where it is now
    "later = ExamplePreviewer(work / 'train.jsonl')\nlater",
    "later.show(2)",
    # 9-10: tagging in a later cell; the tagger's output counts it
    "from machine_nb import Tagger\n"
    "tagger = Tagger({'id': 'run-7', 'machine': 'calc', 'history': [], 'trajectory': [\n"
    "    {'role': 'user', 'content': 'What is 7 + 17?'}, {'role': 'assistant', 'content': 'answer: 24'}]},\n"
    "    store=work / 'store')\ntagger",
    "tagger.good('tagged from a later cell')",
    # 11: the SFT cell as notebook 01 wrote it: display with an id, train, then update the same handle
    "def train(log, n, on_metrics=None):\n"
    "    log.mkdir(exist_ok=True)\n"
    "    for s in range(n):\n"
    "        row = {'step': s, 'learning_rate': 1e-4, 'train_mean_nll': 3.0 / (1 + s)}\n"
    "        with open(log / 'metrics.jsonl', 'a') as fh:\n"
    "            fh.write(json.dumps(row) + '\\n')\n"
    "        if on_metrics: on_metrics([row])\n"
    "    (log / 'checkpoints.jsonl').write_text(json.dumps({'name': 'final'}) + '\\n')\n"
    "plot = LossPlot(work / 'sft')\n"
    "view = display(plot, display_id=True)\n"
    "train(work / 'sft', 7)\n"
    "plot.refresh()\n"
    "view.update(plot)",
    # 12: the same with the plot fed by the trainer's callback (it redraws with each of the 4 steps)
    "fed = LossPlot(work / 'fed')\ndisplay(fed)\ntrain(work / 'fed', 4, on_metrics=fed.update)\nfed.stop()",
    # 13-14: another model chosen in a later cell
    "meter = CostMeter(work / 'train.jsonl', model='thinkingmachines/Inkling-Small', max_usd=5)\nmeter",
    "meter.model = 'local/arith-tiny'",
    # 15-16: a run picker, filtered and clicked in a later cell; its saved output shows that state
    "from machine_nb import RunPicker\n"
    "frame = pd.DataFrame({'id': [f'r{i}' for i in range(6)], 'machine': ['a', 'b'] * 3,\n"
    "                      'input': ['what is up', 'hello', 'what now', 'bye', 'what?', 'x'], 'output': ['o'] * 6})\n"
    "picker = RunPicker(frame, page_size=2)\npicker",
    "picker.set_filters(text='what')\npicker.click('r2')",
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
    from machine_nb.reports.notebook import kernel_arguments

    # the kernel `machine-nb report` starts for a notebook that imports machine_nb: the stack the previewer
    # and the meter load for Inkling (torch, tinker, the cookbook's renderers) is imported before the first
    # cell with the garbage collector paused; what the widgets display does not depend on it
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", extra_arguments=kernel_arguments(),
                                     resources={"metadata": {"path": str(work)}})
    client.execute()
    saved = work / "executed.ipynb"
    nbformat.write(nb, saved)
    from nbconvert import HTMLExporter

    from machine_nb.reports.notebook import clean_notebook

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


def text(value):
    return "".join(value) if isinstance(value, list) else value  # the file stores multiline text as a list


def static_outputs(cell):
    """A saved cell's static fallbacks (the widget view sits in an output of its own)."""
    return [o for o in cell.get("outputs", []) if "mnb-static" in text(o.get("data", {}).get("text/html", ""))]


def test_saved_notebook_widget_metadata_is_renderable_on_github(exported):
    _, saved, _ = exported
    widgets_meta = saved.get("metadata", {}).get("widgets")
    if widgets_meta is not None:  # allowed only with its "state" (GitHub's renderer requires it)
        state = widgets_meta.get("application/vnd.jupyter.widget-state+json")
        assert isinstance(state, dict) and "state" in state, widgets_meta
    views = [o for c in saved["cells"] for o in c.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    statics = [o for c in saved["cells"] for o in c.get("outputs", []) if o in static_outputs(c)]
    assert len(views) == len(statics) == 11  # one live view and one static fallback per widget shown
    for out in views + statics:  # a stable text/plain everywhere: nbval compares it
        assert "text/html" in out["data"] and not re.search(r"0x[0-9a-f]{6,}", text(out["data"]["text/plain"]))
    for view in views:  # the view's own html is empty: its static twin speaks where there is no kernel
        assert text(view["data"]["text/html"]) == ""
    assert "image/png" in static_outputs(saved["cells"][3])[0]["data"]


def test_live_plot_did_not_block_and_saved_its_final_state(exported):
    nb, saved, _ = exported
    printed = "".join(o.get("text", "") for o in nb.cells[5].outputs if o.get("output_type") == "stream")
    assert "live plot rows: 6 still polling: False" in printed
    (live_out,) = static_outputs(saved["cells"][4])
    assert text(live_out["data"]["text/plain"]) == "LossPlot: live: 6 steps, last loss 0.1667"  # updated in place
    assert "image/png" in live_out["data"]


@pytest.mark.parametrize("cell, log, steps", [(11, "sft", 7), (12, "fed", 4)])
def test_a_loss_plot_shown_while_training_is_one_output_with_the_final_curve(exported, cell, log, steps):
    _, saved, _ = exported
    outs = saved["cells"][cell]["outputs"]
    assert len(static_outputs(saved["cells"][cell])) == 1, [list(o.get("data", {})) for o in outs]
    assert sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outs) == 1
    (static,) = static_outputs(saved["cells"][cell])
    assert text(static["data"]["text/plain"]).startswith(f"LossPlot: {log}: {steps} steps")
    assert "image/png" in static["data"]


@pytest.mark.parametrize("page", ["lab", "report"])
def test_the_page_shows_what_later_cells_did(exported, page):
    html = exported[2][page]
    assert "example 3/4 · run run-2" in html and "example 1/4" not in html  # moved by `later.show(2)`
    assert "1 tagged here" in html and "tagged from a later cell" in html and "0 tagged here" not in html
    assert "<b>local/arith-tiny</b>" in html and "Inkling-Small</b>" not in html  # the meter's last choice


def test_a_run_pickers_saved_output_shows_what_it_shows_now(exported):
    _, saved, pages = exported
    (out,) = static_outputs(saved["cells"][15])
    html = text(out["data"]["text/html"])
    assert "text: what" in html and "1 selected" in html and "3 match" in html
    assert "text: what" in pages["report"]
