"""The local server's answers to requests a client gets wrong or that meet trouble on disk: each is a
4xx or a failed future that says what happened, at once, and leaves the run's other requests
running (no future that never finishes, no 500 the SDK retries for minutes)."""

from __future__ import annotations

import errno
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from tinker.proto import tinker_public_pb2 as pb

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import server as server_mod

from serving import api_call as call, api_result as result, new_sampler, new_session


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("review") / "data").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def session(srv) -> str:
    return new_session(srv)


def sampling_session(srv) -> tuple[str, str]:
    """A new session and a sampling session of the base model in it: (session id, sampler id)."""
    own = new_session(srv)
    return own, new_sampler(srv, own, DEFAULT_MODEL)


_SEQ = iter(range(1, 1000))


def new_run(srv, session) -> str:
    out = result(srv, call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": next(_SEQ),
                                                         "base_model": DEFAULT_MODEL, "lora_config": {"rank": 4}}))
    assert "error" not in out, out
    return out["model_id"]


@pytest.fixture(scope="module")
def sampler(srv, session) -> str:
    return new_sampler(srv, session, DEFAULT_MODEL)


def sample_request(sampler: str, **fields) -> dict:
    return {"sampling_session_id": sampler, "seq_id": 0, "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
            "sampling_params": {"max_tokens": 1, "temperature": 1.0}, **fields}


def fwdbwd_body(model_id: str, seq_id: int, *, image: bool = False) -> bytes:
    """A ForwardBackwardRequest protobuf of one datum (tokens 5, 6), or of one image chunk."""
    msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn="cross_entropy")
    datum = msg.data.add()
    chunk = datum.model_input.add()
    if image:
        chunk.image.data = b"\x89PNG"
    else:
        chunk.encoded_text.tokens = np.asarray([5, 6], np.int32).tobytes()
    for name, values, dtype, proto_dtype in (("target_tokens", [6, 7], np.int64, pb.DTYPE_INT64),
                                             ("weights", [1.0, 1.0], np.float32, pb.DTYPE_FLOAT32)):
        t = datum.loss_fn_inputs[name]
        t.dtype, t.dense = proto_dtype, np.asarray(values, dtype).tobytes()
        t.shape.append(2)
    return msg.SerializeToString()


# ---------------------------------------------------------------------------------------------


def test_a_json_number_too_long_for_python_is_a_400_naming_the_body_not_a_500(srv):
    # a 5xx makes the SDK retry for about five minutes before it says anything
    status, body = call(srv, "/api/v1/create_session", raw=b'{"tags": [], "n": ' + b"9" * 5000 + b"}")
    assert status == 400, body
    assert "not valid JSON" in body["detail"] and "digits" in body["detail"]


def test_a_negative_prompt_logprobs_last_n_is_a_400_not_more_logprobs_than_prompt_tokens(srv, sampler):
    status, body = call(srv, "/api/v1/asample", sample_request(sampler, prompt_logprobs=True,
                                                               prompt_logprobs_last_n=-3))
    assert status == 400, body
    assert body["field"] == "prompt_logprobs_last_n"


def test_a_forward_backward_refused_while_decoding_keeps_the_runs_later_requests_running(srv, session, monkeypatch):
    # a gap in a run's seq_ids would hold its next requests until SEQ_GAP_TIMEOUT_S and then fail them
    monkeypatch.setattr(server_mod, "SEQ_GAP_TIMEOUT_S", 0.0)
    model_id = new_run(srv, session)
    status, body = call(srv, "/api/v1/forward_backward", raw=fwdbwd_body(model_id, 1, image=True),
                        content_type="application/x-protobuf")
    assert status == 400 and body["field"] == "data.0.model_input.0", body
    out = result(srv, call(srv, "/api/v1/forward_backward", raw=fwdbwd_body(model_id, 2),
                           content_type="application/x-protobuf"))
    assert "protobuf" in out, out  # trained, not failed for a request that "never arrived"


def test_requests_queued_on_a_sampler_that_is_let_go_fail_instead_of_waiting_forever(srv):
    own, sid = sampling_session(srv)
    sampler = srv.samplers[sid].sampler
    started, release = threading.Event(), threading.Event()
    real_sample = sampler.sample

    def held_sample(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return real_sample(*args, **kwargs)

    sampler.sample = held_sample
    status, running = call(srv, "/api/v1/asample", sample_request(sid))
    assert status == 200 and started.wait(30)
    status, queued = call(srv, "/api/v1/asample", sample_request(sid, seq_id=1))
    assert status == 200
    call(srv, f"/api/v1/sessions/{own}/finish", {})
    srv._reap()  # its session finished: the sampler is let go
    assert sid not in srv.samplers
    release.set()
    assert "protobuf" in result(srv, (200, running))  # the request in progress finishes
    assert srv.futures.get(queued["request_id"]).done.wait(30), "the queued request never finishes"
    out = result(srv, (200, queued))
    assert out["category"] == "server" and "let go" in out["error"], out


def test_a_save_on_a_full_disk_fails_its_future_saying_the_disk_is_full(srv, session):
    model_id = new_run(srv, session)
    trainer = srv.runs[model_id].trainer

    def full_disk(final, meta, *, optimizer):
        raise OSError(errno.ENOSPC, "No space left on device", str(final.parent / ".x.tmp-1"))

    trainer.save = full_disk
    out = result(srv, call(srv, "/api/v1/save_weights", {"model_id": model_id, "seq_id": 1, "path": "full"}))
    assert "No space left on device" in out["error"] and "internal error" not in out["error"], out
    assert "free some space" in out["error"] and str(srv.data_dir) in out["error"], out
    del trainer.save  # the run goes on once there is room
    out = result(srv, call(srv, "/api/v1/save_weights", {"model_id": model_id, "seq_id": 2, "path": "full"}))
    assert out["path"].endswith("/weights/full"), out


def test_a_data_dir_that_cannot_be_made_is_an_engine_error_naming_it(tmp_path):
    from machine_nb.errors import EngineError

    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(EngineError, match="a-file/data: the folder cannot be made"):
        server_mod.LocalServer(data_dir=tmp_path / "a-file" / "data")


def test_a_run_json_that_is_a_named_pipe_is_skipped_instead_of_hanging_the_listing(srv):
    import os

    from machine_nb.engines.local import checkpoints as ck

    run = srv.data_dir / "runs" / "local-0123456789abcdef:train:7"
    run.mkdir(parents=True)
    os.mkfifo(run / "run.json")
    listed: dict = {}
    lister = threading.Thread(target=lambda: listed.update(
        body=call(srv, "/api/v1/training_runs", method="GET", timeout=300)[1]), daemon=True)
    lister.start()
    lister.join(60)
    if lister.is_alive():  # the server reads the pipe: give it an end, so that nothing is left waiting
        os.close(os.open(run / "run.json", os.O_WRONLY))
        pytest.fail("listing the runs waits on a named pipe for ever")
    assert run.name not in [r["training_run_id"] for r in listed["body"]["training_runs"]]
    with pytest.raises(ck.MachineFormatError, match="FIFO"):
        ck.read_run_record(run)


def raw_request(srv, method: str, path: str, headers: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(srv.url + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


def test_the_key_sent_as_a_bearer_token_is_refused_naming_the_header_to_send_it_in(srv):
    status, _, body = raw_request(srv, "GET", "/api/v1/training_runs", {"Authorization": f"Bearer {srv.key}"})
    assert status == 401
    assert "X-API-Key" in body["detail"] and "Authorization" in body["detail"], body
    assert srv.key not in json.dumps(body)


def test_a_known_path_asked_with_another_method_is_a_405_saying_which_it_takes(srv):
    status, headers, body = raw_request(srv, "GET", "/api/v1/create_model", {"X-API-Key": srv.key})
    assert status == 405, body
    assert {k.lower(): v for k, v in headers.items()}["allow"] == "POST"
    assert "POST" in body["detail"]
    status, _, body = raw_request(srv, "GET", "/api/v1/no_such_call", {"X-API-Key": srv.key})
    assert status == 404, body


def test_a_json_body_sent_without_a_json_content_type_is_still_read(srv, session):
    # curl -d sends application/x-www-form-urlencoded for a JSON body
    status, body = call(srv, "/api/v1/session_heartbeat", {"session_id": session},
                        content_type="application/x-www-form-urlencoded")
    assert status == 200, body
    status, body = call(srv, "/api/v1/session_heartbeat", raw=b"session_id=x", content_type="text/plain")
    assert status == 400 and "not valid JSON" in body["detail"] and "text/plain" in body["detail"], body


def test_a_bad_thread_count_in_the_environment_fails_each_request_saying_so_instead_of_hanging(srv, session,
                                                                                            monkeypatch):
    monkeypatch.setenv("MACHINE_NB_THREADS", "four")
    status, created = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": next(_SEQ),
                                                         "base_model": DEFAULT_MODEL, "lora_config": {"rank": 4}})
    assert status == 200, created
    status, opened = call(srv, "/api/v1/create_sampling_session", {"session_id": session, "sampling_session_seq_id": 9,
                                                                   "base_model": DEFAULT_MODEL})
    assert status == 200, opened
    status, sampled = call(srv, "/api/v1/asample", sample_request(opened["sampling_session_id"]))
    assert status == 200, sampled
    for answer in (created, sampled):
        assert srv.futures.get(answer["request_id"]).done.wait(30), "the request never finishes"
        out = result(srv, (200, answer))
        assert "MACHINE_NB_THREADS" in out["error"], out


def test_a_model_seq_id_too_large_for_a_run_folder_is_a_400_and_such_a_run_id_a_404(srv, session):
    status, body = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": 10**300,
                                                      "base_model": DEFAULT_MODEL, "lora_config": {"rank": 4}})
    assert status == 400 and body["field"] == "model_seq_id", body
    status, body = call(srv, f"/api/v1/training_runs/local-0123456789abcdef:train:{10**300}", method="GET")
    assert status == 404, body


def test_a_run_whose_record_cannot_be_written_is_not_created_and_keeps_no_model(srv, session, monkeypatch):
    def full_disk(run):
        raise OSError(errno.ENOSPC, "No space left on device", str(srv.data_dir / "runs" / run.model_id))

    monkeypatch.setattr(srv, "_write_run_record", full_disk)
    status, created = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": next(_SEQ),
                                                         "base_model": DEFAULT_MODEL, "lora_config": {"rank": 4}})
    out = result(srv, (status, created))
    assert "No space left on device" in out["error"], out
    assert srv.runs[created["model_id"]].trainer is None  # its model is let go
    out = result(srv, call(srv, "/api/v1/save_weights", {"model_id": created["model_id"], "seq_id": 1, "path": "x"}))
    assert "not created" in out["error"], out


def test_a_jump_of_the_wall_clock_lets_go_of_no_live_session(srv, monkeypatch):
    # a laptop woken from sleep (or a clock set forward) sees an hour pass between two heartbeats
    import time
    import types

    own, sid = sampling_session(srv)
    later = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    later.time = lambda: time.time() + 3600
    monkeypatch.setattr(server_mod, "time", later)
    new_session(srv)  # lets go of dead sessions
    assert sid in srv.samplers
    status, body = call(srv, "/api/v1/session_heartbeat", {"session_id": own})
    assert status == 200, body


def test_sampling_from_a_sampler_let_go_for_room_says_so_instead_of_asking_about_a_restart(srv, session, monkeypatch):
    monkeypatch.setattr(server_mod, "MAX_SAMPLERS", 1)
    opened = []
    for seq in (20, 21, 22):  # the oldest is let go as the third opens
        status, body = call(srv, "/api/v1/create_sampling_session", {"session_id": session,
                                                                     "sampling_session_seq_id": seq,
                                                                     "base_model": DEFAULT_MODEL})
        assert status == 200, body
        opened.append(body["sampling_session_id"])
    status, body = call(srv, "/api/v1/asample", sample_request(opened[0]))
    assert status == 404, body
    assert "let go" in body["detail"] and "restarted" not in body["detail"], body
    status, body = call(srv, f"/api/v1/samplers/{opened[0]}", method="GET")
    assert status == 404 and "let go" in body["detail"], body


def test_a_temperature_or_top_p_too_small_for_float32_samples_the_top_token():
    """A temperature of 1e-40 overflowed the scaled logits to infinity and a top_p of 1e-300 (0 in
    float32) dropped every token: sampling failed with "probability tensor contains inf/nan",
    reported as an internal error. Both leave the most likely token, as greedy sampling picks it."""
    import torch

    from machine_nb.engines.local.model import choose

    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    gen = torch.Generator().manual_seed(0)
    for temperature, top_p in ((1e-40, None), (1.0, 1e-300), (1e-45, 1e-300)):
        tok, lp = choose(logits, temperature, gen, None, top_p)
        assert tok == 1 and lp == lp and lp <= 0, (temperature, top_p, lp)


def test_full_fine_tuning_of_a_model_that_trains_lora_only_is_a_400_naming_the_rank(srv, session):
    """Rank 0 (the tiny model's full fine-tuning) on SmolLM2 was accepted and failed later, in its
    future: the request names the field at once."""
    from machine_nb.engines.local import SMOLLM2_MODEL

    status, body = call(srv, "/api/v1/create_model", {"session_id": session, "model_seq_id": 900,
                                                      "base_model": SMOLLM2_MODEL, "lora_config": {"rank": 0}})
    assert status == 400 and "lora_config.rank" in json.dumps(body) and "LoRA" in json.dumps(body), body
