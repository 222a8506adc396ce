"""Training's record of itself, as a user reads it back: a sweep run that started but never reached
a checkpoint is told apart from one never started; and a Tinker base URL with credentials in it
(`http://user:token@gateway`) trains, while no file of the run's log dir or the sweep dir holds the
token."""

from __future__ import annotations

import json

import pytest

import machine_nb as mnb
from machine_nb.checks.pricing import clear_prices, set_price
from machine_nb.data.corpus import make_corpus
from machine_nb.engines.local.server import LocalServer
from machine_nb.errors import EngineError
from machine_nb.training.sweeps import read_sweep, run_name, sweep

from serving import TEST_KEY

MODEL = "local/arith-tiny"
# fake credentials: no real service sees them
CANARY = "tml-test-canary-userinfo-0000000000"
QUERY_CANARY = "tml-test-canary-query-1111111111"


def test_read_sweep_tells_a_run_that_stopped_before_its_first_checkpoint_from_one_never_started(tmp_path):
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"grid": {"learning_rate": [0.001, 0.003]}, "seeds": [0, 1],
                                                "settings": {}}))
    started = out / run_name({"learning_rate": 0.001}, 0)  # its run record written, then the kernel died
    started.mkdir()
    (started / "machine_nb.json").write_text(json.dumps({"kind": "sft", "learning_rate": 0.001, "seed": 0}))
    (out / run_name({"learning_rate": 0.003}, 1)).mkdir()  # an empty folder: nothing started there
    back = read_sweep(out)
    assert list(back["status"]) == ["no checkpoint", "missing", "missing", "missing"]
    assert back["steps"].isna().all() and back["error"].isna().all()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A local Tinker-compatible server on its own port and data dir, with its own key: the
    service at the base URL these runs are given (an HTTP server like any other to the SDK)."""
    server = LocalServer(data_dir=tmp_path_factory.mktemp("served") / "data", key=TEST_KEY).start()
    yield server
    server.stop()


@pytest.fixture
def tinker_path(served, monkeypatch):
    """Tinker's path against the served server: its key, a known price, and TINKER_BASE_URL at a
    port nothing answers on, so a run that trains connected to the base_url it was given."""
    monkeypatch.setenv("TINKER_API_KEY", served.key)
    monkeypatch.setenv("TINKER_BASE_URL", "http://127.0.0.1:9")
    set_price(MODEL, train=2.0, prefill=0.5, sample=1.5, source="test price")
    yield served.url.replace("http://", f"http://proxy-user:{CANARY}@")
    clear_prices()


def _files_holding(root, text):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and text in p.read_text(encoding="utf-8", errors="replace"))


def test_a_base_url_with_credentials_trains_and_no_log_file_holds_them(tinker_path, tmp_path):
    """Two runs in one kept training process (the second sees the logging the first configured)."""
    c = make_corpus(tmp_path / "corpus", seed=0)
    out = tmp_path / "sw"
    frame = sweep(c.train, {"learning_rate": [1e-3, 3e-3]}, model=MODEL, engine="tinker", sweep_dir=out,
                  base_url=tinker_path, max_steps=2, batch_size=4, max_usd=1.0, progress=False)
    assert list(frame["status"]) == ["ran", "ran"], list(frame["error"])
    assert list(frame["steps"]) == [2, 2]
    for name in frame["run"]:
        assert {"config.json", "train.log", "logs.log", "machine_nb.json", "metrics.jsonl"} <= {
            p.name for p in (out / name).iterdir()}
    assert _files_holding(out, CANARY) == [], _files_holding(out, CANARY)
    assert _files_holding(out, "proxy-user") == []
    # the cookbook records the git state of the repository its package sits in (code.diff): an installed
    # one sits in none of its own, and the project whose .venv holds it (this checkout's) is not recorded
    for name in frame["run"]:
        assert "### repo:" not in (out / name / "code.diff").read_text()
    # the sweep dir still records which service it ran on, without the credentials
    saved = json.loads((out / "sweep.json").read_text())["settings"]["base_url"]
    assert saved == tinker_path.replace(f"proxy-user:{CANARY}@", "")
    # the same sweep again (the token rotated) reads its runs back
    again = sweep(c.train, {"learning_rate": [1e-3, 3e-3]}, model=MODEL, engine="tinker", sweep_dir=out,
                  base_url=tinker_path.replace(CANARY, CANARY[::-1]), max_steps=2, batch_size=4, max_usd=1.0,
                  progress=False)
    assert list(again["status"]) == ["read back", "read back"]


def test_a_base_url_with_a_query_is_refused_before_anything_is_written(tinker_path, tmp_path):
    """The SDK appends its API paths to the base URL, so a query there breaks every call: refused,
    naming the parameter, never its value."""
    url = f"{tinker_path}/?api_key={QUERY_CANARY}"
    with pytest.raises(EngineError, match=r"api_key.*TINKER_API_KEY") as err:
        mnb.sft(make_corpus(tmp_path / "corpus", seed=0).train, MODEL, "tinker", base_url=url, max_steps=2,
                batch_size=4, max_usd=1.0, log_dir=tmp_path / "run", progress=False)
    assert QUERY_CANARY not in str(err.value) and CANARY not in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.fixture
def gateway():
    """A service behind an authenticating gateway: every request must carry the URL's user and token
    as Basic auth (what the SDK's HTTP client sends for them); /bad answers 500 to everything."""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    expected = "Basic " + base64.b64encode(f"proxy-user:{CANARY}".encode()).decode()

    class Gateway(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.headers.get("Authorization") != expected:
                status, body = 401, {"error": "gateway: credentials needed"}
            elif self.path.startswith("/bad"):
                status, body = 500, {"error": "down"}
            elif self.path.endswith("/healthz"):
                status, body = 200, {"status": "ok"}
            else:
                status, body = 200, {"supported_models": [{"model_name": "someone/Model-8B"}]}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://proxy-user:{CANARY}@127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_service_check_sends_a_base_urls_credentials_and_its_errors_never_show_them(gateway):
    from machine_nb.engines.tinker import check_tinker

    key = "tml-test-canary-api-key-2222222222"
    assert check_tinker(gateway, api_key=key, timeout=5) == gateway  # the gateway let both checks through
    for url in (gateway + "/bad", gateway.rsplit(":", 1)[0] + ":9"):  # a failing service, a closed port
        with pytest.raises(EngineError) as err:
            check_tinker(url, api_key=key, timeout=5)
        assert CANARY not in str(err.value) and "proxy-user" not in str(err.value), str(err.value)
        assert "127.0.0.1" in str(err.value)


def test_a_run_with_no_full_batch_is_estimated_at_no_tokens_and_no_held_out_evals():
    """Fewer rows than one batch: sft refuses the run, so neither its training nor its evals are priced."""
    from machine_nb.training.loop import estimate_run

    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
            for i in range(3)]
    set_price(MODEL, train=2.0, prefill=0.5, sample=1.5, source="test price")
    try:
        est = estimate_run("sft", rows, MODEL, "tinker", epochs=4, batch_size=8, max_steps=None,
                           eval_rows=rows, evals=5)
    finally:
        clear_prices()
    assert est["tokens"] == 0 and est["train_usd"] == 0 and est["eval_usd"] == 0 and est["usd"] == 0
