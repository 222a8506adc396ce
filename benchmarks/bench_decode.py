"""Decoding speed of the local model: a token through `model.plain_forward` (one function over the
weights) against the same token through the model's modules, in one run.

    .venv/bin/python benchmarks/bench_decode.py [--rounds 7] [--tokens 400]

The model is a sampler's: the shipped base with rank-8 adapters (attention, MLP and unembedding,
B drawn non-zero) merged, as the engine samples a trained checkpoint. Each round times greedy and
seeded generation of about `--tokens` tokens from chat prompts of the arithmetic corpus, both ways,
in alternating order; prints the CPU time per token of each (median over rounds), their ratio, and
whether the two gave the same tokens and logprobs. One thread, as the engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=400, help="tokens generated per way per round (about)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from machine_nb.checks.render import get_renderer
    from machine_nb.data.corpus import corpus_rows
    from machine_nb.engines import local
    from machine_nb.engines.local import lora
    from machine_nb.engines.local import model as gpt

    model = local.load_base()
    lora.apply_lora(model, 8, unembed=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(name)))
    lora.merge_lora(model).eval()
    renderer = get_renderer(local.DEFAULT_MODEL)
    prompts = [renderer.build_generation_prompt(row["messages"][:-1]).to_ints() for row in corpus_rows()["eval"]]
    stop = renderer.get_stop_sequences()
    real = gpt.plain_forward

    def decode(way: str) -> tuple[float, list]:
        gpt.plain_forward = real if way == "plain" else (lambda m: None)
        try:
            out, n, t0 = [], 0, time.process_time()
            for i, prompt in enumerate(prompts):
                params = {} if i % 2 else {"temperature": 1.0, "seed": i}
                toks, lps, reason = gpt.generate(model, prompt, 24, stop=stop, **params)
                out.append((toks, lps, reason))
                n += len(toks)
                if n >= args.tokens:
                    break
            return (time.process_time() - t0) / n, out
        finally:
            gpt.plain_forward = real

    decode("plain"), decode("modules")  # warm-up
    times: dict[str, list[float]] = {"plain": [], "modules": []}
    same = True
    for r in range(args.rounds):
        order = ("plain", "modules") if r % 2 == 0 else ("modules", "plain")
        outs = {}
        for way in order:
            t, outs[way] = decode(way)
            times[way].append(t)
        same = same and outs["plain"] == outs["modules"]
    plain, modules = statistics.median(times["plain"]), statistics.median(times["modules"])
    print(f"local model {local.DEFAULT_MODEL}, {model.num_params():,} parameters, {args.rounds} rounds, one thread")
    print(f"through the modules:  {modules * 1e3:.3f} ms CPU per token (median)")
    print(f"plain_forward:        {plain * 1e3:.3f} ms CPU per token (median)")
    print(f"ratio plain / modules: {plain / modules:.2f}")
    print(f"same tokens, logprobs and stop reasons both ways: {same}")


if __name__ == "__main__":
    main()
