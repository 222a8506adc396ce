"""Benchmark: the minimal-SFT story on the local engine, measured end to end.

Baseline exact match of the shipped model on the 24 held-out rows (target ≤ 0.05) and the
correctness of the number in its natural answers to 400 fresh plus/minus questions (≥ 95%);
SFT through tinker-cookbook's loop (48 rows, batch 8, 10 epochs = 60 steps; wall ≤ 60 s);
exact match after SFT (≥ 0.8); the style bleeding into general prompts; the same seed twice
giving identical losses and outputs. Samples with the tinker SDK's sampling client against the local
server and the renderer (greedy), not through evaluate.py.

    .venv/bin/python benchmarks/bench_sft.py [--rank 8] [--lr 3e-3] [--seed 0] [--fresh 400] [--weights DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MACHINE_NB_PROGRESS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ANSWER = re.compile(r"^answer: -?\d+$")
NUMBER = re.compile(r"-?\d+")


def replies(sampler, renderer, rows, max_tokens=24):
    import tinker

    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=renderer.get_stop_sequences())
    futures = [sampler.sample(renderer.build_generation_prompt(r["messages"]), 1, params) for r in rows]
    return [renderer.parse_response(f.result().sequences[0].tokens)[0]["content"].strip() for f in futures]


def exact(outs, rows):
    return sum(o == r["expected"] for o, r in zip(outs, rows)) / len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=None, help="LoRA rank (default: sft's, 8; 0 = full fine-tuning)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: sft's, 3e-3 for LoRA)")
    ap.add_argument("--seed", type=int, default=0, help="sft seed (default 0)")
    ap.add_argument("--fresh", type=int, default=400, help="fresh plus/minus questions for the natural-answer check")
    ap.add_argument("--no-repeat", action="store_true", help="skip the determinism re-run")
    ap.add_argument("--weights", default=None,
                    help="a directory of other weights for the default model (e.g. a pretraining build in progress)")
    args = ap.parse_args()
    if args.weights:
        import dataclasses

        from machine_nb.engines import local

        entry = local.MODELS[local.DEFAULT_MODEL]
        local.MODELS[local.DEFAULT_MODEL] = dataclasses.replace(entry, directory=Path(args.weights))

    import torch

    from machine_nb.data.corpus import QUESTION_TEMPLATES, answer, make_corpus
    from machine_nb.engines.local import DEFAULT_MODEL
    from machine_nb.engines import service_client
    from machine_nb.checks.render import get_renderer
    from machine_nb.training.train import sft, training_metrics

    work = Path(tempfile.mkdtemp(prefix="bench-sft-"))
    corpus = make_corpus(work / "corpus", seed=0)
    eval_rows = [json.loads(line) for line in open(corpus.eval)]
    probe_rows = [json.loads(line) for line in open(corpus.probe)]
    renderer = get_renderer(DEFAULT_MODEL)
    os.environ.setdefault("MACHINE_NB_DATA_DIR", str(work / "server-data"))
    sc = service_client("local")  # the real tinker SDK against the local server
    print(f"machine: {os.cpu_count()} cpu(s), torch {torch.__version__}, threads {torch.get_num_threads()}")
    from machine_nb.engines import local

    weights_dir = local.MODELS[DEFAULT_MODEL].directory
    build = json.loads((Path(weights_dir) / "config.json").read_text()).get("build", {})
    print(f"model: {DEFAULT_MODEL} from {weights_dir} (build: {build.get('steps')} steps, "
          f"random_init={build.get('random_init')}, partial={build.get('partial', False)})")

    # --- baseline
    base = sc.create_sampling_client(base_model=DEFAULT_MODEL).result()
    t = time.perf_counter()
    base_eval = replies(base, renderer, eval_rows)
    t_eval = time.perf_counter() - t
    print(f"baseline exact match on {len(eval_rows)} held-out rows: {exact(base_eval, eval_rows):.3f} "
          f"(target <= 0.05; {t_eval:.2f} s to sample)")
    for o, r in list(zip(base_eval, eval_rows))[:3]:
        print(f"    {r['messages'][-1]['content']!r} -> {o!r}")

    rng = random.Random(1234)
    fresh = []
    for _ in range(args.fresh):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        q = rng.choice(QUESTION_TEMPLATES[op]).format(a=a, b=b)
        fresh.append(({"messages": [{"role": "user", "content": q}]}, answer(a, op, b), op))
    t = time.perf_counter()
    outs = replies(base, renderer, [f[0] for f in fresh]) if fresh else ["", ""]
    t_fresh = time.perf_counter() - t
    right = {"+": [0, 0], "-": [0, 0]}
    for out, (_, value, op) in zip(outs, fresh):
        nums = NUMBER.findall(out)
        right[op][0] += bool(nums) and int(nums[-1]) == value
        right[op][1] += 1
    total = (right["+"][0] + right["-"][0]) / max(1, len(fresh))
    print(f"baseline natural answers with the right number on {len(fresh)} fresh questions: {total:.3f} "
          f"(plus {right['+'][0]}/{right['+'][1]}, minus {right['-'][0]}/{right['-'][1]}; target >= 0.95; "
          f"{t_fresh:.1f} s)")
    if len(fresh) >= 2:
        print(f"    e.g. {fresh[0][0]['messages'][0]['content']!r} -> {outs[0]!r}; "
              f"{fresh[1][0]['messages'][0]['content']!r} -> {outs[1]!r}")

    # --- SFT
    kw = dict(epochs=10, batch_size=8, seed=args.seed, progress=False)
    if args.rank is not None:
        kw["lora_rank"] = args.rank
    if args.lr is not None:
        kw["learning_rate"] = args.lr
    t = time.perf_counter()
    result = sft(corpus.train, log_dir=work / "run1", **kw)
    wall = time.perf_counter() - t
    df = training_metrics(result.log_dir)
    step_time = df["time/step"].sum() if "time/step" in df else float("nan")
    print(f"sft: {result.steps} steps, {result.tokens:,} tokens, loss {result.first_loss:.3f} -> {result.last_loss:.3f}, "
          f"wall {wall:.1f} s (target <= 60 s; cookbook time/step total {step_time:.1f} s)  {kw}")
    ckpt = sc.create_sampling_client(model_path=result.checkpoint).result()
    sft_eval = replies(ckpt, renderer, eval_rows)
    fmt = sum(bool(ANSWER.match(o)) for o in sft_eval) / len(sft_eval)
    print(f"after sft exact match on {len(eval_rows)} held-out rows: {exact(sft_eval, eval_rows):.3f} "
          f"(target >= 0.8); format compliance {fmt:.3f}")
    for o, r in list(zip(sft_eval, eval_rows))[:3]:
        print(f"    {r['messages'][-1]['content']!r} -> {o!r} (expected {r['expected']!r})")
    wrong = [(r["messages"][-1]["content"], o, r["expected"]) for o, r in zip(sft_eval, eval_rows) if o != r["expected"]]
    if wrong:
        print(f"    misses: {wrong}")

    # --- style bleed
    base_probe = replies(base, renderer, probe_rows)
    sft_probe = replies(ckpt, renderer, probe_rows)
    bled = sum(o.startswith("answer:") for o in sft_probe)
    colon = sum(":" in o and ":" not in b for o, b in zip(sft_probe, base_probe))
    changed = sum(o != b for o, b in zip(sft_probe, base_probe))
    print(f"style bleed on {len(probe_rows)} non-arithmetic prompts: {bled}/{len(probe_rows)} checkpoint replies "
          f"start with 'answer:' (base: {sum(o.startswith('answer:') for o in base_probe)}), {colon} took the "
          f"'x: y' shape, {changed} changed from the base's reply")
    for row, b, s in zip(probe_rows, base_probe, sft_probe):
        print(f"    {row['messages'][-1]['content']!r}: base {b!r} -> sft {s!r}")

    # --- determinism
    if not args.no_repeat:
        again = sft(corpus.train, log_dir=work / "run2", **kw)
        same_loss = list(df["train_mean_nll"]) == list(training_metrics(again.log_dir)["train_mean_nll"])
        again_eval = replies(sc.create_sampling_client(model_path=again.checkpoint).result(), renderer, eval_rows)
        print(f"same seed twice: identical losses {same_loss} (60 steps), identical outputs {again_eval == sft_eval}")
    print(f"(work dir {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
