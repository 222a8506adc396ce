"""`machine-nb dashboard WORKSPACE`: the notebook's Dashboard as a web page on 127.0.0.1.

The page is one small self-contained HTML file that asks a JSON endpoint for the dashboard's
HTML about once a second (the same HTML the widget and a saved notebook show:
widgets/dashboard.py) and, on a click on a run, for that run's chat cards. Served by tornado
(installed with Jupyter) on the loopback address only, behind a random access token in the URL,
as Jupyter and Machine's own dashboard do (the opened page moves it from the address bar to a
cookie, `make_app`): a request without it is refused, and so is one whose
Host header names another site (DNS rebinding). The page runs only its own script (a
Content-Security-Policy with a nonce), so markup in a run cannot call anywhere. Ctrl-C and SIGTERM
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
from typing import Any, Callable

from ._flags import PORT, number, path

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>machine-nb dashboard</title>
<style>
body{font-family:system-ui,sans-serif;margin:12px;background:#fff;color:#111}
#preview{margin-top:12px;border-top:1px solid #d1d5db;padding-top:8px}
#status{color:#4b5563;font-size:12px;white-space:pre-line}
@media (prefers-color-scheme: dark){body{background:#111;color:#eee}}
</style></head>
<body><div id="dash">loading…</div><div id="preview"></div><div id="status"></div>
<script nonce="{nonce}">
const token = new URLSearchParams(location.search).get("token") || "";
// out of the address bar (and so of the history, and of a shared screen): a reload sends the cookie
if (token) history.replaceState(null, "", location.pathname);
const auth = token ? "token=" + encodeURIComponent(token) + "&" : "";
const note = document.getElementById("status");
let version = -1;
async function poll() {
  try {
    const r = await fetch("api/state?" + auth + "since=" + version);
    const s = await r.json().catch(() => ({}));
    if (r.status === 403) { note.textContent = s.error || "refused: 403"; return; }
    if (!r.ok) { note.textContent = s.error || ("error: " + r.status); }
    else {
      if (s.html !== undefined) { document.getElementById("dash").innerHTML = s.html; version = s.version; }
      note.textContent = (s.errors || []).map((e) => "reading the workspace: " + e).join("\\n");
    }
  } catch (e) { note.textContent = "server unreachable"; }
  setTimeout(poll, 1000);
}
document.addEventListener("click", async (e) => {
  const a = e.target.closest("[data-run]");
  if (!a) return;
  e.preventDefault();
  const preview = document.getElementById("preview");
  try {
    const r = await fetch("api/run?" + auth + "key=" + encodeURIComponent(a.dataset.run));
    const body = await r.json().catch(() => ({}));
    if (r.ok) preview.innerHTML = body.html; else preview.textContent = body.error || ("refused: " + r.status);
  } catch (e) { preview.textContent = "server unreachable"; }
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
    p.add_argument("workspace", type=path, help="the workspace folder (holding .machine/)")
    p.add_argument("--port", type=PORT, default=0, help="port (default 0: a free one)")
    p.add_argument("--interval", type=number(0, above=True), default=None, help="seconds between checks of the files (default 0.5)")
    p.set_defaults(func=_run)


#: Host names the page answers to. Any other Host header is a page of another site whose name
#: was pointed at 127.0.0.1 (DNS rebinding): refused, the token notwithstanding.
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})

#: What the page may load and run: its own script (by the nonce of each response), inline styles
#: (the dashboard's HTML is styled inline), requests to this server only; no frames around it.
CSP = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

#: Seconds a connection may wait between requests (or for its headers) before it is closed. The
#: page asks once a second; a client that holds connections open without asking loses them.
IDLE_S = 60


def make_app(state: Any, token: str, problems: Callable[[], list[str]] = lambda: []) -> Any:
    """The tornado application: the page, `api/state` and `api/run`, each refusing a wrong token
    or a Host header other than 127.0.0.1 / localhost.

    The page opened with its token sets a cookie holding it (HttpOnly, SameSite=Strict, named
    after a digest of the token, so two dashboards on one host keep theirs apart), and its script
    takes the token out of the address bar: a reload is let in by the cookie.

    Args:
        state: a DashboardState.
        token: the access token every request must carry (`?token=`, or the page's cookie).
        problems: what the page shows under the dashboard: the errors of reading the workspace
            since the last good read (default: none; see `follow`).

    Returns:
        A tornado.web.Application. Every answer of `api/*` (and of an unknown path) is JSON, an
        error as `{"error": "…"}`; the page's own refusal is plain text.
    """
    import hashlib

    import tornado.web

    from ..core.redact import redacted

    cookie = "machine_nb_dashboard_" + hashlib.sha256(token.encode("utf-8")).hexdigest()[:12]

    def is_token(sent: str) -> bool:
        return hmac.compare_digest(sent.encode("utf-8", "replace"), token.encode("utf-8"))

    class Base(tornado.web.RequestHandler):
        def set_default_headers(self) -> None:
            self.set_header("Cache-Control", "no-store")
            self.set_header("Referrer-Policy", "no-referrer")
            self.set_header("X-Content-Type-Options", "nosniff")
            self.set_header("Content-Type", "application/json")

        def prepare(self) -> None:
            if self.request.host_name not in LOCAL_HOSTS:
                self._refuse("this page answers only at 127.0.0.1 or localhost")
                return
            if not (is_token(self.get_query_argument("token", "")) or is_token(self.get_cookie(cookie, ""))):
                self._refuse("this page needs its access token (the ?token=… the command printed)")

        def _refuse(self, why: str) -> None:
            self.set_status(403)
            self.finish(json.dumps({"error": f"403: {why}"}, ensure_ascii=False))

        def write_error(self, status_code: int, **kwargs: Any) -> None:
            self.finish(json.dumps({"error": f"{status_code}: {self._reason}"}))

        def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
            # the request's URL carries the token: say the path and the error, never the query
            if isinstance(value, tornado.web.HTTPError):
                return
            print(redacted(f"machine-nb dashboard: {self.request.path}: {typ.__name__}: {value}"),
                  file=sys.stderr, flush=True)

    class Page(Base):
        def _refuse(self, why: str) -> None:  # read by a person, in the browser's address bar's tab
            self.set_status(403)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"403: {why}")

        def get(self) -> None:
            if is_token(self.get_query_argument("token", "")):  # kept for a reload (the script clears the URL)
                self.set_cookie(cookie, token, path="/", httponly=True, samesite="Strict")
            nonce = secrets.token_urlsafe(16)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Content-Security-Policy", CSP.replace("{nonce}", nonce))
            self.finish(PAGE.replace("{nonce}", nonce))

    class State(Base):
        def get(self) -> None:
            since = self.get_query_argument("since", "-1")
            body: dict[str, Any] = {"version": state.version, "errors": problems()}
            if since != str(state.version):
                body["html"] = state.html()
                body["snapshot"] = state.snapshot()
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

            try:  # a machine definition that does not parse, a workspace gone: said on the page
                lines = load_lines(frame)
            except (ValueError, OSError) as exc:
                self.set_status(500)
                self.finish(json.dumps({"error": redacted(f"{key}: {exc}")}))
                return
            html = chat_cards(lines[0]["messages"]) if lines else "no training example (no assistant answer)"
            self.finish(json.dumps({"html": no_math(f"<b>{escape(key)}</b>{html}")}))

    class NotFound(Base):  # after the Host and token checks, like every other path
        def get(self) -> None:
            self.set_status(404)
            self.finish(json.dumps({"error": "404: no such page (the page is / ; its data api/state, api/run)"}))

    return tornado.web.Application([(r"/", Page), (r"/api/state", State), (r"/api/run", Run)],
                                   default_handler_class=NotFound, log_function=lambda handler: None)


def make_server(app: Any) -> Any:
    """The HTTP server of the app: no request bodies (the app takes none, so no client makes it
    buffer one), idle connections closed after IDLE_S.

    Args:
        app: make_app's application.

    Returns:
        A tornado.httpserver.HTTPServer (not yet listening: `add_sockets`).
    """
    import tornado.httpserver

    return tornado.httpserver.HTTPServer(app, max_body_size=0, idle_connection_timeout=IDLE_S)


def follow(state: Any, loop: asyncio.AbstractEventLoop, interval: float) -> tuple[Any, Callable[[], list[str]]]:
    """A Follower of the state, and the errors of its reads since its last good read.

    Args:
        state: the DashboardState.
        loop: the loop the server runs on (batches are applied there, between requests).
        interval: seconds between checks of the files.

    Returns:
        (the Follower, not started; a function giving the last few errors of reading since the
        last read that succeeded: [] once reading works again).
    """
    from ..widgets.dashboard import Follower

    follower = Follower(state, lambda *_: None, interval=interval, loop=loop)
    return follower, lambda: follower.errors[-3:]


def _run(args: argparse.Namespace) -> int:
    ws = Path(args.workspace)
    if not ws.is_dir():
        raise ValueError(f"{ws}: no such workspace folder (give the folder that holds .machine/)")
    return asyncio.run(_serve(ws, args.port, args.interval))


def _bind(port: int) -> list:
    import errno

    import tornado.netutil

    try:
        return tornado.netutil.bind_sockets(port, "127.0.0.1")
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"port {port} on 127.0.0.1 is taken (another dashboard or server?): "
                                     f"give another --port, or leave --port out for a free one") from None
        raise


async def _serve(ws: Path, port: int, interval: float | None) -> int:
    from ..widgets.dashboard import INTERVAL_S, DashboardState

    sockets = _bind(port)  # before reading the workspace: a port taken is said at once
    try:
        state = DashboardState(ws)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    token = secrets.token_urlsafe(24)
    loop = asyncio.get_running_loop()
    follower, problems = follow(state, loop, interval or INTERVAL_S)
    server = make_server(make_app(state, token, problems))
    server.add_sockets(sockets)
    stop = asyncio.Event()
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
