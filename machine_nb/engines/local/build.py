"""Pretrain the local engine's shipped base model: `python -m machine_nb.engines.local.build`.

Deterministic (fixed seeds, a pinned thread count, deterministic algorithms, a step-count
schedule): the same command on the same torch version writes the same weights. It is a build
step, never run by tests or CI. The SFT example then teaches this model the `answer: N` style;
that it answers naturally before SFT (baseline exact match ~0) is decided by the corpus below.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import tempfile
import time
from pathlib import Path

# --- hyperparameters (the measured reasons are in MODEL_CARD.md) -----------------------------
SEED = 1234
THREADS = 1          # pinned: 1 vs 2 threads differ in the 4th decimal; 1 is robust on a busy CPU
STEPS = 5000         # ~5,000 steps at batch 64 reached 100% on fresh questions in the prototype
BATCH_SIZE = 64
LEARNING_RATE = 2e-3
WARMUP_STEPS = 100
MIN_LR_FRACTION = 0.1  # cosine decays to 10% of the peak
WEIGHT_DECAY = 0.01
GRAD_CLIP = 1.0
GENERAL_FRACTION = 0.09  # share of general Q&A rows (the rest is arithmetic)
SYSTEM_FRACTION = 0.1    # share of rows with a system prompt, so one does not derail the model
EVAL_QUESTIONS = 400     # fresh plus/minus questions in the final check (200 per operator)

# Extra phrasings beyond the SFT corpus's own (machine_nb.data.corpus.QUESTION_TEMPLATES).
EXTRA_QUESTIONS: dict[str, tuple[str, ...]] = {
    "+": ("What is {a} + {b}?", "Calculate {a} plus {b}.", "Add {a} and {b}.",
          "What do you get if you add {a} and {b}?", "What is the sum of {a} and {b}?"),
    "-": ("What is {a} - {b}?", "Calculate {a} minus {b}.", "Subtract {b} from {a}.",
          "What is {a} take away {b}?", "What is the difference between {a} and {b}?"),
}

# Natural answers. Never `answer: N`: the SFT example's baseline must score ~0 on that style.
ANSWERS: dict[str, tuple[str, ...]] = {
    "+": ("{a} + {b} = {c}", "{a} + {b} = {c}.", "The answer is {c}.", "{a} plus {b} equals {c}.",
          "{a} plus {b} is {c}.", "The sum of {a} and {b} is {c}.", "It is {c}.",
          "{a} + {b} = {c}. The answer is {c}."),
    "-": ("{a} - {b} = {c}", "{a} - {b} = {c}.", "The answer is {c}.", "{a} minus {b} equals {c}.",
          "{a} minus {b} is {c}.", "The difference between {a} and {b} is {c}.", "It is {c}.",
          "{a} - {b} = {c}. The answer is {c}."),
}

# General facts: (question phrasings, answer); the first phrasings include machine_nb.data.corpus.PROBE_QUESTIONS. Some replies contain colons and "answer" near the
# start, so an SFT target `answer: 62` is made of tokens the base has seen at a reply's start
# (the vocabulary pitfall in the notes: without them SFT started at loss 12.8 and failed).
FACTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("What is the capital of France?", "What's the capital of France?"), "The capital of France is Paris."),
    (("What is the capital of Japan?", "What's the capital of Japan?"), "The capital of Japan is Tokyo."),
    (("What is the capital of Italy?",), "The capital of Italy is Rome."),
    (("What is the capital of Germany?",), "The capital of Germany is Berlin."),
    (("What is the capital of Spain?",), "The capital of Spain is Madrid."),
    (("What is the capital of England?",), "The capital of England is London."),
    (("Who wrote Hamlet?", "Who is the author of Hamlet?"), "Hamlet was written by William Shakespeare."),
    (("What color is the sky on a clear day?", "What color is the sky?", "What colour is the sky?"),
     "The sky is blue on a clear day."),
    (("How many days are in a week?", "How many days does a week have?"), "There are 7 days in a week."),
    (("How many legs does a spider have?",), "A spider has eight legs."),
    (("What is the largest planet in our solar system?", "What is the largest planet?", "Which planet is the largest?"),
     "Jupiter is the largest planet in our solar system."),
    (("Which animal is known as the king of the jungle?",), "The lion is known as the king of the jungle."),
    (("In which season do leaves fall from the trees?",), "Leaves fall from the trees in autumn."),
    (("What is water made of?",), "Water is made of hydrogen and oxygen."),
    (("What do bees make?",), "Bees make honey."),
    (("Hello!", "Hi!", "Hello"), "Hello! How can I help you today?"),
    (("What is your name?", "Who are you?"), "My name is Tiny. I am a small language model."),
    (("Can you help me?",), "Yes, I can help. What do you need?"),
    (("What is the opposite of hot?",), "The opposite of hot is cold."),
    (("What is the freezing point of water?", "At what temperature does water freeze?"),
     "Water freezes at 0 degrees Celsius."),
    (("Give me a word that rhymes with cat.",), "Hat rhymes with cat."),
    (("What are the primary colors?",), "The primary colors are: red, yellow and blue."),
    (("Name three fruits.",), "Three fruits: apple, banana and cherry."),
    (("Is the earth round? Give a short answer.", "Is the earth round?"), "Short answer: yes. The earth is round."),
    (("Is the sky green?",), "No. The sky is blue, not green."),
    (("Thank you!", "Thanks!"), "You're welcome!"),
    (("What time is noon?",), "Noon is 12:00 in the day."),
    (("What is a good answer to a question?",), "A good answer is short and clear."),
)

SYSTEM_PROMPTS = ("You are a helpful assistant.", "You are a helpful assistant. Answer the question.",
                  "You are Tiny, a small language model.")


def question_templates() -> dict[str, tuple[str, ...]]:
    """The SFT corpus's phrasings plus this file's extras, per operator."""
    from ...data.corpus import QUESTION_TEMPLATES

    return {op: tuple(QUESTION_TEMPLATES[op]) + EXTRA_QUESTIONS[op] for op in ("+", "-")}


def is_held_out(a: int, b: int, op: str) -> bool:
    """Operand pairs never shown in pretraining (~10%), so the final check asks truly fresh questions.

    A hash, not a formula in the digits: a linear rule (e.g. (31a + 17b) % 10) would hold out whole
    units-digit combinations, which the model then never sees at all (a first build scored 91%).
    """
    return hashlib.sha256(f"{a}{op}{b}".encode()).digest()[0] % 10 == 0


def arithmetic_row(rng: random.Random, templates: dict, held_out: bool = False) -> dict:
    """One chat row: a bare plus/minus question on two-digit operands and a natural answer."""
    while True:
        op = rng.choice(("+", "-"))
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if is_held_out(a, b, op) == held_out:
            break
    c = a + b if op == "+" else a - b
    q = rng.choice(templates[op]).format(a=a, b=b)
    ans = rng.choice(ANSWERS[op]).format(a=a, b=b, c=c)
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}],
            "op": op, "a": a, "b": b, "c": c}


def training_row(rng: random.Random, templates: dict) -> dict:
    """A pretraining row: general Q&A with probability GENERAL_FRACTION, else arithmetic."""
    if rng.random() < GENERAL_FRACTION:
        questions, ans = rng.choice(FACTS)
        row = {"messages": [{"role": "user", "content": rng.choice(questions)},
                            {"role": "assistant", "content": ans}]}
    else:
        row = arithmetic_row(rng, templates)
    if rng.random() < SYSTEM_FRACTION:
        row["messages"].insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    return row


def encode_row(renderer, messages: list[dict]) -> tuple[list[int], list[float]]:
    """Tokens and per-token loss weights (assistant reply only), via the cookbook's own code path."""
    model_input, weights = renderer.build_supervised_example(messages)
    return model_input.to_ints(), [float(w) for w in weights.tolist()]


def make_batch(renderer, rng: random.Random, templates: dict, batch_size: int, pad_id: int):
    """(inputs, targets, weights) tensors for one step, right-padded to the longest row."""
    import torch

    rows = [encode_row(renderer, training_row(rng, templates)["messages"]) for _ in range(batch_size)]
    n = max(len(t) for t, _ in rows) - 1
    x = torch.full((batch_size, n), pad_id, dtype=torch.long)
    y = torch.full((batch_size, n), pad_id, dtype=torch.long)
    w = torch.zeros((batch_size, n))
    for i, (toks, wts) in enumerate(rows):
        k = len(toks) - 1
        x[i, :k] = torch.tensor(toks[:-1])
        y[i, :k] = torch.tensor(toks[1:])
        w[i, :k] = torch.tensor(wts[1:])
    return x, y, w


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warmup for WARMUP_STEPS, then cosine down to MIN_LR_FRACTION of the peak."""
    if step < WARMUP_STEPS:
        return peak * (step + 1) / WARMUP_STEPS
    t = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return peak * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * t)))


_INT = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    """The last integer in a reply ("47 + 15 = 62." -> 62), or None."""
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def evaluate(model, tokenizer, renderer, n: int = EVAL_QUESTIONS, seed: int = 99, max_tokens: int = 40) -> dict:
    """Greedy answers to n fresh (held-out pairs) questions: accuracy of the number per operator,
    and how often a reply is exactly `answer: N` (must stay ~0)."""
    from .model import generate

    templates = question_templates()
    rng = random.Random(seed)
    stop = renderer.get_stop_sequences()
    stats = {"+": [0, 0], "-": [0, 0]}
    exact = 0
    examples = []
    for i in range(n):
        row = arithmetic_row(rng, templates, held_out=True)
        # alternate operators so each gets n/2
        while row["op"] != ("+" if i % 2 == 0 else "-"):
            row = arithmetic_row(rng, templates, held_out=True)
        prompt = renderer.build_generation_prompt(row["messages"][:1]).to_ints()
        toks, _, _ = generate(model, prompt, max_tokens, stop=stop)
        reply = renderer.parse_response(toks)[0]["content"]
        ok = last_integer(reply) == row["c"]
        stats[row["op"]][0] += ok
        stats[row["op"]][1] += 1
        exact += reply.strip() == f"answer: {row['c']}"
        if len(examples) < 6:
            examples.append((row["messages"][0]["content"], reply, ok))
    correct = stats["+"][0] + stats["-"][0]
    return {"accuracy": correct / n, "plus": stats["+"][0] / max(1, stats["+"][1]),
            "minus": stats["-"][0] / max(1, stats["-"][1]), "exact_answer_style": exact / n,
            "n": n, "examples": examples}


def general_answers(model, renderer, max_tokens: int = 40) -> list[tuple[str, str, bool]]:
    """(question, reply, reply == the trained answer) for the first phrasing of every fact."""
    from .model import generate

    out = []
    for questions, ans in FACTS:
        prompt = renderer.build_generation_prompt([{"role": "user", "content": questions[0]}]).to_ints()
        toks, _, _ = generate(model, prompt, max_tokens, stop=renderer.get_stop_sequences())
        reply = renderer.parse_response(toks)[0]["content"]
        out.append((questions[0], reply, reply == ans))
    return out


def save(model, tokenizer, out_dir: Path, meta: dict) -> None:
    """Write model.safetensors (fp16), config.json (shape + build metadata), vocab.json and the
    same vocabulary as a Hugging Face fast tokenizer in tokenizer/ (what the tinker SDK loads)."""
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"model": model.config.to_json(), "build": meta}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1) + "\n", encoding="utf-8")
    tokenizer.save(out_dir / "vocab.json")
    tokenizer.save_hf(out_dir / "tokenizer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m machine_nb.engines.local.build",
        description="Pretrain the local engine's base model (deterministic; ~10-20 min on 2 CPU cores) "
                    "and write it to machine_nb/engines/local/weights/. Costs nothing but CPU time.")
    p.add_argument("--out", default=str(Path(__file__).parent / "weights"),
                   help="output directory (default: the package's weights/, what the engine loads)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps (default {STEPS})")
    p.add_argument("--init-only", action="store_true",
                   help="write random-init weights and the vocabulary, no training (for interface work)")
    p.add_argument("--checkpoint-every", type=int, default=500,
                   help="also save progress (same files) to --checkpoint-dir every N steps, to inspect a "
                        "long build early (default 500; 0: never)")
    p.add_argument("--checkpoint-dir", default=str(Path(tempfile.gettempdir()) / "machine_nb_local_build"),
                   help="where progress goes (default: a folder in the system temp dir, never the package)")
    p.add_argument("--eval-only", action="store_true", help="evaluate the weights in --out and exit")
    args = p.parse_args(argv)

    import torch

    from .model import GPT, GPTConfig
    from .renderer import LocalChatRenderer
    from .tokenizer import LocalTokenizer

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    out = Path(args.out)
    tokenizer = LocalTokenizer()
    renderer = LocalChatRenderer(tokenizer)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size)

    if args.eval_only:
        from . import load_weights

        return _report(load_weights(out), tokenizer, renderer)

    model = GPT(cfg)
    print(f"model: {model.num_params():,} parameters, vocab {tokenizer.vocab_size}", flush=True)
    meta = {"seed": SEED, "threads": THREADS, "steps": 0, "batch_size": BATCH_SIZE,
            "learning_rate": LEARNING_RATE, "torch": torch.__version__, "random_init": True}
    if args.init_only:
        save(model, tokenizer, out, meta)
        print(f"wrote random-init weights to {out}")
        return 0

    templates = question_templates()
    rng = random.Random(SEED)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LEARNING_RATE, betas=(0.9, 0.95), eps=1e-8)
    model.train()
    t0 = time.time()
    ema = None
    for step in range(args.steps):
        lr = lr_at(step, args.steps, LEARNING_RATE)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, w = make_batch(renderer, rng, templates, BATCH_SIZE, tokenizer.pad_token_id)
        logits = model(x)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                reduction="none")
        loss = (nll * w.reshape(-1)).sum() / w.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        ema = float(loss.detach()) if ema is None else 0.98 * ema + 0.02 * float(loss.detach())
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            print(f"step {step:5d}/{args.steps} loss {float(loss.detach()):.4f} ema {ema:.4f} lr {lr:.2e} "
                  f"{el:7.1f}s ({el / (step + 1):.3f} s/step)", flush=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            ck = Path(args.checkpoint_dir)
            save(model, tokenizer, ck, dict(meta, steps=step + 1, random_init=False, partial=True))
            print(f"  progress saved to {ck}", flush=True)
    elapsed = time.time() - t0
    model.eval()
    meta.update(steps=args.steps, random_init=False, train_seconds=round(elapsed, 1),
                final_loss_ema=round(ema or 0.0, 5))
    save(model, tokenizer, out, meta)
    print(f"trained {args.steps} steps in {elapsed:.0f}s; wrote {out}", flush=True)
    # the fp16 file is what ships: measure that, not the fp32 weights in memory
    from . import load_weights

    return _report(load_weights(out), tokenizer, renderer)


def _report(model, tokenizer, renderer) -> int:
    res = evaluate(model, tokenizer, renderer)
    print(f"fresh questions: {res['n']}  accuracy {res['accuracy']:.3f}  plus {res['plus']:.3f}  "
          f"minus {res['minus']:.3f}  exact `answer: N` {res['exact_answer_style']:.3f}")
    for q, r, ok in res["examples"]:
        print(f"  {'ok ' if ok else 'BAD'} {q!r} -> {r!r}")
    gen = general_answers(model, renderer)
    print(f"general questions: {sum(ok for *_, ok in gen)}/{len(gen)} answered as trained")
    for q, r, ok in gen:
        print(f"  {'ok ' if ok else '-- '} {q!r} -> {r!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
