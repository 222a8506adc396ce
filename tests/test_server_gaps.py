"""A data dir the local server did not leave as it wrote it: a damaged run.json or checkpoint.json,
a checkpoint folder that is a link, a checkpoint deleted while its run is listed. Each gets an
answer naming the file (and its field) or is skipped, and the server goes on serving the other runs.

The runs and checkpoints here are written by hand into the data dir of a server in this process:
their weights are never loaded, so no model is trained or built."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pytest

from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.engines.local import checkpoints as ck
from machine_nb.engines.local import server as server_mod

GOOD_RUN = f"local-{'1' * 16}:train:0"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = server_mod.LocalServer(data_dir=tmp_path_factory.mktemp("gaps") / "data").start()
    write_run(s.data_dir, GOOD_RUN)
    write_checkpoint(s.data_dir, GOOD_RUN, "sampler_weights", "final")
    yield s
    s.stop()


def call(srv, path: str, body=None, *, method: str = "POST") -> tuple[int, dict]:
    """(status, JSON body) of one request with the server's key."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(srv.url + urllib.parse.quote(path), data=data, method=method,
                                 headers={"Content-Type": "application/json", "X-API-Key": srv.key})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def write_run(data_dir, run_id: str, **fields) -> pathlib.Path:
    """A run folder with the run.json the server writes, `fields` replacing its values."""
    record = {"training_run_id": run_id, "base_model": DEFAULT_MODEL, "lora_rank": 2, "lora_alpha": 4.0,
              "targets": {"attn": True, "mlp": True, "unembed": False}, "seed": 0, "user_metadata": {},
              "created": 1.7e9, **fields}
    directory = ck.run_dir(data_dir, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return directory


def write_checkpoint(data_dir, run_id: str, kind: str, name: str, **fields) -> pathlib.Path:
    """A checkpoint folder as the server writes it (its weights file empty: never loaded here)."""
    meta = {"format": ck.FORMAT, "kind": "sampler", "name": name, "base_model": DEFAULT_MODEL, "lora_rank": 2,
            "lora_alpha": 4.0, "targets": {"attn": True, "mlp": True, "unembed": False}, "seed": 0,
            "model_id": run_id, "user_metadata": {}, "saved_at": "2025-01-01T00:00:00+00:00", **fields}
    directory = ck.run_dir(data_dir, run_id) / kind / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "checkpoint.json").write_text(json.dumps(meta), encoding="utf-8")
    (directory / "adapter.safetensors").write_bytes(b"")
    return directory


def session(srv) -> str:
    status, body = call(srv, "/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.0",
                                                         "type": "create_session"})
    assert status == 200, body
    return body["session_id"]


def still_serves_the_good_run(srv) -> None:
    status, body = call(srv, f"/api/v1/training_runs/{GOOD_RUN}/checkpoints", method="GET")
    assert status == 200 and [c["checkpoint_id"] for c in body["checkpoints"]] == ["sampler_weights/final"], body
    status, body = call(srv, "/api/v1/training_runs", method="GET")
    assert status == 200 and GOOD_RUN in [r["training_run_id"] for r in body["training_runs"]], body
    status, body = call(srv, "/api/v1/checkpoints", method="GET")
    assert status == 200 and ck.tinker_path(GOOD_RUN, "sampler_weights", "final") in [
        c["tinker_path"] for c in body["checkpoints"]], body


# -- a damaged checkpoint.json

DAMAGED_CHECKPOINTS = [  # (what checkpoint.json says instead, the field named: None for the whole file)
    ({"lora_rank": "2"}, "lora_rank"),
    ({"lora_rank": True}, "lora_rank"),
    ({"base_model": 5}, "base_model"),
    ({"targets": ["attn", "mlp"]}, "targets"),
    ({"targets": {"attn": "yes"}}, "targets"),
    ({"user_metadata": ["a", "b"]}, "user_metadata"),
    ({"seed": "7"}, "seed"),
    ({"lora_alpha": "four"}, "lora_alpha"),
    ("[1, 2]", None),
    ("{not json", None),
]


@pytest.mark.parametrize("damage,field_name", DAMAGED_CHECKPOINTS)
def test_a_damaged_checkpoint_json_is_named_by_every_request_that_reads_it(srv, damage, field_name):
    run_id = f"local-{'2' * 16}:train:{DAMAGED_CHECKPOINTS.index((damage, field_name))}"
    write_run(srv.data_dir, run_id)
    if isinstance(damage, dict):
        directory = write_checkpoint(srv.data_dir, run_id, "weights", "step-1", **damage)
    else:
        directory = write_checkpoint(srv.data_dir, run_id, "weights", "step-1")
        (directory / "checkpoint.json").write_text(damage, encoding="utf-8")
    path = ck.tinker_path(run_id, "weights", "step-1")
    sid = session(srv)
    for call_name, request_field, body in [
            ("weights_info", "tinker_path", {"tinker_path": path}),
            ("create_sampling_session", "model_path",
             {"session_id": sid, "sampling_session_seq_id": 0, "model_path": path}),
            ("load_weights", "path", {"session_id": sid, "model_seq_id": 3, "path": path, "optimizer": True})]:
        status, answer = call(srv, f"/api/v1/{call_name}", body)
        assert status == 400 and answer["field"] == request_field, (call_name, answer)
        assert "internal error" not in answer["detail"], (call_name, answer)
        assert str(directory / "checkpoint.json") in answer["detail"], (call_name, answer)
        assert answer.get("error_type") == "MachineFormatError", (call_name, answer)
        assert answer["file"] == str(directory / "checkpoint.json"), (call_name, answer)
        if field_name is not None:
            assert f"'{field_name}'" in answer["detail"] and f"'{field_name}'" in answer["reason"], (call_name, answer)
    # nothing was made of it: no run left half-made, and the rest is served as it was
    status, body = call(srv, f"/api/v1/sessions/{sid}", method="GET")
    assert status == 200 and body["training_run_ids"] == [] and body["sampler_ids"] == [], body
    status, body = call(srv, f"/api/v1/training_runs/{run_id}/checkpoints", method="GET")
    assert status == 200 and [c["checkpoint_id"] for c in body["checkpoints"]] == ["weights/step-1"], body
    still_serves_the_good_run(srv)


def test_a_trainer_resumed_from_a_damaged_checkpoint_names_the_file_and_field(srv):
    """What a run's worker does for load_weights (in this process or a training process): the
    request's future fails as the user's error, naming the file and field."""
    from machine_nb.engines.local import compute

    run_id = f"local-{'3' * 16}:train:0"
    write_run(srv.data_dir, run_id)
    directory = write_checkpoint(srv.data_dir, run_id, "weights", "step-1", targets="attn")
    with pytest.raises(server_mod.MachineFormatError) as err:
        compute.Trainer.from_checkpoint(directory, optimizer=False)
    assert err.value.path == str(directory / "checkpoint.json") and err.value.field == "targets"


# -- a damaged run.json

DAMAGED_RUNS = [  # (what run.json says instead, the field named: None for the whole file)
    ({"created": "yesterday"}, "created"),
    ({"created": 1e300}, "created"),
    ({"user_metadata": ["a"]}, "user_metadata"),
    ({"lora_rank": "4"}, "lora_rank"),
    ({"base_model": ["local/arith-tiny"]}, "base_model"),
    ("[]", None),
    ("not json at all", None),
]


@pytest.mark.parametrize("damage,field_name", DAMAGED_RUNS)
def test_a_damaged_run_json_is_named_and_the_other_runs_are_served(srv, damage, field_name):
    run_id = f"local-{'4' * 16}:train:{DAMAGED_RUNS.index((damage, field_name))}"
    directory = write_run(srv.data_dir, run_id, **(damage if isinstance(damage, dict) else {}))
    if not isinstance(damage, dict):
        (directory / "run.json").write_text(damage, encoding="utf-8")
    write_checkpoint(srv.data_dir, run_id, "sampler_weights", "final")
    for path in (f"/api/v1/training_runs/{run_id}", f"/api/v1/training_runs/{run_id}/checkpoints"):
        status, answer = call(srv, path, method="GET")
        assert status == 400 and "internal error" not in answer["detail"], (path, answer)
        assert str(directory / "run.json") in answer["detail"] and answer["file"] == str(directory / "run.json"), answer
        if field_name is not None:
            assert f"'{field_name}'" in answer["detail"], (path, answer)
    still_serves_the_good_run(srv)
    status, body = call(srv, "/api/v1/training_runs", method="GET")
    assert run_id not in [r["training_run_id"] for r in body["training_runs"]], body


def test_listing_runs_skips_a_damaged_run_json_and_logs_which_file(tmp_path):
    write_run(tmp_path, GOOD_RUN)
    bad = write_run(tmp_path, f"local-{'5' * 16}:train:0", seed="0")
    said: list[str] = []
    assert ck.run_ids(tmp_path, said.append) == [GOOD_RUN]
    assert len(said) == 1 and str(bad / "run.json") in said[0] and "'seed'" in said[0], said


# -- deleting a checkpoint whose folder is a link


def test_deleting_a_checkpoint_whose_folder_is_a_link_removes_the_link_only(srv, tmp_path):
    import tinker

    run_id = f"local-{'6' * 16}:train:0"
    write_run(srv.data_dir, run_id)
    real = write_checkpoint(srv.data_dir, run_id, "sampler_weights", "real")
    inside = real.parent / "alias"
    inside.symlink_to(real, target_is_directory=True)
    outside_target = write_checkpoint(tmp_path, run_id, "sampler_weights", "mine")  # a folder outside the data dir
    outside = real.parent / "elsewhere"
    outside.symlink_to(outside_target, target_is_directory=True)
    kept = sorted(os.listdir(real)), sorted(os.listdir(outside_target))

    status, body = call(srv, f"/api/v1/training_runs/{run_id}/checkpoints/sampler_weights/alias", method="DELETE")
    assert status == 200, body
    rest = tinker.RestClient(base_url=srv.url, api_key=srv.key)
    rest.delete_checkpoint_from_tinker_path(ck.tinker_path(run_id, "sampler_weights", "elsewhere")).result(timeout=60)

    assert not os.path.lexists(inside) and not os.path.lexists(outside)
    assert (sorted(os.listdir(real)), sorted(os.listdir(outside_target))) == kept
    status, body = call(srv, f"/api/v1/training_runs/{run_id}/checkpoints", method="GET")
    assert [c["checkpoint_id"] for c in body["checkpoints"]] == ["sampler_weights/real"], body
    # the folder itself is still deleted on request
    status, body = call(srv, f"/api/v1/training_runs/{run_id}/checkpoints/sampler_weights/real", method="DELETE")
    assert status == 200 and not real.exists(), body


# -- a checkpoint deleted while its run is listed


def test_a_checkpoint_deleted_while_its_run_is_listed_is_left_out(srv, monkeypatch):
    run_id = f"local-{'7' * 16}:train:0"
    write_run(srv.data_dir, run_id)
    for name in ("a", "b", "c"):
        write_checkpoint(srv.data_dir, run_id, "weights", name)
    doomed = ck.run_dir(srv.data_dir, run_id) / "weights" / "b"
    is_file, gone = pathlib.Path.is_file, []

    def is_file_then_deleted(self):
        """Deletes "b" just after the listing has seen its checkpoint.json (another request's delete)."""
        seen = is_file(self)
        if self == doomed / "checkpoint.json" and not gone:
            shutil.rmtree(doomed)
            gone.append(self)
        return seen

    monkeypatch.setattr(pathlib.Path, "is_file", is_file_then_deleted)
    listed = srv.list_checkpoints(run_id)
    assert gone, "the listing never looked at checkpoint b"
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == ["weights/a", "weights/c"]


def test_saving_over_a_checkpoint_whose_folder_is_a_link_replaces_the_link_and_leaves_nothing_behind(tmp_path):
    from machine_nb.engines.local.compute import Trainer

    trainer = Trainer(DEFAULT_MODEL, 2)
    meta = {"format": ck.FORMAT, "base_model": DEFAULT_MODEL, "lora_rank": 2}
    elsewhere = tmp_path / "elsewhere"
    trainer.save(elsewhere, meta, optimizer=False)
    parent = tmp_path / "run" / "weights"
    parent.mkdir(parents=True)
    (parent / "step").symlink_to(elsewhere, target_is_directory=True)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    # a link a killed save left as its replaced folder: removed by the next save, the link only
    (parent / f".other.old-{ended.pid}-a1b2c3").symlink_to(elsewhere, target_is_directory=True)
    trainer.save(parent / "step", meta, optimizer=False)
    assert sorted(p.name for p in parent.iterdir()) == ["step"]  # no `.….old-…` link left over
    assert not (parent / "step").is_symlink() and ck.not_a_checkpoint(parent / "step") is None
    assert ck.not_a_checkpoint(elsewhere) is None  # what the link led to is untouched


@pytest.mark.parametrize("field, value", [("beta1", 1.0), ("beta2", 1.5), ("eps", 0.0)])
def test_adam_settings_no_step_can_take_are_a_400_naming_the_field(srv, field, value):
    """beta1 of 1 divides by zero in the bias correction, an eps of 0 turns untouched weights NaN:
    refused before the step is queued, as a negative learning rate is."""
    import tinker
    from tinker import types

    sc = tinker.ServiceClient(base_url=srv.url, api_key=srv.key)
    try:
        tc = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=2).result()
        with pytest.raises(Exception) as err:
            tc.optim_step(types.AdamParams(learning_rate=1e-3, **{field: value})).result()
        assert f"adam_params.{field}" in str(err.value) and "400" in str(err.value), str(err.value)
    finally:
        sc.close("success").result(timeout=60)


def test_a_default_server_stopped_directly_is_replaced_by_the_next_local_call():
    """`default_server().stop()` (not the toolkit's own stop): the next `engine="local"` call gets a
    running server, not the stopped one, whose port the SDK would retry for minutes."""
    first = server_mod.ensure_server()
    first.stop()
    again = server_mod.ensure_server()
    assert again is not first and not again.stopped and server_mod.default_server() is again
    status, _ = call(again, "/api/v1/healthz", method="GET")
    assert status == 200
