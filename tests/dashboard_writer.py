"""A writer process for the dashboard tests and benchmark: writes what Machine writes, as Machine
writes it (one JSON line appended per event; each run as a temp file renamed into place).

Reads one JSON command per line on stdin and answers {"ok": true, ...} on stdout once done.
"""

from __future__ import annotations

import json
import os
import sys
import time


def run_record(machine: str, rid: str, *, finished: bool = True, score: float = 1.0, cost: float | None = None) -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    run = {"id": rid, "machine": machine, "workspace": "w", "input": f"question {rid}", "history": [],
           "output": f"answer {rid}", "model": "thinkingmachines/Inkling-Small", "harness": "tinker",
           "startedAt": now, "finishedAt": now if finished else "",
           "trajectory": [{"role": "user", "content": f"question {rid}"},
                          {"role": "assistant", "content": f"answer {rid}"}]}
    if finished:
        run["scorecard"] = {"total": score, "evaluatedAt": now, "criteria": {}}
    if cost is not None:
        run["usage"] = {"inputTokens": 10, "outputTokens": 5, "costUsd": cost}
    return run


def write_run(root: str, machine: str, rid: str, rename: bool = True, **kw) -> str:
    folder = os.path.join(root, *machine.split("/"))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{rid}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(run_record(machine, rid, **kw), f)
    path = os.path.join(folder, f"{rid}.json")
    if rename:
        os.replace(tmp, path)
    return path


def append(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)


def event_line(kind: str, machine: str, rid: str) -> str:
    return json.dumps({"type": kind, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "machine": machine, "run": rid}) + "\n"


def main() -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        reply: dict = {"ok": True}
        if op == "append":
            append(cmd["path"], cmd["text"])
        elif op == "burst":  # n appends, one line each
            for i in range(cmd["start"], cmd["start"] + cmd["n"]):
                append(cmd["path"], json.dumps({"n": i}) + "\n")
        elif op == "truncate":
            open(cmd["path"], "w").close()
        elif op == "replace":
            tmp = cmd["path"] + ".tmp"
            with open(tmp, "w") as f:
                f.write(cmd["text"])
            os.replace(tmp, cmd["path"])
        elif op == "run":
            write_run(cmd["root"], cmd["machine"], cmd["id"], finished=cmd.get("finished", True),
                      score=cmd.get("score", 1.0), cost=cmd.get("cost"))
        elif op == "tempfile":
            write_run(cmd["root"], cmd["machine"], cmd["id"], rename=False)
        elif op == "runs":
            for rid in cmd["ids"]:
                if cmd.get("events"):
                    append(cmd["events"], event_line("run.started", cmd["machine"], rid))
                write_run(cmd["root"], cmd["machine"], rid)
                if cmd.get("events"):
                    append(cmd["events"], event_line("run.finished", cmd["machine"], rid))
        else:
            reply = {"ok": False, "error": f"unknown op {op!r}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
