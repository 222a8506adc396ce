"""Measure the SHIPPED local base model (machine_nb/engines/local/weights): what its model card reports.

    .venv/bin/python benchmarks/bench_base_model.py

Prints: size, the number in its natural answer on 400 fresh plus/minus questions (operand pairs
never seen in pretraining), how often it already answers in the `answer: N` style (must be ~0),
exact match on the minimal-SFT corpus's 24 held-out rows (the SFT example's baseline, must be
<= 0.05), its replies to the probe questions, and greedy generation speed. One thread, as the engine.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from machine_nb.data.corpus import corpus_rows
    from machine_nb.engines import local
    from machine_nb.engines.local import build
    from machine_nb.engines.local.model import generate
    from machine_nb.checks.render import get_renderer, get_tokenizer

    name = local.DEFAULT_MODEL
    model = local.load_base(name)
    tok, renderer = get_tokenizer(name), get_renderer(name)
    weights = local.MODELS[name].directory / "model.safetensors"
    print(f"model {name}: {model.num_params():,} parameters, vocab {tok.vocab_size}, "
          f"weights file {weights.stat().st_size / 1e6:.2f} MB (fp16)")
    import json

    meta = json.loads((local.MODELS[name].directory / "config.json").read_text())["build"]
    print(f"build: {meta}")

    t0 = time.perf_counter()
    res = build.evaluate(model, tok, renderer, n=400)
    dt = time.perf_counter() - t0
    print(f"400 fresh questions: number right {res['accuracy']:.3f} (plus {res['plus']:.3f}, "
          f"minus {res['minus']:.3f}); exact `answer: N` style {res['exact_answer_style']:.3f}  [{dt:.1f}s]")
    for q, r, ok in res["examples"][:4]:
        print(f"  {q!r} -> {r!r}")

    rows = corpus_rows(seed=0)["eval"]
    stop = renderer.get_stop_sequences()
    exact = number = 0
    n_tokens = 0
    t0 = time.perf_counter()
    for row in rows:
        prompt = renderer.build_generation_prompt(row["messages"]).to_ints()
        toks, _, _ = generate(model, prompt, 40, stop=stop)
        n_tokens += len(toks)
        reply = renderer.parse_response(toks)[0]["content"]
        expected = row["expected"]
        exact += reply.strip() == expected
        number += build.last_integer(reply) == int(expected.split()[-1])
    dt = time.perf_counter() - t0
    print(f"minimal-SFT held-out rows (seed 0): {len(rows)}; exact match {exact / len(rows):.3f}; "
          f"number right {number / len(rows):.3f}; greedy {n_tokens / dt:.0f} tokens/s")

    probes = corpus_rows(seed=0)["probe"]
    print("probe questions:")
    for row in probes:
        prompt = renderer.build_generation_prompt(row["messages"]).to_ints()
        toks, _, _ = generate(model, prompt, 40, stop=stop)
        reply = renderer.parse_response(toks)[0]["content"]
        hit = row["expected_natural"].lower() in reply.lower()
        print(f"  {'ok ' if hit else '-- '} {row['messages'][0]['content']!r} -> {reply!r}")
    gen = build.general_answers(model, renderer)
    print(f"all {len(gen)} trained facts answered exactly as trained: {sum(ok for *_, ok in gen)}")


if __name__ == "__main__":
    main()
