"""A second Machine workspace, unlike the sample in every way a notebook could lean on: one machine,
`helpdesk`, whose runs are ~700-token chats with tool calls and tool results under a long policy
system prompt, a rubric with no `correct` criterion, cases and held-out cases with no expected
answer, and no tag store at all. The notebooks' tests run 02, 03 and 05 on it.

Deterministic (one seed, a fixed clock). Also a script, for trying notebook 03 on such a machine:

    .venv/bin/python tests/helpdesk_workspace.py runs/helpdesk --model local/smollm2-135m
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

MACHINE = "helpdesk"
START = datetime(2026, 10, 5, 8, 30, 0, tzinfo=timezone.utc)

POLICY = """You are the help desk agent of Northwind Outfitters, an online shop for outdoor gear.

Policy, in order of precedence:
1. Identity. Before discussing an order, confirm the customer's order number and the email on the
   order. Never read out a full address, phone number or payment detail; the last four digits of a
   card are the most you may say.
2. Tools. Look an order up with `lookup_order` before saying anything about its status, and quote
   policy text from `search_policy` rather than from memory. If a tool fails, say so plainly and
   offer to open a ticket with `open_ticket`.
3. Returns. Unused items may be returned within 30 days of delivery for a full refund to the
   original payment method; worn footwear and opened consumables (fuel, food) cannot be returned.
   Refunds take 5 to 10 business days after the return is scanned at the warehouse.
4. Delays. An order more than 5 business days past its promised date qualifies for free express
   shipping on the next order; apologise once, give the new estimate, and do not promise dates the
   carrier has not given.
5. Escalation. Damaged or unsafe products, chargebacks and legal threats go to a human through
   `open_ticket` with priority "high"; tell the customer a person will reply within one business day.
6. Tone. Be warm and brief: at most five sentences, no bullet lists, no internal ticket numbers
   unless the customer asks, and end by asking whether anything else is needed.
7. Privacy. Do not confirm whether an email address has an account unless it matches the order;
   never paste a tool's raw output into a reply, and never guess at facts the tools did not return.
"""

CRITERIA = [
    {"id": "resolves_request", "description": "Does what the customer asked, or says plainly why it cannot",
     "weight": 3, "grader": "judge:resolution"},
    {"id": "follows_policy", "description": "Checks identity, uses the tools, quotes policy, escalates when it must",
     "weight": 2, "grader": "judge:policy"},
    {"id": "brief_and_warm", "description": "At most five sentences, warm, ends with an offer to help further",
     "weight": 1, "grader": "check:tone"},
]

TOOLS = [
    {"name": "lookup_order", "description": "Look up an order by number and email",
     "inputSchema": {"type": "object", "properties": {"order": {"type": "string"}, "email": {"type": "string"}},
                     "required": ["order", "email"]}},
    {"name": "search_policy", "description": "Search the shop's policy pages",
     "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "open_ticket", "description": "Open a ticket for a human agent",
     "inputSchema": {"type": "object", "properties": {"summary": {"type": "string"},
                                                      "priority": {"type": "string", "enum": ["low", "high"]}},
                     "required": ["summary", "priority"]}},
]

# (customer message, policy query, item, status)
CASES = [
    ("Hi, my order NW-48213 (ana.k@example.com) was due last Tuesday and the tracking has not moved since. "
     "Can you tell me where it is?", "late delivery compensation", "a 2-person tent", "delayed"),
    ("I want to return the hiking boots from order NW-51877, email j.okafor@example.com. I wore them on one "
     "short walk and they pinch.", "returns footwear", "hiking boots", "delivered"),
    ("Order NW-39902 for sam.r@example.com: the stove arrived with a cracked valve and it smells of gas. "
     "What should I do?", "damaged unsafe product", "a camping stove", "delivered"),
    ("Can you change the delivery address on NW-60114? The email is lee.h@example.com and I am moving "
     "this weekend.", "change delivery address", "a rain jacket", "processing"),
    ("My refund for NW-27745 (priya.s@example.com) still has not arrived, it has been two weeks since I "
     "sent the parcel back.", "refund timing", "a sleeping bag", "returned"),
    ("I was charged twice for order NW-55530, email m.dubois@example.com. Please fix it or I will dispute "
     "it with my bank.", "double charge chargeback", "trekking poles", "delivered"),
]
HOLDOUT = [
    "Order NW-70021 (c.nguyen@example.com) says delivered but nothing is at my door. What now?",
    "Can I return an unopened gas canister from NW-66340? My email is t.berg@example.com.",
    "The zip on my jacket from NW-61208 broke after a week, email r.silva@example.com. Can I get a new one?",
    "My parcel NW-58866 for o.haddad@example.com is ten days late. Is there anything you can do?",
]
# a run of a held-out question (someone tried the machine on it): never trained on
HOLDOUT_RUN = (HOLDOUT[3], "late delivery compensation", "a headlamp", "delayed")

REPLIES = {  # (reply, scores) per quality: good meets every criterion, fair misses some, poor most
    "good": ("I'm sorry about the wait on your {item}. I checked order {order}: it is {status}, and our "
             "policy says {policy_line} I have noted this on your order. Is there anything else I can help with?",
             {"resolves_request": 1.0, "follows_policy": 1.0, "brief_and_warm": 1.0}),
    "fair": ("Thanks for reaching out about your {item}. Order {order} is {status}. {policy_line} "
             "Let me know if you need more.",
             {"resolves_request": 1.0, "follows_policy": 0.5, "brief_and_warm": 0.5}),
    "poor": ("Orders sometimes take a while. Please check the tracking page again later.",
             {"resolves_request": 0.0, "follows_policy": 0.0, "brief_and_warm": 0.5}),
}
POLICY_LINES = {
    "late delivery compensation": "an order more than 5 business days late qualifies for free express shipping "
                                  "on your next order.",
    "returns footwear": "worn footwear cannot be returned, though unused items can within 30 days.",
    "damaged unsafe product": "damaged or unsafe products go straight to a person, who replies within one "
                              "business day.",
    "change delivery address": "an address can be changed while an order is still processing.",
    "refund timing": "refunds take 5 to 10 business days after the return is scanned at the warehouse.",
    "double charge chargeback": "billing disputes go to a person, who replies within one business day.",
}


def fingerprint() -> str:
    """The rubric's fingerprint (this fixture's own rule: sha256 of the criteria)."""
    return "rb-" + hashlib.sha256(json.dumps(CRITERIA).encode()).hexdigest()[:12]


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _dump(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _order_record(order: str, email: str, item: str, status: str, rng: random.Random) -> str:
    lines = [{"sku": f"NW-{rng.randint(10000, 99999)}", "item": item, "qty": 1, "price": rng.randint(40, 400)},
             {"sku": f"NW-{rng.randint(10000, 99999)}", "item": "gift card", "qty": 1, "price": 0}]
    events = [{"at": _iso(START - timedelta(days=d)), "event": e}
              for d, e in ((14, "order placed"), (13, "payment captured"), (12, "packed at warehouse"),
                           (11, "handed to carrier"), (6, "in transit: regional hub"), (2, "no scan since hub"))]
    return json.dumps({"order": order, "email": email, "status": status, "carrier": "NordPost",
                       "promised": _iso(START - timedelta(days=7)), "lines": lines, "events": events,
                       "card": "**** **** **** 4242", "notes": []}, indent=1)


def _policy_page(query: str) -> str:
    section = POLICY_LINES[query]
    return (f"Policy search results for '{query}':\n"
            f"[1] Customer promise, section 3: {section} This applies to every order placed on the web shop, in "
            "the app or by phone, whatever the payment method, and it is reviewed each quarter.\n"
            "[2] Agent guide: quote the customer promise word for word, never from memory, and link the page "
            "northwind.example/help/promise when the customer asks where it is written.\n"
            "[3] Related: returns portal, carrier claims, price match (not applicable to sale items).")


def _run(case_index: int, input_: str, query: str, item: str, status: str, quality: str, t: datetime,
         rng: random.Random, model: str) -> dict:
    order = input_.split("NW-")[1][:5]
    order = f"NW-{order}"
    email = next(w.strip("(),.") for w in input_.split() if "@" in w)
    c1, c2 = f"call_{rng.getrandbits(32):08x}", f"call_{rng.getrandbits(32):08x}"
    policy_line = POLICY_LINES[query]
    text, scores = REPLIES[quality]
    reply = text.format(item=item, order=order, status=status, policy_line=policy_line)
    failed_lookup = quality == "poor"
    trajectory = [
        {"role": "user", "content": input_},
        {"role": "assistant", "content": "Let me look that order up and check the policy.",
         "reasoning": f"Identity: {order} and {email} given. Look the order up, then search '{query}'."},
        {"role": "assistant", "content": "", "name": "lookup_order", "toolCallId": c1,
         "toolInput": {"order": order, "email": email}},
        {"role": "tool", "name": "lookup_order", "toolCallId": c1,
         "content": "Error: order service timed out" if failed_lookup
         else _order_record(order, email, item, status, rng), **({"isError": True} if failed_lookup else {})},
        {"role": "assistant", "content": "", "name": "search_policy", "toolCallId": c2, "toolInput": {"query": query}},
        {"role": "tool", "name": "search_policy", "toolCallId": c2, "content": _policy_page(query)},
        {"role": "assistant", "content": reply},
    ]
    total = sum(c["weight"] * scores[c["id"]] for c in CRITERIA) / sum(c["weight"] for c in CRITERIA)
    return {
        "id": f"{t:%Y%m%dt%H%M%S}-{rng.getrandbits(24):06x}", "machine": MACHINE, "workspace": "helpdesk",
        "input": input_, "history": [], "output": reply, "model": model, "harness": "tinker",
        "startedAt": _iso(t), "finishedAt": _iso(t + timedelta(seconds=rng.randint(4, 40))),
        "trajectory": trajectory, "version": "v1", "instructions": POLICY,
        "scorecard": {"total": round(total, 4), "evaluatedAt": _iso(t + timedelta(seconds=50)), "rubric": fingerprint(),
                      "criteria": {c["id"]: {"score": scores[c["id"]], "reason": "meets it" if scores[c["id"]] >= 1
                                             else "falls short", "weight": c["weight"], "grader": c["grader"]}
                                   for c in CRITERIA}},
        "usage": {"inputTokens": 900 + rng.randint(0, 200), "cachedInputTokens": 0,
                  "outputTokens": 60 + rng.randint(0, 40), "costUsd": 0.0},
    }


def generate(out: str | Path, *, model: str = "local/arith-tiny", seed: int = 0) -> Path:
    """Write the helpdesk workspace to `out` (created; an existing folder must be empty or absent).

    Args:
        out: the workspace folder.
        model: the model the live version (v1) runs and its runs were made with (default the local
            engine's tiny model, so the notebooks can reach it offline).
        seed: the one seed every choice comes from.

    Returns:
        `out` as a Path.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: the helpdesk workspace is written into an empty folder")
    rng = random.Random(seed)
    t = START
    runs = []
    for i, (input_, query, item, status) in enumerate(CASES):
        for quality in ("good", "fair", "poor"):
            t += timedelta(minutes=rng.randint(3, 50))
            runs.append(_run(i, input_, query, item, status, quality, t, rng, model))
    runs.append(_run(len(CASES), *HOLDOUT_RUN, "good", t + timedelta(minutes=7), rng, model))
    for run in runs:
        _dump(out / ".machine" / "runs" / MACHINE / f"{run['id']}.json", run)
    d = out / "machines" / MACHINE
    (d).mkdir(parents=True, exist_ok=True)
    (d / "instructions.md").write_text(POLICY, encoding="utf-8")
    (d / "machine.ts").write_text('export default { name: "helpdesk" };\n', encoding="utf-8")
    _dump(d / "model.json", {"model": model})
    _dump(d / "rubric.json", {"fingerprint": fingerprint(), "criteria": CRITERIA})
    _dump(d / "tools.json", TOOLS)
    _dump(d / "cases.json", [c[0] for c in CASES])
    _dump(d / "holdout.json", HOLDOUT)
    _dump(d / "versions.json", [{"id": "v1", "instructions": POLICY, "model": model, "rubricFingerprint": fingerprint(),
                                 "createdAt": _iso(START), "source": {"kind": "initial"}, "live": True}])
    return out


def grade(case: dict, reply: str) -> bool:
    """A grader for the held-out cases, which declare no expected answer: the reply offers further help
    (the rubric's tone criterion, the one a string check can score).

    Args:
        case: the case (its `input`).
        reply: the reply text.

    Returns:
        Whether the reply asks if anything else is needed.
    """
    return "anything else" in reply.lower()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="an empty or new folder")
    parser.add_argument("--model", default="local/arith-tiny", help="the live version's model (default local/arith-tiny)")
    args = parser.parse_args(argv)
    print(generate(args.out, model=args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
