"""`stop_notebook`: a notebook that cannot go on shows its reason and the cells below run nothing,
in a real kernel under nbclient and under `run_report` (papermill), which both finish cleanly;
running the stopping cell again checks again; outside a kernel it raises NotebookStopped."""

import json

import nbformat
import pytest
from nbclient import NotebookClient

import machine_nb as mnb
from machine_nb.core.stop import STOPPED_KEY

REASON = "no tag rows yet for helpdesk: tag some runs in the Tagger above, then run from here ($0 spent)"
STOP_CELL = f"if x:\n    mnb.stop_notebook({REASON!r})"


def small_notebook(path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                          "display_name": "Python 3"},
                                            "language_info": {"name": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("import machine_nb as mnb\nprint('before')"),
                nbformat.v4.new_code_cell(STOP_CELL),
                nbformat.v4.new_code_cell("print('after')\n1 / 0"),
                nbformat.v4.new_code_cell("%time 2 + 2"),
                nbformat.v4.new_code_cell(STOP_CELL)]  # the stopping cell run again: it checks again
    nbformat.write(nb, path)
    return path


def test_nbclient_finishes_with_the_reason_and_skips_the_cells_below(tmp_path):
    nb = nbformat.read(small_notebook(tmp_path / "t.ipynb"), as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=120).execute()  # raises on any failed cell
    outs = [c.outputs for c in nb.cells]
    assert outs[1][0]["text"] == "before\n"
    shown = outs[2][0]
    assert shown["metadata"][STOPPED_KEY] == REASON
    assert shown["data"]["text/plain"].startswith("Stopped here. no tag rows yet for helpdesk")
    assert "&#36;0 spent" in shown["data"]["text/html"] and "$0" not in shown["data"]["text/html"]
    assert outs[3] == [] and outs[4] == [], "a cell below the stop ran"
    assert outs[5][0]["metadata"][STOPPED_KEY] == REASON, "the stopping cell, run again, did not check again"


def test_run_report_reads_a_stopped_notebook_as_a_finished_report(tmp_path):
    rep = mnb.run_report(small_notebook(tmp_path / "t.ipynb"), {"x": 1}, tmp_path / "out" / "t.html",
                         progress=False, timeout=120)
    assert rep.stopped == REASON and rep.to_dict()["stopped"] == REASON
    nb = json.loads(rep.executed.read_text(encoding="utf-8"))
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert "Stopped here." in rep.html.read_text(encoding="utf-8")


def test_outside_a_kernel_it_raises_with_the_reason():
    with pytest.raises(mnb.NotebookStopped) as stopped:
        mnb.stop_notebook("no pairs for DPO")
    assert stopped.value.reason == "no pairs for DPO"


def test_in_jupyterlab_the_stopping_cell_edited_and_run_again_lifts_the_stop():
    """JupyterLab names each cell in its execute request (`cellId`): a cell below the stop runs
    nothing, the stopping cell runs again even after an edit, and a front end's silent calls
    (a variable explorer) are never skipped."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def run(code, cell_id=None, silent=False):
            msg = kc.session.msg("execute_request", {"code": code, "silent": silent, "store_history": not silent,
                                                     "user_expressions": {}, "allow_stdin": False,
                                                     "stop_on_error": True},
                                 metadata={"cellId": cell_id} if cell_id else {})
            kc.shell_channel.send(msg)
            outputs = []
            while True:
                m = kc.get_iopub_msg(timeout=60)
                if m["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                    continue
                if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                    break
                if m["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                    outputs.append(m)
            reply = kc.get_shell_msg(timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]
            return outputs

        run("import machine_nb as mnb\nx = 1", "setup")
        stopped = run("if x:\n    mnb.stop_notebook('no pairs for DPO')", "check")
        assert stopped[0]["content"]["metadata"][STOPPED_KEY] == "no pairs for DPO"
        assert run("print('below')", "below") == []
        assert run("print('silent')", silent=True) != [], "a silent request was skipped"
        assert run("x = 0\nprint('edited')", "check")[0]["content"]["text"] == "edited\n"
        assert run("print('below')", "below")[0]["content"]["text"] == "below\n", "the stop was not lifted"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
