"""`machine-nb dashboard WORKSPACE` against a careless or hostile caller: another site's page
calling 127.0.0.1 (Host header, content types, script policy), keys that name paths, a request
body nobody reads, a run that cannot be shown, a workspace that cannot be read, a port taken.

The app runs in this process, on a loop in a thread; requests go through http.client so the
Host header is the test's to choose.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from dashboard_writer import write_run  # noqa: E402

TOKEN = "FAKE-CANARY-dashboard-token-not-a-secret"


class Served:
    """make_app served by make_server on a free port, on its own loop in a thread."""

    def __init__(self, state, problems=None) -> None:
        import tornado.netutil

        from machine_nb.cli.dashboard import make_app, make_server

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)

            async def start() -> None:
                sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
                kw = {} if problems is None else {"problems": problems}
                self.server = make_server(make_app(state, TOKEN, **kw))
                self.server.add_sockets(sockets)
                self.port = sockets[0].getsockname()[1]
                ready.set()

            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def get(self, path: str, host: str | None = None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Host": host} if host is not None else {}
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body

    def close(self) -> None:
        async def stop() -> None:
            self.server.stop()
            await self.server.close_all_connections()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def workspace(tmp_path):
    ws = tmp_path / "ws"
    write_run(str(ws / ".machine" / "runs"), "support", "r1")
    return ws


@pytest.fixture
def served(workspace):
    from machine_nb.widgets.dashboard import DashboardState

    state = DashboardState(workspace)
    s = Served(state)
    yield s
    s.close()
    state.close()


def test_an_unknown_key_is_answered_as_json_not_as_a_page(served):
    status, headers, body = served.get(f"/api/run?token={TOKEN}&key=%3Cscript%3Ealert(1)%3C/script%3E")
    assert status == 404
    assert headers["content-type"].startswith("application/json")  # the key is echoed: never as HTML
    assert headers["x-content-type-options"] == "nosniff"
    assert "no run" in json.loads(body)["error"]


def test_keys_naming_paths_are_not_runs(served, workspace):
    for key in ("../../../etc/passwd", "/etc/passwd", str(workspace / ".machine" / "runs" / "support" / "r1.json"),
                "support/../support/r1", "support/r1/../../support/r1"):
        status, _, body = served.get(f"/api/run?token={TOKEN}&key={key}")
        assert status == 404, key
        assert "root:" not in body.decode()
    assert served.get(f"/api/run?token={TOKEN}&key=support/r1")[0] == 200


def test_another_sites_host_is_refused_even_with_the_token(served):
    # DNS rebinding: a page of evil.example whose name now points at 127.0.0.1
    for host in ("evil.example", f"evil.example:{served.port}", f"127.0.0.1.evil.example:{served.port}"):
        status, _, body = served.get(f"/api/state?token={TOKEN}", host=host)
        assert status == 403, host
        assert TOKEN.encode() not in body
    for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}", "LOCALHOST"):
        assert served.get(f"/api/state?token={TOKEN}", host=host)[0] == 200, host


def test_no_response_offers_itself_to_other_origins(served):
    for path in ("/", "/api/state", "/api/run?key=support/r1"):
        sep = "&" if "?" in path else "?"
        _, headers, _ = served.get(f"{path}{sep}token={TOKEN}")
        assert "access-control-allow-origin" not in headers
        assert headers["cache-control"] == "no-store" and headers["referrer-policy"] == "no-referrer"


def test_the_page_runs_only_its_own_script_and_is_not_framed(served):
    status, headers, body = served.get(f"/?token={TOKEN}")
    assert status == 200
    csp = headers["content-security-policy"]
    nonce = re.search(r"script-src 'nonce-([^']+)'", csp).group(1)
    assert f'<script nonce="{nonce}">' in body.decode()
    assert body.decode().count("<script") == 1
    assert "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
    assert served.get(f"/?token={TOKEN}")[1]["content-security-policy"] != csp  # a fresh nonce each time


def test_a_request_body_is_refused_without_being_read(served):
    # an unauthenticated local process must not make the server buffer megabytes per connection
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    try:
        sock.sendall(b"POST /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 90000000\r\n\r\n")
        t0 = time.monotonic()
        answer = sock.recv(200)
        assert time.monotonic() - t0 < 4
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4")
    finally:
        sock.close()


def test_a_run_that_cannot_be_shown_says_why_and_never_logs_the_token(workspace, caplog, capfd):
    from machine_nb.widgets.dashboard import DashboardState

    (workspace / "machines" / "support").mkdir(parents=True)
    (workspace / "machines" / "support" / "cases.json").write_text("[{ broken")
    state = DashboardState(workspace)
    s = Served(state)
    try:
        with caplog.at_level(logging.DEBUG):
            status, headers, body = s.get(f"/api/run?token={TOKEN}&key=support/r1")
            assert s.get("/api/run?token=%ff")[0] == 400  # a token that is not UTF-8
            assert s.get(f"/api/run?token={TOKEN[:-1]}%ff")[0] == 400
    finally:
        s.close()
        state.close()
    assert status == 500 and headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert "cases.json" in error and "invalid JSON" in error
    out, err = capfd.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in (out, err, logged, body.decode()):
        assert TOKEN not in text and TOKEN[:-1] not in text


def test_read_errors_reach_the_page_until_a_read_succeeds(workspace):
    from machine_nb.cli.dashboard import follow
    from machine_nb.widgets.dashboard import DashboardState

    state = DashboardState(workspace)
    good_read = state.read
    failing = threading.Event()
    failing.set()

    def read(**kw):
        if failing.is_set():
            raise PermissionError(13, "Permission denied", str(workspace / ".machine" / "events.jsonl"))
        return good_read(**kw)

    state.read = read
    shown_by: dict = {}  # follow() needs the server's loop, the server needs what follow() returns
    s = Served(state, problems=lambda: shown_by["problems"]())
    follower, shown_by["problems"] = follow(state, s.loop, interval=0.02)
    s.loop.call_soon_threadsafe(follower.start)
    try:
        def errors() -> list:
            return json.loads(s.get(f"/api/state?token={TOKEN}")[2])["errors"]

        for _ in range(500):
            if errors():
                break
            time.sleep(0.01)
        shown = errors()
        assert shown and "Permission denied" in shown[-1] and "events.jsonl" in shown[-1]
        assert len(shown) <= 3
        failing.clear()  # readable again: the page stops saying so
        for _ in range(500):
            if not errors():
                break
            time.sleep(0.01)
        assert errors() == []
    finally:
        follower.stop()
        s.close()
        state.close()


def test_a_port_taken_says_which_and_the_way_out(workspace, capsys):
    from machine_nb.cli import main

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        assert main(["dashboard", str(workspace), "--port", str(port)]) == 1
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert f"port {port}" in err and "--port" in err


def test_the_pages_script_parses(served):
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to parse the page's script with")
    body = served.get(f"/?token={TOKEN}")[2].decode()
    script = re.search(r"<script[^>]*>(.*)</script>", body, flags=re.S).group(1)
    proc = subprocess.run([node, "--check", "--input-type=commonjs"], input=script, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_an_unexpected_error_is_said_on_stderr_without_the_url(workspace, capfd):
    from machine_nb.widgets.dashboard import DashboardState

    state = DashboardState(workspace)

    def broken(**kw):
        raise RuntimeError("drawing failed")

    state.html = broken
    s = Served(state)
    try:
        status, headers, body = s.get(f"/api/state?token={TOKEN}&since=-1")
        assert s.get(f"/api/state?token={TOKEN}", host="evil.example")[0] == 403
    finally:
        s.close()
        state.close()
    assert status == 500 and json.loads(body)["error"].startswith("500")
    err = capfd.readouterr().err
    assert "/api/state: RuntimeError: drawing failed" in err
    assert TOKEN not in err and "token=" not in err
