"""Odd and hostile requests to the local server: each gets a 4xx at once naming the field, and
leaves nothing behind that a later request trips on (no half-made run, no unlisted checkpoint)."""

from __future__ import annotations

import pytest

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import server as server_mod

from serving import api_call, api_result as result, new_sampler, new_session


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("inputs") / "data").start()
    yield s
    s.stop()


def call(srv, path: str, body=None, *, method: str = "POST", timeout: float = 10) -> tuple[int, dict]:
    """(status, JSON body) of one request, within `timeout` (serving.api_call)."""
    return api_call(srv, path, body, method=method, timeout=timeout)


@pytest.fixture(scope="module")
def session(srv) -> str:
    return new_session(srv)


@pytest.fixture(scope="module")
def run(srv, session) -> str:
    answer = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": 1, "base_model": DEFAULT_MODEL,
                                                "lora_config": {"rank": 4}})
    out = result(srv, answer)
    assert "error" not in out, out
    return out["model_id"]


@pytest.fixture(scope="module")
def sampler(srv, session) -> str:
    return new_sampler(srv, session, DEFAULT_MODEL)


def sample_request(sampler: str, *, num_samples: int = 1, **params) -> dict:
    return {"sampling_session_id": sampler, "seq_id": 0, "num_samples": num_samples,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
            "sampling_params": {"max_tokens": 1, "temperature": 1.0, **params}}


def test_too_many_samples_are_refused_at_once_naming_num_samples(srv, sampler):
    over = server_mod.MAX_NUM_SAMPLES + 1
    status, body = call(srv, "/api/v1/asample", sample_request(sampler, num_samples=over))
    assert status == 400 and body["field"] == "num_samples", body
    assert str(server_mod.MAX_NUM_SAMPLES) in body["detail"]
    # a number no machine could hold is answered as quickly, not built up in the server first
    status, body = call(srv, "/api/v1/asample", sample_request(sampler, num_samples=10**12), timeout=2)
    assert status == 400 and body["field"] == "num_samples", body


def test_a_checkpoint_name_starting_with_a_dot_is_refused(srv, run):
    # a saved ".name" would be left out of every listing, like the save's own temporary folders
    status, body = call(srv, "/api/v1/save_weights", {"model_id": run, "path": ".hidden", "seq_id": 1})
    assert status == 400 and body["field"] == "path", body
    status, body = call(srv, "/api/v1/save_weights_for_sampler", {"model_id": run, "path": ".hidden", "seq_id": 2})
    assert status == 400 and body["field"] == "path", body
    saved = result(srv, call(srv, "/api/v1/save_weights", {"model_id": run, "path": "after.dot", "seq_id": 3}))
    assert saved.get("path", "").endswith("/weights/after.dot"), saved
    status, body = call(srv, f"/api/v1/training_runs/{run}/checkpoints", method="GET")
    assert [c["checkpoint_id"] for c in body["checkpoints"]] == ["weights/after.dot"]


def test_a_negative_model_seq_id_is_refused_and_leaves_no_run(srv, session):
    status, body = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": -1,
                                                      "base_model": DEFAULT_MODEL, "lora_config": {"rank": 4}})
    assert status == 400 and body["field"] == "model_seq_id", body
    status, body = call(srv, f"/api/v1/sessions/{session}", method="GET")
    assert not [m for m in body["training_run_ids"] if m.endswith(":-1")], body


def test_a_seed_out_of_range_is_refused_naming_it(srv, session, sampler):
    status, body = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": 7,
                                                      "base_model": DEFAULT_MODEL,
                                                      "lora_config": {"rank": 4, "seed": 2**70}})
    assert status == 400 and body["field"] == "lora_config.seed", body
    status, body = call(srv, "/api/v1/asample", sample_request(sampler, seed=2**70))
    assert status == 400 and body["field"] == "sampling_params.seed", body
    out = result(srv, call(srv, "/api/v1/asample", sample_request(sampler, seed=-3)))  # within range: sampled
    assert "protobuf" in out, out


@pytest.mark.parametrize("sid", [["local-0"], {"a": 1}, 5])
def test_a_heartbeat_with_a_session_id_that_is_no_string_names_it(srv, sid):
    status, body = call(srv, "/api/v1/session_heartbeat", {"session_id": sid, "type": "session_heartbeat"})
    assert status == 400 and body["field"] == "session_id", body
    assert "internal error" not in body["detail"]


@pytest.mark.parametrize("params,field", [({"temperature": float("nan")}, "sampling_params.temperature"),
                                          ({"temperature": float("inf")}, "sampling_params.temperature"),
                                          ({"top_p": 0.0}, "sampling_params.top_p"),
                                          ({"top_p": 1.5}, "sampling_params.top_p")])
def test_sampling_numbers_no_sampler_can_use_are_refused_naming_them(srv, sampler, params, field):
    """A NaN or infinite temperature (`nan < 0` is false) and a top_p outside (0, 1] sampled anyway."""
    status, body = call(srv, "/api/v1/asample", sample_request(sampler, **params))
    assert status == 400 and body["field"] == field, body
