"""Reports never carry a secret, not even for a moment: a failing cell's error (terminal line and the
raised exception), the notebook while it runs, and after Ctrl-C. Redaction covers common secret
names, passwords inside URLs, short values and key-shaped strings; nothing is created before the
notebook is known to exist, and the input notebook is never overwritten."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machine_nb.reports.notebook import REDACTED, is_secret_name, run_report, scrub, secret_values

from serving import ctrl_c_reaches_it

CANARY = "tml-canary-7f3a-0123456789abcdefDEADBEEF"  # fake, shaped like a key


def _notebook(path: Path, *sources: str, params: str = "x = 1") -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}, "cells": []}
    for i, source in enumerate((params, *sources)):
        nb["cells"].append({"cell_type": "code", "id": f"c{i}", "metadata": {"tags": ["parameters"] if i == 0 else []},
                            "source": source, "execution_count": None, "outputs": []})
    path.write_text(json.dumps(nb))
    return path


def _files_holding(root: Path, needle: str) -> list[Path]:
    hits = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and needle.encode() in p.read_bytes():
                hits.append(p)
        except OSError:
            pass
    return hits


def _env(tmp: Path, **extra) -> dict:
    (tmp / "tmpdir").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp / "tmpdir"), "TINKER_API_KEY": CANARY, **extra}


# (text a notebook prints and raises, the secret in it that must not be seen, what a reader sees instead)
PASSWORD_FORMS = [
    ("host=db user=u password=CANARYdsn1 dbname=app", "CANARYdsn1", f"host=db user=u password={REDACTED} dbname=app"),
    ("host=db password='CANARY dsn2' port=5432", "CANARY dsn2", f"host=db password='{REDACTED}' port=5432"),
    ("jdbc:postgresql://h/db?user=u&password=CANARYjdbc3&ssl=true", "CANARYjdbc3",
     f"jdbc:postgresql://h/db?user=u&password={REDACTED}&ssl=true"),
    ("jdbc:sqlserver://h:1433;user=u;password=CANARYjdbc4;encrypt=true", "CANARYjdbc4",
     f"jdbc:sqlserver://h:1433;user=u;password={REDACTED};encrypt=true"),
    ("postgres://u:CAN@RYurl5@db.example/app", "RYurl5", f"postgres://u:{REDACTED}@db.example/app"),
    ("mysql://root:CANARYurl6@db.example/app", "CANARYurl6", f"mysql://root:{REDACTED}@db.example/app"),
]
PASSWORDS = " | ".join(form for form, _, _ in PASSWORD_FORMS)


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """One notebook whose cell 3 raises an error holding the key (TINKER_API_KEY) and every
    password form, after cell 2 printed them: run once by `machine-nb report` and once by
    run_report, with HOME=/root (the home folder's name is also a user name in a URL)."""
    from papermill.exceptions import PapermillExecutionError

    tmp = tmp_path_factory.mktemp("failed")
    nb = _notebook(tmp / "fail.ipynb", f"print('before')\nprint({PASSWORDS!r})",
                   f"import os\nraise RuntimeError('bad key ' + os.environ['TINKER_API_KEY'] + ' | ' + {PASSWORDS!r})")
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "report", str(nb), "-o", str(tmp / "out.html")],
                          capture_output=True, text=True, env=_env(tmp, HOME="/root"), cwd=tmp, timeout=600)
    mp = pytest.MonkeyPatch()
    mp.setenv("TINKER_API_KEY", CANARY)
    mp.setenv("HOME", "/root")
    try:
        with pytest.raises(PapermillExecutionError) as err:
            run_report(nb, output=tmp / "lib.html", progress=False)
    finally:
        mp.undo()
    return {"tmp": tmp, "proc": proc, "error": err.value, "html": (tmp / "out.html").read_text(),
            "executed": (tmp / "out.ipynb").read_text()}


def test_a_failing_cell_never_prints_or_raises_the_key(failed):
    proc = failed["proc"]
    assert proc.returncode == 1
    assert "cell 3 failed: RuntimeError: bad key [redacted]" in proc.stderr
    assert "Kernel is running over TCP" not in proc.stderr  # the kernel talks over local sockets (POSIX)
    assert CANARY not in proc.stdout + proc.stderr
    assert not _files_holding(failed["tmp"], CANARY)
    assert "before" in failed["html"]  # the partial report is still written, redacted

    exc = failed["error"]
    for text in (str(exc), repr(exc.args), exc.evalue, "\n".join(exc.traceback)):
        assert CANARY not in text and f"bad key {REDACTED}" in text
    assert exc.__cause__ is None and exc.__suppress_context__  # the raw exception is not chained


def test_every_password_form_is_redacted_in_html_notebook_terminal_and_error(failed):
    import html as html_mod

    proc, html_text, executed = failed["proc"], failed["html"], failed["executed"]
    assert proc.returncode == 1
    raised = "\n".join([str(failed["error"]), failed["error"].evalue, *failed["error"].traceback])
    for form, secret, shown in PASSWORD_FORMS:
        for where, seen in (("html", html_mod.unescape(html_text)), ("executed notebook", executed),
                            ("terminal line", proc.stderr + proc.stdout), ("raised error", raised)):
            assert secret not in seen, (where, form)
        assert shown in html_mod.unescape(html_text) and shown in executed, form
        assert shown in proc.stderr, form  # the terminal line names the error, redacted
    assert "mysql:/~" not in html_text + executed


def test_no_unredacted_file_while_running_or_after_ctrl_c(tmp_path):
    go, started, long = tmp_path / "go", tmp_path / "started", tmp_path / "long"
    nb = _notebook(tmp_path / "slow.ipynb",
                   "import os\nprint('the key is', os.environ['TINKER_API_KEY'])",
                   # the kernel holds the key (its digest proves it without writing it) and has printed it
                   f"import hashlib, pathlib, time\npathlib.Path({str(started)!r}).write_text("
                   "hashlib.sha256(os.environ['TINKER_API_KEY'].encode()).hexdigest())\n"
                   f"while not pathlib.Path({str(go)!r}).exists():\n    time.sleep(0.1)",
                   f"pathlib.Path({str(long)!r}).write_text('1')\ntime.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "report", str(nb), "-o",
                             str(tmp_path / "reports" / "slow.html")], env=_env(tmp_path), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)

    def wait_for(marker: Path) -> None:
        for _ in range(3000):
            if marker.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), proc.stderr.read() if proc.poll() is not None else f"{marker.name}: never reached"

    try:
        # papermill saves the notebook when a cell completes and when the next one starts, so by the
        # time a cell runs, the outputs of the cells above it have been saved
        wait_for(started)  # cell 1 has printed the key and been saved
        assert started.read_text() == hashlib.sha256(CANARY.encode()).hexdigest(), "the kernel never saw the key"
        assert not _files_holding(tmp_path, CANARY), "an unredacted file exists while the report runs"
        go.write_text("1")
        wait_for(long)  # cell 2 saved too; Ctrl-C in the long cell
        assert not _files_holding(tmp_path, CANARY), "an unredacted file exists while the report runs"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert CANARY not in stdout + stderr
    assert not _files_holding(tmp_path, CANARY), "an unredacted file was left behind after Ctrl-C"
    assert not list((tmp_path / "reports").glob("slow.*")), "a Ctrl-C writes no report"
    assert not list((tmp_path / "tmpdir").iterdir()), "temporary files left behind"


def test_secret_names_urls_and_short_values():
    env = {"DB_PASS": "hunter2", "HF_AUTH": "abc123", "MY_PASSWORD": "pw12", "SVC_PWD": "s3cr",
           "GCP_CREDENTIALS": "{\"k\": \"v-123\"}", "X_AUTHORIZATION": "Bearer zzz999", "OPENAI_API_KEY": "sk-short",
           "DATABASE_URL": "postgres://admin:Pa55word@db.example/app",
           "PWD": "/home/me/project", "OLDPWD": "/home/me", "GIT_AUTHOR_NAME": "Jane Doe", "HOME": "/home/me",
           "DEBUG_TOKEN": "1", "FEATURE_KEY": "true", "EMPTY_SECRET": "  ", "AWS_SECRET_ACCESS_KEY": "aws/secret+value"}
    values = secret_values(env)
    for v in ("hunter2", "abc123", "pw12", "s3cr", "{\"k\": \"v-123\"}", "Bearer zzz999", "sk-short", "Pa55word",
              "aws/secret+value"):
        assert v in values, v
    for v in ("/home/me/project", "/home/me", "Jane Doe", "1", "true", "  "):
        assert v not in values, v
    assert [is_secret_name(n) for n in ("DB_PASS", "PWD", "OLDPWD", "GIT_AUTHOR_EMAIL", "X_AUTH_TOKEN", "APIKEY",
                                        "TINKER_API_KEY", "KEYBOARD_LAYOUT", "PATH")] == \
        [True, False, False, False, True, True, True, False, False]

    text, n = scrub("pw hunter2, hunter22 xhunter2 'hunter2' and s3cr in s3cret", values)
    assert text == f"pw {REDACTED}, hunter22 xhunter2 '{REDACTED}' and {REDACTED} in s3cret" and n == 3
    text, _ = scrub("connect postgres://u:pw@h/db and https://bob:t0k%40n@git.example/x and http://h/a:b@c", [])
    assert text == f"connect postgres://u:{REDACTED}@h/db and https://bob:{REDACTED}@git.example/x and http://h/a:b@c"
    text, n = scrub(f"key={CANARY} aws=AKIAIOSFODNN7EXAMPLE ok=task-list-of-things-to-do-today", [])
    assert CANARY not in text and "AKIAIOSFODNN7EXAMPLE" not in text and "task-list-of-things-to-do-today" in text
    assert n == 2
    text, _ = scrub("a\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nxyz\n-----END RSA PRIVATE KEY-----\nb", [])
    assert "MIIEow" not in text and text.startswith("a\n") and text.endswith("\nb")


def test_parameters_with_secret_names_and_key_shaped_outputs_are_redacted(tmp_path):
    nb = _notebook(tmp_path / "p.ipynb", "print('using', api_key)", "print('found tml-' + 'Z' * 30)",
                   params="api_key = 'x'")
    rep = run_report(nb, {"api_key": "hush-hush-value-42"}, tmp_path / "out" / "p.html", progress=False)
    for path in (rep.html, rep.executed):
        text = path.read_text()
        assert "hush-hush-value-42" not in text and "tml-" + "Z" * 30 not in text and REDACTED in text
    assert rep.redactions >= 3
    meta = json.loads(rep.executed.read_text())["metadata"]["papermill"]
    # the report's own place, relative to the notebook like every local path; not where it ran in memory
    assert meta["output_path"] == "out/p.ipynb"


def test_a_missing_notebook_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing.ipynb"):
        run_report("missing.ipynb", progress=False)
    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "report", "missing.ipynb"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1 and "missing.ipynb" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    # said before the notebook machinery (papermill, nbformat: seconds of imports) is loaded
    said = subprocess.run([sys.executable, "-c", "import sys\nfrom machine_nb.cli import main\n"
                           "code = main(['report', 'missing.ipynb'])\n"
                           "print(code, sorted(m for m in ('papermill', 'nbformat') if m in sys.modules))"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert said.stdout.split("\n")[0] == "1 []" and "no notebook at" in said.stderr, said


def test_the_input_notebook_is_never_overwritten(tmp_path):
    nb = _notebook(tmp_path / "same.ipynb", "print(1)")
    before = nb.read_bytes()
    with pytest.raises(ValueError, match="overwrite"):
        run_report(nb, output=tmp_path / "same.html", progress=False)
    assert nb.read_bytes() == before and not (tmp_path / "same.html").exists()


def test_cli_parameter_nested_too_deep_stays_a_string():
    from machine_nb.cli.report import _value

    assert _value("[" * 100_000) == "[" * 100_000 and _value("[1, 2]") == [1, 2] and _value("x") == "x"


def test_scrubbing_a_deeply_nested_output_is_no_recursion_error():
    from machine_nb.reports.notebook import _scrub_tree

    deep = inner = []
    for _ in range(5_000):
        inner.append([])
        inner = inner[0]
    inner.append(f"the key {CANARY}")
    _, n = _scrub_tree({"outputs": deep, f"k {CANARY}": 1}, [CANARY])
    assert n == 2 and inner == [f"the key {REDACTED}"]


def test_a_secret_shown_in_an_html_output_is_redacted_in_its_escaped_form(tmp_path, monkeypatch):
    """A table or view shows text HTML-escaped ("&" as "&amp;"): a password holding "&", "<", ">",
    a quote or "$" is redacted in that form too, so the page and the notebook do not show it."""
    import html as html_mod

    password = "Tr0ub4dor&3<horse>'$x"
    monkeypatch.setenv("DB_PASSWORD", password)
    nb = _notebook(tmp_path / "t.ipynb",
                   "import html, os\nimport pandas as pd\nfrom IPython.display import HTML, display\n"
                   "from machine_nb.core.theme import escape\n"
                   "pd.DataFrame({'setting': ['db password'], 'value': [os.environ['DB_PASSWORD']]})",
                   "display(HTML('<p>' + html.escape(os.environ['DB_PASSWORD']) + '</p>'))\n"
                   "display(HTML('<p>' + escape(os.environ['DB_PASSWORD']) + '</p>'))")
    rep = run_report(nb, output=tmp_path / "out" / "t.html", progress=False)
    page, executed = rep.html.read_text(), rep.executed.read_text()
    for where, text in (("html", page), ("executed notebook", executed)):
        seen = html_mod.unescape(text.replace("&#36;", "$"))
        assert password not in seen, where
    outputs = [out for cell in json.loads(executed)["cells"] for out in cell.get("outputs", [])]
    shown = "".join("".join(o.get("data", {}).get("text/html", "")) for o in outputs)
    assert shown.count(REDACTED) == 3 and "horse" not in shown

    text, n = scrub(f"<td>{html_mod.escape(password, quote=False)}</td> <b>{html_mod.escape(password)}</b>",
                    secret_values({"DB_PASSWORD": password}))
    assert text == f"<td>{REDACTED}</td> <b>{REDACTED}</b>" and n == 2


def test_a_secret_named_parameter_given_as_a_number_is_redacted(tmp_path):
    """`machine-nb report -p db_password 48213907` passes a number (the CLI reads JSON): it is a
    secret all the same, redacted in what the notebook prints and in the notebook's metadata."""
    nb = _notebook(tmp_path / "n.ipynb", "print('connecting with', db_password)")
    data = json.loads(nb.read_text())
    data["cells"][0]["source"] = "db_password = 'x'\nn_rows = 0"
    nb.write_text(json.dumps(data))
    rep = run_report(nb, {"db_password": 48213907, "n_rows": 24}, tmp_path / "out" / "n.html", progress=False)
    executed = json.loads(rep.executed.read_text())
    assert "48213907" not in rep.html.read_text() and "connecting with [redacted]" in rep.html.read_text()
    assert executed["metadata"]["papermill"]["parameters"] == {"db_password": REDACTED, "n_rows": 24}
    printed = [out for cell in executed["cells"] for out in cell.get("outputs", []) if out.get("name") == "stdout"]
    assert ["".join(out["text"]) for out in printed] == ["connecting with [redacted]\n"]


def test_a_reports_kernel_uses_local_sockets_only_where_the_runtime_folder_can_hold_them(tmp_path, monkeypatch):
    """IPC where Jupyter's runtime folder takes a Unix socket; TCP (nbclient's default) where its
    path is too long for a socket's name or it cannot hold one (here: a file in its path)."""
    import tempfile

    from machine_nb.reports.notebook import kernel_manager

    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # tmp_path's own path is past a socket name's room
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", os.path.join(short, "runtime"))
        chosen = kernel_manager()["kernel_manager_class"]
        assert chosen().transport == "ipc" and chosen(transport="tcp").transport == "tcp"
        assert os.listdir(os.path.join(short, "runtime")) == []  # the probe is gone
        with open(os.path.join(short, "file"), "w"):
            pass
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", os.path.join(short, "file", "runtime"))
        assert kernel_manager() == {}
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    assert len(str(tmp_path / "runtime")) + 55 > 100 and kernel_manager() == {}
