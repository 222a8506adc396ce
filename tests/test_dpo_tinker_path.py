"""DPO on the Tinker path, offline: `dpo(engine="tinker")` with TINKER_BASE_URL pointing at a
`machine-nb serve` server and a placeholder `tml-…` key runs end to end (service check, price
guard, the cookbook's `train_dpo` in the child, checkpoints on that server); and a server that
dies mid-run fails the call with EngineError within 30 s, where the SDK alone retries for minutes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import tinker

import machine_nb as mnb
from machine_nb.errors import EngineError
from machine_nb.data.export import HeldOutExcluded
from machine_nb.training.preference import dpo
from machine_nb.checks.pricing import clear_prices, set_price

from serving import kill_when, start_server, stop_server, watch_closely

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"
PLACEHOLDER_KEY = "tml-placeholder-key-for-a-local-server-0000"  # a fake key: no real service sees it
MODEL = "local/arith-tiny"


@pytest.fixture(scope="module")
def pairs():
    with pytest.warns(HeldOutExcluded):
        return mnb.preference_pairs(SAMPLE / ".machine-store", workspace=SAMPLE, machine="tutor").head(8)


@pytest.fixture(scope="module")
def servers():
    """The file's `machine-nb serve` subprocess, kept from test to test while it lives; stopped at the end."""
    box: dict = {}
    yield box
    if "server" in box:
        stop_server(box["server"])


@pytest.fixture
def served(servers, tmp_path_factory, monkeypatch):
    """A live `machine-nb serve` subprocess (the file's, or a new one after a test killed it),
    TINKER_BASE_URL at it, a placeholder key and a known price."""
    server = servers.get("server")
    if server is None or server.proc.poll() is not None:
        if server is not None:
            stop_server(server)
        server = servers["server"] = start_server(tmp_path_factory.mktemp("served"))
    monkeypatch.setenv("TINKER_BASE_URL", server.url)
    monkeypatch.setenv("TINKER_API_KEY", PLACEHOLDER_KEY)
    set_price(MODEL, train=2.0, prefill=0.5, sample=1.5, source="test price")
    yield server.proc, server.url, server.data_dir
    clear_prices()


def test_dpo_on_the_tinker_path_trains_on_the_served_server(pairs, served, tmp_path):
    proc, url, data_dir = served
    # one step: training on the served server, its price and its final checkpoint there are what is checked
    res = dpo(pairs, model=MODEL, engine="tinker", batch_size=4, epochs=1, max_steps=1, log_dir=tmp_path / "run",
              progress=False, max_usd=1.0)
    assert (res.engine, res.model, res.steps, res.complete) == ("tinker", MODEL, 1, True)
    assert res.tokens > 0 and res.cost_usd > 0  # priced as Tinker would charge, from the tokens trained
    # the checkpoint lives on the served server, which serves it to any SDK client
    assert res.checkpoint.startswith("tinker://local-") and res.checkpoint.endswith("/sampler_weights/final")
    run_id = res.checkpoint.split("/")[2]
    assert (data_dir / "runs" / run_id / "sampler_weights" / "final" / "checkpoint.json").is_file()
    info = tinker.RestClient(base_url=url, api_key=PLACEHOLDER_KEY).get_weights_info_by_tinker_path(
        res.checkpoint).result(timeout=60)
    assert info.base_model == MODEL
    metrics = mnb.training_metrics(res.log_dir)
    assert len(metrics) == 1 and metrics["dpo_loss"].notna().all()
    for path in [*tmp_path.rglob("*"), *data_dir.parent.rglob("*")]:  # the run's files, the server's data and log
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log"):
            assert PLACEHOLDER_KEY not in path.read_text(encoding="utf-8", errors="replace"), path


def test_a_server_that_dies_mid_dpo_fails_the_call_quickly(pairs, served, tmp_path, monkeypatch):
    """The watchdog's waits are shortened (serving.watch_closely); the failure is still the dead
    server's (its port refuses), after the kill."""
    watch_closely(monkeypatch)
    proc, url, _ = served
    log_dir = tmp_path / "run"
    metrics = log_dir / "metrics.jsonl"
    killed_at = kill_when(proc, lambda: metrics.exists() and metrics.read_text().count("\n") >= 2)  # two steps in
    with pytest.raises(EngineError, match="stopped answering") as err:
        dpo(pairs, model=MODEL, engine="tinker", batch_size=4, epochs=200, log_dir=log_dir, progress=False,
            max_usd=10.0)
    assert killed_at and time.monotonic() - killed_at[0] < 30
    assert "Connection refused" in str(err.value), str(err.value)
    assert not mnb.read_training_log(log_dir).complete
