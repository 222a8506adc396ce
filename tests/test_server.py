"""`machine-nb serve` as the tinker SDK's server: the raw SDK, tinker-cookbook's own loop, bad
requests, a server that dies mid-run, and the rules for binding beyond loopback. Each server here
is a real subprocess, started the way a user starts it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from machine_nb.data.corpus import make_corpus
from machine_nb.engines.local import DEFAULT_MODEL
from machine_nb.errors import EngineError
from machine_nb.checks.render import get_renderer

from serving import cookbook_sft_script, kill_when, start_server, stop_server, watch_closely

CANARY_KEY = "tml-canary-key-for-tests-0123456789"  # a fake key: it must never show in any output


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The module's `machine-nb serve`, bound beyond loopback (every address, 0.0.0.0), which it
    does with the key given by --key; the tests reach it through loopback."""
    s = start_server(tmp_path_factory.mktemp("serve"), "--verbose", "--host", "0.0.0.0", "--key", CANARY_KEY,
                     key=None)
    s.key, s.url = CANARY_KEY, s.url.replace("0.0.0.0", "127.0.0.1")
    yield s
    assert stop_server(s) == 0  # Ctrl-C stops it cleanly


@pytest.fixture(scope="module")
def sc(served):
    client = tinker.ServiceClient(base_url=served.url, api_key=CANARY_KEY)
    yield client
    client.close("success").result(timeout=60)  # its session ends before the server does: no heartbeat left failing


@pytest.fixture(scope="module")
def renderer():
    return get_renderer(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def batch(renderer):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import conversation_to_datum

    pairs = [(12, 30), (45, 11), (23, 67), (50, 19)]
    return [conversation_to_datum([{"role": "user", "content": f"What is {a} plus {b}?"},
                                   {"role": "assistant", "content": f"answer: {a + b}"}],
                                  renderer, 128, TrainOnWhat.LAST_ASSISTANT_MESSAGE) for a, b in pairs]


def steps(tc, data, n, lr=3e-3):
    out = []
    for _ in range(n):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=lr))
        out.append(fb.result().metrics["loss:sum"])
        opt.result()
    return out


def test_raw_sdk_trains_saves_and_samples(sc, batch, renderer):
    tc = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=8).result()
    tok = tc.get_tokenizer()  # the SDK's own AutoTokenizer load, from the tokenizer_id the server reports
    local = get_renderer(DEFAULT_MODEL).tokenizer
    text = "<|user|> What is 47 plus 15?<|end|><|assistant|> answer: 62"
    assert tok.encode(text, add_special_tokens=False) == local.encode(text)
    losses = steps(tc, batch, 6)
    assert losses[-1] < 0.7 * losses[0]
    before = tc.forward(batch, "cross_entropy").result().metrics["loss:sum"]
    assert tc.forward(batch, "cross_entropy").result().metrics["loss:sum"] == before  # forward only: no change
    path = tc.save_weights_for_sampler("six").result().path
    assert path.startswith("tinker://local-") and path.endswith("/sampler_weights/six")
    sampler = sc.create_sampling_client(model_path=path).result()
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 12 plus 30?"}])
    res = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=10, temperature=0.0,
                                                         stop=renderer.get_stop_sequences())).result()
    assert len(res.sequences) == 2 and res.sequences[0].tokens == res.sequences[1].tokens
    assert all(s.sequence_id for s in res.sequences)
    lps = sampler.compute_logprobs(prompt).result()
    assert lps[0] is None and len(lps) == prompt.length and all(x < 0 for x in lps[1:])
    rest = sc.create_rest_client()
    run = rest.get_training_run_by_tinker_path(path).result()
    assert run.base_model == DEFAULT_MODEL and run.lora_rank == 8 and run.last_sampler_checkpoint is not None


def test_forward_backward_custom_with_a_custom_loss(sc, batch):
    """The SDK's forward_backward_custom: a forward-only request, the loss in the client, then a
    backward with weights = -dLoss/dlogprobs (signed floats, negative ones included, as DPO sends)."""
    def doubled_nll(data, logprobs_list):
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].to_numpy())).sum() * 2.0
                   for d, lp in zip(data, logprobs_list))
        return loss, {"custom/doubled:sum": float(loss.detach())}

    a = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=4, seed=9).result()
    b = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=4, seed=9).result()
    plain = a.forward_backward(batch, "cross_entropy").result().metrics["loss:sum"]
    custom = b.forward_backward_custom(batch, doubled_nll).result()
    assert custom.metrics["loss:sum"] == pytest.approx(2 * plain, rel=1e-5)
    # a DPO-shaped loss: one reply pushed up, the other down (negative weights reach the server)
    def reply_logprob(datum, lp):
        return (lp * torch.tensor(datum.loss_fn_inputs["weights"].to_numpy())).sum()

    def margin_now(client):
        out = client.forward(batch[:2], "cross_entropy").result().loss_fn_outputs
        return float(reply_logprob(batch[0], torch.tensor(out[0]["logprobs"].to_numpy()))
                     - reply_logprob(batch[1], torch.tensor(out[1]["logprobs"].to_numpy())))

    c = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=4, seed=9).result()
    start = margin_now(c)

    def push_apart(data, logprobs_list):
        margin = reply_logprob(data[0], logprobs_list[0]) - reply_logprob(data[1], logprobs_list[1])
        return -torch.nn.functional.logsigmoid(margin - start), {}

    margins = [start]
    for _ in range(3):
        fb = c.forward_backward_custom(batch[:2], push_apart)
        opt = c.optim_step(types.AdamParams(learning_rate=1e-2))
        fb.result()
        opt.result()
        margins.append(margin_now(c))
    assert margins[-1] > margins[0]


def test_async_forms_and_two_training_runs_in_one_session(sc, batch):
    async def main():
        one = await sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=4, seed=1)
        two = await sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=2, seed=1)
        assert one.model_id != two.model_id and one.model_id.rsplit(":", 1)[0] == two.model_id.rsplit(":", 1)[0]
        first = []
        for tc in (one, two):
            fb = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=3e-3))
            first.append((await fb).metrics["loss:sum"])
            await opt
        saved = await one.save_weights_for_sampler("a")
        sampler = await sc.create_sampling_client(model_path=saved.path)
        params = types.SamplingParams(max_tokens=4, temperature=0.0)
        many = await asyncio.gather(*[sampler.sample(batch[0].model_input, 1, params) for _ in range(3)])
        return first, many

    first, many = asyncio.run(main())
    assert len(first) == 2 and all(np.isfinite(first))
    assert len({tuple(r.sequences[0].tokens) for r in many}) == 1


COOKBOOK_SCRIPT = cookbook_sft_script("local/arith-tiny", "machine_nb/local_chat", max_length=128, batch_size=8,
                                      learning_rate=3e-3, save_every=3)


#: Runs a script as `python SCRIPT ARGS...` does and, as the interpreter begins to end, writes the
#: names of the process's threads (native ones included) to $THREADS_FILE.
THREADS_AT_EXIT = """
import atexit, os, runpy, sys

def note():
    tasks = os.listdir("/proc/self/task")
    with open(os.environ["THREADS_FILE"], "w") as f:
        f.write("\\n".join(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks))

atexit.register(note)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_cookbooks_own_training_loop_runs_against_the_server(served, tmp_path):
    corpus = make_corpus(tmp_path / "corpus", seed=0)
    script = tmp_path / "train_on_tinker.py"
    script.write_text(COOKBOOK_SCRIPT)
    (tmp_path / "threads_at_exit.py").write_text(THREADS_AT_EXIT)
    env = {**os.environ, "TINKER_API_KEY": CANARY_KEY, "THREADS_FILE": str(tmp_path / "threads")}
    done = subprocess.run([sys.executable, str(tmp_path / "threads_at_exit.py"), str(script), str(corpus.train),
                           str(tmp_path / "log"), served.url], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # The SDK's clients use httpx's own transport, as the server's client config asks: pyqwest's
    # threads, which abort the interpreter when one hands a response over as it ends, never start.
    threads = (tmp_path / "threads").read_text().split("\n")
    assert len(threads) > 1 and not [t for t in threads if t.startswith("tokio")], threads
    rows = [json.loads(line) for line in open(tmp_path / "log" / "checkpoints.jsonl")]
    assert [r["name"] for r in rows] == ["000003", "final"]
    assert all(r["sampler_path"].startswith("tinker://local-") for r in rows)
    metrics = [json.loads(line) for line in open(tmp_path / "log" / "metrics.jsonl")]
    assert len(metrics) == 6 and metrics[-1]["train_mean_nll"] < metrics[0]["train_mean_nll"]
    # and the checkpoint is on the server's disk, where evaluate finds it by its path alone
    run_id = rows[-1]["sampler_path"].split("/")[2]
    assert (served.data_dir / "runs" / run_id / "sampler_weights" / "final" / "checkpoint.json").is_file()


def _post(url: str, path: str, body: bytes, content_type: str = "application/json", key: str | None = CANARY_KEY,
          length: int | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=body, method="POST",
                                 headers={"Content-Type": content_type, **({"X-API-Key": key} if key else {})})
    if length is not None:
        req.add_header("Content-Length", str(length))
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _session(url: str) -> str:
    status, body = _post(url, "/api/v1/create_session",
                         json.dumps({"tags": [], "user_metadata": None, "sdk_version": "0"}).encode())
    assert status == 200
    return body["session_id"]


def test_bad_requests_get_a_4xx_naming_the_field_and_the_server_keeps_serving(served, sc):
    url = served.url
    status, body = _post(url, "/api/v1/create_session", b"{not json")
    assert status == 400 and "not valid JSON" in body["detail"]
    status, body = _post(url, "/api/v1/create_session", json.dumps({"tags": "x", "user_metadata": None,
                                                                      "sdk_version": "0"}).encode())
    assert status == 400 and body["field"] == "tags"
    sid = _session(url)
    status, body = _post(url, "/api/v1/create_model", json.dumps(
        {"session_id": sid, "model_seq_id": 0, "base_model": "Qwen/Qwen3-8B"}).encode())
    assert status == 400 and body["field"] == "base_model" and "does not serve" in body["detail"]
    status, body = _post(url, "/api/v1/no_such_call", b"{}")
    assert status == 404 and "no_such_call" in body["detail"]
    status, body = _post(url, "/api/v1/create_session", b"x" * 10, length=10**9)
    assert status == 413 and "at most" in body["detail"]
    status, body = _call("GET", url, "/api/v1/training_runs?limit=ten")
    assert status == 400 and body["field"] == "limit" and "'ten'" in body["detail"]
    # through the SDK: token ids outside the vocabulary and a context too long, raised at once
    tc = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=2).result()
    bad = types.Datum(model_input=types.ModelInput.from_ints([1, 99999]),
                      loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})
    with pytest.raises(tinker.BadRequestError, match="outside the vocabulary"):
        tc.forward_backward([bad], "cross_entropy").result(timeout=60)
    sampler = sc.create_sampling_client(base_model=DEFAULT_MODEL).result()
    with pytest.raises(tinker.BadRequestError, match="context"):
        sampler.sample(types.ModelInput.from_ints([5] * 400), 1, types.SamplingParams(max_tokens=2)).result(timeout=60)
    with pytest.raises(tinker.BadRequestError, match="does not serve"):
        sc.create_sampling_client(base_model="thinkingmachines/Inkling").result(timeout=60)
    # still serving
    with urllib.request.urlopen(url + "/api/v1/healthz", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}


def test_a_deeply_nested_body_is_a_400_naming_the_field(served):
    """Request bodies go through the bounded JSON parser: nesting past jsonl.MAX_DEPTH, or past
    Python's recursion limit, is a 400 naming the field it is in, and the server keeps serving."""
    from machine_nb.core.jsonl import MAX_DEPTH

    for depth in (MAX_DEPTH + 1, 100_000):
        body = b'{"tags": [], "user_metadata": ' + b"[" * depth + b"]" * depth + b', "sdk_version": "0"}'
        status, answer = _post(served.url, "/api/v1/create_session", body)
        assert status == 400 and answer["field"] == "user_metadata", answer
        assert "nested deeper" in answer["detail"] and "Recursion" not in answer["detail"]
    assert _session(served.url)


def test_the_clients_key_is_never_logged_or_stored(served, sc):
    sc.create_sampling_client(base_model=DEFAULT_MODEL).result()  # requests with the canary key were made
    assert "POST /api/v1/create_sampling_session" in served.output()  # --verbose logs requests …
    assert CANARY_KEY not in served.output()  # … never their key
    for root, _, files in os.walk(served.data_dir):
        for f in files:
            assert CANARY_KEY.encode() not in open(os.path.join(root, f), "rb").read(), f


def test_binding_beyond_loopback_needs_a_key(served, tmp_path):
    """Without a key, `serve` refuses an address beyond loopback; with one (the module's server,
    bound to 0.0.0.0 with --key), every request must send it."""
    refused = subprocess.run([sys.executable, "-m", "machine_nb.cli", "serve", "--host", "0.0.0.0", "--port", "0",
                              "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "--key" in refused.stderr
    assert served.line.startswith("serving the Tinker API on http://0.0.0.0:")
    url = served.url
    status, body = _post(url, "/api/v1/create_session", b"{}", key="tml-wrong")
    assert status == 401 and "key" in body["detail"]
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=url, api_key="tml-wrong").create_sampling_client(
            base_model=DEFAULT_MODEL).result(timeout=60)
    ok = tinker.ServiceClient(base_url=url, api_key=CANARY_KEY)
    assert ok.create_sampling_client(base_model=DEFAULT_MODEL).result(timeout=60).get_base_model() == DEFAULT_MODEL
    ok.close("success").result(timeout=60)


def test_a_server_that_dies_mid_run_or_while_evaluate_samples_fails_the_call_quickly(tmp_path, monkeypatch):
    """sft on a `machine-nb serve` URL (engine="tinker"): kill the server after a few steps. The SDK
    alone would retry for ~5 minutes; the call fails with EngineError well within 30 s, the log
    dir reads back incomplete, and a restarted server (same data dir) lets the run resume.
    Then evaluate on the restarted server (engine="tinker"): kill it while it samples, and that
    call too fails with EngineError well within 30 s, keeping no SDK client for the dead server.

    The watchdog's waits are shortened (watch_closely); with its defaults a dead server is given
    up on within grace + one check interval + one check's timeout of the kill, asserted below."""
    import inspect

    from machine_nb import engines
    from machine_nb.engines.tinker import Watchdog
    from machine_nb.evaluation.evaluate import evaluate
    from machine_nb.training.train import read_training_log, sft

    defaults = {k: p.default for k, p in inspect.signature(Watchdog).parameters.items()}
    assert defaults["grace"] + defaults["every"] + defaults["timeout"] < 30
    watch_closely(monkeypatch)
    corpus = make_corpus(tmp_path / "corpus", seed=0, n_train=16)  # 2 steps an epoch at batch 8, 12 in 6 epochs
    s = start_server(tmp_path, name="doomed", key=CANARY_KEY)
    monkeypatch.setenv("TINKER_API_KEY", CANARY_KEY)
    log_dir = tmp_path / "run"
    metrics = log_dir / "metrics.jsonl"
    killed_at = kill_when(s.proc, lambda: metrics.exists() and metrics.read_text().count("\n") >= 6)  # half way
    with pytest.raises(EngineError, match="stopped answering") as err:
        sft(corpus.train, model=DEFAULT_MODEL, engine="tinker", base_url=s.url, log_dir=log_dir, epochs=6,
            save_every=3, progress=False)
    # the failure came after the kill, from the dead server (its port refuses), within seconds
    assert killed_at and time.monotonic() - killed_at[0] < 30
    assert "Connection refused" in str(err.value), str(err.value)
    s.proc.wait()
    s.log.close()
    part = read_training_log(log_dir)
    assert not part.complete and part.state_path is not None
    again = start_server(tmp_path, "--data-dir", str(s.data_dir), "--verbose", name="again", key=CANARY_KEY)
    try:
        done = sft(corpus.train, resume=log_dir, base_url=again.url, progress=False)
    except BaseException:
        stop_server(again)
        raise
    assert done.complete and done.steps == 12

    monkeypatch.setenv("TINKER_BASE_URL", again.url)
    rows = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}], "expected": f"answer: {a + b}"}
            for a in range(10, 40) for b in range(10, 20)]  # 300 rows: sampling takes a while
    sampled = again.output().count("POST /api/v1/asample")
    killed_at = kill_when(again.proc, lambda: again.output().count("POST /api/v1/asample") >= sampled + 3)
    try:
        with pytest.raises(EngineError, match="stopped answering") as err:
            evaluate(rows, model=DEFAULT_MODEL, engine="tinker", save=False, progress=False, max_tokens=64)
    finally:
        stop_server(again)
    assert killed_at and time.monotonic() - killed_at[0] < 30
    assert "Connection refused" in str(err.value), str(err.value)  # from the dead server
    assert not [k for k in engines._CLIENTS if k[1] == again.url]  # no SDK client kept heartbeating at a dead server


def _call(method: str, url: str, path: str, key: str | None = CANARY_KEY) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, method=method, headers={"X-API-Key": key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _files(root) -> dict[str, tuple[int, int]]:
    """Every file under `root`: (size, mtime in ns), to tell that nothing was written or removed."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_no_request_deletes_files_outside_the_data_dir_or_takes_a_folder_for_a_checkpoint(served, sc, tmp_path):
    """A run folder linked out of the data dir is never deleted through, and a folder named as
    `local://<dir>` (not a checkpoint path) is refused with a 400 naming the request field and
    saying what a checkpoint path looks like, its files unread."""
    import shutil

    from machine_nb.engines.local import checkpoints as ck

    tc = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=2).result()
    path = tc.save_weights_for_sampler("kept").result().path
    rest = tinker.RestClient(base_url=served.url, api_key=CANARY_KEY)

    # a run folder in the data dir that is a link to somewhere else: nothing there is deleted
    run_id = path.split("/")[2]
    outside = tmp_path / "elsewhere"
    shutil.copytree(served.data_dir / "runs" / run_id, outside)
    linked = f"local-{'ab' * 8}:train:0"
    (served.data_dir / "runs" / linked).symlink_to(outside, target_is_directory=True)
    kept = _files(outside)
    status, body = _call("DELETE", served.url, f"/api/v1/training_runs/{linked}/checkpoints/sampler_weights/kept")
    assert status == 403 and _files(outside) == kept
    (served.data_dir / "runs" / linked).unlink()

    # a checkpoint's folder named by its location: not a checkpoint path, refused naming the field
    folder = tmp_path / "old-run" / "sampler_weights" / "final"
    shutil.copytree(ck.checkpoint_dir(served.data_dir, path), folder)
    before = _files(tmp_path / "old-run")
    by_folder = f"local://{folder}"
    sid = _session(served.url)
    for call, field_name, body in [
            ("create_sampling_session", "model_path",
             {"session_id": sid, "sampling_session_seq_id": 0, "model_path": by_folder}),
            ("weights_info", "tinker_path", {"tinker_path": by_folder}),
            ("load_weights", "path", {"session_id": sid, "model_seq_id": 7, "path": by_folder, "optimizer": False})]:
        status, answer = _post(served.url, f"/api/v1/{call}", json.dumps(body).encode())
        assert status == 400 and answer["field"] == field_name, (call, answer)
        assert "is not a checkpoint path tinker://<run>/weights|sampler_weights/<name>" in answer["detail"], (call, answer)
    assert _files(tmp_path / "old-run") == before

    # and what the server wrote itself is still deleted on request
    rest.delete_checkpoint_from_tinker_path(path).result(timeout=60)
    assert not ck.checkpoint_dir(served.data_dir, path).exists()


EVAL_ROWS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}], "expected": f"answer: {a + b}"}
             for a, b in [(12, 30), (45, 11)]]


def test_a_checkpoint_of_another_server_says_where_it_is_served(served, sc, monkeypatch):
    """A `tinker://local-…` checkpoint made by a separate `machine-nb serve` goes to this process's
    own local server when no engine is given; that server does not have it, and the error says
    what to do (engine='tinker' with TINKER_BASE_URL at that server), which then works."""
    from machine_nb.engines import close_clients
    from machine_nb.evaluation.evaluate import evaluate

    tc = sc.create_lora_training_client(base_model=DEFAULT_MODEL, rank=2).result()
    path = tc.save_weights_for_sampler("elsewhere").result().path
    for model in (None, DEFAULT_MODEL):  # the base model read from the checkpoint, or given
        with pytest.raises(EngineError) as err:
            evaluate(EVAL_ROWS, model=model, checkpoint=path, save=False, progress=False)
        assert path in str(err.value) and "engine='tinker'" in str(err.value) and "TINKER_BASE_URL" in str(err.value)
    monkeypatch.setenv("TINKER_BASE_URL", served.url)
    monkeypatch.setenv("TINKER_API_KEY", CANARY_KEY)
    try:
        df = evaluate(EVAL_ROWS, model=DEFAULT_MODEL, checkpoint=path, engine="tinker", save=False,
                      progress=False)
    finally:
        close_clients(served.url)  # this server stops with the module: end the session kept for it first
    assert len(df.rows) == 2 and df.rows["error"].isna().all()
