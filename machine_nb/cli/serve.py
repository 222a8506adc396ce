"""`machine-nb serve`: the local engine as a server that speaks Tinker's HTTP API.

Any script written for Tinker then runs offline on the shipped model(s), unchanged:
`TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-local python my_script.py`.
The protocol is engines/local/server.py's.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve the Tinker API on this machine (the local engine, for the real tinker SDK)",
        description=(
            "Serve Tinker's HTTP API with the local engine, so the real tinker SDK and tinker-cookbook run "
            "offline: TINKER_BASE_URL=http://HOST:PORT TINKER_API_KEY=tml-local python my_script.py. "
            "Prints 'serving the Tinker API on http://HOST:PORT' when ready; Ctrl-C stops it. "
            "Writes: training runs and checkpoints under --data-dir (default $MACHINE_NB_DATA_DIR, else "
            "~/.cache/machine_nb/tinker-server; 0700 folders, 0600 files); nothing is written or deleted "
            "anywhere else (checkpoints written before the server, local://…, are served read-only). "
            "Cost: free, runs on this machine. "
            "Scripts that look up a local model's tokenizer or renderer through tinker-cookbook call "
            "machine_nb.use_local_models() first."))
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other address needs --key)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--data-dir", default=None, help="where runs and checkpoints are written")
    p.add_argument("--key", default=None,
                   help="require this API key on every request (needed to bind a non-loopback address)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default $MACHINE_NB_THREADS, else 1)")
    p.add_argument("--verbose", action="store_true", help="log each request (method and path, never headers)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..engines import serve

    serve(args.host, args.port, data_dir=args.data_dir, key=args.key, threads=args.threads,
          verbose=args.verbose, announce=lambda line: print(line, flush=True))
    print("stopped", file=sys.stderr)
    return 0
