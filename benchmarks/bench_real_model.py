"""Benchmark: the local engine serving the real model, local/smollm2-135m, against bare baselines
measured in the same run.

- one LoRA training step (rank 8, batch 4 x 256 tokens) through `machine-nb serve` and the SDK,
  against a bare PEFT forward/backward/AdamW step in this process on the same batch, with the same
  LoRA targets (the SDK's default train_unembed adds the output projection's adapter to both), dtype,
  attention implementation and torch thread count (target <= 1.3x);
- sampling 8 prompts x 32 new tokens through the server (8 requests in flight), against a bare
  batched `model.generate` on the same prompts (target <= 1.3x);
- server start to first answer with this model: cold (a fresh models folder: the one-time
  conversion included, target <= 30 s) and warm (the median of three restarts on one data
  folder, target <= 5 s); the server's peak resident memory over the whole run (target <= 2.5 GB);
- smoke (2 steps) on the sample workspace's exported `support` rows, then an eval of 8 held-out
  questions (the machine's holdout cases and six more no run answered), target <= 3 min;
- the largest batch x length one training request may hold in the default settings.

    .venv/bin/python benchmarks/bench_real_model.py [--device cpu|cuda|mps] [--repeats 2] [--warm-starts 3]

Figures are ratios or times of this run; the machine's load moves them (run it alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "local/smollm2-135m"
KEY = "tml-bench-real-model"
EXTRA_QUESTIONS = ["Can I pay with a gift card?", "Is there a student discount?", "How long does shipping take?",
                   "Can I pick up my order in a store?", "Do you price match?", "Why was my card declined?"]


def start_server(data_dir: Path, env: dict) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "machine_nb.cli", "serve", "--port", "0", "--data-dir",
                             str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline().strip()
    if not line.startswith("serving the Tinker API on http://"):
        raise SystemExit(f"the server did not start: {line!r}")
    return proc, line.split(" on ", 1)[1].split()[0], line


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def first_answer(env: dict, data_dir: Path) -> tuple[float, subprocess.Popen, str, str]:
    """Seconds from launching `machine-nb serve` to the first sampled token of the model."""
    import tinker
    from tinker import types

    t0 = time.perf_counter()
    proc, url, line = start_server(data_dir, env)
    sc = tinker.ServiceClient(base_url=url, api_key=KEY)
    sampler = sc.create_sampling_client(base_model=MODEL).result()
    sampler.sample(types.ModelInput.from_ints([1, 4093, 198, 19556, 2, 198, 1, 520, 9531, 198]), 1,
                   types.SamplingParams(max_tokens=1, temperature=0.0)).result()
    took = time.perf_counter() - t0
    sc.close("success").result(timeout=60)
    return took, proc, url, line


def batch_4x256(tok) -> list[list[int]]:
    text = (Path(ROOT / "README.md").read_text(encoding="utf-8") * 4)
    ids = tok.encode(text)
    return [ids[i * 257:(i + 1) * 257] for i in range(4)]


def bare_step(model, opt, rows, device) -> float:
    import torch

    x = torch.tensor([r[:-1] for r in rows], device=device)
    y = torch.tensor([r[1:] for r in rows], device=device)
    t = time.perf_counter()
    logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if x.is_cuda:  # wait for the GPU's queued work, as the server's answer does
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - t


def server_step(tc, data) -> float:
    from tinker import types

    t = time.perf_counter()
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
    fb.result()
    opt.result()
    return time.perf_counter() - t


def prompts_8(renderer) -> list[list[int]]:
    qs = ["What is the capital of France?", "Name three primary colours.", "Write a haiku about tea.",
          "How do I reset my password?", "Explain what a GPU is.", "Give me a tip for sleeping well.",
          "What is 12 times 12?", "Translate 'good morning' to Spanish."]
    return [renderer.build_generation_prompt([{"role": "user", "content": q}]).to_ints() for q in qs]


def bare_generate(model, prompts, device) -> float:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32,
                             do_sample=False, pad_token_id=2)
    took = time.perf_counter() - t
    assert out.shape[1] == width + 32
    return took


def server_generate(sampler, prompts) -> float:
    from tinker import types

    params = types.SamplingParams(max_tokens=32, temperature=0.0, stop=[])
    t = time.perf_counter()
    futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
    results = [f.result() for f in futures]
    took = time.perf_counter() - t
    assert all(len(r.sequences[0].tokens) == 32 for r in results)
    return took


def smoke_and_eval(workdir: Path) -> dict:
    """Export support's runs, validate, smoke 2 steps, evaluate 8 held-out questions: seconds each."""
    import machine_nb as mnb

    out: dict = {}
    t0 = time.perf_counter()
    ws = ROOT / "data" / "sample_workspace"
    picked = mnb.select_runs(mnb.load_runs(ws, "support"), "support", workspace=ws)
    train = workdir / "support.jsonl"
    mnb.write_jsonl(mnb.training_lines(picked, "support", workspace=ws), train)
    checked = mnb.validate(train, MODEL)
    out["rows"] = sum(1 for _ in open(train))
    out["export_validate_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    result = mnb.smoke(train, model=MODEL, log_dir=workdir / "smoke")
    out["smoke_s"] = time.perf_counter() - t
    out["smoke_loss"] = (result.first_loss, result.last_loss)
    holdout = json.loads((ROOT / "data/sample_workspace/machines/support/holdout.json").read_text())
    system = (ROOT / "data/sample_workspace/machines/support/instructions.md").read_text()
    rows = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
             "expected": "Thanks for asking", "match": "prefix"} for q in holdout + EXTRA_QUESTIONS]
    evals = workdir / "heldout.jsonl"
    mnb.write_jsonl(rows, evals)
    t = time.perf_counter()
    res = mnb.evaluate(evals, model=MODEL, checkpoint=result.checkpoint, max_tokens=32, save=False)
    out["eval_s"] = time.perf_counter() - t
    out["eval_n"] = len(rows)
    out["eval_accuracy"] = res.summary.get("accuracy")
    out["total_s"] = time.perf_counter() - t0
    out["valid"] = checked.ok
    return out


def paired_medians(bare: Callable[[], float], server: Callable[[], float], repeats: int) -> tuple[float, float]:
    """The median seconds of the bare and the server call (each returns its own), over `repeats`
    rounds that alternate them, after one warm-up call of each."""
    bare(), server()
    b_times, s_times = [], []
    for _ in range(repeats):
        b_times.append(bare())
        s_times.append(server())
    return statistics.median(b_times), statistics.median(s_times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu, cuda or mps (default: the engine's choice)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats of each step and sampling (default 2)")
    ap.add_argument("--warm-starts", type=int, default=3, help="warm starts timed, the median printed (default 3)")
    ap.add_argument("--no-smoke", action="store_true", help="skip the smoke + eval figure")
    args = ap.parse_args()
    if args.warm_starts < 1:
        ap.error("--warm-starts must be 1 or more: the last warm server serves the figures that follow")
    if args.device:
        os.environ["MACHINE_NB_DEVICE"] = args.device
    import torch

    from machine_nb.engines.local import compute, hf
    from machine_nb.checks.render import get_renderer

    threads = compute.configure_torch()
    device, dtype = hf.device_and_dtype()
    print(f"bench_real_model: {MODEL} on {device} ({dtype}), torch threads {threads}, cpu cores {os.cpu_count()}")
    work = Path(tempfile.mkdtemp(prefix="bench-real-"))
    env = {**os.environ, "MACHINE_NB_MODELS_DIR": str(work / "models"), "TINKER_TELEMETRY": "0",
           "MACHINE_NB_SERVER_KEY": KEY}  # the key the benchmark's clients send

    cold, proc, url, line = first_answer(env, work / "data-cold")
    stop(proc)
    warms = []
    for i in range(args.warm_starts):  # the last server stays up for the figures below
        took, proc, url, line = first_answer(env, work / "data")
        warms.append(took)
        if i < args.warm_starts - 1:
            stop(proc)
    print(f"ready line: {line}")
    print(f"server start to first answer: cold {cold:.1f} s (target <= 30, one-time conversion included), "
          f"warm {statistics.median(warms):.1f} s (median of {', '.join(f'{w:.1f}' for w in warms)}; target <= 5)")

    import tinker
    from peft import LoraConfig, get_peft_model
    from tinker_cookbook.supervised.common import datum_from_model_input_weights
    from transformers import AutoModelForCausalLM

    os.environ["MACHINE_NB_MODELS_DIR"] = env["MACHINE_NB_MODELS_DIR"]
    renderer = get_renderer(MODEL)
    tok = renderer.tokenizer
    rows = batch_4x256(tok)
    data = [datum_from_model_input_weights(tinker.ModelInput.from_ints(r), torch.ones(len(r)), max_length=257)
            for r in rows]
    sc = tinker.ServiceClient(base_url=url, api_key=KEY)
    # the SDK's defaults: LoRA on attention, MLP and the output projection (train_unembed)
    tc = sc.create_lora_training_client(base_model=MODEL, rank=8, seed=0, train_unembed=True).result()
    bare = AutoModelForCausalLM.from_pretrained(str(hf.model_dir()), dtype=dtype).to(device)
    targets = list(hf.ATTN_MODULES + hf.MLP_MODULES) + ["lm_head"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings=True.*", category=UserWarning)
        bare = get_peft_model(bare, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                                               target_modules=targets))
    bare.train()
    opt = torch.optim.AdamW([p for p in bare.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    b, s = paired_medians(partial(bare_step, bare, opt, rows, device), partial(server_step, tc, data), args.repeats)
    print(f"LoRA step, rank 8, batch 4 x 256: server {s:.2f} s, bare PEFT {b:.2f} s -> {s / b:.2f}x (target <= 1.3x); "
          f"both with LoRA on {', '.join(targets)} (the server's train_unembed adapter included), the same "
          f"from_pretrained defaults (attention implementation), {str(dtype).removeprefix('torch.')}, "
          f"{torch.get_num_threads()} torch thread(s), AdamW; the server recomputes "
          f"{hf.plan_batch([256] * 4, backward=True)} of {hf.NUM_LAYERS} layers in the backward pass here")
    del bare, opt

    base = AutoModelForCausalLM.from_pretrained(str(hf.model_dir()), dtype=dtype).to(device).eval()
    prompts = prompts_8(renderer)
    sampler = sc.create_sampling_client(base_model=MODEL).result()
    b, s = paired_medians(partial(bare_generate, base, prompts, device), partial(server_generate, sampler, prompts),
                          args.repeats)
    print(f"sampling 8 prompts x 32 tokens: server {s:.2f} s, bare generate {b:.2f} s -> {s / b:.2f}x (target <= 1.3x)")
    del base
    sc.close("success").result(timeout=60)
    rss = peak_rss(proc.pid)
    stop(proc)
    print(f"server peak resident memory: {rss / 1e9:.2f} GB (target <= 2.5)")

    from machine_nb.engines.local.hf import batch_limit, memory_budget

    fits = ", ".join(f"{batch_limit(n)} x {n}" for n in (256, 1024, 2048, 4096, 8192))
    print(f"largest training batch per request (memory budget {memory_budget() / 1e9:.1f} GB): {fits}")

    if not args.no_smoke:
        r = smoke_and_eval(work)
        print(f"support: {r['rows']} rows exported + validated (ok={r['valid']}) in {r['export_validate_s']:.1f} s; smoke 2 steps "
              f"{r['smoke_s']:.1f} s (loss {r['smoke_loss'][0]:.3f} -> {r['smoke_loss'][1]:.3f}); eval of "
              f"{r['eval_n']} held-out questions {r['eval_s']:.1f} s (accuracy {r['eval_accuracy']}); "
              f"total {r['total_s']:.1f} s (target <= 180)")


if __name__ == "__main__":
    main()
