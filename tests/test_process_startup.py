"""The toolkit's own long-lived processes start with the garbage collector paused and, once ready,
freeze what their start-up made and resume it (machine_nb.core.process.pause_collection, settle):
the training runner, and `machine-nb serve` (also when it fails before it is ready). A report's
IPython kernel imports the SDK's and the cookbook's stack so before the notebook's first cell
(reports.notebook.kernel_arguments, core.process.preload). A `machine-nb` command's process
freezes what it holds once its exit handlers have run (core.process.freeze_at_exit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pause_then_settle_freezes_what_was_made_and_resumes_the_collector_once():
    """What the process makes while paused (here a hundred thousand containers, as a start-up's
    imports make them) is frozen by settle; the collector runs again, and a second settle is a no-op."""
    code = textwrap.dedent("""
        import gc, json
        from machine_nb.core.process import pause_collection, settle
        pause_collection()
        paused = not gc.isenabled()
        kept = [[i] for i in range(100_000)]
        made = len(gc.get_objects())
        settle()
        frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
        later = [[i] for i in range(1000)]
        settle()  # settled already: nothing more is frozen
        print(json.dumps([paused, gc.isenabled(), frozen >= made, tracked < 1000, gc.get_freeze_count() == frozen]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [True, True, True, True, True]


PROBE = """
import gc, json, sys


def child_run(spec):
    loaded = [m for m in ("torch", "tinker", "tinker_cookbook.supervised.train") if m in sys.modules]
    with open(spec["out"], "w") as f:
        json.dump([gc.isenabled(), gc.get_freeze_count(), loaded], f)
"""


def test_the_training_runner_runs_a_spec_with_its_preloaded_modules_frozen_and_the_collector_on(tmp_path):
    (tmp_path / "gc_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.training.runner"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    watchdog = threading.Timer(120, proc.kill)  # a stuck runner ends its output, and so the reads below
    watchdog.start()
    try:
        from machine_nb.training.runner import RESTARTS

        assert json.loads(proc.stdout.readline()) == {"event": "ready", "restarts": RESTARTS}
        spec = {"module": "gc_probe", "out": str(tmp_path / "gc.json"), "env": env, "cwd": str(tmp_path),
                "log": str(tmp_path / "run.log")}
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"event": "done"}, (tmp_path / "run.log").read_text()
    finally:
        watchdog.cancel()
        proc.stdin.close()
        proc.wait(60)
    enabled, frozen, loaded = json.loads((tmp_path / "gc.json").read_text())
    assert enabled and loaded == ["torch", "tinker", "tinker_cookbook.supervised.train"]
    assert frozen > 100_000  # the SDK's, the cookbook's and torch's objects, made while the collector was paused


def test_serve_that_fails_before_it_is_ready_resumes_the_collector():
    code = textwrap.dedent("""
        import gc, json
        from machine_nb.cli import main
        code = main(["serve", "--host", "0.0.0.0", "--port", "0"])  # no key for an address beyond this machine
        print(json.dumps([code, gc.isenabled()]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [1, True], done.stderr[-2000:]


def _probe_report(tmp_path, first_line: str) -> tuple[int, list]:
    """Run a one-cell notebook (`first_line`, then a probe) as a report; the cell's execution count and
    what the probe saw: [collector on, objects frozen, KERNEL_PRELOAD modules loaded, the notebook's names]."""
    import nbformat

    from machine_nb.reports.notebook import KERNEL_PRELOAD, run_report

    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(first_line + textwrap.dedent("""
        import gc, json, sys
        names = sorted(n for n in globals() if not n.startswith("_") and n not in ("In", "Out", "exit", "quit", "open", "get_ipython"))
        print("PROBE", json.dumps([gc.isenabled(), gc.get_freeze_count(), [m for m in sys.modules if m in %r], names]))
    """ % (KERNEL_PRELOAD,))))
    nbformat.write(nb, tmp_path / "probe.ipynb")
    report = run_report(tmp_path / "probe.ipynb", output=tmp_path / "out" / "probe.html", progress=False)
    (cell,) = json.loads(report.executed.read_text())["cells"]
    (line,) = [ln for o in cell["outputs"] for ln in "".join(o.get("text", "")).splitlines() if ln.startswith("PROBE")]
    return cell["execution_count"], json.loads(line.split(" ", 1)[1])


def test_a_reports_kernel_starts_with_the_stack_preloaded_and_frozen_and_the_notebook_untouched(tmp_path):
    from machine_nb.reports.notebook import KERNEL_PRELOAD

    count, (enabled, frozen, loaded, names) = _probe_report(tmp_path, "import machine_nb as mnb\n")
    assert count == 1  # the preload took no execution count and showed nothing
    assert enabled and sorted(loaded) == sorted(KERNEL_PRELOAD)
    assert frozen > 100_000  # torch's, the SDK's and the cookbook's objects
    assert names == ["gc", "json", "mnb", "sys"]  # the cell's own imports: the preload bound no name


def test_a_notebook_that_does_not_import_machine_nb_is_not_made_to_load_it(tmp_path):
    _, (enabled, frozen, loaded, names) = _probe_report(tmp_path, "")
    assert enabled and loaded == [] and frozen == 0 and names == ["gc", "json", "sys"]


def test_only_an_ipython_kernel_gets_the_preload(tmp_path, monkeypatch):
    from machine_nb.reports.notebook import kernel_arguments

    spec = tmp_path / "kernels" / "other"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": ["other-kernel", "{connection_file}"], "display_name": "Other",
                                                  "language": "other"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert kernel_arguments("other") == [] and kernel_arguments("no-such-kernel") == []
    (line,) = kernel_arguments("python3")
    assert line.startswith("--IPKernelApp.exec_lines=")


EXIT_PROBE = """
import atexit, gc, json, sys
atexit.register(lambda: print("LAST", gc.get_freeze_count()))  # registered first: runs last
from machine_nb.cli import main
if sys.argv[1] == "program":
    sys.argv = ["machine-nb", "corpus", "-o", sys.argv[2]]
    code = main()
else:
    code = main(["corpus", "-o", sys.argv[2]])
atexit.register(lambda: print("EARLIER", gc.get_freeze_count()))  # registered after main: runs before the freeze
sys.exit(code)
"""


def test_a_command_run_as_the_program_freezes_what_it_holds_after_its_exit_handlers(tmp_path):
    found = {}
    for how in ("program", "python"):
        done = subprocess.run([sys.executable, "-c", EXIT_PROBE, how, str(tmp_path / how)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        found[how] = dict(line.split() for line in done.stdout.splitlines() if line.startswith(("LAST", "EARLIER")))
    assert found["program"]["EARLIER"] == "0" and int(found["program"]["LAST"]) > 10_000
    assert found["python"] == {"EARLIER": "0", "LAST": "0"}  # main(argv) from Python leaves the process alone
