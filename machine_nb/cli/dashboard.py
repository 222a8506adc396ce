"""`machine-nb dashboard WORKSPACE`: the notebook's Dashboard as a web page on 127.0.0.1.

The page is one small self-contained HTML file that asks a JSON endpoint for the dashboard's
HTML about once a second (the same HTML the widget and a saved notebook show:
widgets/dashboard.py) and, on a click on a run, for that run's chat cards. Served by tornado
(installed with Jupyter) on the loopback address only, behind a random access token in the URL,
as Jupyter and Machine's own dashboard do: a request without it is refused. Ctrl-C and SIGTERM
stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from ._flags import PORT, number

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>machine-nb dashboard</title>
<style>
body{font-family:system-ui,sans-serif;margin:12px;background:#fff;color:#111}
#preview{margin-top:12px;border-top:1px solid #d1d5db;padding-top:8px}
#status{color:#4b5563;font-size:12px}
@media (prefers-color-scheme: dark){body{background:#111;color:#eee}}
</style></head>
<body><div id="dash">loading…</div><div id="preview"></div><div id="status"></div>
<script>
const token = new URLSearchParams(location.search).get("token") || "";
let version = -1;
async function poll() {
  try {
    const r = await fetch("api/state?token=" + encodeURIComponent(token) + "&since=" + version);
    if (!r.ok) { document.getElementById("status").textContent = "refused: " + r.status; return; }
    const s = await r.json();
    if (s.html !== undefined) { document.getElementById("dash").innerHTML = s.html; version = s.version; }
    document.getElementById("status").textContent = "";
  } catch (e) { document.getElementById("status").textContent = "server unreachable"; }
  setTimeout(poll, 1000);
}
document.addEventListener("click", async (e) => {
  const a = e.target.closest("[data-run]");
  if (!a) return;
  e.preventDefault();
  const r = await fetch("api/run?token=" + encodeURIComponent(token) + "&key=" + encodeURIComponent(a.dataset.run));
  document.getElementById("preview").innerHTML = r.ok ? (await r.json()).html : "";
});
poll();
</script></body></html>
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard", help="a live view of a workspace as a web page (127.0.0.1, with an access token)",
        description=(
            "Serve the Dashboard of a workspace as a web page on 127.0.0.1: per machine its live version, runs "
            "running / finished today / failed, recent scores and cost so far; the latest events; training runs "
            "with their loss. It follows .machine/events.jsonl, the run files and the training logs as machines "
            "write them. Prints the page's address (with its random access token) when ready; Ctrl-C or SIGTERM "
            "stops it. Reads the workspace only; writes nothing but the run index in the user's cache folder. "
            "Cost: free (nothing leaves this machine)."))
    p.add_argument("workspace", help="the workspace folder (holding .machine/)")
    p.add_argument("--port", type=PORT, default=0, help="port (default 0: a free one)")
    p.add_argument("--interval", type=number(0, above=True), default=None, help="seconds between checks of the files (default 0.5)")
    p.set_defaults(func=_run)


def make_app(state: Any, token: str) -> Any:
    """The tornado application: the page, `api/state` and `api/run`, each refusing a wrong token.

    Args:
        state: a DashboardState.
        token: the access token every request must carry (`?token=`).

    Returns:
        A tornado.web.Application.
    """
    import tornado.web

    class Base(tornado.web.RequestHandler):
        def prepare(self) -> None:
            self.set_header("Cache-Control", "no-store")
            self.set_header("Referrer-Policy", "no-referrer")
            sent = self.get_query_argument("token", "")
            if not hmac.compare_digest(sent.encode("utf-8", "replace"), token.encode("utf-8")):
                self.set_status(403)
                self.finish("403: this page needs its access token (the ?token=… the command printed)")

        def log_exception(self, *args: Any) -> None:  # never log a URL (it carries the token)
            pass

    class Page(Base):
        def get(self) -> None:
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.finish(PAGE)

    class State(Base):
        def get(self) -> None:
            since = self.get_query_argument("since", "-1")
            body: dict[str, Any] = {"version": state.version}
            if since != str(state.version):
                body["html"] = state.html()
                body["snapshot"] = state.snapshot()
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(body, default=str))

    class Run(Base):
        def get(self) -> None:
            key = self.get_query_argument("key", "")
            try:
                frame = state.run_frame(key)
            except KeyError:
                self.set_status(404)
                self.finish(json.dumps({"error": f"no run {key!r} among the latest runs"}))
                return
            from ..core.theme import escape, no_math
            from ..widgets.cards import chat_cards
            from ..widgets.previewer import load_lines

            lines = load_lines(frame)
            html = chat_cards(lines[0]["messages"]) if lines else "no training example (no assistant answer)"
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"html": no_math(f"<b>{escape(key)}</b>{html}")}))

    return tornado.web.Application([(r"/", Page), (r"/api/state", State), (r"/api/run", Run)],
                                   log_function=lambda handler: None)


def _run(args: argparse.Namespace) -> int:
    ws = Path(args.workspace)
    if not ws.is_dir():
        raise ValueError(f"{ws}: no such workspace folder (give the folder that holds .machine/)")
    return asyncio.run(_serve(ws, args.port, args.interval))


async def _serve(ws: Path, port: int, interval: float | None) -> int:
    import tornado.httpserver
    import tornado.netutil

    from ..widgets.dashboard import INTERVAL_S, DashboardState, Follower

    state = DashboardState(ws)
    token = secrets.token_urlsafe(24)
    follower = Follower(state, lambda *_: None, interval=interval or INTERVAL_S, loop=asyncio.get_running_loop())
    sockets = tornado.netutil.bind_sockets(port, "127.0.0.1")
    server = tornado.httpserver.HTTPServer(make_app(state, token))
    server.add_sockets(sockets)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C arrives as KeyboardInterrupt
            pass
    follower.start()
    bound = sockets[0].getsockname()[1]
    print(f"dashboard of {ws} on http://127.0.0.1:{bound}/?token={token}", flush=True)
    try:
        await stop.wait()
    finally:
        follower.stop()
        state.close()
        server.stop()
        await server.close_all_connections()
    print("stopped", file=sys.stderr, flush=True)
    return 0
