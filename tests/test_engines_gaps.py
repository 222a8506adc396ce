"""A long notebook session against the engines: kept SDK clients that went stale (closed by their
user, their server restarted, their key rotated), the errors a refusing server's answer becomes,
and a watchdog that must see a half-dead service through its own liveness probe."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from machine_nb import engines
from machine_nb.errors import EngineError, MachineFormatError

KEY_1 = "tml-test-first-key-1111111111111111"
KEY_2 = "tml-test-rotated-key-2222222222222222"


class _Service(BaseHTTPRequestHandler):
    """Enough of Tinker's API for an SDK client to open a session and keep it alive. `forget()`
    makes it a restarted server (no session survives); `keys` lists the key of each new session."""

    sessions: set = set()
    keys: list = []
    probes: threading.Event

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.endswith("/api/v1/healthz"):
            return self._answer(200, {"status": "ok"})
        if self.path.endswith("/api/v1/get_server_capabilities"):
            return self._answer(200, {"supported_models": [{"model_name": "someone/Model-8B"}]})
        self._answer(404, {"detail": f"no {self.path}"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        cls = type(self)
        if self.path.endswith("/api/v1/create_session"):
            sid = f"session-{len(cls.keys)}"
            cls.sessions.add(sid)
            cls.keys.append(self.headers.get("X-API-Key"))
            return self._answer(200, {"type": "create_session", "session_id": sid})
        if self.path.endswith("/api/v1/session_heartbeat"):
            if body.get("session_id") not in cls.sessions:
                return self._answer(404, {"detail": f"no session {body.get('session_id')!r} on this server"})
            return self._answer(200, {"type": "session_heartbeat"})
        if self.path.endswith("/api/v1/client/config"):
            cls.probes.set()
        if self.path.endswith("/api/v1/telemetry"):
            return self._answer(200, {"status": "accepted"})
        self._answer(200, {})

    def log_message(self, *args):
        pass


@pytest.fixture
def service(monkeypatch):
    """A Tinker-shaped service on a free loopback port, with TINKER_API_KEY set to KEY_1."""
    monkeypatch.setenv("TINKER_API_KEY", KEY_1)
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    handler = type("Handler", (_Service,), {"sessions": set(), "keys": [], "probes": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield url, handler
    engines.close_clients(url)
    server.shutdown()
    server.server_close()


def _opened(client):
    """The client with its session open on the service (what its first training or sampling call does)."""
    assert client.holder is not None
    return client


# -- kept clients


def test_a_kept_client_its_user_closed_is_not_handed_out_again(service):
    url, _ = service
    with engines.service_client("tinker", base_url=url) as client:  # the SDK's own way to finish a session
        _opened(client)
    again = engines.service_client("tinker", base_url=url)
    assert again is not client
    _opened(again)  # a closed client would raise "ServiceClient is closed"


def test_a_kept_client_of_a_restarted_server_is_replaced(service):
    url, handler = service
    first = _opened(engines.service_client("tinker", base_url=url))
    handler.sessions.clear()  # the server restarted: the kept client's session is gone
    second = engines.service_client("tinker", base_url=url)
    assert second is not first
    _opened(second)
    assert len(handler.keys) == 2 and handler.sessions == {"session-1"}
    assert engines.service_client("tinker", base_url=url) is second  # a live session is kept


def test_a_rotated_key_is_used_and_the_old_keys_client_is_stopped(service, monkeypatch):
    url, handler = service
    first = _opened(engines.service_client("tinker", base_url=url))
    monkeypatch.setenv("TINKER_API_KEY", KEY_2)
    second = _opened(engines.service_client("tinker", base_url=url))
    assert second is not first and handler.keys == [KEY_1, KEY_2]
    with pytest.raises(RuntimeError, match="closed"):  # no heartbeat of the old key's session goes on
        first.holder


def test_a_client_made_for_one_key_keeps_it_when_the_environment_changes(service, monkeypatch):
    url, handler = service
    client = engines.service_client("tinker", base_url=url)  # checked, and kept, under KEY_1
    monkeypatch.setenv("TINKER_API_KEY", KEY_2)
    _opened(client)
    assert handler.keys == [KEY_1]


# -- explain: whatever shape the server's answer has


class _Refused(Exception):
    def __init__(self, message: str, body: object):
        super().__init__(message)
        self.body = body


@pytest.mark.parametrize("body", [
    ["not", "an", "object"],
    "x" * 1_000_000,
    b"\xff\xfe\x00 not utf-8",
    {"error_type": "MachineFormatError", "file": 5, "reason": "bad"},
    {"error_type": "MachineFormatError", "file": ["a"], "reason": None},
    {"detail": {"nested": ["x" * 100_000]}},
    {"detail": None},
    None,
])
def test_explain_gives_a_short_engine_error_for_any_body(body):
    error = engines.explain(_Refused("Error code: 400 - " + "y" * 200_000, body))
    assert isinstance(error, EngineError)
    assert 0 < len(str(error)) <= 2_100


def test_explain_lists_a_validation_errors_messages():
    body = {"detail": [{"loc": ["body", "seq_id"], "msg": "field required", "type": "missing"},
                       {"loc": ["body", "model_id"], "msg": "not a string"}]}
    assert str(engines.explain(_Refused("Error code: 422", body))) == \
        "body.seq_id: field required; body.model_id: not a string"


def test_explain_keeps_a_named_corrupt_file():
    error = engines.explain(_Refused("x", {"error_type": "MachineFormatError", "file": "/data/run/checkpoint.json",
                                           "reason": "not JSON"}))
    assert isinstance(error, MachineFormatError) and error.path == "/data/run/checkpoint.json"


def test_explain_of_an_error_without_a_message_says_what_it_was():
    assert "TimeoutError" in str(engines.explain(TimeoutError()))


def test_explain_never_shows_the_key(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", KEY_2)
    for exc in (_Refused(f"Error code: 401 - key {KEY_2} is revoked", None),
                _Refused("401", {"detail": f"key {KEY_2} is revoked"}),
                _Refused("401", {"detail": f"key {engines.LOCAL_API_KEY} is wrong"})):
        text = str(engines.explain(exc))
        assert KEY_2 not in text and engines.LOCAL_API_KEY not in text
        assert "revoked" in text or "wrong" in text


# -- the watchdog


def test_work_calls_of_another_service_whose_url_extends_this_one_are_not_counted():
    from machine_nb.engines.tinker import WorkCalls

    watch = WorkCalls("http://127.0.0.1:80/tinker")
    for url in ("http://127.0.0.1:8000/api/v1/forward", "http://127.0.0.1:80/tinker-staging/api/v1/forward"):
        watch.saw("POST", url, 500)
    assert watch.failing()[0] == 0
    watch.saw("POST", "http://127.0.0.1:80/tinker/api/v1/forward", 500)
    assert watch.failing()[0] == 1


def test_the_watchdogs_own_probe_does_not_hide_failing_work(service):
    """A service whose client-config call answers and whose training calls answer 500: the
    watchdog's probe (that light call) succeeding says nothing about the work that fails."""
    url, handler = service
    dog = engines.tinker.Watchdog(url, every=0.05, grace=60, max_5xx=3, grace_5xx=3600)
    with dog:
        assert handler.probes.wait(30)
        for _ in range(3):
            dog.work.saw("POST", f"{url}/api/v1/forward_backward", 500)
        handler.probes.clear()
        assert handler.probes.wait(30)  # the probe ran again, and answered
        handler.probes.clear()
        assert handler.probes.wait(30)
        assert dog.work.failing()[0] == 3
    assert dog.failed is None


def test_a_forked_child_neither_waits_on_nor_keeps_its_parents_watches():
    """A fork (multiprocessing's default here) while another thread holds the watches' lock, inside
    a watch: the child watches a service of its own and leaves the `httpx` logger as it found it."""
    import logging
    import os
    import signal

    from machine_nb.engines.tinker import WORK_CALLS_FILTER, WorkCalls

    log = logging.getLogger("httpx")
    level = log.level
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with WorkCalls._lock:
            held.set()
            release.wait(30)

    with WorkCalls("http://127.0.0.1:9"):
        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: report by exit code alone
            code = 3
            try:
                signal.alarm(20)  # a child stuck on the parent's lock is ended, and the test fails
                with WorkCalls("http://127.0.0.1:10"):
                    pass
                code = 0 if WORK_CALLS_FILTER not in log.filters and log.level == level else 1
            finally:
                os._exit(code)
        release.set()
        holder.join()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert WORK_CALLS_FILTER not in log.filters and log.level == level
