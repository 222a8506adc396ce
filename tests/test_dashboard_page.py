"""`machine-nb dashboard WORKSPACE`: the page on 127.0.0.1, with and without its token; new runs
appear in its JSON; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_writer import write_run  # noqa: E402


def _get(url: str, cookie: str | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {}),
                                    timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_page_needs_its_token_and_follows_new_runs(tmp_path):
    ws = tmp_path / "ws"
    root = ws / ".machine" / "runs"
    write_run(str(root), "support", "r1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MACHINE_NB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "dashboard", str(ws), "--interval", "0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        base, token = m.group(1), m.group(2)
        assert len(token) >= 24
        for path in ("", "api/state", "api/run?key=support/r1"):
            assert _get(base + path)[0] == 403  # no token
            sep = "&" if "?" in path else "?"
            assert _get(f"{base}{path}{sep}token=wrong")[0] == 403
        status, page = _get(f"{base}?token={token}")
        assert status == 200 and b"api/state" in page
        status, body = _get(f"{base}api/state?token={token}")
        state = json.loads(body)
        assert status == 200 and state["snapshot"]["runs"] == 1 and "support/r1" in state["html"]
        write_run(str(root), "coder", "r2")  # lands while the page is served
        for _ in range(200):  # the server's own polling brings it in; each request is a check, not a wait
            state = json.loads(_get(f"{base}api/state?token={token}")[1])
            if state.get("snapshot", {}).get("runs") == 2:
                break
            time.sleep(0.05)
        assert state["snapshot"]["runs"] == 2 and "coder/r2" in state["html"]
        status, body = _get(f"{base}api/run?token={token}&key=coder/r2")
        assert status == 200 and "answer r2" in json.loads(body)["html"]
        # the page opened with its token leaves a cookie in its place (the page's script takes the
        # token out of the address bar): HttpOnly, sent to this page alone, never by another site
        with urllib.request.urlopen(f"{base}?token={token}", timeout=10) as r:
            cookie = r.headers["Set-Cookie"]
        name, value = cookie.split(";")[0].split("=", 1)
        assert name.startswith("machine_nb_dashboard_") and value == token
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower() and "Path=/" in cookie
        assert b"history.replaceState" in page
        for path in ("", "api/state", "api/run?key=coder/r2"):
            assert _get(base + path, cookie=f"{name}={token}")[0] == 200  # a reload: the cookie alone
            assert _get(base + path, cookie=f"{name}=wrong")[0] == 403
            assert _get(base + path, cookie=f"machine_nb_dashboard_other={token}")[0] == 403  # another's name
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped" in err and token not in err and token not in out


def test_help_says_what_it_reads_writes_and_costs():
    from machine_nb.cli import build_parser

    proc = subprocess.run([sys.executable, "-m", "machine_nb.cli", "--help"], capture_output=True, text=True)
    assert re.search(r"^\s{4}dashboard\s", proc.stdout, flags=re.M)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    text = " ".join(sub.choices["dashboard"].format_help().split()).lower()
    assert "127.0.0.1" in text and "token" in text and "reads" in text and "writes" in text and "free" in text


def test_ctrl_c_stops_it_cleanly(tmp_path):
    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MACHINE_NB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "dashboard", str(ws)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert "http://127.0.0.1:" in proc.stdout.readline()  # serving
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "stopped" in err and "Traceback" not in err
