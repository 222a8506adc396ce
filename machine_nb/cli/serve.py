"""`machine-nb serve`: the local engine as a server that speaks Tinker's HTTP API.

Any script written for Tinker then runs offline on the shipped model(s), unchanged:
`TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=$(cat <data dir>/server.key) python my_script.py`.
Every request must send the server's key, so no other user of the machine can reach the runs.
The protocol is engines/local/server.py's.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._flags import PORT, path, whole

#: The environment variable a server key may come from (kept out of `ps`, unlike --key).
KEY_ENV = "MACHINE_NB_SERVER_KEY"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve the Tinker API on this machine (the local engine, for the real tinker SDK)",
        description=(
            "Serve Tinker's HTTP API with the local engine, so the real tinker SDK and tinker-cookbook run "
            "offline: TINKER_BASE_URL=http://HOST:PORT TINKER_API_KEY=<key> python my_script.py. "
            "Every request must send the server's key as its API key (401 otherwise). The key comes from "
            f"--key-file, else ${KEY_ENV}, else the data dir's own key file (<data-dir>/server.key, made "
            "with a random key on first use, readable only by you); stderr names that file, never the key. "
            "Prints 'serving the Tinker API on http://HOST:PORT' when ready; Ctrl-C or SIGTERM stops it "
            "(requests in progress are answered first; prints 'stopped', exit 0). "
            "Writes: training runs and checkpoints under --data-dir (default $MACHINE_NB_DATA_DIR, else "
            "~/.cache/machine_nb/tinker-server; 0700 folders, 0600 files), and each local model's tokenizer "
            "into the Hugging Face hub cache under the model's name (models--local--…, marked as machine_nb's; "
            "a folder of that name it did not make is left alone), so the SDK's SamplingClient.get_tokenizer() "
            "loads it offline (HF_HUB_OFFLINE=1); nothing is written or deleted anywhere else. "
            "Cost: free, runs on this machine. "
            "Scripts that look up a local model's tokenizer or renderer through tinker-cookbook call "
            "machine_nb.use_local_models() first."))
    p.add_argument("--host", default="127.0.0.1",
                   help=f"address to bind (default 127.0.0.1; any other address needs --key-file or ${KEY_ENV})")
    p.add_argument("--port", type=PORT, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--data-dir", type=path, default=None, help="where runs and checkpoints are written")
    p.add_argument("--key-file", type=path, default=None,
                   help="a file whose first line is the key every request must send (tml-…, 12+ characters)")
    p.add_argument("--key", default=None,
                   help=f"the key itself; other users see it in `ps`: prefer --key-file or ${KEY_ENV}")
    p.add_argument("--threads", type=whole(1), default=None, help="torch threads (default $MACHINE_NB_THREADS, else 1)")
    p.add_argument("--train-workers", type=whole(0), default=None, metavar="N",
                   help="training processes for runs started while others train, so that different runs' steps "
                        "run in parallel (default: one fewer than the cores, at most 7; 0 trains every run in the "
                        "server's own process)")
    p.add_argument("--verbose", action="store_true", help="log each request (method and path, never headers)")
    p.set_defaults(func=_run, end_process=True)  # nothing is left to do once the server has stopped


def _run(args: argparse.Namespace) -> int:
    from ..core.process import pause_collection, settle
    from ..engines import serve, server_key

    def ready(line: str) -> None:
        settle()
        print(line, flush=True)

    key = server_key(args.key, args.key_file, os.environ.get(KEY_ENV))
    pause_collection()  # while the server imports and loads its models; `ready` resumes it
    try:
        serve(args.host, args.port, data_dir=args.data_dir, key=key, threads=args.threads,
              train_workers=args.train_workers, verbose=args.verbose, announce=ready)
    finally:
        settle()  # when it failed before it was ready (after `ready`, nothing is left to do)
    print("stopped", file=sys.stderr)
    return 0
