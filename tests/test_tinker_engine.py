"""The Tinker engine refuses fast and clearly, with no network: no key, an address that does not
answer, a price that cannot be bounded, a budget exceeded, the wrong engine for a model.
A live smoke test runs only when TINKER_API_KEY is set."""

from __future__ import annotations

import http.server
import os
import socket
import threading

import pytest

from machine_nb.data.corpus import make_corpus
from machine_nb.engines import service_client
from machine_nb.engines import tinker as tinker_engine
from machine_nb.engines.tinker import check_tinker
from machine_nb.errors import BudgetExceeded, EngineError
from machine_nb.training.train import sft

from half_dead import serve_half_dead
from serving import watch_closely

SECRET = "tml-test-key-that-must-never-show-0123456789"


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "corpus", seed=0)


@pytest.fixture
def no_key(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on (connections are refused at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def blackhole():
    """A loopback port that accepts TCP connections in the kernel but never answers a request."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def test_no_key_is_refused_before_any_connection(no_key, monkeypatch):
    monkeypatch.setattr(tinker_engine, "probe", lambda *a: pytest.fail("must not connect without a key"))
    with pytest.raises(EngineError, match="TINKER_API_KEY is not set"):
        check_tinker()
    with pytest.raises(EngineError, match="TINKER_API_KEY is not set"):
        service_client("tinker")


def test_refused_address_is_reported_with_the_url_and_never_the_key(monkeypatch, closed_port):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    url = f"http://127.0.0.1:{closed_port}/services/tinker"
    with pytest.raises(EngineError, match="did not answer") as err:
        check_tinker(url, timeout=2.0)
    assert url in str(err.value) and SECRET not in str(err.value)


def test_blackholed_address_times_out_instead_of_hanging(monkeypatch, blackhole):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    url = f"http://127.0.0.1:{blackhole}"
    with pytest.raises(EngineError, match=r"did not answer within 0.5 s") as err:
        check_tinker(url, timeout=0.5)
    assert SECRET not in str(err.value)


def test_base_url_from_the_environment(monkeypatch, closed_port):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{closed_port}")
    with pytest.raises(EngineError, match=f"127.0.0.1:{closed_port}"):
        check_tinker(timeout=2.0)


class _Fake(http.server.BaseHTTPRequestHandler):
    """A server that is not Tinker: every request gets `status` (and counts the requests)."""
    status = 500
    hits = 0

    def do_GET(self):
        type(self).hits += 1
        self.send_response(self.status)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"oops!")

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    servers = []

    def start(status: int) -> str:
        handler = type("Handler", (_Fake,), {"status": status, "hits": 0})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        # a short poll interval: shutdown() waits for the serving loop's next poll
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/services/tinker"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [500, 404, 200])
def test_a_server_that_is_not_tinker_fails_at_once(monkeypatch, fake_server, corpus, tmp_path, status):
    """HTTP 500 (or any page that is not Tinker's health answer) passed the old reachability check,
    then the SDK retried for minutes. Now: a clear EngineError in seconds, no log dir written."""
    import time

    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    url = fake_server(status)
    with pytest.raises(EngineError, match="not answering as Tinker") as err:
        check_tinker(url, timeout=5.0)
    assert SECRET not in str(err.value)
    start = time.monotonic()
    with pytest.raises(EngineError, match="not answering as Tinker"):
        sft(corpus.train, model="thinkingmachines/Inkling", engine="tinker", base_url=url,
            log_dir=tmp_path / "run", progress=False)
    from machine_nb.evaluation.evaluate import evaluate

    monkeypatch.setenv("TINKER_BASE_URL", url)
    with pytest.raises(EngineError, match="not answering as Tinker"):
        evaluate([{"messages": [{"role": "user", "content": "hi"}], "expected": "x"}],
                 model="thinkingmachines/Inkling", engine="tinker", save=False)
    assert time.monotonic() - start < 30
    assert not (tmp_path / "run").exists()


def test_a_local_server_passes_the_check(monkeypatch):
    from machine_nb.engines.local.server import LocalServer

    server = LocalServer(key=SECRET).start()
    try:
        monkeypatch.setenv("TINKER_API_KEY", SECRET)
        assert check_tinker(server.url, timeout=5.0, models=("local/arith-tiny",)) == server.url
    finally:
        server.stop()


def test_sft_on_tinker_refuses_an_unknown_price_before_connecting(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setattr(tinker_engine, "probe", lambda *a: pytest.fail("must refuse before connecting"))
    # Inkling-Small has sampling prices in the table but no training price
    with pytest.raises(BudgetExceeded, match="cannot bound the cost"):
        sft(corpus.train, model="thinkingmachines/Inkling-Small", engine="tinker", log_dir=tmp_path / "a",
            progress=False)
    with pytest.raises(BudgetExceeded, match="cannot bound the cost"):
        sft(corpus.train, model="someone/Unpriced-7B", engine="tinker", log_dir=tmp_path / "b", progress=False)


def test_sft_on_tinker_refuses_over_budget(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setattr(tinker_engine, "probe", lambda *a: pytest.fail("must refuse before connecting"))
    with pytest.raises(BudgetExceeded, match="over the budget"):
        sft(corpus.train, model="thinkingmachines/Inkling", engine="tinker", max_usd=1e-6,
            log_dir=tmp_path / "c", progress=False)


def test_sft_on_tinker_without_key_or_service(corpus, tmp_path, monkeypatch, no_key, closed_port):
    with pytest.raises(EngineError, match="TINKER_API_KEY is not set"):
        sft(corpus.train, model="thinkingmachines/Inkling", engine="tinker", log_dir=tmp_path / "d",
            progress=False)
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    with pytest.raises(EngineError, match="did not answer") as err:
        sft(corpus.train, model="thinkingmachines/Inkling", engine="tinker", log_dir=tmp_path / "e",
            base_url=f"http://127.0.0.1:{closed_port}", progress=False)
    assert SECRET not in str(err.value)
    assert not (tmp_path / "e").exists()  # refused before writing anything


def test_local_model_on_tinker_is_a_clear_error(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setattr(tinker_engine, "probe", lambda *a: ["thinkingmachines/Inkling"])  # real Tinker's list
    with pytest.raises(EngineError, match="engine='local'"):
        sft(corpus.train, model="local/arith-tiny", engine="tinker", log_dir=tmp_path / "f", progress=False)
    with pytest.raises(EngineError, match="needs a model"):
        sft(corpus.train, engine="tinker", log_dir=tmp_path / "g", progress=False)


@pytest.mark.tinker_live
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="TINKER_API_KEY not set: live Tinker test skipped")
def test_live_tinker_smoke(corpus, tmp_path):
    from machine_nb.training.train import smoke

    res = smoke(corpus.train, model="thinkingmachines/Inkling", engine="tinker", max_usd=0.5,
                log_dir=tmp_path / "live", progress=False)
    assert res.steps == 2 and res.checkpoint.startswith("tinker://")


@pytest.fixture
def half_dead(monkeypatch):
    """A half-dead Tinker at TINKER_BASE_URL, watched with the watchdog's waits shortened
    (serving.watch_closely): the same counting and messages, in seconds rather than ten."""
    watch_closely(monkeypatch)
    server, url, handler = serve_half_dead()
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setenv("TINKER_BASE_URL", url)
    yield url, handler
    server.shutdown()
    server.server_close()


def test_a_half_dead_tinker_fails_evaluate_within_seconds_naming_the_call(half_dead):
    """Health and capabilities answer, work calls answer 500: the SDK would retry for ~5 minutes.
    The watchdog counts the 5xx answers to work calls (through httpx's log, nothing patched) and
    evaluate raises EngineError saying which call failed how often. Bounded by a thread deadline."""
    import logging
    import re
    import time

    from machine_nb.evaluation.evaluate import evaluate

    import tinker  # noqa: F401  (importing the SDK sets the httpx logger's level: the level to keep is the one after)

    url, handler = half_dead
    level = logging.getLogger("httpx").level
    out: list = []

    def go() -> None:
        start = time.monotonic()
        try:
            evaluate([{"messages": [{"role": "user", "content": "hi"}], "expected": "x"}],
                     model="thinkingmachines/Inkling", engine="tinker", save=False, progress=False)
        except Exception as exc:  # noqa: BLE001  (asserted below)
            out.append((exc, time.monotonic() - start))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive(), "evaluate still waits on a half-dead service after 90 s"
    exc, _ = out[0]
    assert isinstance(exc, EngineError), repr(exc)
    said = str(exc)
    assert "answers its health check but fails its work" in said and SECRET not in said
    m = re.search(r"(POST|GET) (/api/v1/[\w/]+) answered HTTP 5xx (\d+) times", said)
    # a few answers, not the SDK's minutes of retries (the seconds: benchmarks/bench_hardening.py)
    assert m and 4 <= int(m.group(3)) <= 20 and handler.work >= int(m.group(3))
    assert logging.getLogger("httpx").level == level  # the watch put the logger back


def test_a_half_dead_tinker_fails_sft_within_seconds_naming_the_call(half_dead, corpus, tmp_path, monkeypatch):
    """sft's SDK calls run in its training process; the watchdog here probes a light work call
    itself, so the same half-dead service stops sft with EngineError naming the call. The training
    process, stuck in an SDK call that a first Ctrl-C cannot cancel, ends through its interrupt path
    on a second one, not killed after the last grace."""
    from machine_nb.training import loop

    url, handler = half_dead
    out: list = []
    ended: list = []
    stop = loop._Runner.stop
    monkeypatch.setattr(loop._Runner, "stop", lambda self: (stop(self), ended.append(self.last_outcome())))

    def go() -> None:
        try:
            sft(corpus.train, model="thinkingmachines/Inkling", engine="tinker", base_url=url, max_steps=2,
                log_dir=tmp_path / "run", progress=False)
        except Exception as exc:  # noqa: BLE001  (asserted below)
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "sft still waits on a half-dead service after 120 s"
    assert isinstance(out[0], EngineError), repr(out[0])
    said = str(out[0])
    assert "answers its health check but fails its work" in said and "answered HTTP 5xx" in said
    assert SECRET not in said
    assert [e["event"] for e in ended] == ["interrupted"], ended  # runner.py's report of an interrupted run
    if (tmp_path / "run").exists():  # what it left reads back as an unfinished run, never as a result
        from machine_nb.training.runlog import read_training_log

        log = read_training_log(tmp_path / "run")
        assert not log.complete and log.checkpoint is None
